"""The configuration file: one YAML document parsed into typed, validated objects.

Looked up as `--config PATH`, else `$ICEMAINT_CONFIG`, else `maintenance.yaml` in the working
directory. Relative paths in the file are relative to the file. Secrets are never read from the
file: keys ending in `_env` name the environment variable that holds them.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
import re
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable, Mapping

import yaml

from icemaint.domain.landing import COLUMN_TYPES, FORMATS, SOURCE_NAME, LandingSource
from icemaint.domain.agents import AGENT_NAME, DEFAULT_REQUESTS_PER_HOUR, DEFAULT_REWRITE_BYTES_PER_DAY, AgentSpec
from icemaint.domain.masking import mask_credentials
from icemaint.domain.names import InvalidTableName, TableName
from icemaint.domain.policy import POLICY_KEYS, PolicyBook, PolicyError, TablePolicy, apply_overrides
from icemaint.domain.scope import parse_date
from icemaint.domain.units import human_size, parse_duration, parse_size
from icemaint.errors import UserError
from icemaint.config_keys import AUDIT_SINKS, CATALOG_TYPES, CLAIM_BACKENDS, DAGSTER_STORAGES, ICEBERG_RUNTIMES
from icemaint.config_keys import section_keys as _keys

DEFAULT_CONFIG_NAME = "maintenance.yaml"
CONFIG_ENV = "ICEMAINT_CONFIG"
IDENTITY_ENV = "ICEMAINT_IDENTITY"
SECRET_ENV_PREFIX = "ICEMAINT_CATALOG_"
# A maintenance config is a few KB; anything this large is not one (and would take seconds to parse).
MAX_CONFIG_BYTES = 1 << 20
# Policy sizes reach Iceberg as Java longs; ages beyond this overflow date arithmetic.
MAX_SIZE_BYTES = 2**63 - 1
MAX_DURATION_SECONDS = 100 * 366 * 86400
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Bad values are shown bounded: a YAML alias bomb must not turn into a gigabyte of error message.
_shown = reprlib.Repr()
_shown.maxstring, _shown.maxother, _shown.maxlist, _shown.maxdict, _shown.maxlevel = 120, 120, 5, 5, 2
# Every character str.splitlines() breaks on: a message is one line, whatever the file held.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


class ConfigError(UserError, ValueError):
    """The configuration file is missing or has a bad key or value; the message names both."""


def _one_line(text: str) -> str:
    return text.translate(_LINE_BREAKS)


def _key(key: Any) -> str:
    """A mapping key as it is named in messages (quoted when it is not a plain printable string)."""
    return key if isinstance(key, str) and key.isprintable() and key else repr(key)


MAX_CONCURRENT_READS = 64


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


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)
    # auto: the bundled runtime jar unless spark.jars.packages / spark.jars name an Iceberg runtime;
    # provided: the cluster's classpath has one (EMR, Dataproc, Databricks); bundled: always ours.
    iceberg_runtime: str = "auto"
    # The driver JVM maps Spark's and Iceberg's classes from an archive this machine recorded
    # (icemaint/engine/class_archive.py): ~1.5 s less to start a session.
    class_archive: bool = True




@dataclass(frozen=True)
class ClaimsConfig:
    backend: str = "file"
    dsn_env: str = "ICEMAINT_PG_DSN"


@dataclass(frozen=True)
class AuditConfig:
    sink: str = "file"
    dsn_env: str = "ICEMAINT_PG_DSN"


@dataclass(frozen=True)
class DagsterConfig:
    """Where the Dagster instance under `state_dir` keeps runs, event logs and schedules: SQLite files
    (one machine) or PostgreSQL (`dagster-postgres`; the DSN is read from `dsn_env`, never the file)."""

    storage: str = "sqlite"
    dsn_env: str = "ICEMAINT_PG_DSN"


@dataclass(frozen=True)
class OwnerAlerts:
    """One owner's alert route: `enabled: false` silences it; an unset key falls back to `alerts`'s."""

    enabled: bool = True
    webhook_url_env: str | None = None
    audit: bool | None = None


@dataclass(frozen=True)
class AlertsConfig:
    """Where alerts on failed proofs and failed runs go (per table owner). The webhook URL is a secret:
    the file only names the environment variable that holds it. No `alerts:` section: no alerts."""

    webhook_url_env: str | None = None
    audit: bool = False
    owners: Mapping[str, OwnerAlerts] = field(default_factory=dict)


@dataclass(frozen=True)
class AutomationConfig:
    """What the sensors and `icemaint tick` may start on their own beyond compaction, expiry, manifest rewrites and
    statistics. Operations that delete files the table no longer lists are a person's choice: off until the file
    turns them on. (Quarantine purge is never automatic: `icemaint purge-quarantine` is a person's command.)"""

    # Orphan-file removal after each snapshot expiry (else only `icemaint orphans TABLE` or the UI removes orphans).
    orphan_removal: bool = False
    # How often each sensor polls at most (Dagster's minimum interval), in seconds: an estate of many tables may
    # poll less often; a test or a demo more often.
    discovery_interval: int = 60
    compaction_interval: int = 30
    retention_interval: int = 60


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
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    dagster: DagsterConfig = field(default_factory=DagsterConfig)
    # Where orphan removal's quarantine keeps files: a local directory or an object-store URI
    # (s3://bucket/prefix); None is <state_dir>/quarantine.
    quarantine_dir: str | None = None
    # The AI agents `icemaint mcp` serves, by name (their identity); none: the MCP server has no one to serve.
    agents: Mapping[str, AgentSpec] = field(default_factory=dict)
    automation: AutomationConfig = field(default_factory=AutomationConfig)
    # Landing sources by name (`icemaint ingest`): where small files land and the table they are appended to.
    landing: Mapping[str, LandingSource] = field(default_factory=dict)

    def policy(self, table: str) -> TablePolicy:
        return self.policies.for_table(table)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)

    @property
    def quarantine_location(self) -> str:
        return self.quarantine_dir or str((self.state_path / "quarantine").resolve())

    @property
    def dagster_home(self) -> Path:
        return self.state_path / "dagster"

    def identity(self) -> str:
        """Who maintenance runs as: `$ICEMAINT_IDENTITY`, else the OS user (`$USER`, else the process's own user:
        cron and systemd units often set no `$USER`)."""
        return os.environ.get(IDENTITY_ENV) or os.environ.get("USER") or _os_user() or "unknown"


