"""snapshot_digest on real Iceberg snapshots: exact sums, empty scopes, and the whole-row hash sum."""

from __future__ import annotations

from conftest import current_snapshot, two_versions
from icemaint.engine.digest import WHOLE_ROW, observed, snapshot_digest
from icemaint.domain.names import TableName
from icemaint.engine.validation import COLUMN_AGGREGATES, ROW_COUNT_PARITY, SAMPLE_COMPARISON, validate_rewrite


def test_integer_and_decimal_sums_are_exact_beyond_64_bits(spark, config, table_name):
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (big BIGINT, small INT, price DECIMAL(18,3)) USING iceberg")
    bigs = [2**63 - 1, 2**63 - 2, -(2**63), 123, -5]
    prices = ["999999999999999.999", "999999999999999.998", "-0.001", "12.345", "0.000"]
    values = ", ".join(f"({b}, {2**31 - 1 - i}, {p})" for i, (b, p) in enumerate(zip(bigs, prices)))
    spark.sql(f"INSERT INTO {table_sql} VALUES {values}")

    digest = snapshot_digest(spark, table_sql, current_snapshot(spark, table_sql), None, sample_fraction=1.0, seed=0)

    assert digest.row_count == 5
    assert digest.aggregates[("big", "sum")] == str(sum(bigs))  # a plain 64-bit sum would wrap
    assert digest.aggregates[("small", "sum")] == str(sum(2**31 - 1 - i for i in range(5)))
    # unscaled (x 1000): 999999999999999999 + 999999999999999998 - 1 + 12345 + 0
    assert digest.aggregates[("price", "sum")] == str(999999999999999999 + 999999999999999998 - 1 + 12345)
    assert digest.aggregates[("big", "min")] == str(-(2**63))
    assert digest.aggregates[("big", "max")] == str(2**63 - 1)
    assert len(digest.sample) == 5  # fraction 1.0 keeps every row's fingerprint


def test_an_empty_scope_digests_to_zero_rows_and_validates(spark, config, table_name):
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (k INT, v STRING) USING iceberg")
    spark.sql(f"INSERT INTO {table_sql} VALUES (1, 'a')")
    first = current_snapshot(spark, table_sql)
    spark.sql(f"INSERT INTO {table_sql} VALUES (2, 'b')")
    second = current_snapshot(spark, table_sql)

    digest = snapshot_digest(spark, table_sql, first, "k > 100", sample_fraction=0.5, seed=3)
    assert digest.row_count == 0 and len(digest.sample) == 0
    assert digest.aggregates[("k", "min")] is None and digest.aggregates[("k", "non_null_count")] == "0"

    assert validate_rewrite(spark, table_sql, first, second, "k > 100").passed
    assert not validate_rewrite(spark, table_sql, first, second, "k >= 2").passed


def test_values_swapped_between_rows_fail_the_whole_row_hash_sum(spark, config, table_name):
    """Every per-column aggregate stays equal; only rows as a whole differ."""
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    before, after = two_versions(spark, table_sql, "k INT, v STRING", "(1, 'a'), (2, 'b'), (3, 'c')",
                                 "(1, 'b'), (2, 'a'), (3, 'c')")

    result = validate_rewrite(spark, table_sql, before, after, sample_fraction=1.0)

    assert result.check(ROW_COUNT_PARITY).passed
    aggregates = result.check(COLUMN_AGGREGATES)
    assert not aggregates.passed
    assert [(d["column_name"], d["aggregate"]) for d in aggregates.observed["differing_aggregates"]] == \
        [(WHOLE_ROW, "hash_sum")]
    sample = result.check(SAMPLE_COMPARISON)
    assert not sample.passed and sample.observed["differences"] == 4  # two rows gone, two new
    assert {r["direction"] for r in sample.observed["rows"]} == {"missing_in_after", "unexpected_in_after"}
    assert all(r["row"] for r in sample.observed["rows"])  # each offending row read back


def test_a_column_named_like_the_fingerprint_does_not_collide(spark, config, table_name):
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (__icemaint_fp1 BIGINT, `we``ird` STRING) USING iceberg")
    spark.sql(f"INSERT INTO {table_sql} VALUES (7, 'x'), (8, NULL)")
    before = current_snapshot(spark, table_sql)
    spark.sql(f"UPDATE {table_sql} SET __icemaint_fp1 = 9 WHERE __icemaint_fp1 = 8")
    after = current_snapshot(spark, table_sql)

    digest = snapshot_digest(spark, table_sql, before, None, sample_fraction=1.0, seed=0)
    assert digest.aggregates[("__icemaint_fp1", "sum")] == "15"
    result = validate_rewrite(spark, table_sql, before, after, sample_fraction=1.0)
    assert not result.passed
    assert {d["column_name"] for d in result.check(COLUMN_AGGREGATES).observed["differing_aggregates"]} >= \
        {"__icemaint_fp1"}


