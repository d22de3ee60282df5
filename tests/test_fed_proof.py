"""The proof's old side digested by the read that feeds the rewrite (issue 20, item 3).

A bin-pack of files without deletes reads the replaced files once: while Spark feeds them to the writer,
an Observation digests them (`digest.digest_feed`), and the proof reads only the staged files. Because the
old side is then what the writer was fed, a fourth check (`read_completeness`) proves that read complete
against the manifests: its row count and a file-weighted hash sum must equal what the planned files'
record counts give. These tests break the feeding read (a file left out, a filter that drops rows) and the
write (two values swapped between rows, a row duplicated and another dropped): each must fail the proof,
publish nothing and leave the table's metadata where it was; the rows are read back by pyiceberg.
"""

from __future__ import annotations

import pytest

from icemaint.domain.names import TableName
from icemaint.engine.staging import StagingArea
from icemaint.engine.validation import COLUMN_AGGREGATES, READ_COMPLETENESS, SAMPLE_COMPARISON
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest

from conftest import current_snapshot, make_config
from test_staged_publish import compactor

DATE = "2026-03-01"
FILES, ROWS_PER_FILE = 5, 400


def _table(spark, lake_root, table_name):
    config = make_config(lake_root, defaults={"writer_idle": "0s", "hot_partition_age": "0s", "min_input_files": 2,
                                              "retry_backoff": "0s", "claim_wait": "0s", "sample_fraction": 1.0})
    name = TableName.parse(table_name)
    table_sql = name.sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (id BIGINT, v BIGINT, ts TIMESTAMP) USING iceberg PARTITIONED BY (days(ts))")
    for f in range(FILES):
        spark.range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE, 1, 1).selectExpr(
            "id", "id * 10 AS v", f"TIMESTAMP '{DATE} 01:00:00' AS ts").writeTo(table_sql).append()
    return config, name


