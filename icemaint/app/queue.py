"""The run queue's one-run-per-table rule, for every run however it was launched.

The instance limits maintenance runs to one per table: on the `icemaint/table` run tag, and on the slot tags
(`maint_assets.partitions.slot_tags`), which also keep a run over several tables apart from every other run
of one of them. Sensors, the CLI and the tick set both; runs Dagster creates itself (UI materializations,
partition backfills) carry only Dagster's partition tags: `dagster/partition/table` for table x date runs,
for runs of a table-partitioned asset only `dagster/partition`, and for a batched backfill run only its range
(`dagster/asset_partition_range_start` / `_end`, of `<date>|<table>` keys or of table keys), which no per-table
limit on the other tags covers.
This coordinator adds the tags from a run's partition or range when it is enqueued, so a retention run and a
backfill of the same table wait for each other in the queue.

The limits themselves (one per table tag and per slot: 1,026) come from this coordinator's code, not from
dagster.yaml: written there, they made a 100 KB file that every process opening the instance (the CLI, each
run worker, the daemon, the webserver) parsed with PyYAML's pure-Python loader, 0.55 s of a 2.3 s
`icemaint health`. dagster.yaml's `concurrency.runs` keeps `max_concurrent_runs`; without its own
`tag_concurrency_limits`, Dagster takes the run coordinator's.
"""

from __future__ import annotations

from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator
from icemaint.app.migration_scripts import pin_migration_scripts

from maint_assets.partitions import (
    PARTITION_TABLE_TAG, RANGE_START_TAG, SLOT_TAG_PREFIX, TABLE_DIMENSION, TABLE_SLOTS, TABLE_TAG, TABLES_TAG,
    range_tables, slot_tag, slot_tags, table_of, tables_of,
)


def table_limits() -> list[dict]:
    """One run at a time per value of each per-table tag: `icemaint/table`, Dagster's `dagster/partition/table`,
    and every slot tag."""
    return [{"key": key, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
            for key in (TABLE_TAG, PARTITION_TABLE_TAG, *(slot_tag(slot) for slot in range(TABLE_SLOTS)))]


def queue_tags(tags, order) -> dict[str, str]:
    """The tags a run with `tags` lacks for the queue's per-table limits (`order`: a callable giving the `table`
    partitions' order, read only for a range over several tables)."""
    if any(key.startswith(SLOT_TAG_PREFIX) for key in tags):
        return {}
    tables = tables_of(tags)
    added: dict[str, str] = {}
    if not tags.get(TABLES_TAG):
        spanned = range_tables(tags, order()) if tags.get(RANGE_START_TAG) else ()
        if len(spanned) > 1:  # a range over several tables (Dagster's UI, a backfill): name them all
            tables = spanned
            added[TABLES_TAG] = ",".join(spanned)
        elif not tags.get(TABLE_TAG) and table_of(tags):
            added[TABLE_TAG] = table_of(tags)
    return {**added, **slot_tags(tables, strict=False)}


class TableTaggingRunCoordinator(QueuedRunCoordinator):
    """Dagster's queued run coordinator, with the per-table tags set on every run that maintains a table and
    the per-table limits on them (after any the coordinator's own config names)."""

    def __init__(self, *args, tag_concurrency_limits=None, **kwargs):
        # Every process of the instance builds its coordinator (the daemon's and the UI's, which open each run's
        # SQLite event log too): from here on, no run leaves alembic's exit stacks behind in them either.
        pin_migration_scripts()
        super().__init__(*args, tag_concurrency_limits=[*(tag_concurrency_limits or ()), *table_limits()], **kwargs)

    def submit_run(self, context):
        run = context.dagster_run
        added = queue_tags(run.tags, lambda: self._instance.get_dynamic_partitions(TABLE_DIMENSION))
        if added:
            self._instance.add_run_tags(run.run_id, added)
        return super().submit_run(context)
