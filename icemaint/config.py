"""The configuration file: one YAML document parsed into typed, validated objects.

Looked up as `--config PATH`, else `$ICEMAINT_CONFIG`, else `maintenance.yaml` in the working
directory. Relative paths in the file are relative to the file. Secrets are never read from the
file: keys ending in `_env` name the environment variable that holds them.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from icemaint.domain.names import InvalidTableName, TableName
from icemaint.domain.policy import PolicyBook, PolicyError, TablePolicy, apply_overrides
from icemaint.domain.scope import parse_date

CATALOG_TYPES = ("hadoop", "jdbc", "rest", "glue")
CLAIM_BACKENDS = ("file", "postgres")
AUDIT_SINKS = ("file", "postgres")
DEFAULT_CONFIG_NAME = "maintenance.yaml"
CONFIG_ENV = "ICEMAINT_CONFIG"
IDENTITY_ENV = "ICEMAINT_IDENTITY"
SECRET_ENV_PREFIX = "ICEMAINT_CATALOG_"


class ConfigError(ValueError):
    """The configuration file is missing or has a bad key or value; the message names both."""


@dataclass(frozen=True)
class CatalogConfig:
    name: str = "lake"
    type: str = "hadoop"
    warehouse: str = ".icemaint/warehouse"
    uri: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)
    # auto: the bundled runtime jar unless spark.jars.packages / spark.jars name an Iceberg runtime;
    # provided: the cluster's classpath has one (EMR, Dataproc, Databricks); bundled: always ours.
    iceberg_runtime: str = "auto"


ICEBERG_RUNTIMES = ("auto", "provided", "bundled")


@dataclass(frozen=True)
class ClaimsConfig:
    backend: str = "file"
    dsn_env: str = "ICEMAINT_PG_DSN"


@dataclass(frozen=True)
class AuditConfig:
    sink: str = "file"
    dsn_env: str = "ICEMAINT_PG_DSN"


@dataclass(frozen=True)
class ScopeConfig:
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()

    def admits(self, table: str) -> bool:
        return any(fnmatch.fnmatchcase(table, p) for p in self.include) and not any(
            fnmatch.fnmatchcase(table, p) for p in self.exclude
        )


@dataclass(frozen=True)
class MaintenanceConfig:
    catalog: CatalogConfig = field(default_factory=CatalogConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    state_dir: str = ".icemaint"
    claims: ClaimsConfig = field(default_factory=ClaimsConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    scope: ScopeConfig = field(default_factory=ScopeConfig)
    dates_start: dt.date = dt.date(2020, 1, 1)
    max_runs_total: int = 2
    policies: PolicyBook = field(default_factory=PolicyBook)
    source: str | None = None

    def policy(self, table: str) -> TablePolicy:
        return self.policies.for_table(table)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)

    @property
    def dagster_home(self) -> Path:
        return self.state_path / "dagster"

    def identity(self) -> str:
        """Who maintenance runs as: `$ICEMAINT_IDENTITY`, else the OS user."""
        return os.environ.get(IDENTITY_ENV) or os.environ.get("USER") or "unknown"


_TOP_KEYS = ("catalog", "spark", "state_dir", "claims", "audit", "scope", "dates_start",
             "max_runs_total", "defaults", "tables")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    return value


def _only(section: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in section:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown key; allowed: {', '.join(allowed)}")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {value!r} is not a non-empty string")
    return value


def _choice(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not allowed; allowed: {', '.join(allowed)}")
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    section = _mapping(value, where)
    out = {}
    for k, v in section.items():
        if isinstance(v, (dict, list)) or v is None:
            raise ConfigError(f"{where}.{k}: {v!r} must be a scalar")
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _resolve(path: str, base: Path) -> str:
    if "://" in path:
        return path
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def parse_config(raw: Any, base_dir: Path, source: str | None = None) -> MaintenanceConfig:
    """Parse a loaded YAML document. Raises ConfigError naming the bad key and value."""
    doc = _mapping(raw, "config")
    _only(doc, _TOP_KEYS, "config")

    cat = _mapping(doc.get("catalog"), "catalog")
    _only(cat, ("name", "type", "warehouse", "uri", "properties"), "catalog")
    catalog_name = _string(cat.get("name", "lake"), "catalog.name")
    if not catalog_name.isidentifier():
        raise ConfigError(f"catalog.name: {catalog_name!r} must be a plain identifier")
    catalog_type = _choice(cat.get("type", "hadoop"), CATALOG_TYPES, "catalog.type")
    warehouse = cat.get("warehouse")
    if catalog_type == "hadoop" and not warehouse:
        warehouse = ".icemaint/warehouse"
    if warehouse is not None:
        warehouse = _resolve(_string(warehouse, "catalog.warehouse"), base_dir)
    uri = cat.get("uri")
    if catalog_type in ("jdbc", "rest") and not uri:
        raise ConfigError(f"catalog.uri: required for catalog.type {catalog_type!r}")
    for key in _string_map(cat.get("properties"), "catalog.properties"):
        if any(s in key.lower() for s in ("password", "secret", "token", "credential")):
            raise ConfigError(
                f"catalog.properties.{key}: secrets are not read from the file; set "
                f"{secret_env_name(key)} in the environment instead"
            )
    catalog = CatalogConfig(catalog_name, catalog_type, warehouse, uri and _string(uri, "catalog.uri"),
                            _string_map(cat.get("properties"), "catalog.properties"))

    sp = _mapping(doc.get("spark"), "spark")
    _only(sp, ("master", "conf", "iceberg_runtime"), "spark")
    conf = _string_map(sp.get("conf"), "spark.conf")
    runtime = _choice(sp.get("iceberg_runtime", "auto"), ICEBERG_RUNTIMES, "spark.iceberg_runtime")
    spark = SparkConfig(_string(sp.get("master", "local[*]"), "spark.master"), conf, runtime)

    state_dir = _resolve(_string(doc.get("state_dir", ".icemaint"), "state_dir"), base_dir)

    cl = _mapping(doc.get("claims"), "claims")
    _only(cl, ("backend", "dsn_env"), "claims")
    claims = ClaimsConfig(_choice(cl.get("backend", "file"), CLAIM_BACKENDS, "claims.backend"),
                          _string(cl.get("dsn_env", "ICEMAINT_PG_DSN"), "claims.dsn_env"))
    au = _mapping(doc.get("audit"), "audit")
    _only(au, ("sink", "dsn_env"), "audit")
    audit = AuditConfig(_choice(au.get("sink", "file"), AUDIT_SINKS, "audit.sink"),
                        _string(au.get("dsn_env", "ICEMAINT_PG_DSN"), "audit.dsn_env"))

    sc = _mapping(doc.get("scope"), "scope")
    _only(sc, ("include", "exclude"), "scope")
    patterns = {}
    for key, default in (("include", ["*"]), ("exclude", [])):
        val = sc.get(key, default)
        if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
            raise ConfigError(f"scope.{key}: {val!r} is not a list of table-name patterns")
        patterns[key] = tuple(val)
    scope = ScopeConfig(**patterns)

    start = doc.get("dates_start", dt.date(2020, 1, 1))
    if isinstance(start, str):
        try:
            start = parse_date(start)
        except ValueError:
            raise ConfigError(f"dates_start: {start!r} is not a date (YYYY-MM-DD)") from None
    if isinstance(start, dt.datetime) or not isinstance(start, dt.date):
        raise ConfigError(f"dates_start: {start!r} is not a date (YYYY-MM-DD)")

    max_runs = doc.get("max_runs_total", 2)
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ConfigError(f"max_runs_total: {max_runs!r} must be a whole number of at least 1")

    try:
        defaults = apply_overrides(TablePolicy(), _mapping(doc.get("defaults"), "defaults"), "defaults")
        tables = {}
        for name, overrides in _mapping(doc.get("tables"), "tables").items():
            try:
                key = TableName.parse(str(name)).key
            except InvalidTableName as exc:
                raise ConfigError(f"tables.{name}: {exc}") from None
            tables[key] = apply_overrides(defaults, _mapping(overrides, f"tables.{name}"), f"tables.{name}")
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None

    return MaintenanceConfig(catalog, spark, state_dir, claims, audit, scope, start, max_runs,
                             PolicyBook(defaults, tables), source)


def config_path(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return Path(DEFAULT_CONFIG_NAME)


def load_config(path: str | os.PathLike | None = None) -> MaintenanceConfig:
    """Load and validate the configuration file (see the module docstring for the lookup)."""
    p = config_path(path)
    if not p.exists():
        raise ConfigError(f"{p}: configuration file not found (set --config or ${CONFIG_ENV})")
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the configuration file: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    try:
        return parse_config(raw, p.resolve().parent, str(p))
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


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
