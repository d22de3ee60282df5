"""Proof that a rewrite changed no data: Great Expectations checks comparing two snapshots of a table.

Owns `validate_rewrite`, `prove_rows` and `full_row_hash`. Each side's scoped rows are read once by Spark
(`icemaint.engine.digest.rows_digest`: row count, a whole-row hash sum over every value of every row,
NULL positions included, and the fingerprints of a content-hashed sample), or, for a staged bin-pack, the
old side is digested by the read that fed the rewrite (`digest.digest_feed`); Great Expectations then
proves equality with its own expectations:

- row_count_parity: `ExpectColumnPairValuesToBeEqual` over the two sides' row counts, each counted by the
  side's one read (GX counting the after snapshot again was a Spark job whose answer the digest already held);
- sample_comparison: `ExpectColumnPairValuesToBeEqual` over every sampled row's multiplicity in the
  two snapshots (rows keyed by a 128-bit content fingerprint; a changed row appears in both
  directions, a dropped duplicate as a lower count);
- column_aggregates: `ExpectColumnPairValuesToBeEqual` over every aggregate's before/after value;
- read_completeness (fed old side only): `ExpectColumnPairValuesToBeEqual` over the planned files' rows
  and file-weighted hash sum (from their manifests) against what the feeding read counted.

Only on failure are both sides read again, with each column's hash sum, min, max and exact sum so the
report names the columns that differ, and the offending sampled rows read back and reported as JSON.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import pandas as pd

from icemaint.engine.long_lived import freeze_loaded
from icemaint.engine.digest import (
    FedRows, SnapshotDigest, expected_file_hash_sum, row_hash_args, rows_digest, sampled_rows, snapshot_sql,
)
from icemaint.errors import UserError, one_line

ROW_COUNT_PARITY = "row_count_parity"
SAMPLE_COMPARISON = "sample_comparison"
COLUMN_AGGREGATES = "column_aggregates"
READ_COMPLETENESS = "read_completeness"  # only when the old side was digested by the read that fed the rewrite
CHECK_NAMES = (ROW_COUNT_PARITY, SAMPLE_COMPARISON, COLUMN_AGGREGATES)

_MAX_TEXT = 8000  # characters kept of a query, a traceback or any long string in a trimmed GX result


class ValidationError(UserError, ValueError):
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
    reads: dict = field(default_factory=dict)  # {"before"|"after": SnapshotDigest.read}: the one read of each
    error: str | None = None  # the proof could not run (and so failed): why

    @classmethod
    def could_not_run(cls, before_snapshot_id: int, after_snapshot_id: int, scope: str | None,
                      exc: BaseException) -> ValidationResult:
        """A proof that could not run proves nothing: failed, saying why."""
        return cls(passed=False, before_snapshot_id=before_snapshot_id, after_snapshot_id=after_snapshot_id,
                   scope=scope, checks=(), duration_seconds=0.0,
                   error=f"the proof could not run: {type(exc).__name__}: {one_line(exc, 500)}")

    def to_dict(self) -> dict:
        """A JSON-serialisable dict of the whole result (for the audit log and Dagster metadata)."""
        doc = asdict(self)
        doc["checks"] = [asdict(c) for c in self.checks]
        if self.error is None:
            del doc["error"]
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


def _snapshot_id(value: Any, what: str) -> int:
    # bool is an int subclass; a True snapshot id is a bug, not snapshot 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(
            f"{what} must be an int snapshot id, got {type(value).__name__} {value!r}"
        )
    return value


def sample_multiplicities(before: SnapshotDigest, after: SnapshotDigest) -> pd.DataFrame:
    """One row per distinct sampled fingerprint: how many times each snapshot holds it."""
    def counts(digest: SnapshotDigest, name: str) -> pd.Series:
        return digest.sample.groupby(["fp1", "fp2"]).size().rename(name)

    frame = pd.concat([counts(before, "before_count"), counts(after, "after_count")], axis=1)
    frame = frame.fillna(0).astype("int64").reset_index()
    return frame.sort_values(["fp1", "fp2"], kind="stable").reset_index(drop=True)


def digests_agree(before: SnapshotDigest, after: SnapshotDigest) -> bool:
    """Whether two digests hold the same row count, sampled rows (with multiplicity) and aggregates."""
    if before.row_count != after.row_count or before.aggregates != after.aggregates:
        return False
    samples = sample_multiplicities(before, after)
    return bool((samples["before_count"] == samples["after_count"]).all())


def aggregate_pairs(before: SnapshotDigest, after: SnapshotDigest) -> pd.DataFrame:
    """One row per compared aggregate with its before and after value (exact, as strings)."""
    keys = list(before.aggregates)
    return pd.DataFrame({
        "column_name": [c for c, _ in keys],
        "aggregate": [a for _, a in keys],
        "before_value": [before.aggregates[k] for k in keys],
        "after_value": [after.aggregates.get(k) for k in keys],
    }, dtype=object)


class _Suite:
    """GX's ephemeral context with the proof's four batch definitions, made once per process.

    A batch definition takes its dataframe at `get_batch`, so the context, its two data sources and their
    assets serve every proof: making them anew cost each proof about as much as GX's own checks. GX's
    context is not thread-safe, so proofs run through it one at a time (`_SUITE_LOCK`).
    """

    def __init__(self):
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.gx = gx
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        frames = context.data_sources.add_pandas("icemaint_snapshot_comparison")
        assets = {
            ROW_COUNT_PARITY: frames.add_dataframe_asset("row_counts"),
            SAMPLE_COMPARISON: frames.add_dataframe_asset("sampled_row_multiplicities"),
            COLUMN_AGGREGATES: frames.add_dataframe_asset("column_aggregates"),
            READ_COMPLETENESS: frames.add_dataframe_asset("planned_against_read"),
        }
        self.definitions = {name: asset.add_batch_definition_whole_dataframe("whole") for name, asset in assets.items()}
        freeze_loaded("gx")  # GX's modules and this context live as long as the process

    def validate(self, name: str, dataframe, expectation) -> dict:
        batch = self.definitions[name].get_batch(batch_parameters={"dataframe": dataframe})
        return _jsonable(batch.validate(expectation, result_format="SUMMARY").to_json_dict())


_SUITE: _Suite | None = None
_SUITE_LOCK = threading.Lock()
_IMPORTING: threading.Thread | None = None


def import_in_background() -> None:
    """Imports Great Expectations (seconds of module loading) in a daemon thread, once per process: called as a
    run is about to start its JVM, so the first proof finds GX loaded instead of loading it after the rewrite.
    Modules only: GX's context is made by the first proof, on the Spark session that exists by then."""
    global _IMPORTING
    if _IMPORTING is None and "great_expectations" not in sys.modules:
        _IMPORTING = threading.Thread(target=_import_gx, name="icemaint-import-gx", daemon=True)
        _IMPORTING.start()


