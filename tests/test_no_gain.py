"""A rewrite that gains nothing is not published.

Two files of ~60% of the target on one date are due (2 small files >= min_input_files 2), but Iceberg's
writer rolls at the target, so their rewrite is two files again: publishing it would leave the date as due
as before and every tick would rewrite it once more (an endless `tick --until-idle`). The run says
"nothing gained", main is unchanged, and the rows are the written ones (read by pyiceberg).

A rewrite that applies deletes gains even when one file becomes one: it is published, and the date's
position-delete file leaves the live table.
"""

from __future__ import annotations

from icemaint.domain.names import TableName
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest

from conftest import current_snapshot, make_config
from test_staged_publish import compactor

DATE = "2026-02-01"


def test_a_rewrite_that_writes_as_many_files_is_not_published(spark, lake_root, table_name):
    config = make_config(lake_root, defaults={"writer_idle": "0s", "hot_partition_age": "0s", "min_input_files": 2,
                                              "small_file_size_bytes": "64KiB", "target_file_size_bytes": "64KiB",
                                              "retry_backoff": "0s", "claim_wait": "0s"})
    name = TableName.parse(table_name)
    table_sql = name.sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (id BIGINT, v DOUBLE, ts TIMESTAMP) USING iceberg PARTITIONED BY (days(ts))")
    for batch in range(2):  # one file each: random values compress little, ~40 KiB a file
        spark.range(batch * 2500, (batch + 1) * 2500, 1, 1).selectExpr(
            "id", "CAST(xxhash64(id) AS DOUBLE) AS v", f"TIMESTAMP '{DATE} 01:00:00' AS ts").writeTo(table_sql).append()
    reader = CatalogReader(config)
    before = reader.health(name.key).partition(DATE)
    assert before.data_files == 2 and before.small_files == 2, before
    snapshot, location = current_snapshot(spark, table_sql), reader.metadata_location(name.key)

    outcome = compactor(config, spark).run(CompactionRequest(name.key, DATE))

    assert outcome.decision == "noop", outcome.reason
    assert outcome.reason.startswith("nothing gained: the rewrite of 2 files wrote 2"), outcome.reason
    assert [e.verdict for e in outcome.staged] == ["no_gain"] and not outcome.published
    tbl = reader.load(name.key)
    assert tbl.current_snapshot().snapshot_id == snapshot  # main never moved
    assert not [r for r in tbl.metadata.refs if r != "main"]  # the staging branch is gone
    assert reader.metadata_location(name.key) != location  # (the branch came and went)
    ids = sorted(tbl.scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(5000))


def test_a_rewrite_that_applies_deletes_is_published_though_one_file_becomes_one(spark, lake_root, table_name):
    config = make_config(lake_root, defaults={"writer_idle": "0s", "hot_partition_age": "0s", "min_input_files": 2,
                                              "small_file_size_bytes": "16KiB", "target_file_size_bytes": "1MiB",
                                              "max_delete_ratio": 0.0, "retry_backoff": "0s", "claim_wait": "0s"})
    name = TableName.parse(table_name)
    table_sql = name.sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (id BIGINT, v DOUBLE, ts TIMESTAMP) USING iceberg PARTITIONED BY (days(ts)) "
              "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')")
    # one data file of ~40 KiB (not small), then one row deleted by a position-delete file beside it
    spark.range(0, 2500, 1, 1).selectExpr(
        "id", "CAST(xxhash64(id) AS DOUBLE) AS v", f"TIMESTAMP '{DATE} 01:00:00' AS ts").writeTo(table_sql).append()
    spark.sql(f"DELETE FROM {table_sql} WHERE id = 1234")

    def files(content: int) -> set[str]:  # the live table's files on DATE, by Spark's metadata table
        return {r[0] for r in spark.sql(f"SELECT file_path FROM {table_sql}.files WHERE content = {content} "
                                        f"AND partition.ts_day = DATE '{DATE}'").collect()}

    data_before, deletes_before = files(0), files(1)
    assert len(data_before) == 1 and len(deletes_before) == 1, (data_before, deletes_before)
    reader = CatalogReader(config)
    before = reader.health(name.key).partition(DATE)
    assert before.data_files == 1 and before.small_files == 0 and before.position_delete_files == 1, before
    snapshot = current_snapshot(spark, table_sql)

    outcome = compactor(config, spark).run(CompactionRequest(name.key, DATE))

    # published though the rewrite wrote as many files as it replaced: it applied the deletes
    assert outcome.decision == "run" and outcome.published, outcome.reason
    assert [e.verdict for e in outcome.staged] == ["published"], outcome.staged
    assert (outcome.rewritten_files, outcome.added_files) == (1, 1)
    assert outcome.validation.passed is True
    tbl = reader.load(name.key)
    head = tbl.current_snapshot()
    assert head.snapshot_id != snapshot and head.snapshot_id == outcome.after_snapshot_id
    assert head.parent_snapshot_id == snapshot
    assert head.summary.operation.value == "replace"
    assert not [r for r in tbl.metadata.refs if r != "main"]  # the staging branch is gone

    data_after = files(0)
    assert len(data_after) == 1 and not data_after & data_before  # one file became one new file
    assert files(1) == set()  # the position-delete file is gone from the live table

    ids = tbl.scan().to_arrow().column("id").to_pylist()  # an independent reader: pyiceberg
    assert sorted(ids) == [i for i in range(2500) if i != 1234]
