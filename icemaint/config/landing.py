"""The `landing:` section: landing sources by name (`icemaint ingest`): where small files land, their format (and
schema), the table they are appended to, when a batch is due, and what happens to them once it is committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from icemaint.config.keys import section_keys
from icemaint.config.parse import (IDENTIFIER, ConfigError, choice, duration, key_name, local_directory, mapping, only,
                                   resolve, size, string, whole_number)
from icemaint.domain.landing import COLUMN_TYPES, FORMATS, SOURCE_NAME, LandingSource
from icemaint.domain.masking import mask_credentials
from icemaint.domain.names import InvalidTableName, TableName
from icemaint.domain.units import shown

_LANDING_KEYS = section_keys("landing.<source>")
MAX_BATCH_FILES = 1_000_000


def parse_landing(value: Any, base_dir: Path) -> dict[str, LandingSource]:
    """`landing:` source name -> its `LandingSource`."""
    out: dict[str, LandingSource] = {}
    for name, settings in mapping(value, "landing").items():
        if not isinstance(name, str) or not SOURCE_NAME.fullmatch(name):
            raise ConfigError(f"landing.{key_name(name)}: a source's name is a letter, then up to 63 letters, digits "
                              "or '_'")
        out[name] = _source(name, mapping(settings, f"landing.{name}"), base_dir)
    return out


def _source(name: str, section: Mapping[str, Any], base_dir: Path) -> LandingSource:
    where = f"landing.{name}"
    only(section, _LANDING_KEYS, where)
    for required in ("location", "table"):
        if required not in section:
            raise ConfigError(f"{where}.{required}: required")
    location = _location(section["location"], base_dir, f"{where}.location")
    fmt = choice(section.get("format", "parquet"), FORMATS, f"{where}.format")
    try:
        table = TableName.parse(string(section["table"], f"{where}.table")).key
    except InvalidTableName as exc:
        raise ConfigError(f"{where}.table: {exc}") from None
    schema = _schema(section.get("schema"), fmt, f"{where}.schema")
    min_files, max_files = (whole_number(section.get(key, default), f"{where}.{key}", 1, MAX_BATCH_FILES)
                            for key, default in (("min_files", 100), ("max_files", 10_000)))
    min_bytes, target_file_size = (size(section.get(key, default), f"{where}.{key}", low=1)
                                   for key, default in (("min_bytes", "64 MiB"), ("target_file_size", "128 MiB")))
    max_age = section.get("max_age", "5m")
    max_age_seconds = None if max_age is None else duration(max_age, f"{where}.max_age")
    keep = section.get("delete_processed_after")
    delete_after = None if keep is None or keep == "none" else duration(keep, f"{where}.delete_processed_after")
    if max_age_seconds is None:
        raise ConfigError(f"{where}.max_age: a duration is required (e.g. 5m)")
    processed = section.get("processed")
    if processed is not None:
        processed = _location(processed, base_dir, f"{where}.processed")
        if processed.rstrip("/") == location.rstrip("/"):
            raise ConfigError(f"{where}.processed: is the landing location itself; ingested files would land again")
    return LandingSource(name, location, fmt, table, schema, min_files, min_bytes, float(max_age_seconds),
                         target_file_size, max_files, processed, delete_after)


def _location(value: Any, base_dir: Path, where: str) -> str:
    """A local directory (relative to the file) or an object-store URI."""
    text = string(value, where)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        if scheme not in ("s3", "s3a", "file"):
            raise ConfigError(f"{where}: {mask_credentials(shown(text))}: a local directory or "
                              "s3://bucket/prefix")
        if scheme == "file":
            text = "/" + text[len("file://"):].lstrip("/")
        else:
            return "s3://" + text.split("://", 1)[1]
    return local_directory(resolve(text, base_dir), where)


def _schema(value: Any, fmt: str, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        if fmt != "parquet":
            raise ConfigError(f"{where}: required for format {fmt!r} (column: type, in the files' order)")
        return ()
    section = mapping(value, where)
    if not section:
        raise ConfigError(f"{where}: names no column")
    out = []
    for column, kind in section.items():
        if not isinstance(column, str) or not IDENTIFIER.match(column):
            raise ConfigError(f"{where}.{key_name(column)}: a column name is a plain identifier")
        out.append((column, choice(kind, COLUMN_TYPES, f"{where}.{column}")))
    return tuple(out)
