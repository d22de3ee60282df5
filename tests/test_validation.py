"""validate_rewrite and full_row_hash on real Iceberg snapshots with real Great Expectations."""

from __future__ import annotations

import json

import pytest

from conftest import current_snapshot, two_versions

from icemaint.domain.names import TableName
from icemaint.engine.validation import (
    COLUMN_AGGREGATES,
    ROW_COUNT_PARITY,
    SAMPLE_COMPARISON,
    ValidationError,
    full_row_hash,
    validate_rewrite,
)

DAY1 = "ts >= TIMESTAMP '2026-01-01 00:00:00' AND ts < TIMESTAMP '2026-01-02 00:00:00'"
DAY2 = "ts >= TIMESTAMP '2026-01-02 00:00:00' AND ts < TIMESTAMP '2026-01-03 00:00:00'"
DAY3 = "ts >= TIMESTAMP '2026-01-03 00:00:00' AND ts < TIMESTAMP '2026-01-04 00:00:00'"


def _create_table(spark, config, name: str, rows: int = 300, batches: int = 3) -> str:
    """A merge-on-read v2 table partitioned by day over 3 days, written in small appends.

    Columns cover NULLs (every 7th string, every 5th amount), a string with quotes and braces, a
    decimal, an array, a map and a struct, so null-safety and complex types are exercised.
    """
    table_sql = TableName.parse(name).sql(config.catalog.name)
    spark.sql(f"""
        CREATE TABLE {table_sql} (
            id BIGINT, ts TIMESTAMP, s STRING, amount DOUBLE, price DECIMAL(10,2),
            tags ARRAY<STRING>, attrs MAP<STRING, INT>, info STRUCT<a: INT, b: STRING>)
        USING iceberg PARTITIONED BY (days(ts))
        TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                       'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')""")
    per_batch = rows // batches
    for b in range(batches):
        lo, hi = b * per_batch, (b + 1) * per_batch
        # ts spreads each batch over the 3 days, so every day gets one small file per batch.
        spark.sql(f"""
            INSERT INTO {table_sql}
            SELECT id,
                   TIMESTAMP '2026-01-01 00:00:00' + make_interval(0, 0, 0, CAST(id % 3 AS INT),
                       0, CAST(id % 60 AS INT), CAST(id % 59 AS DOUBLE) + 0.123456),
                   CASE WHEN id % 7 = 0 THEN NULL ELSE concat('row \\'{{', CAST(id AS STRING), '}}"') END,
                   CASE WHEN id % 5 = 0 THEN NULL ELSE id * 0.1 END,
                   CAST(id * 1.25 AS DECIMAL(10,2)),
                   CASE WHEN id % 4 = 0 THEN NULL ELSE array(CAST(id AS STRING), NULL) END,
                   map('k', CAST(id AS INT)),
                   named_struct('a', CAST(id % 11 AS INT), 'b', CASE WHEN id % 2 = 0 THEN NULL ELSE 'x' END)
            FROM range({lo}, {hi}) AS r(id)""")
    return table_sql


def _rewrite_day(spark, config, name: str, day_predicate: str) -> None:
    where = day_predicate.replace("TIMESTAMP ", "").replace("'", "\\'")
    rows = spark.sql(
        f"CALL `{config.catalog.name}`.system.rewrite_data_files("
        f"table => {TableName.parse(name).procedure_arg()}, where => '{where}', "
        "options => map('min-input-files', '2'))").collect()
    assert rows[0]["rewritten_data_files_count"] >= 2, rows
    assert rows[0]["added_data_files_count"] >= 1, rows


def _assert_all_passed(result) -> None:
    failed = {c.name: c.observed for c in result.checks if not c.passed}
    assert result.passed and not failed, json.dumps(failed, indent=1)[:4000]