def _import_gx() -> None:
    try:
        import great_expectations  # noqa: F401
        from great_expectations.data_context.types.base import ProgressBarsConfig  # noqa: F401
    except Exception:  # the proof imports it again and reports what fails there
        pass


def row_counts(before: SnapshotDigest, after: SnapshotDigest) -> pd.DataFrame:
    """The two sides' row counts, one row, as each side's one read counted them."""
    return pd.DataFrame({"before_row_count": [before.row_count], "after_row_count": [after.row_count]})


def _run_suite(counts: pd.DataFrame, samples: pd.DataFrame,
               aggregates: pd.DataFrame, completeness: pd.DataFrame | None = None) -> dict[str, dict]:
    """Runs the three expectations with GX (four with `completeness`); returns each result's JSON dict by
    check name."""
    global _SUITE
    with _SUITE_LOCK:
        if _SUITE is None:
            _SUITE = _Suite()
        suite, gx = _SUITE, _SUITE.gx
        runs = [
            (ROW_COUNT_PARITY, counts, gx.expectations.ExpectColumnPairValuesToBeEqual(
                column_A="before_row_count", column_B="after_row_count", meta={"check": ROW_COUNT_PARITY})),
            (SAMPLE_COMPARISON, samples, gx.expectations.ExpectColumnPairValuesToBeEqual(
                column_A="before_count", column_B="after_count", meta={"check": SAMPLE_COMPARISON})),
            (COLUMN_AGGREGATES, aggregates, gx.expectations.ExpectColumnPairValuesToBeEqual(
                column_A="before_value", column_B="after_value", meta={"check": COLUMN_AGGREGATES})),
        ]
        if completeness is not None:
            runs.append((READ_COMPLETENESS, completeness, gx.expectations.ExpectColumnPairValuesToBeEqual(
                column_A="planned", column_B="read", meta={"check": READ_COMPLETENESS})))
        return {name: suite.validate(name, frame, expectation) for name, frame, expectation in runs}


