"""Table shapes real estates hold, built with plain Spark SQL: each is compacted with its proof and
its rows compared before and after by an independent whole-table digest.

(The beginning of the shape matrix of issue 11: partition evolution and month partitions here;
time types and edge values in test_proof_edge_values.py.)
"""

import pytest

from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.engine.validation import full_row_hash
from staged_faults import main_lineage


def compactor(config, spark):
    return Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config))


def insert_files(spark, sql, stamps, start_id=0):
    """One INSERT (so one small file) per timestamp literal."""
    for i, ts in enumerate(stamps):
        spark.sql(f"INSERT INTO {sql} VALUES ({start_id + i}, TIMESTAMP '{ts}', 'v{start_id + i}')")


def test_after_partition_evolution_a_date_is_seen_and_compacted_across_both_specs(spark, config, table_name):
    sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (days(ts))")
    insert_files(spark, sql, [f"2026-01-02 0{h}:00:00" for h in range(4)] + ["2026-01-03 01:00:00"])
    spark.sql(f"ALTER TABLE {sql} REPLACE PARTITION FIELD days(ts) WITH hours(ts)")
    insert_files(spark, sql, [f"2026-01-02 1{h}:00:00" for h in range(4)], start_id=100)

    health = CatalogReader(config).health(table_name)
    assert health.partition("2026-01-02").data_files == 8, "files of the old spec are part of their date"
    assert sum(p.data_files for p in health.partitions) == health.data_files == 9
    assert sum(p.records for p in health.partitions) == health.records
    before = full_row_hash(spark, sql, main_lineage(spark, sql)[0]["snapshot_id"])

    outcome = compactor(config, spark).run(CompactionRequest(table_name, "2026-01-02"))
    assert outcome.decision == "run" and outcome.published, outcome.reason
    # the 4 day-spec files form one bin; each hour-spec file is its own partition, left alone
    assert outcome.rewritten_files == 4 and outcome.validation.passed is True
    after = CatalogReader(config).health(table_name)
    assert after.partition("2026-01-02").data_files == 5
    assert full_row_hash(spark, sql, after.snapshot_id) == before


def test_a_month_partition_is_compacted_whole_for_any_date_inside_it(spark, config, table_name):
    sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (months(ts))")
    insert_files(spark, sql, ["2025-03-02 10:00:00", "2025-03-09 10:00:00", "2025-03-17 10:00:00",
                              "2025-03-31 23:59:59", "2025-04-01 00:00:00"])
    health = CatalogReader(config).health(table_name)
    assert [(p.date, p.data_files) for p in health.partitions] == [("2025-03-01", 4), ("2025-04-01", 1)]
    before = full_row_hash(spark, sql, health.snapshot_id)

    outcome = compactor(config, spark).run(CompactionRequest(table_name, "2025-03-17"))
    assert outcome.decision == "run" and outcome.published, outcome.reason
    assert outcome.period_key == "2025-03-01" and "keyed by its first day 2025-03-01" in outcome.reason
    assert outcome.rewritten_files == 4 and outcome.files_after == 1
    after = CatalogReader(config).health(table_name)
    assert [(p.date, p.data_files) for p in after.partitions] == [("2025-03-01", 1), ("2025-04-01", 1)]
    assert full_row_hash(spark, sql, after.snapshot_id) == before


@pytest.mark.parametrize("column_type, literal", [("DATE", "DATE '{d}'"), ("TIMESTAMP_NTZ", "TIMESTAMP_NTZ '{d} 05:00:00'")])
def test_identity_date_and_zone_less_timestamp_columns(spark, config, table_name, column_type, literal):
    sql = TableName.parse(table_name).sql(config.catalog.name)
    part = "d" if column_type == "DATE" else "days(d)"
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, d {column_type}) USING iceberg PARTITIONED BY ({part})")
    for i in range(4):
        spark.sql(f"INSERT INTO {sql} VALUES ({i}, {literal.format(d='2026-01-02')})")
    before = full_row_hash(spark, sql, main_lineage(spark, sql)[0]["snapshot_id"])
    outcome = compactor(config, spark).run(CompactionRequest(table_name, "2026-01-02"))
    assert outcome.decision == "run" and outcome.published and outcome.files_after == 1, outcome.reason
    assert full_row_hash(spark, sql, main_lineage(spark, sql)[0]["snapshot_id"]) == before


def test_a_file_spanning_two_dates_is_rewritten_whole_with_every_row_group(spark, lake_root, table_name):
    """A table dated by its time column's bounds (no time partition): a file written across midnight is a
    candidate of its first date and is replaced whole, so all of it must be read, the row groups of the next
    date included. Planned with the date's residual, Iceberg's Parquet reader skipped those row groups: the
    proof read the same tasks and passed, and the publish dropped their rows."""
    from conftest import make_config

    config = make_config(lake_root, tables={table_name: {"time_column": "ts"}})
    sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg "
              "TBLPROPERTIES ('write.parquet.row-group-size-bytes'='4096', 'write.distribution-mode'='none')")
    # one file of 4,000 rows in time order, 2,000 on 2026-01-02 and 2,000 on 2026-01-03: many row groups
    spark.range(0, 4000, 1, 1).selectExpr(
        "id", "timestamp_seconds(1767312000 + id * 43) AS ts", "sha2(CAST(id AS STRING), 256) AS v") \
        .sortWithinPartitions("ts").writeTo(sql).append()
    insert_files(spark, sql, [f"2026-01-02 0{h}:00:00" for h in range(3)], start_id=10_000)
    reader = CatalogReader(config)
    health = reader.health(table_name)
    assert health.partition("2026-01-02").data_files == 4, [(p.date, p.data_files) for p in health.partitions]

    outcome = compactor(config, spark).run(CompactionRequest(table_name, "2026-01-02"))

    assert outcome.decision == "run" and outcome.published, outcome.reason
    ids = sorted(reader.load(table_name).scan().to_arrow().column("id").to_pylist())  # pyiceberg, not Spark
    assert ids == list(range(4000)) + [10_000, 10_001, 10_002]
