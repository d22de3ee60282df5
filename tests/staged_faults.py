"""Test helpers for staged rewrites: a value corrupted inside a staged Parquet file, main's lineage.

The corruption is what bad memory or a buggy writer leaves: one 64-bit value changed in place, the
file's length unchanged (Iceberg reads footers at the length its metadata records). It needs
uncompressed Parquet, so that the value's bytes appear as they are.
"""

from __future__ import annotations

import os
import struct
from urllib.parse import urlparse


def uncompressed(spark, table_sql: str) -> None:
    """New files of the table (the staged ones too) are written without compression."""
    spark.sql(f"ALTER TABLE {table_sql} SET TBLPROPERTIES ('write.parquet.compression-codec' = 'uncompressed')")


def local_path(location: str) -> str:
    parsed = urlparse(location)
    return parsed.path if parsed.scheme in ("file", "") else location


def corrupt_long(paths, old: int, new: int) -> int:
    """Replaces every little-endian 64-bit `old` with `new` in the files; returns how many were replaced."""
    before, after = struct.pack("<q", old), struct.pack("<q", new)
    replaced = 0
    for location in paths:
        path = local_path(location)
        with open(path, "rb") as fh:
            data = fh.read()
        count = data.count(before)
        if count:
            with open(path, "wb") as fh:
                fh.write(data.replace(before, after))
            # Hadoop's local file system keeps a CRC sidecar; a bad writer would have written it
            # for the bad bytes, so drop it rather than let the sidecar catch what the proof must.
            sidecar = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")
            if os.path.exists(sidecar):
                os.remove(sidecar)
            replaced += count
    return replaced


def main_lineage(spark, table_sql: str) -> list[dict]:
    """`main`'s snapshots, newest first: snapshot_id, parent_id, operation, summary."""
    head = spark.sql(f"SELECT snapshot_id FROM {table_sql}.`refs` WHERE name = 'main'").first()[0]
    snaps = {r["snapshot_id"]: r.asDict() for r in spark.sql(
        f"SELECT snapshot_id, parent_id, operation, summary FROM {table_sql}.`snapshots`").collect()}
    out, cursor = [], head
    while cursor is not None and cursor in snaps:
        out.append(snaps[cursor])
        cursor = snaps[cursor]["parent_id"]
    return out


def staging_refs(config, table: str) -> dict[str, int]:
    """Staging branches on the table, read by pyiceberg: name -> snapshot id."""
    from icemaint.engine.staging import STAGE_PREFIX
    from icemaint.observe.catalog import CatalogReader

    refs = CatalogReader(config).load(table).metadata.refs
    return {name: ref.snapshot_id for name, ref in refs.items() if name.startswith(STAGE_PREFIX)}
