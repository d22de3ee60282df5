"""The compression codec a rewrite writes: the table's own, or Iceberg's default where the table names none.

Iceberg's Java writers fall back to gzip for a Parquet table without `write.parquet.compression-codec`: the
default before Iceberg 1.4, kept for old tables. Since 1.4 Java catalogs write `zstd` into every new table's
properties, and writers without a JVM (pyiceberg, iceberg-rust, zamboni, ...) create tables with no codec
property and write zstd themselves, the format's documented default. A rewrite through Spark would turn
those tables' zstd files into gzip files: slower for every reader after it, and the rewrite's single biggest
cost (gzip's deflate was 47% of the executor's samples compacting 10,000 files of a pyiceberg table; the
stage took 48 s in gzip, 28 s in zstd).

So a rewrite writes what the table asks for, and zstd where it asks for nothing, in the order Iceberg's
Spark writer resolves it (`SparkWriteConf`): a write option, then the session's
`spark.sql.iceberg.compression-codec`, then the table property (for delete files
`write.delete.parquet.compression-codec` first), then Iceberg's fallback. Only when neither the session nor
the table says anything does icemaint add the write option `compression-codec=zstd`. Tables whose files are
ORC or Avro keep their format's own default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

FORMAT = "write.format.default"
DELETE_FORMAT = "write.delete.format.default"
PARQUET_CODEC = "write.parquet.compression-codec"
DELETE_PARQUET_CODEC = "write.delete.parquet.compression-codec"
SESSION_CODEC = "spark.sql.iceberg.compression-codec"
PROPERTIES = (FORMAT, DELETE_FORMAT, PARQUET_CODEC, DELETE_PARQUET_CODEC)  # the ones `write_codec` reads

DEFAULT_CODEC = "zstd"  # Iceberg's documented Parquet default (its Java default for tables created since 1.4)
WRITE_OPTION = "compression-codec"  # Iceberg's Spark write option, which wins over the session and the table


@dataclass(frozen=True)
class WriteCodec:
    """The codec a rewrite's files get and who chose it.

    Attributes:
        codec: The codec's name as configured (e.g. 'zstd'); None for ORC or Avro files (their own default).
        source: Who chose it, said for people: the table property, the session setting or icemaint's default.
        options: The write options icemaint adds for it (empty unless the choice is icemaint's).
    """

    codec: str | None
    source: str
    options: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"codec": self.codec, "codec_source": self.source}


def write_codec(properties: Mapping[str, str], session_codec: str | None = None, *,
                deletes: bool = False) -> WriteCodec:
    """The codec of a rewrite's data files (or, with `deletes`, its position-delete files).

    Args:
        properties: The table's properties (only `PROPERTIES` are read; absent keys may be missing or None).
        session_codec: The session's `spark.sql.iceberg.compression-codec`, None when unset.
        deletes: Decide for delete files, which have their own format and codec properties.
    """
    data_format = (properties.get(FORMAT) or "parquet").lower()
    file_format = (properties.get(DELETE_FORMAT) or data_format).lower() if deletes else data_format
    if file_format != "parquet":
        return WriteCodec(None, f"{file_format.upper()} files: the format's own default")
    if session_codec:
        return WriteCodec(session_codec, f"the session's {SESSION_CODEC}")
    keys = (DELETE_PARQUET_CODEC, PARQUET_CODEC) if deletes else (PARQUET_CODEC,)
    for key in keys:
        if properties.get(key):
            return WriteCodec(properties[key], f"the table's {key}")
    return WriteCodec(DEFAULT_CODEC, f"Iceberg's default for Parquet (the table sets no {PARQUET_CODEC})",
                      {WRITE_OPTION: DEFAULT_CODEC})