def test_real_rewrite_passes_every_check(spark, config, table_name):
    table_sql = _create_table(spark, config, table_name)
    before = current_snapshot(spark, table_sql)
    _rewrite_day(spark, config, table_name, DAY2)
    after = current_snapshot(spark, table_sql)
    assert after != before
    files = spark.sql(f"SELECT count(*) FROM {table_sql}.`files` "
                      f"WHERE partition.ts_day = DATE '2026-01-02'").first()[0]
    assert files == 1  # the rewrite really compacted the day we validate

    result = validate_rewrite(spark, table_sql, before, after, DAY2)

    _assert_all_passed(result)
    assert [c.name for c in result.checks] == [ROW_COUNT_PARITY, SAMPLE_COMPARISON,
                                               COLUMN_AGGREGATES]
    assert result.check(ROW_COUNT_PARITY).observed == {"before_row_count": 100,
                                                       "after_row_count": 100}
    sample = result.check(SAMPLE_COMPARISON).observed
    assert sample["sampled_before_rows"] == sample["sampled_after_rows"] > 0
    assert sample["differences"] == 0 and sample["rows"] == []
    aggregates = result.check(COLUMN_AGGREGATES).observed
    assert aggregates["columns_compared"] == 8 and aggregates["differences"] == 0
    assert result.check(ROW_COUNT_PARITY).gx_result["expectation_config"]["type"] == \
        "expect_column_pair_values_to_be_equal"
    assert result.before_snapshot_id == before and result.after_snapshot_id == after
    json.dumps(result.to_dict())  # the audit log stores it as JSON
    assert full_row_hash(spark, table_sql, before) == full_row_hash(spark, table_sql, after)
    # the whole table too, unscoped, every row compared
    _assert_all_passed(validate_rewrite(spark, table_sql, before, after, sample_fraction=1.0))


def test_dropped_row_fails_row_count_and_sample(spark, config, table_name):
    table_sql = _create_table(spark, config, table_name)
    before = current_snapshot(spark, table_sql)
    spark.sql(f"DELETE FROM {table_sql} WHERE id = 31")  # id 31 lives on day 2 (31 % 3 == 1)
    after = current_snapshot(spark, table_sql)

    result = validate_rewrite(spark, table_sql, before, after, DAY2, sample_fraction=1.0)

    assert not result.passed
    parity = result.check(ROW_COUNT_PARITY)
    assert not parity.passed
    assert parity.observed == {"before_row_count": 100, "after_row_count": 99}
    sample = result.check(SAMPLE_COMPARISON)
    assert not sample.passed
    assert sample.observed["differences"] == 1
    assert sample.observed["missing_in_after"] == 1 and sample.observed["unexpected_in_after"] == 0
    [row] = sample.observed["rows"]
    assert row["before_count"] == 1 and row["after_count"] == 0
    assert json.loads(row["row"])["id"] == 31
    assert not result.check(COLUMN_AGGREGATES).passed  # non-null counts moved too
    assert full_row_hash(spark, table_sql, before, DAY2)[0] == 100
    assert full_row_hash(spark, table_sql, after, DAY2)[0] == 99


def test_changed_value_keeps_count_but_fails_sample_and_aggregates(spark, config, table_name):
    table_sql = _create_table(spark, config, table_name)
    before = current_snapshot(spark, table_sql)
    spark.sql(f"UPDATE {table_sql} SET amount = amount + 0.5 WHERE id = 34")  # day 2
    after = current_snapshot(spark, table_sql)

    result = validate_rewrite(spark, table_sql, before, after, DAY2, sample_fraction=1.0)

    assert not result.passed
    assert result.check(ROW_COUNT_PARITY).passed
    sample = result.check(SAMPLE_COMPARISON)
    assert not sample.passed
    directions = sorted((r["direction"], json.loads(r["row"])["amount"])
                        for r in sample.observed["rows"])
    assert directions == [("missing_in_after", pytest.approx(3.4)),
                          ("unexpected_in_after", pytest.approx(3.9))]
    aggregates = result.check(COLUMN_AGGREGATES)
    assert not aggregates.passed
    differing = {(d["column_name"], d["aggregate"]) for d in aggregates.observed["differing_aggregates"]}
    assert ("amount", "hash_sum") in differing and ("*", "hash_sum") in differing
    assert all(column in ("amount", "*") for column, _ in differing)  # "*": the whole-row hash sum
    assert full_row_hash(spark, table_sql, before) != full_row_hash(spark, table_sql, after)


def test_scope_limits_the_comparison_to_its_date(spark, config, table_name):
    table_sql = _create_table(spark, config, table_name)
    before = current_snapshot(spark, table_sql)
    spark.sql(f"UPDATE {table_sql} SET s = 'changed' WHERE id = 35")  # day 3 (35 % 3 == 2)
    after = current_snapshot(spark, table_sql)

    _assert_all_passed(validate_rewrite(spark, table_sql, before, after, DAY1, sample_fraction=1.0))
    other_day = validate_rewrite(spark, table_sql, before, after, DAY3, sample_fraction=1.0)
    assert not other_day.passed
    assert not other_day.check(SAMPLE_COMPARISON).passed
    assert not other_day.check(COLUMN_AGGREGATES).passed
    assert other_day.scope == DAY3


