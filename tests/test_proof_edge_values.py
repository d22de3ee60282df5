"""The rewrite proof on edge values: the same rows in another physical layout always pass, and each
real difference fails.

Edge values: 0.0 and -0.0 (as min and as max of a column, where min/max return whichever zero they
meet first), NaN (Spark writes every NaN as the canonical 0x7ff8... NaN through Parquet, so NaN
payloads cannot differ on disk: both `CAST('NaN' AS DOUBLE)` and its negation are used anyway),
+-Infinity, the largest and smallest doubles and floats (several rows tying at the float min and
max), subnormals, `timestamp_ntz` down to the microsecond, `decimal(38,10)` at full precision,
empty strings vs NULL, and a row held twice.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest

from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.engine.validation import COLUMN_AGGREGATES, SAMPLE_COMPARISON, full_row_hash, validate_rewrite

from conftest import current_snapshot

COLUMNS = ("id INT, d DOUBLE, f FLOAT, dz DOUBLE, fz FLOAT, ts TIMESTAMP_NTZ, dec DECIMAL(38,10), s STRING")


def _d(text: str) -> str:
    return f"CAST('{text}' AS DOUBLE)"


def _f(text: str) -> str:
    return f"CAST('{text}' AS FLOAT)"


NULL = "NULL"
# Each column cycles through its own list; the lengths are pairwise coprime-ish so rows differ.
D_VALUES = [_d("NaN"), f"-{_d('NaN')}", _d("-0.0"), _d("0.0"), _d("Infinity"), _d("-Infinity"),
            _d("1.7976931348623157E308"), _d("-1.7976931348623157E308"), _d("4.9E-324"), NULL, _d("1.5")]
F_VALUES = [_f("3.4028235E38"), _f("-3.4028235E38"), _f("-0.0"), _f("0.0"), _f("3.4028235E38"),
            _f("1.4E-45"), _f("-3.4028235E38"), NULL, _f("2.5")]
DZ_VALUES = [_d("0.0"), _d("-0.0"), _d("1.5"), NULL, _d("-0.0")]  # min ties between 0.0 and -0.0
FZ_VALUES = [_f("-0.0"), _f("-1.5"), _f("0.0"), NULL]  # max ties between -0.0 and 0.0
TS_VALUES = ["TIMESTAMP_NTZ '2026-01-02 03:04:05.123456'", "TIMESTAMP_NTZ '2026-01-02 03:04:05.123457'",
             "TIMESTAMP_NTZ '1900-01-01 00:00:00.000001'", "TIMESTAMP_NTZ '9999-12-31 23:59:59.999999'",
             "TIMESTAMP_NTZ '1970-01-01 00:00:00'", NULL, "TIMESTAMP_NTZ '2026-01-02 00:00:00'"]
DEC_VALUES = ["CAST('9999999999999999999999999999.9999999999' AS DECIMAL(38,10))",
              "CAST('-9999999999999999999999999999.9999999999' AS DECIMAL(38,10))",
              "CAST('0.0000000001' AS DECIMAL(38,10))", "CAST('-0.0000000001' AS DECIMAL(38,10))",
              "CAST('0' AS DECIMAL(38,10))", NULL,
              "CAST('1234567890123456789012345678.0123456789' AS DECIMAL(38,10))",
              "CAST('1234567890123456789012345678.0123456788' AS DECIMAL(38,10))"]
S_VALUES = ["''", NULL, "' '", "'a'", "'NULL'", "''", "'it\\'s'"]

ROWS = 40

COLS = ("id", "d", "f", "dz", "fz", "ts", "dec", "s")


def replace_column(src: str, column: str, expr: str) -> str:
    return "SELECT " + ", ".join(f"{expr} AS {c}" if c == column else c for c in COLS) + f" FROM {src}"



def edge_rows() -> list[str]:
    """SQL VALUES tuples; the last row repeats row 0 exactly (a row held twice)."""
    out = []
    for i in range(ROWS - 1):
        out.append("(" + ", ".join([
            str(i), D_VALUES[i % len(D_VALUES)], F_VALUES[i % len(F_VALUES)], DZ_VALUES[i % len(DZ_VALUES)],
            FZ_VALUES[i % len(FZ_VALUES)], TS_VALUES[i % len(TS_VALUES)], DEC_VALUES[i % len(DEC_VALUES)],
            S_VALUES[i % len(S_VALUES)]]) + ")")
    out.append(out[0])
    return out


def create_edge_table(spark, config, table: str) -> tuple[str, int]:
    """The edge rows written by one INSERT (one file); returns (table sql, snapshot)."""
    sql = TableName.parse(table).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} ({COLUMNS}) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.distribution-mode'='none')")
    spark.sql(f"INSERT INTO {sql} VALUES {', '.join(edge_rows())}")
    return sql, current_snapshot(spark, sql)


@dataclass(frozen=True)
class EdgeTable:
    """The module's one table of edge rows: `base` is the snapshot the INSERT wrote. Each test overwrites the
    table with its own `after` computed from `base` (`VERSION AS OF`), so the tests share the table, not a state."""
    sql: str
    base: int
    base_layout: tuple
    base_rows: Counter


@pytest.fixture(scope="module")
def edge_table(spark, config) -> EdgeTable:
    sql, base = create_edge_table(spark, config, f"t.edge_values_{uuid.uuid4().hex[:8]}")
    return EdgeTable(sql, base, *layout_and_rows(spark, sql, base))


def overwrite(spark, sql: str, select: str) -> int:
    spark.sql(f"INSERT OVERWRITE {sql} {select}")
    return current_snapshot(spark, sql)


def relayout_sql(sql: str, base: int, i: int) -> str:
    """The same rows as `base`, in the i-th physical layout (other order, other file split)."""
    src = f"(SELECT * FROM {sql} VERSION AS OF {base})"
    k = 2 + (i // 5) % 4  # an explicit partition count: adaptive execution does not coalesce it
    return [
        f"SELECT * FROM (SELECT /*+ REPARTITION({k}) */ * FROM {src}) SORT BY rand({i})",
        f"SELECT /*+ REPARTITION({k}) */ * FROM {src}",
        f"SELECT * FROM (SELECT /*+ REPARTITION({k}, id) */ * FROM {src}) SORT BY dz DESC, fz, rand({i})",
        f"SELECT * FROM {src} ORDER BY dz, fz DESC, f DESC, id DESC",
        f"SELECT * FROM (SELECT /*+ REPARTITION_BY_RANGE({k}, d) */ * FROM {src}) SORT BY rand({i})",
    ][i % 5]


# The layouts proved (indices into relayout_sql): each randomised form, each partition count 2-5 among them, the
# shuffled form once more, and the deterministic ORDER BY once (a second one would write the same layout again).
# Every layout holds every edge row, so each edge value meets each layout.
LAYOUTS = (0, 6, 12, 19, 15, 3)


def layout_and_rows(spark, sql: str, snapshot: int) -> tuple[tuple[tuple[int, ...], ...], Counter]:
    """One read of the snapshot: its physical layout (the ids of each data file in file position order) and its
    rows as text, with multiplicity, an independent check of what the table holds (CAST AS STRING keeps the sign
    of a zero and every decimal digit)."""
    text = ", ".join(f"coalesce(CAST({c} AS STRING), '<null>')" for c in COLS)
    rows = spark.sql(f"SELECT _file, _pos, id, {text} FROM {sql} VERSION AS OF {snapshot}").collect()
    files: dict[str, list] = {}
    for r in rows:
        files.setdefault(r[0], []).append((r[1], r[2]))
    shape = tuple(sorted(tuple(i for _, i in sorted(v)) for v in files.values()))
    return shape, Counter(tuple(r[3:]) for r in rows)


def stored_rows(spark, sql: str, snapshot: int) -> Counter:
    return layout_and_rows(spark, sql, snapshot)[1]


def failed_checks(result) -> dict:
    return {c.name: c.observed for c in result.checks if not c.passed}


# --------------------------------------------------------------------------------------------------
# the same rows in other layouts: never a spurious failure


def test_other_layouts_of_the_same_edge_rows_all_pass(spark, edge_table):
    sql, base, base_layout, base_rows = edge_table.sql, edge_table.base, edge_table.base_layout, edge_table.base_rows
    assert sum(base_rows.values()) == ROWS and max(base_rows.values()) == 2
    # the edge values are what the table holds (the zeros keep their sign; NaN is read back as NaN)
    signs = spark.sql(f"SELECT count_if(CAST(dz AS STRING) = '-0.0'), count_if(CAST(dz AS STRING) = '0.0'), "
                      f"count_if(isnan(d)) FROM {sql} VERSION AS OF {base}").first()
    assert signs[0] > 0 and signs[1] > 0 and signs[2] > 0, signs
    layouts, spurious = set(), []
    for i in LAYOUTS:
        after = overwrite(spark, sql, relayout_sql(sql, base, i))
        shape, rows = layout_and_rows(spark, sql, after)
        assert shape != base_layout, f"layout {i} is not a different physical layout"
        layouts.add(shape)
        # independent of the proof: the same multiset of rows, zeros' signs included
        assert rows == base_rows
        result = validate_rewrite(spark, sql, base, after, sample_fraction=1.0, seed=i)
        if not result.passed:
            spurious.append((i, relayout_sql(sql, base, i), failed_checks(result)))
    assert not spurious, json.dumps(spurious, indent=1, default=str)[:6000]
    assert len(layouts) >= len(LAYOUTS) - 2, f"only {len(layouts)} distinct layouts in {len(LAYOUTS)} runs"
    assert len({len(s) for s in layouts}) >= 3, "layouts should differ in how many files they split into"


# --------------------------------------------------------------------------------------------------
# each real difference fails


def _differs(spark, edge_table: EdgeTable, make_after) -> tuple:
    sql, base = edge_table.sql, edge_table.base
    after = overwrite(spark, sql, make_after(f"(SELECT * FROM {sql} VERSION AS OF {base})"))
    assert stored_rows(spark, sql, after) != edge_table.base_rows, "the fault did not change the rows"
    return validate_rewrite(spark, sql, base, after, sample_fraction=1.0), sql, base, after


CHANGED_VALUE = {
    # the last of 38 decimal digits
    "decimal_last_digit": ("dec", "CASE WHEN id = 6 THEN dec + CAST('0.0000000001' AS DECIMAL(38,10)) ELSE dec END"),
    "timestamp_ntz_one_microsecond": ("ts", "CASE WHEN id = 0 THEN ts + INTERVAL 1 MICROSECOND ELSE ts END"),
    "empty_string_to_null": ("s", "CASE WHEN id = 0 THEN NULL ELSE s END"),
    "null_to_empty_string": ("s", "CASE WHEN id = 1 THEN '' ELSE s END"),
    "float_max_to_next_lower": ("f", "CASE WHEN id = 0 THEN CAST('3.4028233E38' AS FLOAT) ELSE f END"),
    "nan_to_infinity": ("d", "CASE WHEN id = 0 THEN CAST('Infinity' AS DOUBLE) ELSE d END"),
}


@pytest.mark.parametrize("case", sorted(CHANGED_VALUE))
def test_one_changed_value_fails(spark, edge_table, case):
    column, expr = CHANGED_VALUE[case]
    result, *_ = _differs(spark, edge_table, lambda src: replace_column(src, column, expr))
    assert not result.passed
    assert result.check("row_count_parity").passed
    failed = failed_checks(result)
    assert SAMPLE_COMPARISON in failed and COLUMN_AGGREGATES in failed, failed
    assert failed[SAMPLE_COMPARISON]["missing_in_after"] == 1
    assert failed[SAMPLE_COMPARISON]["unexpected_in_after"] == 1


def test_two_values_swapped_between_rows_fails(spark, edge_table):
    # rows 6 and 7 hold decimals differing in the last of their 38 digits; swapping the two values
    # between the rows keeps every per-column aggregate equal: only whole rows tell.
    swap = ("CASE WHEN id = 6 THEN (SELECT dec FROM src WHERE id = 7) "
            "WHEN id = 7 THEN (SELECT dec FROM src WHERE id = 6) ELSE dec END")

    def make_after(src):
        return f"WITH src AS {src} " + replace_column("src", "dec", swap)

    result, *_ = _differs(spark, edge_table, make_after)
    assert not result.passed
    failed = failed_checks(result)
    assert SAMPLE_COMPARISON in failed, failed
    assert failed[SAMPLE_COMPARISON]["missing_in_after"] == 2
    assert failed[SAMPLE_COMPARISON]["unexpected_in_after"] == 2
    differing = {(a["column_name"], a["aggregate"])
                 for a in failed.get(COLUMN_AGGREGATES, {}).get("differing_aggregates", [])}
    assert ("*", "hash_sum") in differing, failed
    assert not {c for c, _ in differing} - {"*"}, f"per-column aggregates should be unchanged by a swap: {differing}"


def test_one_row_duplicated_and_another_dropped_fails(spark, edge_table):
    def make_after(src):
        return f"WITH src AS {src} SELECT * FROM src WHERE id <> 3 UNION ALL SELECT * FROM src WHERE id = 4"

    result, *_ = _differs(spark, edge_table, make_after)
    assert not result.passed
    assert result.check("row_count_parity").passed  # same row count: only content tells
    failed = failed_checks(result)
    assert SAMPLE_COMPARISON in failed and COLUMN_AGGREGATES in failed, failed
    assert failed[SAMPLE_COMPARISON]["missing_in_after"] == 1
    assert failed[SAMPLE_COMPARISON]["unexpected_in_after"] == 1


def test_negative_zero_turned_positive_fails(spark, edge_table):
    """-0.0 and 0.0 are different stored values (CAST AS STRING and 1/x in Java tell them apart): a
    rewrite flipping the sign of a zero changed the data."""
    result, *_ = _differs(spark, edge_table,
                          lambda src: replace_column(src, "dz", "CASE WHEN id = 1 THEN abs(dz) ELSE dz END"))
    assert not result.passed, "a zero whose sign flipped passed the proof"


# --------------------------------------------------------------------------------------------------
# end to end: a staged compaction of a timestamp_ntz day partition holding the edge values


def test_compaction_of_a_timestamp_ntz_day_partition_keeps_edge_rows(spark, config, table_name):
    date = "2026-01-02"
    sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts_ntz TIMESTAMP_NTZ, d DOUBLE, f FLOAT, dz DOUBLE, "
              "dec DECIMAL(38,10), s STRING) USING iceberg PARTITIONED BY (days(ts_ntz)) "
              "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')")
    for batch in range(6):  # one small file per day per batch
        values = []
        for j in range(8):
            i = batch * 100 + j
            day = "2026-01-02" if j % 4 else "2026-01-03"  # batch 0's 2026-01-03 row sits at its midnight
            clock = {1: "00:00:00", 3: "23:59:59.999999"}.get(j, f"{j:02d}:{batch:02d}:00.{i:06d}")
            values.append(f"({i}, TIMESTAMP_NTZ '{day} {clock}', {D_VALUES[i % len(D_VALUES)]}, "
                          f"{F_VALUES[i % len(F_VALUES)]}, {DZ_VALUES[i % len(DZ_VALUES)]}, "
                          f"{DEC_VALUES[i % len(DEC_VALUES)]}, {S_VALUES[i % len(S_VALUES)]})")
        spark.sql(f"INSERT INTO {sql} VALUES {', '.join(values)}")
    spark.sql(f"DELETE FROM {sql} WHERE id = 202")  # a position delete on the date, applied by the rewrite
    before = current_snapshot(spark, sql)
    scope = f"ts_ntz >= TIMESTAMP_NTZ '{date} 00:00:00' AND ts_ntz < TIMESTAMP_NTZ '2026-01-03 00:00:00'"
    before_hash, before_scoped = full_row_hash(spark, sql, before), full_row_hash(spark, sql, before, scope)
    health = CatalogReader(config).health(table_name)
    assert health.time_column == "ts_ntz" and health.time_column_type == "timestamp"
    assert health.partition(date).data_files == 6

    outcome = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config)).run(
        CompactionRequest(table_name, date))

    assert outcome.decision == "run", outcome.reason
    assert outcome.published and outcome.validation.passed is True
    after = current_snapshot(spark, sql)
    assert after == outcome.after_snapshot_id != before
    assert outcome.rewritten_files == 6 and outcome.files_after == 1 and outcome.removed_delete_files == 1
    assert full_row_hash(spark, sql, after) == before_hash
    assert full_row_hash(spark, sql, after, scope) == before_scoped and before_scoped[0] == 6 * 6 - 1
    # the other day's files were not touched
    other = f"SELECT file_path FROM {sql}.files VERSION AS OF %d WHERE partition.ts_ntz_day = DATE '2026-01-03'"
    assert {r[0] for r in spark.sql(other % before).collect()} == {r[0] for r in spark.sql(other % after).collect()}
    # the signs of zeros survived the rewrite
    signs = (f"SELECT count_if(CAST(dz AS STRING) = '-0.0'), count_if(CAST(dz AS STRING) = '0.0') "
             f"FROM {sql} VERSION AS OF %d")
    assert spark.sql(signs % after).first() == spark.sql(signs % before).first()
