"""Column statistics on Spark: one Puffin file of theta sketches for a snapshot, committed to the table's metadata.

The sketches are Iceberg's own (`org.apache.spark.sql.stats.ThetaSketchAgg`, one aggregate per column in one Spark
job over the snapshot; the blobs are `apache-datasketches-theta-v1` with their `ndv` estimate), what the
`compute_table_stats` procedure writes. The procedure is not called: it commits once against the table as loaded
before its Spark job, so any writer's commit during the job fails it, and a busy table would never get statistics.
Here the file is written once and its commit (`UpdateStatistics`, metadata only: no snapshot, no data file, `main`
does not move) is made against the table as it is then, again on a conflict: statistics belong to their snapshot,
so a writer's later commits do not make them wrong. A file that is not committed in the end is deleted again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Callable

from icemaint.domain.names import TableName
from icemaint.domain.statistics import THETA_BLOB, statistics_columns
from icemaint.engine.java import java_class
from icemaint.engine.retention import RetentionCommitUnknown, RetentionConflict, _commit
from icemaint.engine.spark_session import iceberg_table
from icemaint.errors import OperationalError

NDV_PROPERTY = "ndv"
_SHADED = "org.apache.iceberg.shaded.org.apache.datasketches"


class StatisticsSnapshotGone(OperationalError, RuntimeError):
    """The snapshot the statistics were computed for is no longer in the table (expired meanwhile)."""


@dataclass(frozen=True)
class StatisticsResult:
    table: str
    snapshot_id: int
    columns: tuple[str, ...]
    dry_run: bool
    ndv: dict = field(default_factory=dict)  # column -> distinct values estimated (empty in a dry run)
    path: str | None = None  # the committed statistics file (None in a dry run)
    file_size_bytes: int = 0
    attempts: int = 0  # commit attempts (a writer's commit in between makes another)
    state_was_unknown: bool = False  # the catalog could not confirm the commit; a re-read found the file


def _schema_fields(jtable, snapshot) -> list[tuple[str, bool]]:
    schema = jtable.schemas().get(snapshot.schemaId())
    return [(str(f.name()), bool(f.type().isPrimitiveType())) for f in schema.columns()]


def _sketches(spark, table_sql: str, snapshot_id: int, columns: tuple[str, ...]) -> list[bytes]:
    """One theta sketch per column over the snapshot's rows (one Spark job)."""
    from pyspark.sql import Column, functions as F

    from icemaint.engine.digest import ident

    jvm = spark._jvm
    aggregate = java_class(jvm, "org.apache.spark.sql.stats.ThetaSketchAgg")
    jcolumn = java_class(jvm, "org.apache.spark.sql.Column")
    # Over each column as one back-quoted identifier: any name Iceberg allows ("a.b", "x`y", "select"), no SQL text.
    # (ThetaSketchAgg(name) parses the name as an attribute path: "a.b" is a struct field, "x`y" a syntax error.)
    aggregates = [Column(jcolumn(aggregate(F.col(ident(name))._jc.expr(), 0, 0).toAggregateExpression()))
                  for name in columns]
    row = spark.read.option("snapshot-id", str(snapshot_id)).table(table_sql).select(*aggregates).first()
    return [bytes(value) for value in row]


def _write_puffin(spark, jtable, snapshot, columns: tuple[str, ...], sketches: list[bytes]):
    """Writes the statistics file; returns (its GenericStatisticsFile, ndv by column)."""
    jvm = spark._jvm
    schema = jtable.schemas().get(snapshot.schemaId())
    location = jtable.operations().metadataFileLocation(f"{snapshot.snapshotId()}-{uuid.uuid4()}.stats")
    output = jtable.io().newOutputFile(location)
    writer = java_class(jvm, "org.apache.iceberg.puffin.Puffin").write(output).createdBy(
        f"icemaint (Iceberg {java_class(jvm, 'org.apache.iceberg.IcebergBuild').fullVersion()}, "
        f"Spark {spark.version})").build()
    ndv = {}
    written = False
    try:
        for name, data in zip(columns, sketches):
            sketch = java_class(jvm, f"{_SHADED}.theta.CompactSketch").wrap(
                java_class(jvm, f"{_SHADED}.memory.Memory").wrap(bytearray(data)))
            ndv[name] = int(sketch.getEstimate())
            fields = java_class(jvm, "java.util.ArrayList")()
            fields.add(schema.findField(name).fieldId())
            properties = java_class(jvm, "java.util.HashMap")()
            properties.put(NDV_PROPERTY, str(ndv[name]))
            writer.add(java_class(jvm, "org.apache.iceberg.puffin.Blob")(
                THETA_BLOB, fields, snapshot.snapshotId(), snapshot.sequenceNumber(),
                java_class(jvm, "java.nio.ByteBuffer").wrap(sketch.toByteArray()),
                java_class(jvm, "org.apache.iceberg.puffin.PuffinCompressionCodec").ZSTD, properties))
        writer.finish()
        written = True
    finally:
        writer.close()
        if not written:  # a partial file nobody references
            jtable.io().deleteFile(location)
    blobs = getattr(java_class(jvm, "org.apache.iceberg.GenericBlobMetadata"), "from")(writer.writtenBlobsMetadata())
    statistics = java_class(jvm, "org.apache.iceberg.GenericStatisticsFile")(
        snapshot.snapshotId(), output.location(), writer.fileSize(), writer.footerSize(), blobs)
    return statistics, ndv


