"""Removes a table's metadata.json files that dropped out of its metadata log (`domain.metadata_files` decides
which): a listing of the metadata directory and a delete per file, through the table's own FileIO or Hadoop's
FileSystem (`engine.files.Files`). No table commit: the table's metadata location does not move."""

from __future__ import annotations

import datetime as dt
import posixpath
from dataclasses import dataclass

from icemaint.domain.metadata_files import ListedFile, MetadataCleanupPlan, stale_metadata_files
from icemaint.domain.names import TableName
from icemaint.engine.files import Files
from icemaint.engine.spark_session import iceberg_table


@dataclass(frozen=True)
class MetadataCleanup:
    plan: MetadataCleanupPlan
    removed: tuple[str, ...]  # what was deleted (empty in a dry run)
    missing: int              # planned but already gone (a writer's delete-after-commit got there first)

    def to_dict(self) -> dict:
        return {"metadata_files_removed": len(self.removed), "metadata_bytes_removed": self.removed_bytes,
                "metadata_files_planned": len(self.plan.remove), "metadata_bytes_planned": self.plan.remove_bytes,
                "metadata_files_in_log": self.plan.kept_listed, "metadata_files_kept_young": self.plan.kept_young,
                "metadata_files_kept_other": self.plan.kept_unversioned, "metadata_files_already_gone": self.missing}

    @property
    def removed_bytes(self) -> int:
        sizes = {f.location: f.size for f in self.plan.remove}
        return sum(sizes.get(location, 0) for location in self.removed)


def remove_old_metadata_files(spark, catalog: str, table: TableName, current_location: str, log_locations: list[str],
                              *, now: dt.datetime, dry_run: bool = False) -> MetadataCleanup:
    """Lists the directory of `current_location` and deletes the metadata.json files older than the table's log.

    `current_location` and `log_locations` come from one read of the table's metadata (pyiceberg): a commit after
    that read only raises the log's oldest version, so what this removes is below it in any newer state too.
    """
    files = Files(spark, catalog, table_io=iceberg_table(spark, catalog, table).io())
    directory = posixpath.dirname(current_location.rstrip("/"))
    listed = [ListedFile(f.location, f.size, f.modified_ms) for f in files.list(directory)]
    plan = stale_metadata_files(listed, current_location, log_locations, int(now.timestamp() * 1000))
    if dry_run:
        return MetadataCleanup(plan, (), 0)
    removed, missing = [], 0
    for f in plan.remove:
        if files.delete(f.location):
            removed.append(f.location)
        else:
            missing += 1
    return MetadataCleanup(plan, tuple(removed), missing)