# ---------------------------------------------------------------------------------------------
# Public API


def _check_table_sql(table_sql) -> None:
    if not isinstance(table_sql, str) or not table_sql.startswith("`"):
        raise ValidationError(f"table_sql must be a back-quoted identifier from TableName.sql, "
                              f"got {table_sql!r}")


def _check_arguments(scope, sample_fraction, seed, max_reported_rows) -> None:
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


@dataclass(frozen=True)
class RowSet:
    """One side of a proof: the rows a snapshot holds for the rewrite, as a DataFrame factory.

    `load` must return a fresh, uncached DataFrame each call (it is read once for the digest and
    again only to report offending rows).
    """

    snapshot_id: int
    load: Callable[[], Any]
    description: str = ""


def _differing_rows(before: RowSet, after: RowSet, seed: int,
                    samples: pd.DataFrame, limit: int) -> tuple[int, int, list[dict]]:
    """(missing, unexpected, up to `limit` reported rows) of the sampled rows whose counts differ."""
    diff = samples[samples["before_count"] != samples["after_count"]]
    missing = int((diff["before_count"] > diff["after_count"]).sum())
    shown = [((int(r.fp1), int(r.fp2)), int(r.before_count), int(r.after_count))
             for r in diff.head(limit).itertuples()]
    # a missing row is read back from the before snapshot, an unexpected one from the after snapshot
    text = {**sampled_rows(before.load(), seed=seed, fingerprints=[k for k, b, a in shown if b > a]),
            **sampled_rows(after.load(), seed=seed, fingerprints=[k for k, b, a in shown if b <= a])}
    rows = [{"direction": "missing_in_after" if b > a else "unexpected_in_after",
             "before_count": b, "after_count": a, "row": text.get(k)} for k, b, a in shown]
    rows.sort(key=lambda r: (r["row"] or "", r["direction"]))
    return missing, len(diff) - missing, rows


def validate_rewrite(spark, table_sql: str, before_snapshot_id: int, after_snapshot_id: int,
                     scope: str | None = None, *, sample_fraction: float = 0.05, seed: int = 0,
                     max_reported_rows: int = 20) -> ValidationResult:
    """Proves with Great Expectations that the after snapshot holds the same rows as the before one.

    Three checks always run, on the rows of both snapshots selected by `scope`:
    `row_count_parity` (same row count), `sample_comparison` (a seeded, content-hashed sample of
    rows compared row for row by 128-bit fingerprint, with multiplicity, null-safely, in both
    directions) and `column_aggregates` (the whole-row hash sum; on failure also per column its non-null
    count, an order-independent hash sum, min and max of fixed-width types and the exact
    sum of integers/decimals, to name the columns that differ). A failing check does not stop the others.
    Each snapshot's rows are read once when the proof passes, twice when it fails.

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
        ValidationError: A snapshot id that is not an int, an out-of-range argument, or
            snapshots whose columns differ.
    """
    before = _snapshot_id(before_snapshot_id, "before_snapshot_id")
    after = _snapshot_id(after_snapshot_id, "after_snapshot_id")
    _check_table_sql(table_sql)
    _check_arguments(scope, sample_fraction, seed, max_reported_rows)
    return prove_rows(
        RowSet(before, lambda: spark.sql(snapshot_sql(table_sql, before, scope)), f"snapshot {before}"),
        RowSet(after, lambda: spark.sql(snapshot_sql(table_sql, after, scope)), f"snapshot {after}"),
        scope=scope, sample_fraction=sample_fraction, seed=seed, max_reported_rows=max_reported_rows,
        what=table_sql)


