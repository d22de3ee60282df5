"""The physical floor of a rewrite: the same bytes read and written once with pyarrow, in one process.

No planning, no commit, no validation, no task scheduling: read every small file of the date,
concatenate, write one Parquet file with the codec the table's files use. Spark's rewrite time
over this is what the engine and Iceberg's bookkeeping cost on top of moving the bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.measure import Stopwatch


def parquet_codec(path: str) -> str:
    """The compression codec of the first column chunk of a Parquet file (e.g. 'ZSTD')."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return meta.row_group(0).column(0).compression


def rewrite_with_pyarrow(paths: list[str], out_path: Path) -> dict:
    """Reads `paths`, concatenates and writes one file; returns the seconds of each part.

    Raises:
        ValueError: no files to read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not paths:
        raise ValueError("pyarrow floor: the date has no data files to read")
    codec = parquet_codec(paths[0])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with Stopwatch() as read:
        table = pa.concat_tables([pq.read_table(p) for p in paths])
    with Stopwatch() as write:
        pq.write_table(table, out_path, compression=codec.lower())
    result = {"read_seconds": round(read.seconds, 3), "write_seconds": round(write.seconds, 3),
              "seconds": round(read.seconds + write.seconds, 3), "files": len(paths), "rows": table.num_rows,
              "bytes_in": sum(os.path.getsize(p) for p in paths), "bytes_out": os.path.getsize(out_path),
              "codec": codec}
    out_path.unlink()
    return result
