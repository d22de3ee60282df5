"""One read of a snapshot's rows, reduced to what a rewrite proof compares: a `SnapshotDigest`.

A rewrite proof must read both snapshots' rows; reading them more than once is what made the
proof cost several rewrites. `snapshot_digest` reads the rows once: while Spark streams them, an
Observation (Spark's CollectMetrics) computes the row count, a whole-row hash sum and the
per-column aggregates, and the same scan hands back the 128-bit fingerprints of a content-hashed
sample of rows. Only the sample's fingerprints (16 bytes a row) leave Spark.

Aggregates stay on fixed-width buffers so Spark keeps them in generated code: 64-bit values are
summed exactly as two 32-bit halves (exact up to 2^31 rows), and min/max are taken only of
fixed-width types (strings, binaries and nested values are covered by their count and hash sum).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pandas as pd

# Sampling is a hash of the row's content, not rand(): the same row gets the same decision in both
# snapshots whatever the file layout, so comparing the two samples compares each sampled row
# against the whole other snapshot.
SAMPLE_BUCKETS = 1_000_000_000
WHOLE_ROW = "*"  # the column name under which whole-row aggregates are reported
_LOW_32 = 4294967295


@dataclass(frozen=True)
class Aggregate:
    """One compared aggregate: `exprs` are Spark SQL aggregate expressions over the scoped rows.

    Two expressions are the high and low 32-bit halves of an exact 64-bit sum; one is the value.
    """

    column: str
    name: str
    exprs: tuple[str, ...]

    def value(self, results: list[Any]) -> str | None:
        """The aggregate as a string (exact), from its expressions' results in order."""
        if len(self.exprs) == 2:
            high, low = results
            return None if high is None and low is None else str(int(high or 0) * 2**32 + int(low or 0))
        (only,) = results
        return None if only is None else str(only)


@dataclass(frozen=True)
class SnapshotDigest:
    """What one read of a snapshot's scoped rows leaves for the proof.

    Attributes:
        snapshot_id: The snapshot read.
        row_count: Rows in scope.
        aggregates: (column, aggregate name) -> exact value as a string (None when undefined,
            e.g. min of no rows), in the order of `aggregates_for(schema)`.
        sample: The sampled rows' fingerprints, one row each (columns fp1, fp2; duplicates kept).
        read: How the read went, as evidence of what the snapshot's layout costs a reader:
            {"planning_ms" (Spark's analysis and optimisation), "scan_ms" (the read, Iceberg's file
            planning included), "rows"}.
    """

    snapshot_id: int
    row_count: int
    aggregates: dict[tuple[str, str], str | None]
    sample: pd.DataFrame
    read: dict


def ident(name: str) -> str:
    """A column name from the table's own schema as a back-quoted Spark identifier."""
    # Names come from Iceberg metadata, not from users, but may be any string Iceberg allows:
    # doubling back-quotes is Spark's escape, so every name stays one identifier.
    return "`" + name.replace("`", "``") + "`"


def _contains_map(data_type) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, ArrayType):
        return _contains_map(data_type.elementType)
    if isinstance(data_type, StructType):
        return any(_contains_map(f.dataType) for f in data_type.fields)
    return False


def _negative_zero(col: str) -> str:
    """True for a float column's -0.0 alone: pow(-0.0, -1) is -Infinity, and `AND` stops at `col = 0` for
    every other value, so pow runs on zeros alone (Spark's hashes read -0.0 as 0.0)."""
    return f"({col} = 0 AND pow({col}, -1) < 0)"


def comparable(field) -> str:
    """An expression equal for two values exactly when the column values are equal.

    Spark can neither group, join nor hash map values, so map-bearing columns compare as JSON.
    """
    from pyspark.sql.types import DoubleType, FloatType

    col = ident(field.name)
    if isinstance(field.dataType, (DoubleType, FloatType)):
        return f"{col}, {_negative_zero(col)}"  # the flag keeps the sign Spark's hashes drop
    return f"to_json({col})" if _contains_map(field.dataType) else col


_MASK_BITS = 62  # flags per BIGINT mask (bits 0-61: every mask is a positive long)