def _os_user() -> str | None:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name or None
    except (ImportError, KeyError, OSError):  # no passwd entry for this uid (a container's arbitrary uid)
        return None


_TOP_KEYS = _keys("")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {_shown.repr(value)}")
    return value


def _only(section: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in section:
        if key not in allowed:
            raise ConfigError(f"{where}.{_key(key)}: unknown key; allowed: {', '.join(allowed)}")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {_shown.repr(value)} is not a non-empty string")
    return value


def _choice(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{where}: {_shown.repr(value)} is not allowed; allowed: {', '.join(allowed)}")
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    section = _mapping(value, where)
    out = {}
    for k, v in section.items():
        if isinstance(v, (dict, list)) or v is None:
            raise ConfigError(f"{where}.{_key(k)}: {_shown.repr(v)} must be a scalar")
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


# Catalog properties the config's own keys set (for Spark and pyiceberg alike).
RESERVED_CATALOG_PROPERTIES = {"warehouse": "catalog.warehouse", "uri": "catalog.uri", "type": "catalog.type",
                               "catalog-impl": "catalog.type", "cache-enabled": "icemaint (always false)"}


# Words that make a catalog property a secret (jdbc.password, s3.secret-access-key, s3.session-token, token,
# credential, adls.sas-token.<account>, gcs.oauth2.token), and a name ending in `key` (adls.account-key,
# s3.sse.key, a private or API key). `s3.access-key-id` names a key without being one.
_SECRET_WORDS = ("password", "passwd", "secret", "token", "credential", "apikey")
# HTTP headers for the REST catalog carry bearer tokens and API keys; these carry none.
PLAIN_HEADERS = frozenset({"header.x-iceberg-access-delegation"})


def is_secret_property(key: str) -> bool:
    """Whether catalog property `key` holds a secret, which the file must not (`ICEMAINT_CATALOG_*` supplies it)."""
    key = key.lower()
    if key.startswith("header."):
        return key not in PLAIN_HEADERS
    last = key.rsplit(".", 1)[-1]
    return any(word in key for word in _SECRET_WORDS) or last == "key" or last.endswith(("-key", "_key"))


def _local_directory(path: str, where: str) -> str:
    """A local path that is a directory or can become one (a file there, or above it, would fail every run much
    later, in a traceback)."""
    if "://" in path:
        return path
    target = Path(path)
    try:
        target.resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError in Python 3.11)
        raise ConfigError(f"{where}: {path} cannot be used: {exc}") from None
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{where}: {path} is a file, not a directory")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{where}: {path} cannot be created: {parent} is a file, not a directory")
            break
    return path


