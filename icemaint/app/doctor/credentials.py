"""Secrets in the environment: the catalog's, named and never shown, and the values no report line may show."""

from __future__ import annotations

import os
import re

from icemaint.app.doctor.report import Check, ok, warn
from icemaint.config import MaintenanceConfig
from icemaint.config.catalog import SECRET_ENV_PREFIX, catalog_secret_properties, secret_env_name


def check_catalog_credentials(config: MaintenanceConfig) -> Check:
    """Which `ICEMAINT_CATALOG_*` variables are set, by name; what the catalog type expects and lacks."""
    name, cat = "catalog credentials", config.catalog
    present = sorted(secret_env_name(key) for key in catalog_secret_properties(cat))
    empty = sorted(v for v, value in os.environ.items() if v.startswith(SECRET_ENV_PREFIX) and not value)
    shown = f"set: {', '.join(present)}" if present else "none set"
    if empty:
        return warn(name, f"{shown}; set but empty: {', '.join(empty)}")
    keys = {**cat.properties, **catalog_secret_properties(cat)}
    if cat.type == "jdbc" and (cat.uri or "").startswith("jdbc:postgresql:"):
        lacking = [secret_env_name(k) for k in ("jdbc.password",) if k not in keys]
        if "jdbc.user" not in keys:
            lacking.insert(0, f"catalog.properties.jdbc.user or {secret_env_name('jdbc.user')}")
        if lacking:
            return warn(name, f"{shown}; missing: {', '.join(lacking)}")
    if cat.type == "rest" and not {"token", "credential"} & set(keys):
        return ok(name, f"{shown} (a REST catalog that needs auth takes {secret_env_name('token')} "
                        f"or {secret_env_name('credential')})")
    return ok(name, shown)


def secret_values(config: MaintenanceConfig) -> list[str]:
    """Values no line may show: the catalog's secrets and the PostgreSQL DSNs in the environment, and
    the passwords inside those DSNs (a driver's message may quote one alone)."""
    dsn_vars = {config.claims.dsn_env, config.audit.dsn_env, "PGPASSWORD"}
    values = [v for k, v in os.environ.items() if v and (k.startswith(SECRET_ENV_PREFIX) or k in dsn_vars)]
    for value in list(values):
        values += re.findall(r"//[^/@:]*:([^/@]+)@", value)
        values += re.findall(r"password\s*=\s*'?([^\s&;']+)", value, flags=re.I)
    # longest first, so a DSN goes whole before its password; very short values would garble every line
    return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)


def scrubbed(check: Check, secrets: list[str]) -> Check:
    detail = check.detail
    for value in secrets:
        detail = detail.replace(value, "***")
    return check if detail == check.detail else Check(check.name, check.status, detail)