def row_hash_args(schema) -> str:
    """xxhash64 arguments covering every column of a row: bit masks of its NULL positions and of the sign of
    every float zero, then every value.

    xxhash64 skips NULL inputs, so (NULL, 5) and (5, NULL) would hash alike: a bit per column says where the
    NULLs are. Spark's hashes read -0.0 as 0.0: a bit per float column says which zeros are negative
    (`_negative_zero`). Packed into one long per 62 flags, they cost one hash step, where a flag each cost a
    step per column (chaining xxhash64 finalises the hash at every input). Measured on 40M rows of 5 columns,
    warm, 3 runs each: reading every column 4.5-5.0 s, with the row hash of a flag each 5.3-5.8 s, with the
    masks 4.9-5.1 s.
    """
    from pyspark.sql.types import DoubleType, FloatType

    flags, values = [], []
    for field in schema.fields:
        col = ident(field.name)
        flags.append(f"isnull({col})")
        if isinstance(field.dataType, (DoubleType, FloatType)):
            flags.append(_negative_zero(col))
        # the value alone, not `comparable()`, which adds the zero's sign the mask already holds
        values.append(f"to_json({col})" if _contains_map(field.dataType) else col)
    masks = [" | ".join(f"(CASE WHEN {flag} THEN {1 << bit}L ELSE 0L END)"
                        for bit, flag in enumerate(flags[start:start + _MASK_BITS]))
             for start in range(0, len(flags), _MASK_BITS)]
    return ", ".join(masks + values)


def snapshot_sql(table_sql: str, snapshot_id: int, scope: str | None) -> str:
    where = f" WHERE ({scope})" if scope else ""
    return f"SELECT * FROM {table_sql} VERSION AS OF {int(snapshot_id)}{where}"


def sample_predicate(fingerprint_column: str, sample_fraction: float) -> str:
    """Keeps a row when its fingerprint's first half falls below the sampled share of buckets."""
    if sample_fraction >= 1.0:
        return "TRUE"
    threshold = math.ceil(sample_fraction * SAMPLE_BUCKETS)
    return f"pmod({fingerprint_column}, {SAMPLE_BUCKETS}) < {threshold}"


def fingerprint_exprs(schema, seed: int) -> tuple[str, str]:
    """Two 64-bit hashes of the whole row from different starting values: a 128-bit fingerprint."""
    args = row_hash_args(schema)
    return f"xxhash64({int(seed)}, {args})", f"xxhash64({int(seed)}, 1, {args})"


def _split_sum(expr: str) -> tuple[str, str]:
    return f"sum(shiftright({expr}, 32))", f"sum(({expr}) & {_LOW_32})"


def _fixed_width(dtype) -> bool:
    from pyspark.sql.types import (
        BooleanType, ByteType, DateType, DecimalType, DoubleType, FloatType, IntegerType, LongType,
        ShortType, TimestampNTZType, TimestampType,
    )

    if isinstance(dtype, DecimalType):
        return dtype.precision <= 18
    return isinstance(dtype, (BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType,
                              DoubleType, DateType, TimestampType, TimestampNTZType))


def _signless_zero(col: str, dtype) -> str:
    """Floats with -0.0 read as 0.0: min/max return whichever zero they meet first, so two layouts
    of the same rows would report different zeros. The hash sums still tell the zeros apart
    (`comparable` adds the sign of every float)."""
    from pyspark.sql.types import DoubleType, FloatType

    if isinstance(dtype, (DoubleType, FloatType)):
        return f"(CASE WHEN {col} = 0 THEN CAST(0 AS {dtype.simpleString().upper()}) ELSE {col} END)"
    return col


