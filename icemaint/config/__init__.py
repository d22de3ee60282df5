"""The configuration file: one YAML document parsed into a typed, validated `MaintenanceConfig`.

Looked up as `--config PATH`, else `$ICEMAINT_CONFIG`, else `maintenance.yaml` in the working
directory. Relative paths in the file are relative to the file. Secrets are never read from the
file: keys ending in `_env` name the environment variable that holds them.

This module owns the document as a whole and its small sections; each large section has a module of its
own beside it (`catalog`, `policies`, `alerts`, `agents`, `automation`, `landing`), all built from the
primitives in `parse`; `keys` lists every key the file takes, and `yaml_reader` reads the file.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from icemaint.config.agents import parse_agents
from icemaint.config.alerts import AlertsConfig, parse_alerts
from icemaint.config.automation import AutomationConfig, parse_automation
from icemaint.config.catalog import CatalogConfig, parse_catalog
from icemaint.config.keys import AUDIT_SINKS, CLAIM_BACKENDS, DAGSTER_STORAGES, ICEBERG_RUNTIMES, section_keys
from icemaint.config.landing import parse_landing
from icemaint.config.parse import (ConfigError, choice, env_name, flag, local_directory, mapping, one_line, only,
                                   resolve, string, string_map)
from icemaint.config.policies import parse_policies
from icemaint.config.yaml_reader import read_document
from icemaint.domain.agents import AgentSpec
from icemaint.domain.landing import LandingSource
from icemaint.domain.policy import PolicyBook, TablePolicy
from icemaint.domain.scope import parse_date
from icemaint.domain.units import shown


DEFAULT_CONFIG_NAME = "maintenance.yaml"
CONFIG_ENV = "ICEMAINT_CONFIG"
IDENTITY_ENV = "ICEMAINT_IDENTITY"
_DSN = "the DSN"


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


def parse_config(raw: Any, base_dir: Path, source: str | None = None) -> MaintenanceConfig:
    """Parse a loaded YAML document. Raises ConfigError naming the bad key and value."""
    doc = mapping(raw, "config")
    only(doc, section_keys(""), "config")
    catalog = parse_catalog(doc.get("catalog"), base_dir)
    spark = _spark(doc.get("spark"), base_dir)
    state_dir = local_directory(resolve(string(doc.get("state_dir", ".icemaint"), "state_dir"), base_dir),
                                "state_dir")
    cl = mapping(doc.get("claims"), "claims")
    only(cl, section_keys("claims"), "claims")
    claims = ClaimsConfig(choice(cl.get("backend", "file"), CLAIM_BACKENDS, "claims.backend"),
                          env_name(cl.get("dsn_env", "ICEMAINT_PG_DSN"), "claims.dsn_env", _DSN))
    au = mapping(doc.get("audit"), "audit")
    only(au, section_keys("audit"), "audit")
    audit = AuditConfig(choice(au.get("sink", "file"), AUDIT_SINKS, "audit.sink"),
                        env_name(au.get("dsn_env", "ICEMAINT_PG_DSN"), "audit.dsn_env", _DSN))
    quarantine = doc.get("quarantine_dir")
    if quarantine is not None:
        quarantine = local_directory(resolve(string(quarantine, "quarantine_dir"), base_dir), "quarantine_dir")
    dg = mapping(doc.get("dagster"), "dagster")
    only(dg, section_keys("dagster"), "dagster")
    dagster = DagsterConfig(choice(dg.get("storage", "sqlite"), DAGSTER_STORAGES, "dagster.storage"),
                            env_name(dg.get("dsn_env", "ICEMAINT_PG_DSN"), "dagster.dsn_env", _DSN))
    scope, start, max_runs = _scope(doc.get("scope")), _dates_start(doc), _max_runs(doc)
    policies = parse_policies(doc.get("defaults"), doc.get("tables"))
    automation = parse_automation(doc.get("automation"))
    return MaintenanceConfig(catalog, spark, state_dir, claims, audit, scope, start, max_runs, policies, source,
                             parse_alerts(doc.get("alerts")), dagster, quarantine, parse_agents(doc.get("agents")),
                             automation, parse_landing(doc.get("landing"), base_dir))


def _spark(value: Any, base_dir: Path) -> SparkConfig:
    sp = mapping(value, "spark")
    only(sp, section_keys("spark"), "spark")
    conf = string_map(sp.get("conf"), "spark.conf")
    if "spark.jars" in conf:  # local jar paths, like every path in the file, are relative to the file
        conf["spark.jars"] = ",".join(resolve(jar.strip(), base_dir) for jar in conf["spark.jars"].split(",")
                                      if jar.strip())
    runtime = choice(sp.get("iceberg_runtime", "auto"), ICEBERG_RUNTIMES, "spark.iceberg_runtime")
    return SparkConfig(string(sp.get("master", "local[*]"), "spark.master"), conf, runtime,
                       flag(sp.get("class_archive", True), "spark.class_archive"))


def _scope(value: Any) -> ScopeConfig:
    sc = mapping(value, "scope")
    only(sc, section_keys("scope"), "scope")
    patterns = {}
    for key, default in (("include", ["*"]), ("exclude", [])):
        val = sc.get(key, default)
        if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
            raise ConfigError(f"scope.{key}: {shown(val)} is not a list of table-name patterns")
        patterns[key] = tuple(val)
    return ScopeConfig(**patterns)


def _dates_start(doc: Mapping[str, Any]) -> dt.date:
    start = doc.get("dates_start", dt.date(2020, 1, 1))
    if isinstance(start, str):
        try:
            start = parse_date(start)
        except ValueError:
            raise ConfigError(f"dates_start: {shown(start)} is not a date (YYYY-MM-DD)") from None
    if isinstance(start, dt.datetime) or not isinstance(start, dt.date):
        raise ConfigError(f"dates_start: {shown(start)} is not a date (YYYY-MM-DD)")
    return start


def _max_runs(doc: Mapping[str, Any]) -> int:
    max_runs = doc.get("max_runs_total", 2)
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or not 1 <= max_runs <= 10_000:
        raise ConfigError(f"max_runs_total: {shown(max_runs)} must be a whole number of at least 1 "
                          "(and at most 10000)")
    return max_runs


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return Path(DEFAULT_CONFIG_NAME)


def load_config(path: str | os.PathLike[str] | None = None) -> MaintenanceConfig:
    """Load and validate the configuration file (see the module docstring for the lookup).

    Raises:
        ConfigError: one line naming the file and what is wrong: missing, unreadable, larger than
            `yaml_reader.MAX_CONFIG_BYTES`, not UTF-8 text, not YAML, empty, or a bad key or value.
    """
    p = config_path(path)
    try:
        if not p.exists():
            raise ConfigError(f"{p}: configuration file not found (set --config or ${CONFIG_ENV})")
        raw = read_document(p)
        try:
            return parse_config(raw, p.resolve().parent, str(p))
        except ConfigError as exc:
            raise ConfigError(f"{p}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(one_line(str(exc))) from None
