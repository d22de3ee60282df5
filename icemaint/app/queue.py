"""The run queue's one-run-per-table rule, for every run however it was launched.

The instance limits maintenance runs to one per table on the `icemaint/table` run tag. Sensors, the
CLI and the tick set it; runs Dagster creates itself (UI materializations, partition backfills) carry
only Dagster's partition tags: `dagster/partition/table` for table x date runs, for runs of a
table-partitioned asset only `dagster/partition`, and for a batched backfill run only its range
(`dagster/asset_partition_range_start`), which no per-table limit on the other tags covers.
This coordinator adds `icemaint/table` to each run from its partition when it is enqueued, so a
retention run and a backfill of the same table wait for each other in the queue.
"""

from __future__ import annotations

from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator

from maint_assets.partitions import TABLE_TAG, table_of


class TableTaggingRunCoordinator(QueuedRunCoordinator):
    """Dagster's queued run coordinator, with `icemaint/table` set on every run that maintains a table."""

    def submit_run(self, context):
        run = context.dagster_run
        if not run.tags.get(TABLE_TAG):
            table = table_of(run.tags)
            if table:
                self._instance.add_run_tags(run.run_id, {TABLE_TAG: table})
        return super().submit_run(context)