def prove_rows(before: RowSet, after: RowSet, *, scope: str | None = None, sample_fraction: float = 0.05,
               seed: int = 0, max_reported_rows: int = 20, what: str = "", fed: FedRows | None = None,
               planned_rows: dict[str, int] | None = None) -> ValidationResult:
    """Proves with Great Expectations that `after` holds exactly the rows of `before`.

    The same three checks as `validate_rewrite`, on any two row sets (a staged rewrite compares
    the replaced files as of S with the staged files). Each side is read once (twice when the proof fails).

    With `fed` (the old side digested by the read that fed the rewrite's writer, `digest.digest_feed`) the
    first comparison reads only `after`, and a fourth check, `read_completeness`, proves that read
    complete: its row count and file-weighted hash sum must equal what the planned files' record counts
    (`planned_rows`: path -> rows, from the manifests) give, so a file left out of the read or a filter
    that dropped rows fails the proof. It needs `sample_fraction` and `seed` to be the feed's.

    Raises:
        ValidationError: The two sides have different columns, or `fed` without `planned_rows`.
    """
    started = time.monotonic()
    _check_arguments(scope, sample_fraction, seed, max_reported_rows)
    after_df = after.load()
    # A fed old side names the columns the writer got; a DataFrame of its own (the table loaded again, a plan
    # analysed) only for their names is not made.
    if fed is not None and fed.columns:
        before_df, before_columns = None, list(fed.columns)
    else:
        before_df = before.load()
        before_columns = [f.name for f in before_df.schema.fields]
    if before_columns != [f.name for f in after_df.schema.fields]:
        # A rewrite never changes the schema; differing columns is itself a failed proof, but the
        # row comparison cannot be expressed over two shapes: stop with the two column lists.
        raise ValidationError(
            f"{before.description or before.snapshot_id} and {after.description or after.snapshot_id} of {what} "
            f"have different columns: {before_columns} vs {[f.name for f in after_df.schema.fields]}")

    if fed is not None and planned_rows is None:
        raise ValidationError("a digest fed by the rewrite's read needs the planned files' record counts")
    # Each side is read once, by its digest's action (nothing is cached): GX checks what the digests hold.
    # A fed digest's sample may be smaller than the policy's (`digest.fed_sample_fraction`): the after side is
    # sampled alike; a failing proof reads both sides again at the policy's share.
    first_fraction = fed.sample_fraction if fed is not None else sample_fraction
    digests = [fed.digest if fed is not None and side is before else
               rows_digest(frame, side.snapshot_id, sample_fraction=first_fraction, seed=seed, detail=False)
               for side, frame in ((before, before_df), (after, after_df))]
    compared_fraction = first_fraction
    completeness = None if fed is None else _completeness(fed, planned_rows)
    unstable = False
    if not digests_agree(*digests):
        # A failing proof: both sides are read again with each column's detail, so the report names the
        # columns that differ (the verdict is the same: the whole-row hash sum already covers every value).
        digests = [rows_digest(side.load(), side.snapshot_id, sample_fraction=sample_fraction, seed=seed)
                   for side in (before, after)]
        compared_fraction = sample_fraction
        # A pass never comes from the second read: sides that agree only when read again are not stable.
        unstable = digests_agree(*digests)
    samples = sample_multiplicities(*digests)
    aggregates = aggregate_pairs(*digests)
    results = _run_suite(row_counts(*digests), samples, aggregates, completeness)

    checks = []
    for name in CHECK_NAMES + ((READ_COMPLETENESS,) if completeness is not None else ()):
        doc = results.get(name, {})
        passed = bool(doc.get("success"))
        result = doc.get("result") or {}
        if name == ROW_COUNT_PARITY:
            observed = {"before_row_count": digests[0].row_count, "after_row_count": digests[1].row_count}
        elif name == SAMPLE_COMPARISON:
            missing, unexpected, rows = (0, 0, []) if passed else _differing_rows(
                before, after, seed, samples, max_reported_rows)
            observed = {"differences": int(result.get("unexpected_count") or 0),
                        "sample_fraction": float(compared_fraction), "seed": seed,
                        "sampled_before_rows": len(digests[0].sample),
                        "sampled_after_rows": len(digests[1].sample),
                        "distinct_sampled_rows": len(samples),
                        "missing_in_after": missing, "unexpected_in_after": unexpected,
                        "rows": rows}
        elif name == READ_COMPLETENESS:
            observed = {"planned_files": len(planned_rows), "planned_rows": int(completeness["planned"][0]),
                        "rows_read": int(completeness["read"][0]),
                        "file_weighted_hash_sum": {"planned": completeness["planned"][1],
                                                   "read": completeness["read"][1]}}
        else:
            same = aggregates["before_value"] == aggregates["after_value"]
            both_null = aggregates["before_value"].isna() & aggregates["after_value"].isna()
            differing = aggregates[~(same | both_null)].head(max_reported_rows)
            observed = {"differences": int(result.get("unexpected_count") or 0),
                        "aggregates_compared": len(aggregates),
                        "columns_compared": len(before_columns),
                        "differing_aggregates": differing.to_dict(orient="records")}
        error = _gx_error(doc)
        if error is not None:
            passed = False
            observed["error"] = error
        if unstable and name == COLUMN_AGGREGATES:
            passed = False
            observed["error"] = ("the two sides disagreed when first read and agreed when read again: the rows "
                                 "read are not stable, so nothing is proven")
        checks.append(CheckOutcome(name=name, passed=passed, observed=_jsonable(observed),
                                   gx_result=_trim(doc, max_reported_rows)))

    return ValidationResult(
        passed=all(c.passed for c in checks),
        before_snapshot_id=before.snapshot_id,
        after_snapshot_id=after.snapshot_id,
        scope=scope,
        checks=tuple(checks),
        duration_seconds=round(time.monotonic() - started, 3),
        reads={"before": digests[0].read, "after": digests[1].read},
    )