def test_nulls_compare_equal_and_null_to_value_is_caught(spark, config, table_name):
    table_sql = _create_table(spark, config, table_name, rows=120, batches=4)
    before = current_snapshot(spark, table_sql)
    _rewrite_day(spark, config, table_name, DAY1)
    rewritten = current_snapshot(spark, table_sql)
    # NULL strings, doubles, arrays with NULL elements and struct fields equal themselves
    _assert_all_passed(validate_rewrite(spark, table_sql, before, rewritten, DAY1,
                                        sample_fraction=1.0))

    spark.sql(f"UPDATE {table_sql} SET s = '' WHERE id = 21")  # s was NULL; day 1 (21 % 3 == 0)
    changed = current_snapshot(spark, table_sql)
    result = validate_rewrite(spark, table_sql, rewritten, changed, DAY1, sample_fraction=1.0)
    assert result.check(ROW_COUNT_PARITY).passed
    assert not result.check(SAMPLE_COMPARISON).passed
    [(missing, extra)] = [
        sorted((json.loads(r["row"])["s"] for r in result.check(SAMPLE_COMPARISON).observed["rows"]),
               key=lambda v: v is not None, reverse=True)]
    assert (missing, extra) == ("", None) or (missing, extra) == (None, "")
    differing = {(d["column_name"], d["aggregate"])
                 for d in result.check(COLUMN_AGGREGATES).observed["differing_aggregates"]}
    assert ("s", "non_null_count") in differing


def test_dropped_duplicate_row_is_caught_by_the_sample(spark, config, table_name):
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    # an overwrite that keeps 3 distinct rows and adds one: same count, one duplicate gone
    before, after = two_versions(spark, table_sql, "k INT, v STRING", "(1, 'a'), (1, 'a'), (2, NULL), (3, 'c')",
                                 "(1, 'a'), (2, NULL), (3, 'c'), (4, 'd')")

    sample = validate_rewrite(spark, table_sql, before, after, sample_fraction=1.0) \
        .check(SAMPLE_COMPARISON)

    assert not sample.passed
    rows = {json.loads(r["row"])["k"]: (r["before_count"], r["after_count"])
            for r in sample.observed["rows"]}
    assert rows == {1: (2, 1), 4: (0, 1)}


@pytest.mark.parametrize("bad", ["123", 1.0, None, True, [1]])
def test_bad_snapshot_ids_are_refused(spark, bad):
    with pytest.raises(ValidationError, match="before_snapshot_id must be an int"):
        validate_rewrite(spark, "`lake`.`t`.`x`", bad, 1)
    with pytest.raises(ValidationError, match="after_snapshot_id must be an int"):
        validate_rewrite(spark, "`lake`.`t`.`x`", 1, bad)
    with pytest.raises(ValidationError, match="snapshot_id must be an int"):
        full_row_hash(spark, "`lake`.`t`.`x`", bad)


@pytest.mark.parametrize("kwargs, message", [
    ({"sample_fraction": 0.0}, "sample_fraction"),
    ({"sample_fraction": 1.5}, "sample_fraction"),
    ({"scope": "  "}, "scope"),
    ({"seed": "0"}, "seed"),
])
def test_bad_arguments_are_refused(spark, kwargs, message):
    with pytest.raises(ValidationError, match=message):
        validate_rewrite(spark, "`lake`.`t`.`x`", 1, 2, **kwargs)


def test_full_row_hash_keeps_the_position_of_nulls(spark, config, table_name):
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    first, second = two_versions(spark, table_sql, "a INT, b INT", "(NULL, 5)", "(5, NULL)")

    assert full_row_hash(spark, table_sql, first)[0] == full_row_hash(spark, table_sql, second)[0]
    assert full_row_hash(spark, table_sql, first) != full_row_hash(spark, table_sql, second)
    result = validate_rewrite(spark, table_sql, first, second, sample_fraction=1.0)
    assert result.check(ROW_COUNT_PARITY).passed
    assert not result.check(SAMPLE_COMPARISON).passed
    assert not result.check(COLUMN_AGGREGATES).passed
