"""One independent reader for "the rows are identical afterwards": pyiceberg + pyarrow + numpy.

Neither Spark nor Iceberg's Java library nor icemaint's proof is involved: the table's latest
metadata file is found from the Hadoop catalog's version hint, pyiceberg plans the snapshot's
files, pyarrow decodes them, and every row is hashed (64-bit, column by column, in column order)
into an order-independent multiset digest: the row count and two wrapping sums of differently
mixed row hashes. Two snapshots with the same digest hold the same rows with the same
multiplicities (up to a 2^-64-scale collision).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from icemaint.domain.names import TableName

_U = np.uint64
_GOLDEN = _U(0x9E3779B97F4A7C15)
_M1, _M2 = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)
_NULL = _U(0x6A09E667F3BCC908)
_SECOND = _U(0xA0761D6478BD642F)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping)."""
    x = x ^ (x >> _U(30))
    x = x * _M1
    x = x ^ (x >> _U(27))
    x = x * _M2
    return x ^ (x >> _U(31))


def _text_hash(value) -> int:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _column_words(column) -> np.ndarray:
    """A uint64 per value of an Arrow column (nulls handled by the caller)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    typ = column.type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ):
        encoded = pc.dictionary_encode(column.fill_null(""))
        words = np.array([_text_hash(v) for v in encoded.dictionary.to_pylist()] or [0], dtype=np.uint64)
        return words[encoded.indices.to_numpy(zero_copy_only=False)]
    if pa.types.is_floating(typ):
        values = column.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False) + 0.0  # -0.0 -> 0.0
        values = np.where(np.isnan(values), np.nan, values)
        return values.view(np.uint64)
    if pa.types.is_timestamp(typ) or pa.types.is_date(typ) or pa.types.is_time(typ):
        column = column.cast(pa.int64()) if not pa.types.is_date32(typ) else column.cast(pa.int32()).cast(pa.int64())
    if pa.types.is_boolean(typ):
        column = column.cast(pa.int8())
    return column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).view(np.uint64)


def batch_digest(batch) -> tuple[int, int, int]:
    """(rows, sum of row hashes, sum of re-mixed row hashes) of one Arrow record batch, mod 2^64."""
    n = batch.num_rows
    if n == 0:
        return 0, 0, 0
    with np.errstate(over="ignore"):
        return _batch_digest(batch, n)


def _batch_digest(batch, n: int) -> tuple[int, int, int]:
    h = np.full(n, _GOLDEN, dtype=np.uint64)
    for i in range(batch.num_columns):
        column = batch.column(i)
        words = _mix(_column_words(column) + _U(i + 1) * _GOLDEN)
        if column.null_count:
            words = np.where(column.is_null().to_numpy(zero_copy_only=False), _NULL + _U(i), words)
        h = _mix(h * _M2 ^ words)
    return n, int(h.sum(dtype=np.uint64)), int(_mix(h ^ _SECOND).sum(dtype=np.uint64))


def latest_metadata(warehouse: Path, table: TableName) -> str:
    """The Hadoop catalog's current metadata file of `table` (from its version-hint.text)."""
    meta = Path(warehouse, *table.namespace, table.name, "metadata")
    return str(meta / f"v{(meta / 'version-hint.text').read_text().strip()}.metadata.json")


def snapshot_digest(warehouse: Path, table: TableName, snapshot_id: int) -> dict:
    """The multiset digest of every row of the whole table as of `snapshot_id` (deletes applied)."""
    from pyiceberg.table import StaticTable

    started = time.perf_counter()
    tbl = StaticTable.from_metadata(latest_metadata(warehouse, table))
    scan = tbl.scan(snapshot_id=int(snapshot_id))
    files = sum(1 for _ in scan.plan_files())
    rows, s1, s2 = 0, 0, 0
    for batch in scan.to_arrow_batch_reader():
        n, a, b = batch_digest(batch)
        rows, s1, s2 = rows + n, (s1 + a) % 2**64, (s2 + b) % 2**64
    return {"snapshot_id": int(snapshot_id), "rows": rows, "digest": f"{s1:016x}{s2:016x}", "files": files,
            "seconds": round(time.perf_counter() - started, 3)}