def _first_call(monkeypatch, method: str, change):
    """Patches StagingArea.<method> so that its first call (the staging's read) goes through `change`."""
    original = getattr(StagingArea, method)
    calls = []

    def patched(self, *args, **kwargs):
        calls.append(method)
        if len(calls) == 1:
            return change(original, self, *args, **kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(StagingArea, method, patched)
    return calls


def _refused(config, name, outcome, snapshot, location) -> dict:
    """Asserts nothing was published and every written row is in the table; the failed checks."""
    reader = CatalogReader(config)
    assert outcome.decision == "not_published" and not outcome.published, outcome.reason
    assert reader.metadata_location(name.key) != location  # (the staging branch came and went)
    tbl = reader.load(name.key)
    assert tbl.current_snapshot().snapshot_id == snapshot  # main never moved
    assert not [r for r in tbl.metadata.refs if r != "main"]
    rows = tbl.scan().to_arrow()
    assert sorted(rows.column("id").to_pylist()) == list(range(FILES * ROWS_PER_FILE))
    assert rows.column("v").to_pylist() == [i * 10 for i in rows.column("id").to_pylist()]
    proof = outcome.to_dict()["validation"]["commits"][-1]
    return {c["name"]: c for c in proof["checks"] if not c["passed"]}


def test_the_proof_reads_only_the_new_files_and_proves_the_feeding_read_complete(spark, lake_root, table_name):
    config, name = _table(spark, lake_root, table_name)

    outcome = compactor(config, spark).run(CompactionRequest(name.key, DATE))

    assert outcome.decision == "run" and outcome.published, outcome.reason
    proof = outcome.to_dict()["validation"]["commits"][-1]
    assert proof["passed"] is True
    assert proof["reads"]["before"].get("fed_by_rewrite") is True  # the old side was not read by the proof
    assert outcome.read_before.rows == outcome.read_after.rows == FILES * ROWS_PER_FILE
    checks = {c["name"]: c for c in proof["checks"]}
    complete = checks[READ_COMPLETENESS]
    assert complete["passed"] is True
    assert complete["observed"]["planned_files"] == FILES
    assert complete["observed"]["planned_rows"] == complete["observed"]["rows_read"] == FILES * ROWS_PER_FILE
    sums = complete["observed"]["file_weighted_hash_sum"]
    assert sums["planned"] == sums["read"] and sums["planned"] != "0"
    tbl = CatalogReader(config).load(name.key)
    assert sorted(tbl.scan().to_arrow().column("id").to_pylist()) == list(range(FILES * ROWS_PER_FILE))


def test_a_file_left_out_of_the_feeding_read_fails_the_proof(spark, lake_root, table_name, monkeypatch):
    config, name = _table(spark, lake_root, table_name)
    table_sql = name.sql(config.catalog.name)
    snapshot, location = current_snapshot(spark, table_sql), CatalogReader(config).metadata_location(name.key)
    # the writer is fed all planned files but the last: it and the proof's new side both lack its rows
    _first_call(monkeypatch, "_stage_tasks", lambda original, self, tasks: original(self, tasks[:-1]))

    outcome = compactor(config, spark).run(CompactionRequest(name.key, DATE))

    failed = _refused(config, name, outcome, snapshot, location)
    assert set(failed) == {READ_COMPLETENESS}, failed  # the rows read and the rows written agree
    observed = failed[READ_COMPLETENESS]["observed"]
    assert observed["planned_rows"] - observed["rows_read"] == ROWS_PER_FILE


def test_a_filter_that_drops_rows_from_the_feeding_read_fails_the_proof(spark, lake_root, table_name, monkeypatch):
    config, name = _table(spark, lake_root, table_name)
    table_sql = name.sql(config.catalog.name)
    snapshot, location = current_snapshot(spark, table_sql), CatalogReader(config).metadata_location(name.key)
    _first_call(monkeypatch, "_read_set",
                lambda original, self, *a, **k: original(self, *a, **k).where("id % 7 <> 3"))

    outcome = compactor(config, spark).run(CompactionRequest(name.key, DATE))

    failed = _refused(config, name, outcome, snapshot, location)
    assert set(failed) == {READ_COMPLETENESS}, failed
    observed = failed[READ_COMPLETENESS]["observed"]
    assert observed["planned_rows"] - observed["rows_read"] == sum(1 for i in range(FILES * ROWS_PER_FILE)
                                                                    if i % 7 == 3)


WRITE_FAULTS = {
    # v of rows 6 and 7 swapped: every per-column aggregate stays equal, only whole rows tell
    "two_values_swapped": "CASE WHEN id = 6 THEN 70 WHEN id = 7 THEN 60 ELSE v END AS v",
    # row 3 dropped, row 4 written twice: the same row count
    "duplicated_and_dropped": None,
}


@pytest.mark.parametrize("fault", sorted(WRITE_FAULTS))
def test_a_write_that_changes_rows_after_the_feeding_read_fails_the_proof(spark, lake_root, table_name, monkeypatch,
                                                                          fault):
    config, name = _table(spark, lake_root, table_name)
    table_sql = name.sql(config.catalog.name)
    snapshot, location = current_snapshot(spark, table_sql), CatalogReader(config).metadata_location(name.key)

    def faulty_write(original, self, rows, set_id, options):
        if fault == "duplicated_and_dropped":  # one pass over the rows (the feed's Observation runs once)
            rows = rows.selectExpr("*", "explode(CASE WHEN id = 3 THEN array() WHEN id = 4 THEN array(1, 2) "
                                        "ELSE array(1) END) AS __copy").drop("__copy")
        else:
            rows = rows.selectExpr("id", WRITE_FAULTS[fault], "ts")
        return original(self, rows, set_id, options)

    _first_call(monkeypatch, "_write_replacements", faulty_write)

    outcome = compactor(config, spark).run(CompactionRequest(name.key, DATE))

    failed = _refused(config, name, outcome, snapshot, location)
    assert READ_COMPLETENESS not in failed  # the read was complete: the write changed the rows
    assert SAMPLE_COMPARISON in failed and COLUMN_AGGREGATES in failed, failed
    assert failed[SAMPLE_COMPARISON]["observed"]["missing_in_after"] == (2 if fault == "two_values_swapped" else 1)
    differing = {(a["column_name"], a["aggregate"])
                 for a in failed[COLUMN_AGGREGATES]["observed"]["differing_aggregates"]}
    assert ("*", "hash_sum") in differing, differing


def test_the_expected_file_hash_sum_hashes_paths_as_spark_hashes_the_read_file_column(spark):
    """The planned side is hashed in Python, the read side by Spark: the two must be the same function, for
    any path a catalog can hold (non-ASCII, long, with a tail of 1-7 bytes past XXH64's 8-byte words)."""
    from icemaint.engine.digest import expected_file_hash_sum, spark_xxhash64

    paths = ["", "a", "s3://bücket/é/日本/part-00000.parquet",
             "file:/tmp/lake/db/t/data/ts_day=2026-03-01/00000-1-" + "f" * 300 + ".parquet"]
    paths += [f"file:/w/data/x={'é' * i}/{'p' * (i * 7)}.parquet" for i in range(1, 40)]
    rows = spark.createDataFrame([(p,) for p in paths], "p STRING").selectExpr("p", "xxhash64(p) AS h").collect()
    assert [spark_xxhash64(r["p"]) for r in rows] == [r["h"] for r in rows]
    counts = {p: i + 1 for i, p in enumerate(paths)}
    assert expected_file_hash_sum(counts) == sum(counts[r["p"]] * r["h"] for r in rows)
    assert expected_file_hash_sum({}) == 0


def test_the_fed_sample_is_the_policys_share_capped_at_about_twenty_thousand_rows():
    from icemaint.engine.digest import FED_SAMPLE_ROWS, fed_sample_fraction

    assert fed_sample_fraction(0.05, 1_000) == 0.05
    assert fed_sample_fraction(1.0, FED_SAMPLE_ROWS) == 1.0
    assert fed_sample_fraction(0.05, 15_000_000) == pytest.approx(FED_SAMPLE_ROWS / 15_000_000)
    assert fed_sample_fraction(0.001, 15_000_000) == 0.001  # a smaller share is kept


def test_a_failed_read_completeness_fails_the_row_count_parity_check_of_the_run():
    """The blocking Dagster check a fed proof's completeness reports through: row_count_parity."""
    from maint_assets.compaction import check_result

    def outcome(complete: bool) -> dict:
        checks = [{"name": n, "passed": True, "observed": {}, "gx_result": {}}
                  for n in ("row_count_parity", "sample_comparison", "column_aggregates")]
        checks.append({"name": READ_COMPLETENESS, "passed": complete, "observed": {"rows_read": 1}, "gx_result": {}})
        return {"table": "t.x", "date": DATE, "decision": "run" if complete else "not_published",
                "validation": {"passed": complete, "commits": [{"passed": complete, "checks": checks}]}}

    assert check_result("row_count_parity", outcome(True)).passed
    failed = check_result("row_count_parity", outcome(False))
    assert not failed.passed and "FAILED" in failed.description
    assert check_result("sample_comparison", outcome(False)).passed  # the others report their own verdicts