def _check_bounds(policy: TablePolicy, where: str) -> None:
    """Sizes that fit a Java long (they reach Iceberg as one) and ages date arithmetic can hold; a file group that
    can hold a file."""
    for key, (attr, parse) in POLICY_KEYS.items():
        value = getattr(policy, attr)
        if parse is parse_size and isinstance(value, int) and value > MAX_SIZE_BYTES:
            raise ConfigError(f"{where}.{key}: {value} bytes is too large; at most {MAX_SIZE_BYTES} (a Java long)")
        if parse is parse_duration and isinstance(value, (int, float)) and value > MAX_DURATION_SECONDS:
            raise ConfigError(f"{where}.{key}: {value:g} seconds is too long; at most 100 years")
    if policy.max_file_group_size_bytes <= 0:
        raise ConfigError(f"{where}.max_file_group_size_bytes: {human_size(policy.max_file_group_size_bytes)} holds "
                          "no file: with partial_progress no date would ever be compacted; give a size such as 10GiB")


def _resolve(path: str, base: Path) -> str:
    if "://" in path:
        return path
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # whole: "$" would let "AB\n" by
_URL_IN_FILE = ("the webhook URL is a secret and is not read from the file; set it in the environment and "
                "name the variable in")


def _env_name(value: Any, where: str) -> str:
    if isinstance(value, str) and "://" in value:  # the URL itself: never repeat it in a message
        raise ConfigError(f"{where}: {_URL_IN_FILE} {where} (a variable name such as ICEMAINT_ALERT_WEBHOOK)")
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise ConfigError(f"{where}: {_shown.repr(value)} is not an environment variable name (the webhook "
                          "URL itself stays in that variable, never in the file)")
    return value


def _env_name_plain(value: Any, where: str) -> str:
    """A variable's name (the DSN itself stays in the environment, never in the file)."""
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise ConfigError(f"{where}: {_shown.repr(value)} is not an environment variable name (the DSN itself "
                          "stays in that variable, never in the file)")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {_shown.repr(value)} is not a boolean; use true or false")
    return value