def aggregates_for(schema, fingerprint_column: str, detail: bool = True) -> list[Aggregate]:
    """The aggregates compared between snapshots, in report order.

    Always: an exact sum of the row fingerprints' first halves (the whole-row hash sum: every value of
    every row, NULL positions and the sign of a zero included). With `detail`, per column also its
    non-null count, an exact sum of its value hashes, min and max of fixed-width columns, and the exact
    sum of integers and decimals of up to 18 digits (float sums are left out on purpose: a float sum
    depends on the order of addition, which a rewrite changes; the hash sums cover them).

    The detail adds no detection to the whole-row hash sum, which already changes with any value of any
    row and with any NULL's position; it names the column that differs. Every aggregate is one more update
    per row in Spark's metric collector (the non-null counts alone were a fifth of the fed digest's cost at
    15M rows), so a proof reads without the detail and reads both sides again with it only when it failed.
    """
    from pyspark.sql.types import ByteType, DecimalType, IntegerType, LongType, ShortType

    out = [Aggregate(WHOLE_ROW, "hash_sum", _split_sum(fingerprint_column))]
    for field in schema.fields:
        if not detail:
            break
        col, dtype = ident(field.name), field.dataType
        out.append(Aggregate(field.name, "non_null_count", (f"count({col})",)))
        if _fixed_width(dtype):
            value = _signless_zero(col, dtype)
            out.append(Aggregate(field.name, "min", (f"CAST(min({value}) AS STRING)",)))
            out.append(Aggregate(field.name, "max", (f"CAST(max({value}) AS STRING)",)))
        if isinstance(dtype, (ByteType, ShortType, IntegerType)):
            out.append(Aggregate(field.name, "sum", (f"sum(CAST({col} AS BIGINT))",)))
        elif isinstance(dtype, LongType):
            out.append(Aggregate(field.name, "sum", _split_sum(col)))
        elif isinstance(dtype, DecimalType) and dtype.precision <= 18:
            # the unscaled value: exact as a long for up to 18 digits
            out.append(Aggregate(field.name, "sum", _split_sum(
                f"CAST({col} * {10 ** dtype.scale} AS BIGINT)")))
        out.append(Aggregate(field.name, "hash_sum", _split_sum(f"xxhash64({comparable(field)})")))
    return out


def _free_name(schema, base: str) -> str:
    taken = {f.name.lower() for f in schema.fields}
    name, n = base, 0
    while name.lower() in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def snapshot_digest(spark, table_sql: str, snapshot_id: int, scope: str | None, *,
                    sample_fraction: float, seed: int, detail: bool = True) -> SnapshotDigest:
    """Reads the snapshot's scoped rows once; returns counts, aggregates and sample fingerprints."""
    return rows_digest(spark.sql(snapshot_sql(table_sql, snapshot_id, scope)), snapshot_id,
                       sample_fraction=sample_fraction, seed=seed, detail=detail)


def rows_digest(rows, snapshot_id: int, *, sample_fraction: float, seed: int,
                detail: bool = True) -> SnapshotDigest:
    """Reads the rows of a DataFrame once; returns counts, aggregates and sample fingerprints
    (`detail`: see `aggregates_for`).

    Never cache or persist these frames: Spark's cache manager matches Iceberg relations without
    their snapshot id, so a cached `VERSION AS OF <before>` would answer the after snapshot's query
    too and the proof would compare a snapshot with itself.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    started = time.monotonic()
    fp1 = _free_name(rows.schema, "__icemaint_fp1")
    first, second = fingerprint_exprs(rows.schema, seed)
    aggregates = aggregates_for(rows.schema, ident(fp1), detail)
    exprs = ["count(1)"] + [e for a in aggregates for e in a.exprs]
    observation = Observation(f"icemaint_digest_{snapshot_id}_{uuid.uuid4().hex[:8]}")
    sampled = (rows.selectExpr("*", f"{first} AS {ident(fp1)}")
               .observe(observation, *[F.expr(e).alias(f"m{i}") for i, e in enumerate(exprs)])
               .where(sample_predicate(ident(fp1), sample_fraction))
               .selectExpr(f"{ident(fp1)} AS fp1", f"{second} AS fp2"))
    # Spark's analysis and optimisation; Iceberg plans the files when the scan starts (in scan_ms).
    sampled._jdf.queryExecution().executedPlan()
    planned = time.monotonic()
    sample = sampled.toPandas()  # the action: the Observation's metrics come with it
    values = observed(observation, len(exprs))
    if values is None:
        raise RuntimeError(f"Spark delivered no digest metrics for snapshot {snapshot_id}")
    out = aggregate_values(aggregates, values[1:])
    read = {"planning_ms": round((planned - started) * 1000, 3),
            "scan_ms": round((time.monotonic() - planned) * 1000, 3), "rows": int(values[0])}
    return SnapshotDigest(snapshot_id=int(snapshot_id), row_count=int(values[0]), aggregates=out,
                          sample=sample.astype({"fp1": "int64", "fp2": "int64"}), read=read)


def observed(observation, count: int) -> list | None:
    """The observed metrics `m0` .. `m{count - 1}`, each read by its name; None when Spark completed the
    observation without them. Not pyspark's `Observation.get`: it walks the Java map to its end, which Py4J
    signals with a Java exception that pyspark converts, inspects and formats (~8 ms a call, measured, against
    ~1 ms for these reads)."""
    metrics = observation._jo.getAsJava()
    if not metrics.containsKey("m0"):
        return None
    return [metrics.get(f"m{i}") for i in range(count)]


def aggregate_values(aggregates: list[Aggregate], values: list) -> dict[tuple[str, str], str | None]:
    """Each aggregate's exact value, from its expressions' results in `aggregates` order."""
    out, i = {}, 0
    for agg in aggregates:
        out[(agg.column, agg.name)] = agg.value(values[i:i + len(agg.exprs)])
        i += len(agg.exprs)
    return out


def sampled_rows(rows, *, seed: int, fingerprints: list[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The rows (as JSON) of a DataFrame behind sample fingerprints, read back for a failure report.

    Only run when a proof failed; `fingerprints` are ints we computed, never user text.
    """
    if not fingerprints:
        return {}
    first, second = fingerprint_exprs(rows.schema, seed)
    wanted = ", ".join(str(int(f)) for f in sorted({f for f, _ in fingerprints}))
    found = rows.selectExpr(f"{first} AS fp1", f"{second} AS fp2", f"{row_json(rows.schema)} AS row") \
        .where(f"fp1 IN ({wanted})").collect()
    keep = set(fingerprints)
    return {(r["fp1"], r["fp2"]): r["row"] for r in found if (r["fp1"], r["fp2"]) in keep}


