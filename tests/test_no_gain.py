"""A rewrite that gains nothing is not published.

Two files of ~60% of the target on one date are due (2 small files >= min_input_files 2), but Iceberg's
writer rolls at the target, so their rewrite is two files again: publishing it would leave the date as due
as before and every tick would rewrite it once more (an endless `tick --until-idle`). The run says
"nothing gained", main is unchanged, and the rows are the written ones (read by pyiceberg).
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
    assert [e["verdict"] for e in outcome.staged] == ["no_gain"] and not outcome.published
    tbl = reader.load(name.key)
    assert tbl.current_snapshot().snapshot_id == snapshot  # main never moved
    assert not [r for r in tbl.metadata.refs if r != "main"]  # the staging branch is gone
    assert reader.metadata_location(name.key) != location  # (the branch came and went)
    ids = sorted(tbl.scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(5000))
