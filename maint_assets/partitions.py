"""Partitions, defined once: `table` (dynamic, filled by the discovery sensor) and `date` (daily)."""


import datetime as dt

import dagster as dg

TABLE_DIMENSION = "table"
DATE_DIMENSION = "date"

table_partitions = dg.DynamicPartitionsDefinition(name=TABLE_DIMENSION)


def date_partitions(start: dt.date) -> dg.DailyPartitionsDefinition:
    # end_offset=1 makes today a partition too: streaming tables write into it (hot-partition
    # policy keeps maintenance off it until it cools down).
    return dg.DailyPartitionsDefinition(start_date=start.isoformat(), timezone="UTC", end_offset=1)


def table_date_partitions(start: dt.date) -> dg.MultiPartitionsDefinition:
    """`table` x `date`; a key string is "<date>|<table>" (dimensions sorted by name)."""
    return dg.MultiPartitionsDefinition({DATE_DIMENSION: date_partitions(start), TABLE_DIMENSION: table_partitions})


def table_date_key(table: str, date: str) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({DATE_DIMENSION: date, TABLE_DIMENSION: table})


def split_table_date(partition_key) -> tuple[str, str]:
    """(table, date) of a `table` x `date` partition key (a MultiPartitionKey or its string)."""
    if isinstance(partition_key, dg.MultiPartitionKey):
        keys = partition_key.keys_by_dimension
        return keys[TABLE_DIMENSION], keys[DATE_DIMENSION]
    date, table = str(partition_key).split("|", 1)
    return table, date
