"""Staged rewrites of position-delete files: many small ones of a date merged, the data files left alone.

The same contract as a data rewrite (`icemaint.engine.staging`): plan on S, write the new delete files
with Iceberg's own position-delete rewrite write (files written, not committed: the `position_deletes`
metadata table read through a scan-task set and written back with `rewritten-file-scan-task-set-id`),
commit them to a staging branch at S as one `replace` of delete files, prove that every data file they
apply to reads the same rows as of S and on the branch, then publish the same swap on `main` validated
from S. Every delete row is kept, also those naming data files outside the planned date (a delete file of
a coarser, older partition spec covers several dates) or no longer live: the new files delete exactly
what the old ones did, in the same partition.
"""

from __future__ import annotations

import uuid

from icemaint.domain.rewrite_plan import DeleteGroup, DeleteRef, plan_delete_groups
from icemaint.engine.java import _java_list, _with_files, java_class, listed_java
from icemaint.engine.staging import StagedRewrite, StagingArea
from icemaint.engine.staging_errors import StagingError

PUFFIN = "PUFFIN"


def position_delete_refs(area: StagingArea, tasks_by_path: dict) -> list[DeleteRef]:
    """The position-delete files (not deletion vectors) attached to the planned data files, one per
    (delete file, data file) it applies to."""
    tbl = area.table(refresh=False)
    specs = tbl.specs()
    refs = []
    for data_path, task in tasks_by_path.items():
        deletes = task.deletes()
        if not deletes.size():
            continue
        for delete in listed_java(area.jvm, deletes):
            if delete.content().toString() != "POSITION_DELETES" or delete.format().toString() == PUFFIN:
                continue
            spec_id = int(delete.specId())
            refs.append(DeleteRef(path=str(delete.location()), spec_id=spec_id,
                                  partition=str(specs.get(spec_id).partitionToPath(delete.partition())),
                                  size_bytes=int(delete.fileSizeInBytes()), data_file=data_path))
    return refs


def plan_position_deletes(area: StagingArea, tasks_by_path: dict) -> list[DeleteGroup]:
    return plan_delete_groups(position_delete_refs(area, tasks_by_path))


def stage_position_deletes(area: StagingArea, group: DeleteGroup, tasks_by_path: dict, base_snapshot_id: int,
                           scan_filter, *, target_file_size_bytes: int, index: int = 0) -> StagedRewrite:
    """Writes the group's merged position-delete files and commits them, in place of the group's delete
    files, to a new staging branch at `base_snapshot_id`. `main` does not move."""
    jvm = area.jvm
    tbl = area.table(refresh=False)
    deletes_table = java_class(jvm, "org.apache.iceberg.MetadataTableUtils").createMetadataTableInstance(
        tbl, java_class(jvm, "org.apache.iceberg.MetadataTableType").POSITION_DELETES)
    coordinator = java_class(jvm, "org.apache.iceberg.spark.PositionDeletesRewriteCoordinator").get()
    set_id = f"icemaint-deletes-{uuid.uuid4().hex}"
    branch = area.branch_name(index)
    try:
        with area.branch_removed_on_failure(branch, "the position-delete rewrite"):
            tasks, old_deletes = _delete_tasks(area, deletes_table, group, base_snapshot_id, scan_filter)
            manager = java_class(jvm, "org.apache.iceberg.spark.ScanTaskSetManager").get()
            manager.stageTasks(deletes_table, set_id, _java_list(jvm, tasks))
            area.track_task_set(set_id)
            deletes_sql = f"{area.name.sql(area.catalog)}.`position_deletes`"
            rows = area.spark.read.format("iceberg").option("scan-task-set-id", set_id) \
                .option("split-size", str(group.total_bytes + 1)).option("file-open-cost", "0").load(deletes_sql)
            rows = rows.sortWithinPartitions("file_path", "pos")
            codec = area.write_codec(deletes=True)
            rows.write.format("iceberg").option("rewritten-file-scan-task-set-id", set_id) \
                .option("target-delete-file-size-bytes", str(int(target_file_size_bytes))) \
                .options(**codec.options).mode("append").save(deletes_sql)
            new_deletes = listed_java(jvm, coordinator.fetchNewFiles(deletes_table, set_id))
            staged = area.commit_to_branch(branch, lambda t: _with_files(_with_files(
                t.newRewrite().toBranch(branch).validateFromSnapshot(int(base_snapshot_id)), "deleteFile", old_deletes),
                "addFile", new_deletes), create_at=base_snapshot_id)
            sequence_number = area.sequence_number(base_snapshot_id)
            return StagedRewrite(
                table=area.name.key, branch=branch, base_snapshot_id=int(base_snapshot_id),
                base_sequence_number=sequence_number, staged_snapshot_id=int(staged),
                replaced_files=group.delete_files, new_files=tuple(str(f.location()) for f in new_deletes),
                dangling_deletes=(), replaced_bytes=group.total_bytes, target="position_deletes",
                _old_tasks=[tasks_by_path[p] for p in group.data_files], _new_files=new_deletes,
                _removed_deletes=old_deletes, _scan_filter=scan_filter, codec=codec)
    finally:
        coordinator.clearRewrite(deletes_table, set_id)


def _delete_tasks(area: StagingArea, deletes_table, group: DeleteGroup, base_snapshot_id: int, scan_filter):
    """The `position_deletes` table's scan tasks of exactly the group's delete files as of S, and the files."""
    scan = deletes_table.newBatchScan().useSnapshot(int(base_snapshot_id))
    if scan_filter is not None:
        scan = scan.baseTableFilter(scan_filter)
    wanted = set(group.delete_files)
    iterable = scan.planFiles()
    try:
        tasks = [t for t in listed_java(area.jvm, iterable) if str(t.file().location()) in wanted]
    finally:
        iterable.close()
    files = {}
    for task in tasks:
        files.setdefault(str(task.file().location()), task.file())
    if set(files) != wanted:
        raise StagingError(f"{len(wanted) - len(files)} of the {len(wanted)} position-delete files planned on "
                           f"snapshot {base_snapshot_id} were not found in its position_deletes table")
    return tasks, [files[p] for p in group.delete_files]

