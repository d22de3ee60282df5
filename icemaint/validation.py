"""Proof that a rewrite changed no data: Great Expectations checks comparing two snapshots of a table.

Owns `validate_rewrite` (row count, sampled row-for-row comparison, per-column aggregates) and
`full_row_hash`, both reading the snapshots by Iceberg time travel (`VERSION AS OF`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

ROW_COUNT_PARITY = "row_count_parity"
SAMPLE_COMPARISON = "sample_comparison"
COLUMN_AGGREGATES = "column_aggregates"
CHECK_NAMES = (ROW_COUNT_PARITY, SAMPLE_COMPARISON, COLUMN_AGGREGATES)

# GX's UnexpectedRowsExpectation registers the batch as a session-wide temp view with a fixed
# name ("tmp_view"): two validations on one session at once would read each other's batch.
# Public so any other GX query expectation run on the shared session can hold it too.
gx_session_lock = threading.Lock()

# Sampling is a hash of the row's content, not rand(): the same row gets the same decision in
# both snapshots whatever the file layout, so comparing the two samples is comparing each sampled
# row against the whole other snapshot.
_SAMPLE_BUCKETS = 1_000_000_000

_MAX_TEXT = 8000  # characters kept of a query, a traceback or any long string in a trimmed GX result


class ValidationError(ValueError):
    """Arguments to a rewrite validation that cannot be used (wrong types, out of range)."""


@dataclass(frozen=True)
class CheckOutcome:
    """One check of a rewrite validation.

    Attributes:
        name: 'row_count_parity', 'sample_comparison' or 'column_aggregates'.
        passed: Whether the check found the snapshots equal.
        observed: JSON-serialisable numbers and a capped list of offending rows or aggregates.
        gx_result: The GX expectation validation result (`to_json_dict()`), trimmed.
    """

    name: str
    passed: bool
    observed: dict
    gx_result: dict


@dataclass(frozen=True)
class ValidationResult:
    """The outcome of comparing the snapshot before a rewrite with the snapshot after it."""

    passed: bool
    before_snapshot_id: int
    after_snapshot_id: int
    scope: str | None
    checks: tuple[CheckOutcome, ...]
    duration_seconds: float

    def to_dict(self) -> dict:
        """A JSON-serialisable dict of the whole result (for the audit log and Dagster metadata)."""
        doc = asdict(self)
        doc["checks"] = [asdict(c) for c in self.checks]
        return doc

    def check(self, name: str) -> CheckOutcome:
        """The outcome of the check called `name`.

        Raises:
            KeyError: No check of that name ran.
        """
        for outcome in self.checks:
            if outcome.name == name:
                return outcome
        raise KeyError(f"no check named {name!r}; checks are {[c.name for c in self.checks]}")


# ---------------------------------------------------------------------------------------------
# SQL building (pure; the schema comes from Spark as a StructType)


def _snapshot_id(value: Any, what: str) -> int:
    # bool is an int subclass; a True snapshot id is a bug, not snapshot 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(
            f"{what} must be an int snapshot id, got {type(value).__name__} {value!r}"
        )
    return value


def _ident(name: str) -> str:
    """A column name from the table's own schema as a back-quoted Spark identifier."""
    # Names come from Iceberg metadata, not from users, but may be any string Iceberg allows:
    # doubling back-quotes is Spark's escape, so every name stays one identifier.
    return "`" + name.replace("`", "``") + "`"


def _string_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _contains_map(data_type) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, ArrayType):
        return _contains_map(data_type.elementType)
    if isinstance(data_type, StructType):
        return any(_contains_map(f.dataType) for f in data_type.fields)
    return False


def _comparable(field) -> str:
    """An expression equal for two values exactly when the column values are equal.

    Spark can neither group, join nor hash map values, so map-bearing columns compare as JSON.
    """
    col = _ident(field.name)
    return f"to_json({col})" if _contains_map(field.dataType) else col