def row_json(schema) -> str:
    """The row as JSON for reports: nulls kept and microseconds shown, so it is the stored row."""
    return ("to_json(struct(" + ", ".join(ident(f.name) for f in schema.fields) + "), "
            "map('ignoreNullFields', 'false', "
            "'timestampFormat', 'yyyy-MM-dd\\'T\\'HH:mm:ss.SSSSSSXXX'))")


# ---------------------------------------------------------------------------------------------
# The old side digested while it is fed to the rewrite's writer


FILE_COLUMN = "_file"  # Iceberg's metadata column: the data file a row was read from
# Sampled fingerprints leave the feeding read through Spark's accumulators, which the driver also keeps per
# task for its status store: a 5% sample of 15M rows there ran a 1 GiB driver out of memory. The fed
# sample is capped at about this many rows (the whole-row hash sum still covers every row).
FED_SAMPLE_ROWS = 20_000


def fed_sample_fraction(sample_fraction: float, planned_rows: int) -> float:
    """The share of rows the feeding read samples: the policy's, capped at about FED_SAMPLE_ROWS rows."""
    if planned_rows <= FED_SAMPLE_ROWS:
        return sample_fraction
    return min(sample_fraction, FED_SAMPLE_ROWS / planned_rows)


@dataclass(frozen=True)
class FedRows:
    """The digest of a rewrite's old rows, taken by the read that fed its writer (no read of its own).

    Attributes:
        digest: Count, aggregates and sample fingerprints, exactly as `rows_digest` computes them.
        file_hash_sum: The exact sum, over every row read, of xxhash64(the path of the file it came
            from): with the planned files' record counts this proves each file fed all its rows
            (`expected_file_hash_sum`), so a file missing from the read or rows a filter dropped fail.
    """

    digest: SnapshotDigest
    file_hash_sum: int
    sample_fraction: float
    columns: tuple[str, ...] = ()  # the fed rows' columns, as the writer got them


class FeedDigest:
    """A digest being taken while a writer consumes the rows; `result` once the write has finished."""

    def __init__(self, observation, aggregates: list[Aggregate], snapshot_id: int, started: float,
                 sample_fraction: float, columns: tuple[str, ...] = ()):
        self.sample_fraction = sample_fraction
        self.columns = columns
        self._observation = observation
        self._aggregates = aggregates
        self._snapshot_id = int(snapshot_id)
        self._started = started

    def result(self, timeout: float = 30.0) -> FedRows | None:
        """The digest, or None when Spark did not deliver the observed metrics within `timeout` seconds
        (the proof then reads the old side itself). Only call after the write finished."""
        from py4j.protocol import Py4JError

        n_exprs = sum(len(a.exprs) for a in self._aggregates)
        try:
            future = self._observation._jo.future()
            deadline = time.monotonic() + timeout
            while not future.isCompleted():
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.01)
            # Spark completes the observation with no metrics when the plan that ran did not collect them
            values = observed(self._observation, 1 + n_exprs + 3)
        except Py4JError:
            return None
        if values is None:
            return None
        high, low, sample_text = values[1 + n_exprs:]
        fp = [int(v) for v in sample_text.replace(":", ",").split(",")] if sample_text else []
        sample = pd.DataFrame({"fp1": fp[0::2], "fp2": fp[1::2]}, dtype="int64")
        read = {"planning_ms": 0.0, "scan_ms": 0.0, "rows": int(values[0]), "fed_by_rewrite": True,
                "rewrite_ms": round((time.monotonic() - self._started) * 1000, 3)}
        digest = SnapshotDigest(snapshot_id=self._snapshot_id, row_count=int(values[0]),
                                aggregates=aggregate_values(self._aggregates, values[1:1 + n_exprs]),
                                sample=sample, read=read)
        return FedRows(digest=digest, file_hash_sum=int(high or 0) * 2**32 + int(low or 0),
                       sample_fraction=self.sample_fraction, columns=self.columns)


