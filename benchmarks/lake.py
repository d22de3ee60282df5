"""Seeded small-file Iceberg tables for the benchmarks: the simulator's table shape, written fast.

One date holds many small files written in a few commits (one Spark task per file, distribution
mode `none`), rather than the thousands of commits a streaming writer would need for the same
layout. Every column is a hash of the row id, so two tables built from the same layout hold the
same rows in the same files.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from icemaint.domain.names import TableName
from icemaint.app.simulator import COLUMNS, PARTITIONING, TABLE_PROPERTIES

from benchmarks.measure import Stopwatch

# The neighbouring days' rows start here, far above any target-date id.
NEIGHBOUR_ID_BASE = 10**12


@dataclass(frozen=True)
class SmallFileLayout:
    """How many small files a table's target date holds and how they were committed.

    Attributes:
        files: Data files on the target date.
        rows_per_file: Rows in each of them.
        commits: Appends the target date's files are spread over.
        date: The target date (the one compacted and probed).
        neighbour_files: Files on each of the two neighbouring days (one more append), so that
            the date's where clause and the probe's filter have partitions to prune.
        seed: Seeds every column's hash.
    """

    files: int
    rows_per_file: int
    commits: int
    date: dt.date
    neighbour_files: int = 4
    seed: int = 42

    def __post_init__(self) -> None:
        if self.files < 2 or self.rows_per_file < 1 or not 1 <= self.commits <= self.files:
            raise ValueError(f"bad layout {self}: need files >= 2, rows_per_file >= 1, 1 <= commits <= files")

    @property
    def rows(self) -> int:
        return self.files * self.rows_per_file


def rows_sql(seed: int) -> list[str]:
    """The projection turning `id` into the simulator's columns (deterministic, partitioning-proof)."""
    return [
        "id AS event_id",
        f"CAST(pmod(xxhash64(id, {seed}), 1000) AS INT) AS device_id",
        # `day_start`: the row's day start in microseconds (see day_rows)
        f"timestamp_micros(day_start + pmod(xxhash64(id, {seed + 1}), 86400000000)) AS ts",
        f"CAST(pmod(xxhash64(id, {seed + 2}), 10000000) AS DOUBLE) / 100 AS reading",
        f"element_at(array('ok', 'ok', 'ok', 'ok', 'warn', 'error'), "
        f"CAST(pmod(xxhash64(id, {seed + 3}), 6) AS INT) + 1) AS status",
    ]


def _day_start_micros(date: dt.date) -> int:
    return int(dt.datetime.combine(date, dt.time(), dt.timezone.utc).timestamp()) * 1_000_000


def day_rows(spark, start: int, end: int, tasks: int, date: dt.date, seed: int):
    """A DataFrame of the rows with ids [start, end) on `date`, in `tasks` Spark partitions."""
    return (spark.range(start, end, 1, tasks)
            .selectExpr("id", f"CAST({_day_start_micros(date)} AS BIGINT) AS day_start")
            .selectExpr(*rows_sql(seed)))


def create_table(spark, catalog: str, table: TableName, properties: dict[str, str] | None = None) -> None:
    """(Re)create `table` with the simulator's columns and day partitioning."""
    namespace = ".".join(f"`{p}`" for p in (catalog, *table.namespace))
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
    spark.sql(f"DROP TABLE IF EXISTS {table.sql(catalog)}")
    columns = ", ".join(f"{col} {typ.upper()}" for col, typ in COLUMNS)
    props = {**TABLE_PROPERTIES, **(properties or {})}
    props_sql = ", ".join(f"'{k}'='{v}'" for k, v in sorted(props.items()))
    spark.sql(f"CREATE TABLE {table.sql(catalog)} ({columns}) USING iceberg "
              f"PARTITIONED BY ({PARTITIONING}) TBLPROPERTIES ({props_sql})")


def build_small_file_table(spark, catalog: str, table: TableName, layout: SmallFileLayout) -> dict:
    """Creates `table` and writes the layout; returns what was written and how long it took.

    Returns:
        {"seconds", "commits", "date_files", "date_rows", "date_bytes", "table_files", "snapshot_id"}.
    """
    with Stopwatch() as sw:
        # distribution none: each task writes its rows straight to its own file (one per task)
        create_table(spark, catalog, table, {"write.distribution-mode": "none"})
        table_sql = table.sql(catalog)
        per_commit, extra = divmod(layout.files, layout.commits)
        start = 0
        for c in range(layout.commits):
            files = per_commit + (1 if c < extra else 0)
            end = start + files * layout.rows_per_file
            day_rows(spark, start, end, files, layout.date, layout.seed).writeTo(table_sql).append()
            start = end
        if layout.neighbour_files:
            n = layout.neighbour_files
            size = n * layout.rows_per_file
            before = day_rows(spark, NEIGHBOUR_ID_BASE, NEIGHBOUR_ID_BASE + size, n,
                              layout.date - dt.timedelta(days=1), layout.seed)
            after = day_rows(spark, NEIGHBOUR_ID_BASE + size, NEIGHBOUR_ID_BASE + 2 * size, n,
                             layout.date + dt.timedelta(days=1), layout.seed)
            before.union(after).writeTo(table_sql).append()
    stats = date_file_stats(spark, catalog, table, layout.date)
    return {"seconds": round(sw.seconds, 3), "commits": layout.commits + (1 if layout.neighbour_files else 0),
            **stats, "snapshot_id": current_snapshot_id(spark, catalog, table)}


def current_snapshot_id(spark, catalog: str, table: TableName) -> int:
    """The snapshot the table's `main` branch points at."""
    row = spark.sql(f"SELECT snapshot_id FROM {table.sql(catalog)}.refs WHERE name = 'main'").first()
    return int(row["snapshot_id"])


def date_file_stats(spark, catalog: str, table: TableName, date: dt.date) -> dict:
    """Live data files, rows and bytes on `date`, and live files in the whole table (current snapshot)."""
    row = spark.sql(
        f"SELECT count_if(partition.ts_day = DATE '{date.isoformat()}') AS date_files, "
        f"sum(IF(partition.ts_day = DATE '{date.isoformat()}', record_count, 0)) AS date_rows, "
        f"sum(IF(partition.ts_day = DATE '{date.isoformat()}', file_size_in_bytes, 0)) AS date_bytes, "
        f"count(*) AS table_files FROM {table.sql(catalog)}.files WHERE content = 0").first()
    return {k: int(row[k] or 0) for k in ("date_files", "date_rows", "date_bytes", "table_files")}


def date_data_file_paths(spark, catalog: str, table: TableName, date: dt.date) -> list[str]:
    """Paths of the date's live data files in the current snapshot, as local paths."""
    rows = spark.sql(f"SELECT file_path FROM {table.sql(catalog)}.files "
                     f"WHERE content = 0 AND partition.ts_day = DATE '{date.isoformat()}'").collect()
    return sorted(r["file_path"].removeprefix("file:") for r in rows)


def rollback(spark, catalog: str, table: TableName, snapshot_id: int) -> None:
    """Sets the table back to `snapshot_id` so the next repetition starts from the same files."""
    spark.sql(f"CALL `{catalog}`.system.rollback_to_snapshot({table.procedure_arg()}, {int(snapshot_id)})")
    spark.sql(f"REFRESH TABLE {table.sql(catalog)}")
