"""Health parity: pyiceberg health numbers equal an independent Spark aggregate over Iceberg's own
metadata tables (`.files`, `.manifests`, `.snapshots`) at the same snapshot, before and after maintenance."""

from __future__ import annotations

import datetime as dt
import uuid
from types import SimpleNamespace

import pytest

from conftest import current_snapshot, write_config
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.app.simulator import StreamingWriter, WorkloadSpec

DATE = "2026-01-02"


@pytest.fixture(scope="module")
def estate(spark, lake_root, tmp_path_factory):
    """A simulated day-partitioned table with merge-on-read deletes, and a config whose small-file size
    sits between the table's file sizes (so `small_files` is neither 0 nor every file)."""
    root = tmp_path_factory.mktemp("health")
    table = f"health_{uuid.uuid4().hex[:8]}.events"
    writer = StreamingWriter(spark, "lake", WorkloadSpec(table=table, days=3, rows_per_day=12, delete_every=2,
                                                          deletes_per_batch=4, seed=11))
    writer.create_table()
    writer.run(4)
    sql = TableName.parse(table).sql("lake")
    sizes = sorted({r[0] for r in spark.sql(f"SELECT file_size_in_bytes FROM {sql}.files WHERE content = 0").collect()})
    assert len(sizes) > 1, f"the simulated files all have one size {sizes}; the small-file test needs spread"
    threshold = sizes[len(sizes) // 2]
    path = write_config(root / "maintenance.yaml", lake_root, state_dir=str(root / "state"),
                        tables={table: {"small_file_size_bytes": threshold}})
    # compaction runs under the estate's default policy (every file here is below its 1 MiB small size)
    compact_path = write_config(root / "compact.yaml", lake_root, state_dir=str(root / "state"))
    return SimpleNamespace(table=table, sql=sql, writer=writer, config=load_config(path), threshold=threshold,
                           compact_config=load_config(compact_path))


def spark_truth(spark, sql: str, snapshot_id: int, small_below: int) -> dict:
    """The health numbers, computed by Spark from Iceberg's metadata tables at `snapshot_id`."""
    at = f"VERSION AS OF {int(snapshot_id)}"
    files = spark.sql(f"""
        SELECT count_if(content = 0) AS data_files,
               count_if(content = 0 AND file_size_in_bytes < {int(small_below)}) AS small_files,
               coalesce(sum(CASE WHEN content = 0 THEN file_size_in_bytes END), 0) AS total_bytes,
               coalesce(sum(CASE WHEN content = 0 THEN record_count END), 0) AS records,
               count_if(content <> 0) AS delete_files,
               coalesce(sum(CASE WHEN content <> 0 THEN record_count END), 0) AS delete_records
        FROM {sql}.files {at}""").collect()[0].asDict()
    per_date = {
        r["date"]: r.asDict() for r in spark.sql(f"""
            SELECT CAST(partition.ts_day AS STRING) AS date,
                   count_if(content = 0) AS data_files,
                   count_if(content = 0 AND file_size_in_bytes < {int(small_below)}) AS small_files,
                   coalesce(sum(CASE WHEN content = 0 THEN file_size_in_bytes END), 0) AS total_bytes,
                   count_if(content <> 0) AS delete_files,
                   coalesce(sum(CASE WHEN content <> 0 THEN record_count END), 0) AS delete_records
            FROM {sql}.files {at} GROUP BY partition.ts_day""").collect()}
    manifests = spark.sql(f"SELECT count(*) AS n, coalesce(sum(length), 0) AS bytes FROM {sql}.manifests {at}").collect()[0]
    # writer activity and the last commit are read from main's lineage only (a staging branch's
    # append is neither); the snapshot count is every snapshot the metadata keeps
    snapshots = spark.sql(f"""
        SELECT count(*) AS n,
               max(CASE WHEN h.is_current_ancestor AND operation <> 'replace'
                        THEN unix_millis(s.committed_at) END) AS writer_ms,
               max_by(CASE WHEN h.is_current_ancestor THEN operation END,
                      CASE WHEN h.is_current_ancestor THEN s.committed_at END) AS last_operation
        FROM {sql}.snapshots s LEFT JOIN {sql}.history h ON s.snapshot_id = h.snapshot_id""").collect()[0]
    return {**files, "per_date": per_date, "manifests": manifests["n"], "manifest_bytes": manifests["bytes"],
            "snapshots": snapshots["n"], "writer_ms": snapshots["writer_ms"],
            "last_operation": snapshots["last_operation"]}


def assert_parity(health, truth: dict) -> None:
    for key in ("data_files", "small_files", "total_bytes", "records", "delete_files", "delete_records",
                "manifests", "manifest_bytes", "snapshots"):
        assert getattr(health, key) == truth[key], f"{key}: health {getattr(health, key)} != Spark {truth[key]}"
    got = {p.date: {"data_files": p.data_files, "small_files": p.small_files, "total_bytes": p.total_bytes,
                    "delete_files": p.delete_files, "delete_records": p.delete_records} for p in health.partitions}
    want = {d: {k: v for k, v in row.items() if k != "date"} for d, row in truth["per_date"].items()}
    assert got == want


def test_health_equals_spark_metadata_aggregate_on_a_table_with_deletes(spark, estate):
    health = CatalogReader(estate.config).health(estate.table)
    assert health.snapshot_id == current_snapshot(spark, estate.sql)
    truth = spark_truth(spark, estate.sql, health.snapshot_id, estate.threshold)
    # the table exercises every number: deletes, small and not-small files, several dates and manifests
    assert truth["delete_files"] > 0 and truth["delete_records"] > 0
    assert 0 < truth["small_files"] < truth["data_files"]
    assert len(truth["per_date"]) == 3 and truth["manifests"] > 1
    assert health.small_file_size_bytes == estate.threshold
    assert_parity(health, truth)
    assert (health.time_column, health.time_transform, health.time_column_type) == ("ts", "day", "timestamptz")
    assert health.last_commit_by == "writer"
    assert health.last_commit_operation == truth["last_operation"]


def test_health_after_compaction_then_after_an_append(spark, estate):
    config = estate.config
    reader = CatalogReader(config)
    before = reader.health(estate.table)
    compact = estate.compact_config
    outcome = Compactor(compact, spark, CatalogReader(compact), open_claims(compact), open_audit(compact)).run(
        CompactionRequest(estate.table, DATE))
    assert outcome.decision == "run" and outcome.validation.passed is True, outcome.reason

    now = dt.datetime.now(dt.timezone.utc)
    after = reader.health(estate.table, now=now)
    assert after.snapshot_id == outcome.after_snapshot_id == current_snapshot(spark, estate.sql)
    truth = spark_truth(spark, estate.sql, after.snapshot_id, estate.threshold)
    assert_parity(after, truth)
    assert after.last_commit_by == "maintenance" and truth["last_operation"] == "replace"
    compacted = after.partition(DATE)
    assert compacted.data_files < before.partition(DATE).data_files and compacted.delete_files == 0
    assert after.snapshots > before.snapshots
    # the rewrite is not writer activity: idle time still counts from the last writer commit
    assert after.seconds_since_writer_commit == pytest.approx(now.timestamp() - truth["writer_ms"] / 1000, abs=1e-3)
    assert after.last_writer_commit_at == before.last_writer_commit_at

    estate.writer.write_batch()
    now = dt.datetime.now(dt.timezone.utc)
    appended = reader.health(estate.table, now=now)
    truth = spark_truth(spark, estate.sql, appended.snapshot_id, estate.threshold)
    assert_parity(appended, truth)
    assert appended.last_commit_by == "writer" and appended.last_commit_operation == "append"
    assert appended.seconds_since_writer_commit == pytest.approx(now.timestamp() - truth["writer_ms"] / 1000, abs=1e-3)
    assert 0 <= appended.seconds_since_writer_commit < after.seconds_since_writer_commit + 1
    assert appended.last_writer_commit_at > after.last_writer_commit_at