def can_feed(rows) -> bool:
    """Whether the rows can be digested on their way to the writer: the read offers Iceberg's file column
    (a format v3 table's rewrite read does not) and no column of the table shadows it."""
    from pyspark.errors import AnalysisException

    if FILE_COLUMN in {f.name.lower() for f in rows.schema.fields}:
        return False
    try:
        rows.selectExpr(FILE_COLUMN)  # analysed now: raises when the read has no such column
    except AnalysisException:
        return False
    return True


def digest_feed(rows, snapshot_id: int, *, sample_fraction: float, seed: int):
    """(rows to write, FeedDigest): the same rows, digested by an Observation while the writer reads them.

    The digest is `rows_digest`'s without detail (a failing proof reads again with it), plus the sum of
    each row's file's hash, so the proof can check the read fed every planned row (`sample_fraction`:
    keep it within `fed_sample_fraction`, the sample leaves through accumulators). Only for a write that
    reads its input once (no sort: a range partitioner samples its input with a job of its own, which
    would count rows twice); the proof fails, never passes, if rows were counted twice.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    started = time.monotonic()
    fp1 = _free_name(rows.schema, "__icemaint_fp1")
    file_hash = _free_name(rows.schema, "__icemaint_file_hash")
    picked = _free_name(rows.schema, "__icemaint_sampled")
    first, second = fingerprint_exprs(rows.schema, seed)
    aggregates = aggregates_for(rows.schema, ident(fp1), detail=False)
    # Every per-row expression is computed in the projection, which Spark compiles into the scan's
    # generated code; the Observation only sums and lists columns: its collector updates each aggregate
    # row by row outside that code (the sample's predicate moved from there into the projection: 0.2 s less
    # of a 6 s stage at 15M rows).
    # The sampled rows' "fp1:fp2" text, NULL for the others (collect_list skips NULLs: one string leaves Spark).
    sample = (f"CASE WHEN {sample_predicate(ident(fp1), sample_fraction)} "
              f"THEN concat({ident(fp1)}, ':', {second}) END AS {ident(picked)}")
    exprs = (["count(1)"] + [e for a in aggregates for e in a.exprs] + list(_split_sum(ident(file_hash)))
             + [f"array_join(collect_list({ident(picked)}), ',')"])
    observation = Observation(f"icemaint_feed_{snapshot_id}_{uuid.uuid4().hex[:8]}")
    fed = (rows.selectExpr("*", f"xxhash64({FILE_COLUMN}) AS {ident(file_hash)}", f"{first} AS {ident(fp1)}")
           .selectExpr("*", sample)
           .observe(observation, *[F.expr(e).alias(f"m{i}") for i, e in enumerate(exprs)])
           .drop(fp1, file_hash, picked))
    return fed, FeedDigest(observation, aggregates, snapshot_id, started, sample_fraction,
                           columns=tuple(f.name for f in rows.schema.fields))


def spark_xxhash64(text: str) -> int:
    """Spark's `xxhash64(text)` of a string, computed in Python: XXH64 of its UTF-8 bytes with Spark's seed 42,
    as a signed 64-bit value (tests/test_fed_proof.py checks it against Spark's own)."""
    import xxhash

    value = xxhash.xxh64_intdigest(text.encode("utf-8"), seed=42)
    return value - 2**64 if value >= 2**63 else value


def expected_file_hash_sum(record_counts: dict[str, int]) -> int:
    """Σ record count x xxhash64(path) over the planned files: what `FedRows.file_hash_sum` must be when
    every file fed each of its rows once (each path hashed as Spark hashes the read's file column; no Spark
    job: a proof of 100 small files spent a fifth of its time starting one for this)."""
    return sum(int(rows) * spark_xxhash64(path) for path, rows in record_counts.items())