def _row_hash_args(schema) -> str:
    # xxhash64 skips NULL inputs, so (NULL, 5) and (5, NULL) would hash alike: the isnull flag
    # before each value keeps the position of a NULL in the hash.
    return ", ".join(f"isnull({_ident(f.name)}), {_comparable(f)}" for f in schema.fields)


def _snapshot_sql(table_sql: str, snapshot_id: int, scope: str | None) -> str:
    where = f" WHERE ({scope})" if scope else ""
    return f"SELECT * FROM {table_sql} VERSION AS OF {snapshot_id}{where}"


def _sample_predicate(schema, sample_fraction: float, seed: int) -> str:
    if sample_fraction >= 1.0:
        return "TRUE"
    threshold = math.ceil(sample_fraction * _SAMPLE_BUCKETS)
    return (f"pmod(xxhash64({seed}, {_row_hash_args(schema)}), {_SAMPLE_BUCKETS}) "
            f"< {threshold}")


def _row_json(schema) -> str:
    # Display only: nulls kept and microseconds shown so the reported row is the stored row.
    return ("to_json(struct(" + ", ".join(_ident(f.name) for f in schema.fields) + "), "
            "map('ignoreNullFields', 'false', "
            "'timestampFormat', 'yyyy-MM-dd\\'T\\'HH:mm:ss.SSSSSSXXX'))")


def sample_comparison_query(before_sql: str, schema, sample_fraction: float, seed: int) -> str:
    """The GX unexpected-rows query: sampled rows whose multiplicity differs between snapshots.

    `{batch}` is the after snapshot. Rows are grouped on every column (GROUP BY treats NULLs as
    equal, so the comparison is null-safe) over the union of both samples; a row group whose count
    differs is a row missing in the after snapshot, or one that appeared there. A changed row shows
    up in both directions. Comparing counts, not an anti-join, also catches a dropped duplicate.
    """
    keys = ", ".join(f"{_comparable(f)} AS k{i}" for i, f in enumerate(schema.fields))
    group = ", ".join(f"k{i}" for i in range(len(schema.fields)))
    pred = _sample_predicate(schema, sample_fraction, seed)
    row = _row_json(schema)
    return (
        "SELECT CASE WHEN sum(in_before) > sum(in_after) THEN 'missing_in_after' "
        "ELSE 'unexpected_in_after' END AS direction, "
        "sum(in_before) AS before_count, sum(in_after) AS after_count, first(row) AS row "
        "FROM ("
        f"SELECT {keys}, {row} AS row, 1 AS in_before, 0 AS in_after "
        f"FROM ({before_sql}) WHERE {pred} "
        "UNION ALL "
        f"SELECT {keys}, {row} AS row, 0 AS in_before, 1 AS in_after "
        f"FROM {{batch}} WHERE {pred}"
        f") GROUP BY {group} HAVING sum(in_before) <> sum(in_after) "
        "ORDER BY row, direction"
    )


def column_aggregates(schema) -> list[tuple[str, str, str]]:
    """(column, aggregate name, Spark SQL aggregate expression rendering a string) per aggregate.

    Every column: non-null count and an order-independent hash sum. Orderable atomic columns: min
    and max. Exact numerics (integers, decimals): the sum. Float sums are left out on purpose: a
    float sum depends on the order of addition, which a rewrite changes; the hash sum covers them.
    """
    from pyspark.sql.types import (
        AtomicType, BinaryType, ByteType, DecimalType, IntegerType, LongType, ShortType,
    )

    out = []
    for field in schema.fields:
        col, dtype = _ident(field.name), field.dataType
        out.append((field.name, "non_null_count", f"CAST(count({col}) AS STRING)"))
        if isinstance(dtype, BinaryType):
            out.append((field.name, "min", f"hex(min({col}))"))
            out.append((field.name, "max", f"hex(max({col}))"))
        elif isinstance(dtype, AtomicType):
            out.append((field.name, "min", f"CAST(min({col}) AS STRING)"))
            out.append((field.name, "max", f"CAST(max({col}) AS STRING)"))
        if isinstance(dtype, (ByteType, ShortType, IntegerType, LongType)):
            # decimal(38,0) holds any sum of up to 10^19 longs: no silent wrap-around.
            out.append((field.name, "sum",
                        f"CAST(sum(CAST({col} AS DECIMAL(38,0))) AS STRING)"))
        elif isinstance(dtype, DecimalType):
            out.append((field.name, "sum", f"CAST(sum({col}) AS STRING)"))
        out.append((field.name, "hash_sum",
                    f"CAST(sum(CAST(xxhash64({_comparable(field)}) AS DECIMAL(38,0))) AS STRING)"))
    return out