def statistics_files(jtable) -> list:
    """The table's statistics files (Java objects), as the table is loaded."""
    return list(jtable.statisticsFiles())


def _has_file(jtable, location: str) -> bool:
    return any(str(f.path()) == location for f in statistics_files(jtable))


def compute_statistics(spark, catalog: str, table: TableName, snapshot_id: int, *,
                       columns: tuple[str, ...] | None = None, dry_run: bool = False, max_attempts: int = 4,
                       before_commit: Callable[[int], None] | None = None) -> StatisticsResult:
    """Computes the statistics of `snapshot_id` (every top-level primitive column, or `columns`) and commits them.

    `before_commit(attempt)` is called right before each commit attempt (a test seam).

    Raises:
        StatisticsError: a named column is not in the snapshot's schema or not a primitive; nothing written.
        StatisticsSnapshotGone: the snapshot is not in the table (before the job, or expired before the commit);
            the file is deleted again.
        RetentionConflict: writers' commits conflicted `max_attempts` times; the file is deleted again.
        RetentionCommitUnknown: the commit's state is unknown and a re-read does not show it. The file is kept:
            the commit may still land (orphan removal reclaims the file once it is old if it never does).
    """
    jtable = iceberg_table(spark, catalog, table)
    snapshot = jtable.snapshot(int(snapshot_id))
    if snapshot is None:
        raise StatisticsSnapshotGone(f"snapshot {snapshot_id} is not in {table.key}")
    chosen = statistics_columns(_schema_fields(jtable, snapshot), columns)
    if dry_run:
        return StatisticsResult(table.key, int(snapshot_id), chosen, dry_run=True)
    sketches = _sketches(spark, table.sql(catalog), int(snapshot_id), chosen)
    statistics, ndv = _write_puffin(spark, jtable, snapshot, chosen, sketches)
    location = str(statistics.path())
    attempt = 0
    try:
        while True:
            attempt += 1
            current = iceberg_table(spark, catalog, table)  # the table as it is now: the commit lands on top of it
            if current.snapshot(int(snapshot_id)) is None:
                raise StatisticsSnapshotGone(f"snapshot {snapshot_id} of {table.key} was expired while its "
                                             "statistics were computed")
            seam = None if before_commit is None else (lambda: before_commit(attempt))
            try:
                _, unknown = _commit(lambda: current.updateStatistics().setStatistics(statistics).commit(), seam,
                                     lambda: _has_file(iceberg_table(spark, catalog, table), location),
                                     f"statistics commit of {table.key}")
            except RetentionConflict as exc:
                if attempt >= max_attempts:
                    raise RetentionConflict(f"{exc} (at each of {attempt} attempts)") from exc
                continue
            return StatisticsResult(table.key, int(snapshot_id), chosen, dry_run=False, ndv=ndv, path=location,
                                    file_size_bytes=int(statistics.fileSizeInBytes()), attempts=attempt,
                                    state_was_unknown=unknown)
    except RetentionCommitUnknown:
        raise  # the commit may still land: its file stays
    except BaseException:
        if not _may_be_referenced(spark, catalog, table, location):
            jtable.io().deleteFile(location)  # never committed: nobody can reference it
        raise


def _may_be_referenced(spark, catalog: str, table: TableName, location: str) -> bool:
    try:
        return _has_file(iceberg_table(spark, catalog, table), location)
    except Exception:  # cannot tell: keep the file (orphan removal reclaims it once old, if unreferenced)
        return True
