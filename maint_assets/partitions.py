"""Partitions and run tags, defined once: `table` (dynamic, filled by the discovery sensor), `date`
(daily), the partition key format, and the tags every maintenance run carries however it is launched.
"""


import datetime as dt
import zlib
from collections.abc import Iterable, Sequence

import dagster as dg

from icemaint.domain.verdicts import AGENT_TRIGGER

TABLE_DIMENSION = "table"
DATE_DIMENSION = "date"

# Run tags. The run queue limits one maintenance run per table on TABLE_TAG and on Dagster's own
# partition tag (backfills set only the latter); sensors and the CLI set TABLE_TAG.
TABLE_TAG = "icemaint/table"
# A run over one date of several tables (the tick's catch-up batches) names them all, comma-separated.
TABLES_TAG = "icemaint/tables"
# A run tag holds one value, so TABLE_TAG cannot keep a run over several tables apart from another run of one
# of them. Every maintenance run also carries one slot tag per table it maintains: key SLOT_TAG_PREFIX + the
# table's slot (a stable hash of its name, `table_slot`), value the table. The queue limits each slot key to
# one run per value, so two runs that share a table never run together, whichever tables they hold besides;
# tables of one run must have different slots (`tick.table_batches` cuts its batches there). 1,024 slots: with
# 256, batches of up to 31 arbitrarily named tables were cut at 19 tables on average (530 runs for 10,000 tables,
# against 382 with 1,024); each slot is one entry of the queue's limits, which every process that opens the
# instance parses with Dagster's pure-Python YAML loader: dagster.yaml ~100 KB, 0.156 s (0.037 s with 256 slots).
# Plumbing tags carry Dagster's hidden prefix: the UI lists a run's other tags, not these (Dagster 1.13 hides keys
# starting `.dagster/`, `dagster._core.storage.tags.HIDDEN_TAG_PREFIX`); the queue and our code read them as before.
HIDDEN_TAG_PREFIX = ".dagster/"
SLOT_TAG_PREFIX = f"{HIDDEN_TAG_PREFIX}icemaint/slot/"
TABLE_SLOTS = 1024
PARTITION_TABLE_TAG = f"dagster/partition/{TABLE_DIMENSION}"
TRIGGER_TAG = "icemaint/trigger"
# The agent an `agent`-triggered run was requested by (`icemaint mcp`): the run's identity under the policy.
AGENT_TAG = "icemaint/agent"
# The reason the agent gave for the request that launched the run: on every audit record of the run.
AGENT_REASON_TAG = "icemaint/agent_reason"
PLANNED_SNAPSHOT_TAG = f"{HIDDEN_TAG_PREFIX}icemaint/planned_snapshot_id"
PLANNED_SCHEMA_TAG = f"{HIDDEN_TAG_PREFIX}icemaint/planned_schema_id"
PARTITION_TAG = "dagster/partition"
# A batched backfill run (several dates of one table) names its range instead of a partition.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"

table_partitions = dg.DynamicPartitionsDefinition(name=TABLE_DIMENSION)


def run_identity(tags) -> str | None:
    """Who a run runs as when not the process's identity: the agent an agent-triggered run names (`icemaint mcp`
    sets both tags). A run that names an agent without the agent trigger is a person's, as before."""
    return tags.get(AGENT_TAG) if tags.get(TRIGGER_TAG) == AGENT_TRIGGER else None


def run_agent_reason(tags) -> str | None:
    """The reason an agent gave for the request that launched an agent-triggered run (None for other runs)."""
    return tags.get(AGENT_REASON_TAG) if run_identity(tags) is not None else None


def date_partitions(start: dt.date) -> dg.DailyPartitionsDefinition:
    # end_offset=1 makes today a partition too: streaming tables write into it (hot-partition
    # policy keeps maintenance off it until it cools down).
    return dg.DailyPartitionsDefinition(start_date=start.isoformat(), timezone="UTC", end_offset=1)


def table_date_partitions(start: dt.date) -> dg.MultiPartitionsDefinition:
    """`table` x `date`; a key string is "<date>|<table>" (dimensions sorted by name)."""
    return dg.MultiPartitionsDefinition({DATE_DIMENSION: date_partitions(start), TABLE_DIMENSION: table_partitions})