def column_aggregates_query(before_sql: str, schema) -> str:
    """The GX unexpected-rows query: one row per aggregate whose before and after values differ."""
    aggs = column_aggregates(schema)
    select = ", ".join(f"{expr} AS a{i}" for i, (_, _, expr) in enumerate(aggs))
    stack = ", ".join(
        f"{i}, {_string_literal(column)}, {_string_literal(metric)}, a{i}"
        for i, (column, metric, _) in enumerate(aggs)
    )

    def side(source: str) -> str:
        return (f"SELECT stack({len(aggs)}, {stack}) AS (i, column_name, aggregate, value) "
                f"FROM (SELECT {select} FROM {source})")

    return (
        "SELECT b.column_name, b.aggregate, b.value AS before_value, a.value AS after_value "
        f"FROM ({side('(' + before_sql + ')')}) b JOIN ({side('{batch}')}) a ON b.i = a.i "
        "WHERE NOT (b.value <=> a.value) ORDER BY b.i"
    )


def _gx_query(sql: str) -> str:
    """Escape braces for GX, which runs `str.format(batch=...)` on the query, keeping `{batch}`."""
    marker = "\x00BATCH\x00"
    return sql.replace("{batch}", marker).replace("{", "{{").replace("}", "}}").replace(
        marker, "{batch}")


# ---------------------------------------------------------------------------------------------
# GX results


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _trim(value: Any, max_rows: int) -> Any:
    if isinstance(value, dict):
        return {k: _trim(v, max_rows) for k, v in value.items()}
    if isinstance(value, list):
        return [_trim(v, max_rows) for v in value[:max_rows]]
    if isinstance(value, str) and len(value) > _MAX_TEXT:
        return value[:_MAX_TEXT] + f"... [{len(value) - _MAX_TEXT} more characters]"
    return value


def _gx_error(result_doc: dict) -> str | None:
    for info in (result_doc.get("exception_info") or {}).values():
        if isinstance(info, dict) and info.get("raised_exception"):
            return str(info.get("exception_message", ""))[:_MAX_TEXT]
    info = result_doc.get("exception_info") or {}
    if info.get("raised_exception"):
        return str(info.get("exception_message", ""))[:_MAX_TEXT]
    return None