def test_a_passing_proof_runs_one_spark_job_per_snapshot_plus_gx_row_count(spark, config, table_name):
    """The property the benchmarks rest on: each snapshot's rows are read once, not once per check."""
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (k INT, v STRING) USING iceberg")
    for i in range(3):
        spark.sql(f"INSERT INTO {table_sql} SELECT id, CAST(id AS STRING) FROM range({i * 100}, {i * 100 + 100})")
    before = current_snapshot(spark, table_sql)
    spark.sql(f"CALL `{config.catalog.name}`.system.rewrite_data_files("
              f"table => {TableName.parse(table_name).procedure_arg()}, options => map('min-input-files', '2'))")
    after = current_snapshot(spark, table_sql)
    tracker, group = spark.sparkContext.statusTracker(), f"proof-{table_name}"

    spark.sparkContext.setJobGroup(group, "rewrite proof")
    try:
        result = validate_rewrite(spark, table_sql, before, after, sample_fraction=0.5)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)

    assert result.passed
    jobs = sorted(tracker.getJobIdsForGroup(group))
    stages = [tracker.getStageInfo(st).name for j in jobs for st in tracker.getJobInfo(j).stageIds]
    # one read per snapshot (icemaint/engine/digest.py); everything else is GX counting the after
    # snapshot for row_count_parity (a count: its shuffle and result stages)
    assert sum("icemaint/engine/digest.py" in name for name in stages) == 2, "\n".join(stages)
    assert all("icemaint/engine/digest.py" in name or "great_expectations" in name for name in stages), "\n".join(stages)
    assert len(jobs) <= 4, "\n".join(stages)


def test_without_detail_only_the_whole_row_hash_sum_is_kept(spark, config, table_name):
    """What a passing proof reads: the whole-row hash sum (it hashes every value and every NULL's position);
    each column's non-null count, hash sum, min, max and sum, which only name a differing column, are read
    when a proof fails."""
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (k INT, v STRING, f DOUBLE) USING iceberg")
    spark.sql(f"INSERT INTO {table_sql} VALUES (1, 'a', 0.0), (2, 'b', -0.0), (3, NULL, 2.5)")
    snapshot = current_snapshot(spark, table_sql)

    full = snapshot_digest(spark, table_sql, snapshot, None, sample_fraction=1.0, seed=0)
    lean = snapshot_digest(spark, table_sql, snapshot, None, sample_fraction=1.0, seed=0, detail=False)

    assert set(lean.aggregates) == {(WHOLE_ROW, "hash_sum")}
    assert ("v", "non_null_count") in full.aggregates
    assert all(lean.aggregates[k] == full.aggregates[k] for k in lean.aggregates)
    assert lean.aggregates[(WHOLE_ROW, "hash_sum")] is not None and lean.row_count == 3
    assert lean.sample.equals(full.sample)


def test_the_lean_hash_sum_still_sees_a_null_filled_or_moved(spark, config, table_name):
    """Without the non-null counts the whole-row hash sum alone must tell a NULL from an empty string and
    (NULL, 5) from (5, NULL): the isnull flag before each value keeps a NULL's position in the hash."""
    table_sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (a INT, b INT, s STRING) USING iceberg")
    sums = {}
    for label, values in {"null": "(NULL, 5, NULL)", "moved": "(5, NULL, NULL)", "empty": "(NULL, 5, '')"}.items():
        spark.sql(f"DELETE FROM {table_sql}")
        spark.sql(f"INSERT INTO {table_sql} VALUES {values}")
        digest = snapshot_digest(spark, table_sql, current_snapshot(spark, table_sql), None,
                                 sample_fraction=1.0, seed=0, detail=False)
        sums[label] = digest.aggregates[(WHOLE_ROW, "hash_sum")]
    assert len(set(sums.values())) == 3, sums


def test_observed_metrics_are_read_by_name_as_pyspark_reads_them_and_none_when_not_collected(spark):
    from pyspark.sql import Observation, functions as F

    seen = Observation("icemaint_test_observed")
    spark.range(5).observe(seen, F.count(F.lit(1)).alias("m0"), F.sum("id").alias("m1"), F.lit("1:2").alias("m2"),
                           F.sum(F.when(F.col("id") > 9, F.col("id"))).alias("m3"),
                           F.sum(F.col("id").cast("decimal(38,0)")).alias("m4")).collect()
    values = observed(seen, 5)
    assert values == [5, 10, "1:2", None, 10]
    assert values == [seen.get[f"m{i}"] for i in range(5)]  # pyspark's own reading of the same metrics

    # A plan that never ran the observation's node (optimised away): Spark completes it without metrics.
    skipped = Observation("icemaint_test_skipped")
    spark.range(5).observe(skipped, F.count(F.lit(1)).alias("m0")).where("false").collect()
    assert observed(skipped, 1) is None


def test_the_row_hash_tells_null_positions_and_zero_signs_apart_past_one_masks_worth_of_columns(spark):
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    from icemaint.engine.digest import row_hash_args

    # 64 longs then 2 doubles: 68 flags, two masks; the doubles' flags land in the second mask.
    schema = StructType([StructField(f"c{i}", LongType()) for i in range(64)]
                        + [StructField("x", DoubleType()), StructField("y", DoubleType())])
    base = [7] * 64 + [0.0, 1.5]

    def variant(**changes):
        row = list(base)
        for name, value in changes.items():
            row[[f.name for f in schema.fields].index(name)] = value
        return tuple(row)

    rows = [variant(), variant(c0=None, c1=7), variant(c61=None), variant(c62=None), variant(c63=None),
            variant(x=-0.0), variant(x=None), variant(y=None), variant(c63=None, y=None), variant(c62=None, x=-0.0)]
    frame = spark.createDataFrame(rows + [variant()], schema)
    hashes = [r[0] for r in frame.selectExpr(f"xxhash64(0, {row_hash_args(schema)})").collect()]
    assert len(set(hashes[:-1])) == len(rows), "rows that differ only in NULL positions or a zero's sign collided"
    assert hashes[-1] == hashes[0]  # the same row hashes alike
    args = row_hash_args(schema)
    assert args.count(" ELSE 0L END)") == 68 and args.count("THEN 1L ELSE") == 2  # every flag, in two masks