def table_date_key(table: str, date: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({DATE_DIMENSION: date, TABLE_DIMENSION: table})


def date_range_tags(table: str, first: str, last: str) -> dict[str, str]:
    """The run tags of one run over consecutive dates `first`..`last` of `table` (Dagster's partition range)."""
    return {RANGE_START_TAG: str(table_date_key(table, first)), RANGE_END_TAG: str(table_date_key(table, last))}


def table_range_tags(tables: list[str], first: str, last: str) -> dict[str, str]:
    """The run tags of one run over the dates `first`..`last` of `tables`, neighbours in the `table` partitions'
    order (Dagster's partition range covers every table between the first and the last, each of those dates)."""
    return {TABLES_TAG: ",".join(tables), RANGE_START_TAG: str(table_date_key(tables[0], first)),
            RANGE_END_TAG: str(table_date_key(tables[-1], last))}


def table_slot(table: str) -> int:
    """The table's queue slot (0 .. TABLE_SLOTS - 1): the same in every process and release (CRC-32 of its name)."""
    return zlib.crc32(table.encode("utf-8")) % TABLE_SLOTS


def slot_tag(slot: int) -> str:
    return f"{SLOT_TAG_PREFIX}{slot:04d}"


def slot_tags(tables: Iterable[str], strict: bool = True) -> dict[str, str]:
    """The queue's slot tags of a run over `tables` (see SLOT_TAG_PREFIX). Not `strict` (a range of tables
    Dagster's UI made): of tables that share a slot the first keeps it.

    Raises:
        ValueError: `strict` and two of the tables share a slot, so one run cannot carry both.
    """
    tags: dict[str, str] = {}
    for table in tables:
        key = slot_tag(table_slot(table))
        if tags.get(key, table) != table:
            if strict:
                raise ValueError(f"tables {tags[key]} and {table} share queue slot {table_slot(table)}: "
                                 "one run cannot hold both")
            continue
        tags[key] = table
    return tags


def range_tables(tags, order: Sequence[str]) -> tuple[str, ...]:
    """The tables of a run over a range (Dagster's range tags) of `table` x `date` keys (`<date>|<table>`) or of
    `table` keys (a backfill of a table-partitioned asset: retention, statistics, health), every table from the
    range's first to its last in `order` (the `table` partitions' order); () when the run has no such range."""
    start, end = tags.get(RANGE_START_TAG, ""), tags.get(RANGE_END_TAG, "")
    if not start or not end or ("|" in start) != ("|" in end):
        return ()
    first, last = (start.split("|", 1)[1], end.split("|", 1)[1]) if "|" in start else (start, end)
    if first == last:
        return (first,) if "|" in start or first in order else ()
    position = {table: i for i, table in enumerate(order)}
    if first not in position or last not in position or position[first] > position[last]:
        return ()
    return tuple(order[position[first]:position[last] + 1])


def tables_range_tags(tables: list[str]) -> dict[str, str]:
    """The run tags of one run of a table-partitioned asset over `tables`, neighbours in the `table` partitions'
    order (Dagster's range over the `table` partitions: every table from the first to the last)."""
    return {TABLES_TAG: ",".join(tables), RANGE_START_TAG: tables[0], RANGE_END_TAG: tables[-1]}


def split_table_date(partition_key) -> tuple[str, str]:
    """(table, date) of a `table` x `date` partition key (a MultiPartitionKey or its string)."""
    if isinstance(partition_key, dg.MultiPartitionKey):
        keys = partition_key.keys_by_dimension
        return keys[TABLE_DIMENSION], keys[DATE_DIMENSION]
    date, table = str(partition_key).split("|", 1)
    return table, date


def tables_of(tags) -> tuple[str, ...]:
    """The tables a run maintains: every table of a run over several (`TABLES_TAG`), else `table_of`'s one."""
    if tags.get(TABLES_TAG):
        return tuple(t for t in tags[TABLES_TAG].split(",") if t)
    table = table_of(tags)
    return (table,) if table else ()


def table_of(tags) -> str | None:
    """The table a run maintains, from its tags (ours, or the partition or range Dagster set); None when
    it names none (a run over several tables names them in `TABLES_TAG`: see `tables_of`)."""
    from icemaint.domain.names import InvalidTableName, TableName

    if tags.get(TABLES_TAG):
        return None
    if tags.get(TABLE_TAG):
        return tags[TABLE_TAG]
    candidate = tags.get(PARTITION_TABLE_TAG) or tags.get(PARTITION_TAG) or tags.get(RANGE_START_TAG, "")
    candidate = candidate.split("|", 1)[1] if "|" in candidate else candidate  # "<date>|<table>"
    try:
        return TableName.parse(candidate).key if candidate else None
    except InvalidTableName:
        return None