def _run_suite(spark, after_df, expectations, parameters: dict) -> dict[str, dict]:
    """Runs the expectations on `after_df` with GX; returns each result's JSON dict by check name."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_spark("icemaint_rewrite_validation", persist=False)
    batch_definition = source.add_dataframe_asset("after_snapshot") \
        .add_batch_definition_whole_dataframe("whole_snapshot")
    suite = gx.ExpectationSuite(name="rewrite_changed_no_data", expectations=expectations)
    batch = batch_definition.get_batch(batch_parameters={"dataframe": after_df})
    result = batch.validate(suite, result_format="COMPLETE", expectation_parameters=parameters)
    return {r.expectation_config.meta["check"]: _jsonable(r.to_json_dict())
            for r in result.results}


# ---------------------------------------------------------------------------------------------
# Public API


def validate_rewrite(spark, table_sql: str, before_snapshot_id: int, after_snapshot_id: int,
                     scope: str | None = None, *, sample_fraction: float = 0.05, seed: int = 0,
                     max_reported_rows: int = 20) -> ValidationResult:
    """Proves with Great Expectations that the after snapshot holds the same rows as the before one.

    Three checks always run, on the rows of both snapshots selected by `scope`:
    `row_count_parity` (same row count), `sample_comparison` (a seeded, content-hashed sample of
    rows compared row for row, with multiplicity, null-safely, in both directions) and
    `column_aggregates` (per column: non-null count, min, max, exact sum of integers/decimals and
    an order-independent hash sum). A failing check does not stop the others.

    Validations are serialised within the process: GX's unexpected-rows query reads the batch
    through one fixed temp view name on the session.

    Args:
        spark: The SparkSession with the table's catalog.
        table_sql: The back-quoted table identifier, from `TableName.sql(catalog)`.
        before_snapshot_id: The snapshot the rewrite started from.
        after_snapshot_id: The snapshot the rewrite committed.
        scope: A Spark SQL predicate limiting both snapshots to the rewritten rows, e.g.
            "ts >= TIMESTAMP '2026-01-02 00:00:00' AND ts < TIMESTAMP '2026-01-03 00:00:00'".
            It is pasted into SQL as is: it must be built by icemaint from validated values and
            never be user text.
        sample_fraction: Share of rows compared row for row, in (0, 1]; 1.0 compares every row.
        seed: Chooses which rows the sample holds (the sample is a hash of the row's content).
        max_reported_rows: Cap on offending rows or aggregates listed in each check's results.

    Returns:
        A ValidationResult whose `passed` is true only if all three checks passed.

    Raises:
        ValidationError: A snapshot id that is not an int, or an out-of-range argument.
    """
    started = time.monotonic()
    before = _snapshot_id(before_snapshot_id, "before_snapshot_id")
    after = _snapshot_id(after_snapshot_id, "after_snapshot_id")
    if not isinstance(table_sql, str) or not table_sql.startswith("`"):
        raise ValidationError(f"table_sql must be a back-quoted identifier from TableName.sql, "
                              f"got {table_sql!r}")
    if scope is not None and (not isinstance(scope, str) or not scope.strip()):
        raise ValidationError(f"scope must be a non-empty SQL predicate or None, got {scope!r}")
    if isinstance(sample_fraction, bool) or not isinstance(sample_fraction, (int, float)) \
            or not 0.0 < sample_fraction <= 1.0:
        raise ValidationError(f"sample_fraction must be in (0, 1], got {sample_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not -2**31 <= seed < 2**31:
        raise ValidationError(f"seed must be a 32-bit int, got {seed!r}")
    if isinstance(max_reported_rows, bool) or not isinstance(max_reported_rows, int) \
            or max_reported_rows < 0:
        raise ValidationError(f"max_reported_rows must be an int >= 0, got {max_reported_rows!r}")

    import great_expectations as gx

    before_sql = _snapshot_sql(table_sql, before, scope)
    # Never cache these frames (persist/cache): Spark's cache manager matches Iceberg relations
    # without their snapshot id, so a cached `VERSION AS OF <before>` answers the after query
    # too and the proof compares a snapshot with itself (measured: every check then passes).
    after_df = spark.sql(_snapshot_sql(table_sql, after, scope))
    before_df = spark.sql(before_sql)
    schema = before_df.schema
    if [f.name for f in schema.fields] != [f.name for f in after_df.schema.fields]:
        # A rewrite never changes the schema; differing columns is itself a failed proof, but the
        # row comparison cannot be expressed over two shapes: stop with the two column lists.
        raise ValidationError(
            f"snapshots {before} and {after} of {table_sql} have different columns: "
            f"{[f.name for f in schema.fields]} vs {[f.name for f in after_df.schema.fields]}")

    sample_pred = _sample_predicate(schema, sample_fraction, seed)
    before_counts = spark.sql(
        f"SELECT count(*) AS n, count_if({sample_pred}) AS sampled FROM ({before_sql})").first()
    after_sampled = spark.sql(
        f"SELECT count_if({sample_pred}) AS sampled FROM ({_snapshot_sql(table_sql, after, scope)})"
    ).first()["sampled"]
    aggregates = column_aggregates(schema)

    expectations = [
        gx.expectations.ExpectTableRowCountToEqual(
            value={"$PARAMETER": "before_row_count"}, meta={"check": ROW_COUNT_PARITY}),
        gx.expectations.UnexpectedRowsExpectation(
            unexpected_rows_query=_gx_query(
                sample_comparison_query(before_sql, schema, sample_fraction, seed)),
            meta={"check": SAMPLE_COMPARISON}),
        gx.expectations.UnexpectedRowsExpectation(
            unexpected_rows_query=_gx_query(column_aggregates_query(before_sql, schema)),
            meta={"check": COLUMN_AGGREGATES}),
    ]
    with gx_session_lock:
        results = _run_suite(spark, after_df, expectations,
                             {"before_row_count": int(before_counts["n"])})

    checks = []
    for name in CHECK_NAMES:
        doc = results.get(name, {})
        passed = bool(doc.get("success"))
        result = doc.get("result") or {}
        error = _gx_error(doc)
        if name == ROW_COUNT_PARITY:
            observed = {"before_row_count": int(before_counts["n"]),
                        "after_row_count": result.get("observed_value")}
        else:
            rows = (result.get("details") or {}).get("unexpected_rows") or []
            observed = {"differences": result.get("observed_value")}
            if name == SAMPLE_COMPARISON:
                # the direction counts cover the rows GX lists (its cap is 200); "differences"
                # is the exact number of differing row groups
                observed.update({
                    "sample_fraction": float(sample_fraction), "seed": seed,
                    "sampled_before_rows": int(before_counts["sampled"]),
                    "sampled_after_rows": int(after_sampled),
                    "missing_in_after": sum(r["direction"] == "missing_in_after" for r in rows),
                    "unexpected_in_after": sum(
                        r["direction"] == "unexpected_in_after" for r in rows),
                    "rows": rows[:max_reported_rows],
                })
            else:
                observed.update({"aggregates_compared": len(aggregates),
                                 "columns_compared": len(schema.fields),
                                 "differing_aggregates": rows[:max_reported_rows]})
        if error is not None:
            passed = False
            observed["error"] = error
        checks.append(CheckOutcome(name=name, passed=passed, observed=_jsonable(observed),
                                   gx_result=_trim(doc, max_reported_rows)))

    return ValidationResult(
        passed=all(c.passed for c in checks),
        before_snapshot_id=before,
        after_snapshot_id=after,
        scope=scope,
        checks=tuple(checks),
        duration_seconds=round(time.monotonic() - started, 3),
    )


def full_row_hash(spark, table_sql: str, snapshot_id: int, scope: str | None = None
                  ) -> tuple[int, int]:
    """Row count and an order-independent hash of every row of one snapshot.

    Two snapshots with equal results hold the same multiset of rows (up to 64-bit hash
    collisions); file layout and row order do not matter.

    Args:
        spark: The SparkSession with the table's catalog.
        table_sql: The back-quoted table identifier, from `TableName.sql(catalog)`.
        snapshot_id: The snapshot to read.
        scope: Optional predicate built by icemaint (never user text), as in `validate_rewrite`.

    Returns:
        (row count, sum of 64-bit row hashes as an exact integer).
    """
    snapshot = _snapshot_id(snapshot_id, "snapshot_id")
    source = _snapshot_sql(table_sql, snapshot, scope)
    schema = spark.sql(source).schema
    row = spark.sql(
        f"SELECT count(*) AS n, sum(CAST(xxhash64({_row_hash_args(schema)}) AS DECIMAL(38,0))) "
        f"AS h FROM ({source})").first()
    return int(row["n"]), int(row["h"] or 0)