def _completeness(fed: FedRows, planned_rows: dict[str, int]) -> pd.DataFrame:
    """The planned files' rows (from their manifests) against what the feeding read counted, as exact strings."""
    return pd.DataFrame({
        "measure": ["rows", "file_weighted_hash_sum"],
        "planned": [str(sum(int(n) for n in planned_rows.values())), str(expected_file_hash_sum(planned_rows))],
        "read": [str(fed.digest.row_count), str(fed.file_hash_sum)],
    }, dtype=object)


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
    source = snapshot_sql(table_sql, snapshot, scope)
    schema = spark.sql(source).schema
    row = spark.sql(
        f"SELECT count(*) AS n, sum(CAST(xxhash64({row_hash_args(schema)}) AS DECIMAL(38,0))) "
        f"AS h FROM ({source})").first()
    return int(row["n"]), int(row["h"] or 0)


def failure_summary(proof: ValidationResult) -> str:
    """One line saying what differed in a failed proof."""
    if proof.error:
        return one_line(proof.error)
    parts = []
    for check in proof.checks:
        if check.passed:
            continue
        observed = check.observed
        if check.name == "row_count_parity":
            parts.append(f"rows {observed.get('before_row_count')} before vs {observed.get('after_row_count')} staged")
        elif check.name == "sample_comparison":
            parts.append(f"{observed.get('missing_in_after', 0)} sampled rows missing and "
                         f"{observed.get('unexpected_in_after', 0)} unexpected")
        elif check.name == "read_completeness":
            parts.append(f"the rewrite's read fed {observed.get('rows_read')} rows of the "
                         f"{observed.get('planned_rows')} its {observed.get('planned_files')} files hold"
                         + ("" if observed.get("rows_read") != observed.get("planned_rows") else
                            " (the same count, from other files)"))
        else:
            differing = observed.get("differing_aggregates") or []
            named = ", ".join(f"{d.get('aggregate')}({d.get('column_name')})" for d in differing[:4])
            parts.append(f"aggregates differ: {named or observed.get('differences')}")
    return "; ".join(parts) or "a check failed"
