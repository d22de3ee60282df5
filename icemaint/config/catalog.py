"""The `catalog:` section, and the catalog's secrets: which properties are secrets (never read from the file) and
the `ICEMAINT_CATALOG_<KEY>` environment variables that supply them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from icemaint.config.keys import CATALOG_TYPES, section_keys
from icemaint.config.parse import (IDENTIFIER, ConfigError, choice, duration, local_directory, mapping, only, resolve,
                                   string, string_map, whole_number)
from icemaint.domain.masking import mask_credentials
from icemaint.domain.units import shown

SECRET_ENV_PREFIX = "ICEMAINT_CATALOG_"
MAX_CONCURRENT_READS = 64
# Catalog properties the config's own keys set (for Spark and pyiceberg alike).
RESERVED_CATALOG_PROPERTIES = {"warehouse": "catalog.warehouse", "uri": "catalog.uri", "type": "catalog.type",
                               "catalog-impl": "catalog.type", "cache-enabled": "icemaint (always false)"}
# Words that make a catalog property a secret (jdbc.password, s3.secret-access-key, s3.session-token, token,
# credential, adls.sas-token.<account>, gcs.oauth2.token), and a name ending in `key` (adls.account-key,
# s3.sse.key, a private or API key). `s3.access-key-id` names a key without being one.
_SECRET_WORDS = ("password", "passwd", "secret", "token", "credential", "apikey")
# HTTP headers for the REST catalog carry bearer tokens and API keys; these carry none.
PLAIN_HEADERS = frozenset({"header.x-iceberg-access-delegation"})


@dataclass(frozen=True)
class CatalogConfig:
    name: str = "lake"
    type: str = "hadoop"
    warehouse: str | None = ".icemaint/warehouse"
    uri: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    # Every metadata read through the catalog (REST, JDBC) gives up after this: a catalog that accepts a
    # connection and never answers must not hang a sensor tick forever.
    timeout_seconds: float = 30.0
    # How many tables' metadata a sensor tick reads at once (a bounded thread pool): on an object store
    # or a REST catalog each read mostly waits on the network. None: `read_workers` picks by catalog type.
    concurrent_reads: int | None = None

    @property
    def read_workers(self) -> int:
        """Tables whose metadata a tick reads at once: `concurrent_reads`, else 1 for a hadoop catalog
        (local files: a read is parsing that holds the GIL, so threads only contend; measured at 10,000
        tables: full tick 40-46 s one at a time, 59 s eight at a time) and 8 for the others."""
        if self.concurrent_reads is not None:
            return self.concurrent_reads
        return 1 if self.type == "hadoop" else 8

    @property
    def concurrent_commits(self) -> bool:
        """Whether commits to different tables may run at once (`icemaint tick` runs tables' runs at once only
        then): not through a SQLite JDBC catalog, where a second writer fails with SQLITE_BUSY (measured: every
        commit of a threaded tick failed at once; with `busy_timeout` they waited it out and failed then)."""
        return not (self.type == "jdbc" and (self.uri or "").startswith("jdbc:sqlite:"))

    @property
    def warehouse_root(self) -> str | None:
        """The warehouse as a location every table's files should lie under: a URI, or a local path for the
        path-based catalogs; None when it is a name the catalog resolves (a REST catalog's `warehouse`)."""
        if not self.warehouse:
            return None
        if "://" in self.warehouse:
            return self.warehouse
        return f"file:{self.warehouse}" if self.type in ("hadoop", "jdbc") else None


def parse_catalog(value: Any, base_dir: Path) -> CatalogConfig:
    cat = mapping(value, "catalog")
    only(cat, section_keys("catalog"), "catalog")
    catalog_name = string(cat.get("name", "lake"), "catalog.name")
    if not IDENTIFIER.match(catalog_name):
        raise ConfigError(f"catalog.name: {shown(catalog_name)} must be a plain identifier "
                          "(ASCII letters, digits and underscores)")
    catalog_type = choice(cat.get("type", "hadoop"), CATALOG_TYPES, "catalog.type")
    uri = cat.get("uri")
    warehouse = _warehouse(cat.get("warehouse"), catalog_type, base_dir)
    if catalog_type in ("jdbc", "rest") and not uri:
        raise ConfigError(f"catalog.uri: required for catalog.type {catalog_type!r}")
    properties = string_map(cat.get("properties"), "catalog.properties")
    for key in properties:
        if key in RESERVED_CATALOG_PROPERTIES:
            raise ConfigError(f"catalog.properties.{key}: set by icemaint from {RESERVED_CATALOG_PROPERTIES[key]}; "
                              "given here too, Spark and pyiceberg would read different catalogs: remove it")
        if is_secret_property(key):
            raise ConfigError(
                f"catalog.properties.{key}: secrets are not read from the file; set "
                f"{secret_env_name(key)} in the environment instead"
            )
    timeout = duration(cat.get("timeout", "30s"), "catalog.timeout", high=float("inf"))
    if timeout <= 0:
        raise ConfigError("catalog.timeout: must be more than 0s (e.g. 30s)")
    reads = cat.get("concurrent_reads")
    if reads is not None:
        whole_number(reads, "catalog.concurrent_reads", 1, MAX_CONCURRENT_READS,
                     " (tables whose metadata a tick reads at once)")
    return CatalogConfig(catalog_name, catalog_type, warehouse, uri and string(uri, "catalog.uri"), properties,
                         timeout, reads)


def _warehouse(warehouse: Any, catalog_type: str, base_dir: Path) -> str | None:
    """hadoop and jdbc: a local directory, relative to the file; the others: as given (a REST catalog's warehouse
    name, as Polaris or Lakekeeper call it, or a URI)."""
    if catalog_type == "hadoop" and warehouse is None:
        warehouse = ".icemaint/warehouse"
    if catalog_type == "hadoop" and isinstance(warehouse, str) and ":" in warehouse.split("/", 1)[0]:
        if not warehouse.startswith("file:"):
            raise ConfigError(f"catalog.warehouse: {mask_credentials(shown(warehouse))}: a hadoop catalog is "
                              "read here from a local warehouse directory; for an object store use a rest, jdbc or glue "
                              "catalog")
        warehouse = "/" + warehouse[len("file:"):].lstrip("/")  # file:///x, file:/x: the local path /x
    if warehouse is None:
        return None
    if catalog_type in ("hadoop", "jdbc"):
        return local_directory(resolve(string(warehouse, "catalog.warehouse"), base_dir), "catalog.warehouse")
    return string(warehouse, "catalog.warehouse")


def is_secret_property(key: str) -> bool:
    """Whether catalog property `key` holds a secret, which the file must not (`ICEMAINT_CATALOG_*` supplies it)."""
    key = key.lower()
    if key.startswith("header."):
        return key not in PLAIN_HEADERS
    last = key.rsplit(".", 1)[-1]
    return any(word in key for word in _SECRET_WORDS) or last == "key" or last.endswith(("-key", "_key"))


def catalog_secret_properties(catalog: CatalogConfig) -> dict[str, str]:
    """Catalog properties that come from the environment: `ICEMAINT_CATALOG_<KEY>` -> `<key>`.

    E.g. `ICEMAINT_CATALOG_JDBC_PASSWORD` becomes `jdbc.password` and
    `ICEMAINT_CATALOG_S3_SECRET__ACCESS__KEY` becomes `s3.secret-access-key` (`__` is `-`).
    """
    out = {}
    for name, value in os.environ.items():
        if name.startswith(SECRET_ENV_PREFIX) and value:
            out[name[len(SECRET_ENV_PREFIX):].lower().replace("__", "-").replace("_", ".")] = value
    return out


def secret_env_name(key: str) -> str:
    """The environment variable that supplies catalog property `key` (inverse of catalog_secret_properties)."""
    return SECRET_ENV_PREFIX + key.upper().replace("-", "__").replace(".", "_")
