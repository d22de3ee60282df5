"""`icemaint doctor`: what a new deployment gets wrong, found before the first run, one line per check.

Each check looks at one thing the way the product later uses it: Java as Spark's launcher finds it,
the jars the session would load, the catalog through the sensors' own pyiceberg reader, PostgreSQL
through the connector claims and the audit log use, the Dagster instance the CLI opens. A check
turns its own exceptions into a FAIL line with their first line (never a stack trace), and every
line is scrubbed of the secrets in the environment: credentials are named, never shown.

`run_doctor` is the check list, in the order a new user fixes them; each probe is a module of this package.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Callable

from icemaint.app.doctor.catalog import check_catalog, check_configured_tables
from icemaint.app.doctor.credentials import check_catalog_credentials, scrubbed, secret_values
from icemaint.app.doctor.dagster_instance import check_automation, check_dagster_instance
from icemaint.app.doctor.files import check_config, check_state_dir
from icemaint.app.doctor.jars import check_iceberg_runtime, check_jdbc_driver, check_spark_jars, jar_entries
from icemaint.app.doctor.java import check_java
from icemaint.app.doctor.postgres import check_postgres, postgres_users
from icemaint.app.doctor.report import NETWORK_TIMEOUT_S, Check, Status, fail, first_line, warn
from icemaint.app.doctor.spark import check_class_archive, check_local_files, check_spark
from icemaint.config import MaintenanceConfig


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    try:
        return check()
    except Exception as exc:
        return fail(name, first_line(exc))


def run_doctor(config: MaintenanceConfig, config_path: str | os.PathLike | None = None, *, spark: bool = False,
               timeout_s: float = NETWORK_TIMEOUT_S) -> list[Check]:
    """Every check for this config, in the order a new user fixes them.

    Args:
        config: the loaded configuration (loading it was the first check).
        config_path: the file it came from, for the report.
        spark: also start Spark and report the Iceberg version it loaded (slow: a JVM).
        timeout_s: how long the catalog and PostgreSQL get to answer.
    """
    checks = [_guarded("config", lambda: check_config(config, config_path)),
              _guarded("java", check_java)]
    if config.spark.master.startswith("local"):  # a cluster's file systems are its own
        checks.append(_guarded("local files", lambda: check_local_files(config)))
    checks.append(_guarded("iceberg runtime", lambda: check_iceberg_runtime(config)))
    checks.append(_guarded("class archive", lambda: check_class_archive(config)))
    if jar_entries(config):
        checks.append(_guarded("spark.jars", lambda: check_spark_jars(config)))
    if config.catalog.type == "jdbc" and (config.catalog.uri or "").startswith("jdbc:postgresql:"):
        checks.append(_guarded("jdbc driver", lambda: check_jdbc_driver(config)))
    checks.append(_guarded("catalog credentials", lambda: check_catalog_credentials(config)))
    listed: list[list[str]] = []
    checks.append(_guarded("catalog", lambda: check_catalog(config, timeout_s, listed)))
    if config.policies.tables:
        checks.append(_guarded("configured tables", lambda: check_configured_tables(config, listed)))
    checks.append(_guarded("state dir", lambda: check_state_dir(config)))
    for var, sections in postgres_users(config).items():
        checks.append(_guarded("postgres", partial(check_postgres, var, sections, timeout_s)))
    checks.append(_guarded("dagster instance", lambda: check_dagster_instance(config)))
    checks.append(_guarded("automation", lambda: check_automation(config)))
    if spark:
        blocking = [c.name for c in checks
                    if c.status is Status.FAIL and c.name in ("java", "iceberg runtime", "spark.jars")]
        checks.append(warn("spark", f"not started: fix {', '.join(blocking)} first") if blocking
                      else _guarded("spark", lambda: check_spark(config)))
    secrets = secret_values(config)
    return [scrubbed(c, secrets) for c in checks]
