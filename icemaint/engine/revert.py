"""Undoing a published rewrite with a forward commit: the proven files back, the rewrite's files out.

An operator may want a compaction undone after it was published (a reader depended on the old layout,
a sort order turned out wrong). `main` is never rewound: the revert is one more `replace` commit that
swaps the rewrite's files (as they are now) for the files it replaced, proven row for row first.

Restoring a file must not change which deletes apply to it. With Iceberg 1.10's `RewriteFiles` every
restored file takes one data sequence number, so a revert is offered only for a publish whose
replaced files carried no deletes and that removed no delete files: their rows are then exactly the
files' rows whatever sequence number they get. The restored files take the rewrite's own data sequence
number, so deletes committed after the publish apply to them as they applied to the rewrite's files;
a writer's delete on the rewrite's files since the publish makes the proof (and the commit's
validation) fail instead of resurrecting the deleted rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from icemaint.domain.health import MAINTENANCE_TAG
from icemaint.domain.names import TableName
from icemaint.engine.java import (CONFLICT_CLASSES, find_on_main, iterate_java, java_exception_class, java_root_message,
                                  listed_java)
from icemaint.engine.staging import PROOF_KEY, StagingArea
from icemaint.engine.staging_errors import PublishConflict
from icemaint.errors import UserError

REVERT_OF_KEY = "icemaint.revert-of"


class RevertRefused(UserError, ValueError):
    """The snapshot cannot be reverted safely; nothing was changed. The message says why."""


@dataclass
class RevertPlan:
    """What a revert of publish P swaps, as of the current head H."""

    published_snapshot_id: int
    head_snapshot_id: int
    sequence_number: int
    restored_files: tuple[str, ...]
    removed_files: tuple[str, ...]
    restored_records: int
    _old_tasks: list = field(default_factory=list, repr=False)
    _new_tasks: list = field(default_factory=list, repr=False)


class Reverter:
    """Plans, reads and commits the revert of one publish (Iceberg's Java API through Py4J)."""

    def __init__(self, spark, catalog: str, name: TableName, run_token: str):
        self.staging = StagingArea(spark, catalog, name, run_token)  # its exact scan-task reads
        self.jvm = spark._jvm
        self.name = name

    def _table(self):
        return self.staging.table()

    def plan(self, published_snapshot_id: int) -> RevertPlan:
        """The revert of `published_snapshot_id` on the current head.

        Raises:
            RevertRefused: not an icemaint publish on main, already reverted or changed since, or a
                rewrite that applied or removed deletes.
        """
        tbl = self._table()
        head = tbl.currentSnapshot()
        snap = tbl.snapshot(int(published_snapshot_id))
        key = self.name.key
        if snap is None:
            raise RevertRefused(f"snapshot {published_snapshot_id} is not in {key}'s metadata (expired, or a typo)")
        on_main, cursor = False, head
        while cursor is not None:
            if int(cursor.snapshotId()) == int(published_snapshot_id):
                on_main = True
                break
            parent = cursor.parentId()
            cursor = tbl.snapshot(parent) if parent is not None else None
        summary = snap.summary()
        if not on_main:
            raise RevertRefused(f"snapshot {published_snapshot_id} is not on {key}'s main branch")
        if str(summary.get(MAINTENANCE_TAG)) != "true" or str(summary.get(PROOF_KEY)) != "passed" \
                or str(snap.operation()) != "replace":
            raise RevertRefused(f"snapshot {published_snapshot_id} of {key} is not a proven icemaint rewrite "
                                f"(operation {snap.operation()}); only those are reverted")
        if summary.get(REVERT_OF_KEY) is not None:
            raise RevertRefused(f"snapshot {published_snapshot_id} is itself a revert; compact the date again instead")
        done = find_on_main(tbl, REVERT_OF_KEY, str(published_snapshot_id))
        if done is not None:  # e.g. a revert interrupted after its commit, run again
            raise RevertRefused(f"snapshot {published_snapshot_id} of {key} was already reverted by snapshot "
                                f"{done.snapshotId()}: nothing to do")
        io = tbl.io()
        removed_deletes = list(iterate_java(snap.removedDeleteFiles(io)))
        if removed_deletes:
            raise RevertRefused(
                f"the rewrite in snapshot {published_snapshot_id} removed {len(removed_deletes)} delete files it had "
                "applied; restoring its files would need those deletes back at their own sequence numbers, which "
                "this Iceberg runtime's RewriteFiles cannot commit: compact again with the layout you want instead")
        old = {str(f.location()): f for f in iterate_java(snap.removedDataFiles(io))}
        new = {str(f.location()) for f in iterate_java(snap.addedDataFiles(io))}
        if not old or not new:
            raise RevertRefused(f"snapshot {published_snapshot_id} of {key} replaced no data files")
        parent = int(snap.parentId())
        if tbl.snapshot(parent) is None:
            raise RevertRefused(
                f"snapshot {parent}, the one the rewrite in {published_snapshot_id} was published on, has been expired: "
                "the replaced files cannot be read as they were (and may be deleted); compact again with the layout "
                "you want instead")
        old_tasks = self._tasks_of(parent, set(old))
        if len(old_tasks) != len(old):
            raise RevertRefused(f"{len(old) - len(old_tasks)} of the replaced files cannot be read as of snapshot "
                                f"{parent}, the one the rewrite was published on")
        with_deletes = [t for t in old_tasks if t.deletes().size()]
        if with_deletes:
            raise RevertRefused(
                f"{len(with_deletes)} of the replaced files carried deletes when the rewrite applied them; a revert "
                "would need them restored at their own sequence numbers, which this Iceberg runtime's "
                "RewriteFiles cannot commit: compact again with the layout you want instead")
        new_tasks = self._tasks_of(int(head.snapshotId()), new)
        if len(new_tasks) != len(new):
            raise RevertRefused(
                f"{len(new) - len(new_tasks)} of the {len(new)} files snapshot {published_snapshot_id} added are no "
                f"longer live at snapshot {head.snapshotId()} (a later rewrite or a writer replaced them): there is "
                "nothing to revert to as one swap")
        sequence = {int(t.file().dataSequenceNumber()) for t in new_tasks}
        return RevertPlan(
            published_snapshot_id=int(published_snapshot_id), head_snapshot_id=int(head.snapshotId()),
            sequence_number=max(sequence), restored_files=tuple(sorted(old)), removed_files=tuple(sorted(new)),
            restored_records=sum(int(t.file().recordCount()) for t in old_tasks),
            _old_tasks=old_tasks, _new_tasks=new_tasks)

    def _tasks_of(self, snapshot_id: int, paths: set[str]) -> list:
        iterable = self._table().newScan().useSnapshot(int(snapshot_id)).planFiles()
        try:
            return [t for t in listed_java(self.jvm, iterable) if str(t.file().location()) in paths]
        finally:
            iterable.close()

    # -- the proof's two sides ---------------------------------------------------------------
    def rows_now(self, plan: RevertPlan):
        """The rewrite's files as main reads them now (deletes since the publish applied)."""
        return self.staging.read_tasks(plan._new_tasks)

    def rows_restored(self, plan: RevertPlan):
        """The replaced files' rows (they carried no deletes)."""
        return self.staging.read_tasks(plan._old_tasks)

    def commit(self, plan: RevertPlan, properties: dict[str, str]) -> int:
        """One forward `replace` on main, validated from the head the plan was made on.

        Raises:
            PublishConflict: a writer's commit since the plan conflicts; nothing changed.
        """
        from py4j.protocol import Py4JJavaError

        tbl = self._table()
        rewrite = tbl.newRewrite().validateFromSnapshot(plan.head_snapshot_id).dataSequenceNumber(plan.sequence_number)
        for task in plan._new_tasks:
            rewrite = rewrite.deleteFile(task.file())
        for task in plan._old_tasks:
            rewrite = rewrite.addFile(task.file())
        marker = {**properties, MAINTENANCE_TAG: "true", REVERT_OF_KEY: str(plan.published_snapshot_id)}
        for key, value in marker.items():
            rewrite = rewrite.set(key, str(value))
        try:
            rewrite.commit()
        except Py4JJavaError as exc:
            if java_exception_class(exc) in CONFLICT_CLASSES:
                raise PublishConflict(java_root_message(exc)) from exc
            raise
        tbl.refresh()
        snap = find_on_main(tbl, REVERT_OF_KEY, str(plan.published_snapshot_id))  # a writer may have committed since
        if snap is None:
            raise PublishConflict(f"the revert of {plan.published_snapshot_id} returned but is not on main")
        return int(snap.snapshotId())

    def release(self) -> None:
        self.staging.release_reads()

