"""The run queue's one-run-per-table rule, for every run however it was launched.

The instance limits maintenance runs to one per table on the `icemaint/table` run tag. Sensors, the
CLI and the tick set it; runs Dagster creates itself (UI materializations, partition backfills) carry
only Dagster's partition tags: `dagster/partition/table` for table x date runs, and for runs of a
table-partitioned asset only `dagster/partition`, which no per-table limit on the other tags covers.
This coordinator adds `icemaint/table` to each run from its partition when it is enqueued, so a
retention run and a backfill of the same table wait for each other in the queue.
"""

from __future__ import annotations

from typing import Mapping

from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator

from icemaint.domain.names import InvalidTableName, TableName
from maint_assets.partitions import PARTITION_TABLE_TAG, TABLE_TAG

PARTITION_TAG = "dagster/partition"


def table_of(tags: Mapping[str, str]) -> str | None:
    """The table a run maintains, from its tags; None when it names none (not a maintenance run)."""
    if tags.get(TABLE_TAG):
        return tags[TABLE_TAG]
    candidate = tags.get(PARTITION_TABLE_TAG) or tags.get(PARTITION_TAG, "")
    candidate = candidate.split("|", 1)[1] if "|" in candidate else candidate  # "<date>|<table>"
    try:
        return TableName.parse(candidate).key if candidate else None
    except InvalidTableName:
        return None


class TableTaggingRunCoordinator(QueuedRunCoordinator):
    """Dagster's queued run coordinator, with `icemaint/table` set on every run that maintains a table."""

    def submit_run(self, context):
        run = context.dagster_run
        if not run.tags.get(TABLE_TAG):
            table = table_of(run.tags)
            if table:
                self._instance.add_run_tags(run.run_id, {TABLE_TAG: table})
        return super().submit_run(context)
