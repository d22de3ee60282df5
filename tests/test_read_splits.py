"""A compaction writes as many files as its bytes call for, never one more (`rewrite_plan.read_splits`).

A date of equal small files whose count does not divide by the outputs: splits of a plain share packed one
file less each and made one read task (and one small output file) too many. Judged by the files the table
holds afterwards (Spark's metadata table) and its rows (pyiceberg and a whole-table digest).
"""

from __future__ import annotations

import uuid

import pytest

from icemaint.domain.names import TableName
from icemaint.domain.rewrite_plan import next_fit_splits, read_splits
from icemaint.engine.validation import full_row_hash
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest

from conftest import current_snapshot, make_config
from test_position_deletes import files_on
from test_staged_publish import DATE, run_compaction

pytestmark = pytest.mark.slow

FILES = 54
ROWS = 3000


def sizes_on(spark, sql: str) -> list[int]:
    return [r[0] for r in spark.sql(f"SELECT file_size_in_bytes FROM {sql}.files WHERE content = 0 "
                                    f"AND partition.ts_day = DATE '{DATE}' ORDER BY file_path").collect()]


def test_equal_small_files_compact_into_the_files_their_bytes_call_for(spark, lake_root, tmp_path):
    table = f"t.read_splits_{uuid.uuid4().hex[:8]}"
    sql = TableName.parse(table).sql("lake")
    # Random bytes, so the writer's in-memory size estimate (it rolls files by it) is what lands on disk.
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP, v BINARY) USING iceberg PARTITIONED BY (days(ts)) "
              "TBLPROPERTIES ('format-version'='2')")
    # One append of FILES tasks of ROWS rows each, written as they come (no shuffle): one file per task.
    (spark.sql(f"SELECT id, TIMESTAMP '{DATE} 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id % 80000) AS ts, "
               f"unhex(sha2(CAST(id AS STRING), 256)) AS v FROM range(0, {FILES * ROWS}, 1, {FILES})")
     .writeTo(sql).option("distribution-mode", "none").append())
    sizes = sizes_on(spark, sql)
    assert len(sizes) == FILES
    target = -(-sum(sizes) * 10 // 48)  # 4.8 files' worth: 5 outputs
    splits = read_splits(sizes, sum(sizes), target)
    assert splits.files == 5
    # The case at hand: a plain share's splits would make one more read task than outputs.
    assert next_fit_splits(sizes, sum(sizes) // 5 + 1) == 6

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table: {
        "target_file_size_bytes": target, "small_file_size_bytes": target, "min_input_files": 2}})
    before = full_row_hash(spark, sql, current_snapshot(spark, sql))
    outcome = run_compaction(config, spark, CompactionRequest(table, DATE))

    assert outcome.decision == "run" and outcome.published, outcome.reason
    after = sizes_on(spark, sql)
    assert len(after) == 5 == outcome.added_files, after
    assert min(after) > max(after) // 2, after  # no short straggler beside four full files
    assert full_row_hash(spark, sql, current_snapshot(spark, sql)) == before
    ids = CatalogReader(config).load(table).scan().to_arrow().column("id").to_pylist()
    assert sorted(ids) == list(range(FILES * ROWS))
    assert len(files_on(spark, sql, DATE, 0)) == 5