def _alert_route(section: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> str | None:
    """Checks one route's keys; returns its webhook_url_env (None when unset)."""
    if "webhook_url" in section:
        raise ConfigError(f"{where}.webhook_url: {_URL_IN_FILE} {where}.webhook_url_env")
    _only(section, allowed, where)
    env = section.get("webhook_url_env")
    return None if env is None else _env_name(env, f"{where}.webhook_url_env")


def _alerts(value: Any) -> AlertsConfig:
    section = _mapping(value, "alerts")
    env = _alert_route(section, "alerts", _keys("alerts"))
    owners = {}
    for owner, route in _mapping(section.get("owners"), "alerts.owners").items():
        where = f"alerts.owners.{_key(owner)}"
        route = _mapping(route, where)
        own_env = _alert_route(route, where, _keys("alerts.owners.<owner>"))
        audit = route.get("audit")
        owners[str(owner)] = OwnerAlerts(_flag(route.get("enabled", True), f"{where}.enabled"), own_env,
                                         None if audit is None else _flag(audit, f"{where}.audit"))
    return AlertsConfig(env, _flag(section.get("audit", False), "alerts.audit"), owners)


_AGENT_KEYS = _keys("agents.<name>")


def _agents(value: Any) -> dict[str, AgentSpec]:
    """`agents:` name -> {token_env, requests_per_hour, rewrite_bytes_per_day}; the token itself stays in the
    environment (`token_env` names the variable), never in the file."""
    out = {}
    for name, settings in _mapping(value, "agents").items():
        if not isinstance(name, str) or not AGENT_NAME.fullmatch(name):
            raise ConfigError(f"agents.{_key(name)}: an agent's name is its identity: a letter, then up to 63 "
                              "letters, digits, '_', '.' or '-'")
        where = f"agents.{name}"
        section = _mapping(settings, where)
        if "token" in section:  # the token itself: never repeat it in a message
            raise ConfigError(f"{where}.token: a bearer token is a secret and is not read from the file; set it in "
                              f"the environment and name the variable in {where}.token_env")
        _only(section, _AGENT_KEYS, where)
        env = section.get("token_env")
        if env is not None and (not isinstance(env, str) or not _ENV_NAME.fullmatch(env)):
            raise ConfigError(f"{where}.token_env: {_shown.repr(env)} is not an environment variable name (the "
                              "token itself stays in that variable, never in the file)")
        per_hour = section.get("requests_per_hour", DEFAULT_REQUESTS_PER_HOUR)
        if isinstance(per_hour, bool) or not isinstance(per_hour, int) or not 1 <= per_hour <= 1_000_000:
            raise ConfigError(f"{where}.requests_per_hour: {_shown.repr(per_hour)} must be a whole number from 1 to "
                              "1000000")
        try:
            per_day = parse_size(section.get("rewrite_bytes_per_day", DEFAULT_REWRITE_BYTES_PER_DAY))
        except ValueError as exc:
            raise ConfigError(f"{where}.rewrite_bytes_per_day: {exc}") from None
        if per_day > MAX_SIZE_BYTES:
            raise ConfigError(f"{where}.rewrite_bytes_per_day: {per_day} bytes is too large; at most {MAX_SIZE_BYTES}")
        out[name] = AgentSpec(name, env, per_hour, per_day)
    return out


_LANDING_KEYS = _keys("landing.<source>")


def _landing(value: Any, base_dir: Path) -> dict[str, LandingSource]:
    """`landing:` source name -> where files land, their format (and schema), the table, thresholds and what
    happens to them after their batch is committed."""
    out: dict[str, LandingSource] = {}
    for name, settings in _mapping(value, "landing").items():
        if not isinstance(name, str) or not SOURCE_NAME.fullmatch(name):
            raise ConfigError(f"landing.{_key(name)}: a source's name is a letter, then up to 63 letters, digits "
                              "or '_'")
        where = f"landing.{name}"
        section = _mapping(settings, where)
        _only(section, _LANDING_KEYS, where)
        for required in ("location", "table"):
            if required not in section:
                raise ConfigError(f"{where}.{required}: required")
        location = _landing_location(section["location"], base_dir, f"{where}.location")
        fmt = _choice(section.get("format", "parquet"), FORMATS, f"{where}.format")
        try:
            table = TableName.parse(_string(section["table"], f"{where}.table")).key
        except InvalidTableName as exc:
            raise ConfigError(f"{where}.table: {exc}") from None
        schema = _landing_schema(section.get("schema"), fmt, f"{where}.schema")
        counts = {}
        for key, count in (("min_files", 100), ("max_files", 10_000)):
            number = section.get(key, count)
            if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 1_000_000:
                raise ConfigError(f"{where}.{key}: {_shown.repr(number)} must be a whole number from 1 to 1000000")
            counts[key] = number
        sizes = {}
        for key, default in (("min_bytes", "64 MiB"), ("target_file_size", "128 MiB")):
            try:
                sizes[key] = parse_size(section.get(key, default))
            except ValueError as exc:
                raise ConfigError(f"{where}.{key}: {exc}") from None
            if not 1 <= sizes[key] <= MAX_SIZE_BYTES:
                raise ConfigError(f"{where}.{key}: must be from 1 B to {human_size(MAX_SIZE_BYTES)}")
        ages: dict[str, float | None] = {}
        for key, age in (("max_age", "5m"), ("delete_processed_after", None)):
            v = section.get(key, age)
            if v is None or (key == "delete_processed_after" and v == "none"):
                ages[key] = None
                continue
            try:
                ages[key] = parse_duration(v)
            except ValueError as exc:
                raise ConfigError(f"{where}.{key}: {exc}") from None
            if not 0 <= (ages[key] or 0) <= MAX_DURATION_SECONDS:
                raise ConfigError(f"{where}.{key}: {_shown.repr(v)} must be from 0s to 100 years")
        if ages["max_age"] is None:
            raise ConfigError(f"{where}.max_age: a duration is required (e.g. 5m)")
        processed = section.get("processed")
        if processed is not None:
            processed = _landing_location(processed, base_dir, f"{where}.processed")
            if processed.rstrip("/") == location.rstrip("/"):
                raise ConfigError(f"{where}.processed: is the landing location itself; ingested files would land "
                                  "again")
        out[name] = LandingSource(name, location, fmt, table, schema, counts["min_files"], sizes["min_bytes"],
                                  float(ages["max_age"] or 0.0), sizes["target_file_size"], counts["max_files"],
                                  processed, ages["delete_processed_after"])
    return out


def _landing_location(value: Any, base_dir: Path, where: str) -> str:
    """A local directory (relative to the file) or an object-store URI."""
    text = _string(value, where)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        if scheme not in ("s3", "s3a", "file"):
            raise ConfigError(f"{where}: {mask_credentials(_shown.repr(text))}: a local directory or "
                              "s3://bucket/prefix")
        if scheme == "file":
            text = "/" + text[len("file://"):].lstrip("/")
        else:
            return "s3://" + text.split("://", 1)[1]
    return _local_directory(_resolve(text, base_dir), where)


def _landing_schema(value: Any, fmt: str, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        if fmt != "parquet":
            raise ConfigError(f"{where}: required for format {fmt!r} (column: type, in the files' order)")
        return ()
    section = _mapping(value, where)
    if not section:
        raise ConfigError(f"{where}: names no column")
    out = []
    for column, kind in section.items():
        if not isinstance(column, str) or not _IDENTIFIER.match(column):
            raise ConfigError(f"{where}.{_key(column)}: a column name is a plain identifier")
        out.append((column, _choice(kind, COLUMN_TYPES, f"{where}.{column}")))
    return tuple(out)


def parse_config(raw: Any, base_dir: Path, source: str | None = None) -> MaintenanceConfig:
    """Parse a loaded YAML document. Raises ConfigError naming the bad key and value."""
    doc = _mapping(raw, "config")
    _only(doc, _TOP_KEYS, "config")

    cat = _mapping(doc.get("catalog"), "catalog")
    _only(cat, _keys("catalog"), "catalog")
    catalog_name = _string(cat.get("name", "lake"), "catalog.name")
    if not _IDENTIFIER.match(catalog_name):
        raise ConfigError(f"catalog.name: {_shown.repr(catalog_name)} must be a plain identifier "
                          "(ASCII letters, digits and underscores)")
    catalog_type = _choice(cat.get("type", "hadoop"), CATALOG_TYPES, "catalog.type")
    warehouse = cat.get("warehouse")
    if catalog_type == "hadoop" and warehouse is None:
        warehouse = ".icemaint/warehouse"
    if catalog_type == "hadoop" and isinstance(warehouse, str) and ":" in warehouse.split("/", 1)[0]:
        if not warehouse.startswith("file:"):
            raise ConfigError(f"catalog.warehouse: {mask_credentials(_shown.repr(warehouse))}: a hadoop catalog is "
                              "read here from a local warehouse directory; for an object store use a rest, jdbc or glue "
                              "catalog")
        warehouse = "/" + warehouse[len("file:"):].lstrip("/")  # file:///x, file:/x: the local path /x
    if warehouse is not None and catalog_type in ("hadoop", "jdbc"):  # a path: relative to this file
        warehouse = _local_directory(_resolve(_string(warehouse, "catalog.warehouse"), base_dir),
                                     "catalog.warehouse")
    elif warehouse is not None:  # a REST catalog's warehouse name (Polaris, Lakekeeper, ...) or a URI, as given
        warehouse = _string(warehouse, "catalog.warehouse")
    uri = cat.get("uri")
    if catalog_type in ("jdbc", "rest") and not uri:
        raise ConfigError(f"catalog.uri: required for catalog.type {catalog_type!r}")
    for key in _string_map(cat.get("properties"), "catalog.properties"):
        if key in RESERVED_CATALOG_PROPERTIES:
            raise ConfigError(f"catalog.properties.{key}: set by icemaint from {RESERVED_CATALOG_PROPERTIES[key]}; "
                              "given here too, Spark and pyiceberg would read different catalogs: remove it")
        if is_secret_property(key):
            raise ConfigError(
                f"catalog.properties.{key}: secrets are not read from the file; set "
                f"{secret_env_name(key)} in the environment instead"
            )
    try:
        timeout = parse_duration(cat.get("timeout", "30s"))
    except ValueError as exc:
        raise ConfigError(f"catalog.timeout: {exc}") from None
    if timeout <= 0:
        raise ConfigError("catalog.timeout: must be more than 0s (e.g. 30s)")
    reads = cat.get("concurrent_reads")
    if reads is not None and (isinstance(reads, bool) or not isinstance(reads, int)
                              or not 1 <= reads <= MAX_CONCURRENT_READS):
        raise ConfigError(f"catalog.concurrent_reads: {_shown.repr(reads)} must be a whole number from 1 to "
                          f"{MAX_CONCURRENT_READS} (tables whose metadata a tick reads at once)")
    catalog = CatalogConfig(catalog_name, catalog_type, warehouse, uri and _string(uri, "catalog.uri"),
                            _string_map(cat.get("properties"), "catalog.properties"), timeout, reads)

    sp = _mapping(doc.get("spark"), "spark")
    _only(sp, _keys("spark"), "spark")
    conf = _string_map(sp.get("conf"), "spark.conf")
    if "spark.jars" in conf:  # local jar paths, like every path in the file, are relative to the file
        conf["spark.jars"] = ",".join(_resolve(jar.strip(), base_dir) for jar in conf["spark.jars"].split(",")
                                      if jar.strip())
    runtime = _choice(sp.get("iceberg_runtime", "auto"), ICEBERG_RUNTIMES, "spark.iceberg_runtime")
    spark = SparkConfig(_string(sp.get("master", "local[*]"), "spark.master"), conf, runtime,
                        _flag(sp.get("class_archive", True), "spark.class_archive"))

    state_dir = _local_directory(_resolve(_string(doc.get("state_dir", ".icemaint"), "state_dir"), base_dir),
                                 "state_dir")

    cl = _mapping(doc.get("claims"), "claims")
    _only(cl, _keys("claims"), "claims")
    claims = ClaimsConfig(_choice(cl.get("backend", "file"), CLAIM_BACKENDS, "claims.backend"),
                          _env_name_plain(cl.get("dsn_env", "ICEMAINT_PG_DSN"), "claims.dsn_env"))
    au = _mapping(doc.get("audit"), "audit")
    _only(au, _keys("audit"), "audit")
    audit = AuditConfig(_choice(au.get("sink", "file"), AUDIT_SINKS, "audit.sink"),
                        _env_name_plain(au.get("dsn_env", "ICEMAINT_PG_DSN"), "audit.dsn_env"))

    quarantine = doc.get("quarantine_dir")
    if quarantine is not None:
        quarantine = _local_directory(_resolve(_string(quarantine, "quarantine_dir"), base_dir), "quarantine_dir")

    dg = _mapping(doc.get("dagster"), "dagster")
    _only(dg, _keys("dagster"), "dagster")
    dagster = DagsterConfig(_choice(dg.get("storage", "sqlite"), DAGSTER_STORAGES, "dagster.storage"),
                            _env_name_plain(dg.get("dsn_env", "ICEMAINT_PG_DSN"), "dagster.dsn_env"))

    sc = _mapping(doc.get("scope"), "scope")
    _only(sc, _keys("scope"), "scope")
    patterns = {}
    for key, default in (("include", ["*"]), ("exclude", [])):
        val = sc.get(key, default)
        if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
            raise ConfigError(f"scope.{key}: {_shown.repr(val)} is not a list of table-name patterns")
        patterns[key] = tuple(val)
    scope = ScopeConfig(**patterns)

    start = doc.get("dates_start", dt.date(2020, 1, 1))
    if isinstance(start, str):
        try:
            start = parse_date(start)
        except ValueError:
            raise ConfigError(f"dates_start: {_shown.repr(start)} is not a date (YYYY-MM-DD)") from None
    if isinstance(start, dt.datetime) or not isinstance(start, dt.date):
        raise ConfigError(f"dates_start: {_shown.repr(start)} is not a date (YYYY-MM-DD)")

    max_runs = doc.get("max_runs_total", 2)
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or not 1 <= max_runs <= 10_000:
        raise ConfigError(f"max_runs_total: {_shown.repr(max_runs)} must be a whole number of at least 1 "
                          "(and at most 10000)")

    try:
        defaults = apply_overrides(TablePolicy(), _mapping(doc.get("defaults"), "defaults"), "defaults")
        _check_bounds(defaults, "defaults")
        tables = {}
        for name, overrides in _mapping(doc.get("tables"), "tables").items():
            try:
                key = TableName.parse(str(name)).key
            except InvalidTableName as exc:
                raise ConfigError(f"tables.{_key(name)}: {exc}") from None
            where = f"tables.{key}"
            tables[key] = apply_overrides(defaults, _mapping(overrides, where), where)
            _check_bounds(tables[key], where)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None

    auto = _mapping(doc.get("automation"), "automation")
    if "quarantine_purge" in auto:
        raise ConfigError("automation.quarantine_purge: quarantine purge is never automatic; purge with "
                          "`icemaint purge-quarantine --older-than 7d` (remove the key)")
    _only(auto, _keys("automation"), "automation")
    automation = AutomationConfig(_flag(auto.get("orphan_removal", False), "automation.orphan_removal"),
                                  *(_poll_interval(auto, key, default) for key, default in (
                                      ("discovery_interval", 60), ("compaction_interval", 30),
                                      ("retention_interval", 60))))

    return MaintenanceConfig(catalog, spark, state_dir, claims, audit, scope, start, max_runs,
                             PolicyBook(defaults, tables), source, _alerts(doc.get("alerts")), dagster,
                             quarantine, _agents(doc.get("agents")), automation,
                             _landing(doc.get("landing"), base_dir))


def _poll_interval(section: Mapping[str, Any], key: str, default: int) -> int:
    """A sensor's minimum interval in whole seconds, from 1s to 1d (Dagster takes whole seconds)."""
    value = section.get(key, default)
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ConfigError(f"automation.{key}: {exc}") from None
    if not 1 <= seconds <= 86400:
        raise ConfigError(f"automation.{key}: {_shown.repr(value)} must be from 1s to 1d")
    return max(1, round(seconds))


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return Path(DEFAULT_CONFIG_NAME)


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, reading a date such as `dates_start: 2020-13-01` as text: the key's own check then
    names it (YAML's date constructor only says "month must be in 1..12"), and refusing a key given twice in one
    mapping (YAML keeps the last silently: a policy edited in two places would apply only one of them)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        merges = 0
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: keys after it override the base's
                merges += 1
                if merges > 1:  # YAML would apply the first alone (merge several with `<<: [*a, *b]`)
                    raise yaml.constructor.ConstructorError(
                        None, None, "the merge key '<<' is given twice in one mapping; merge several with "
                        "<<: [*a, *b]", key_node.start_mark)
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the constructor below names it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def load_config(path: str | os.PathLike[str] | None = None) -> MaintenanceConfig:
    """Load and validate the configuration file (see the module docstring for the lookup).

    Raises:
        ConfigError: one line naming the file and what is wrong: missing, unreadable, larger than
            `MAX_CONFIG_BYTES`, not UTF-8 text, not YAML, empty, or a bad key or value.
    """
    p = config_path(path)
    try:
        return _load(p)
    except ConfigError as exc:
        raise ConfigError(_one_line(str(exc))) from None


def _load(p: Path) -> MaintenanceConfig:
    if not p.exists():
        raise ConfigError(f"{p}: configuration file not found (set --config or ${CONFIG_ENV})")
    try:
        if p.is_file() and p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: {p.stat().st_size} bytes is not a maintenance config (at most "
                              f"{MAX_CONFIG_BYTES} bytes)")
        raw = yaml.load(p.read_bytes().decode("utf-8"), Loader=_ConfigLoader)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the configuration file: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    except (ValueError, OverflowError) as exc:  # a YAML scalar that is no value, e.g. the date 2024-02-30
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    except RecursionError:  # PyYAML parses nesting recursively
        raise ConfigError(f"{p}: not valid YAML: nested too deeply") from None
    if raw is None:
        raise ConfigError(f"{p}: the file holds no settings (empty, or only comments); write at least one key, "
                          "e.g. catalog.warehouse")
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
