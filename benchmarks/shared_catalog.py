"""The one SQL catalog named `local` that icemaint and the peer (iceberg-zamboni) both commit to.

PostgreSQL (the default): a throwaway server started by the benchmark (tests/pg_server.py, the one the
production-profile tests use), a fresh database per shape. pyiceberg opens it as a SQL catalog, icemaint
as a JDBC catalog (Debian's PostgreSQL JDBC driver, on Spark's classpath when installed), zamboni through
`benchmarks/zamboni_on_sql.py`. A PostgreSQL catalog takes commits to different tables at once, so
`icemaint tick` runs tables at once (`CatalogConfig.concurrent_commits`), as the peer could.

SQLite (`--catalog sqlite`): `<wh>/catalog.db`, the catalog zamboni's CLI opens unpatched; it takes one
writer at a time, so icemaint runs one table at a time through it.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

SQLITE_JAR = "/usr/share/java/sqlite-jdbc.jar"
POSTGRES_JAR = "/usr/share/java/postgresql.jar"
PASSWORD_ENV = "ICEMAINT_CATALOG_JDBC_PASSWORD"  # icemaint reads the JDBC password from here (never the config)


@dataclass(frozen=True)
class SharedCatalog:
    kind: str                 # "postgres" | "sqlite"
    sqlalchemy_uri: str       # pyiceberg's SQL catalog (this process and zamboni)
    jdbc_uri: str             # icemaint's JDBC catalog
    jdbc_properties: dict = field(default_factory=dict)
    spark_jars: str | None = None  # None: the PostgreSQL jar is added by icemaint itself when installed
    env: dict = field(default_factory=dict)  # icemaint's process: the catalog password

    def describe(self) -> str:
        return {"postgres": "PostgreSQL SQL catalog `local`, a fresh database per shape",
                "sqlite": "SQLite SQL catalog `local`"}[self.kind]


def sqlite_catalog(wh: Path) -> SharedCatalog:
    return SharedCatalog("sqlite", f"sqlite:///{wh}/catalog.db", f"jdbc:sqlite:{wh}/catalog.db",
                         spark_jars=SQLITE_JAR)


def missing_prerequisite(kind: str) -> str | None:
    """What this machine lacks for `kind`, as a line naming the fix; None when it has it all."""
    if kind == "sqlite" and not Path(SQLITE_JAR).exists():
        return f"{SQLITE_JAR} is missing: run scripts/ensure_debian_packages.sh libxerial-sqlite-jdbc-java"
    if kind == "postgres":
        from tests.pg_server import find_bindir

        if not Path(POSTGRES_JAR).exists() or find_bindir() is None:
            return "PostgreSQL or its JDBC driver is missing: run scripts/ensure_postgres.sh"
    return None


def postgres_server():
    """A throwaway PostgreSQL server for the whole benchmark run (a context: stopped and deleted after)."""
    from tests.pg_server import running_server

    return running_server("icemaint-bench-pg-")


@contextlib.contextmanager
def postgres_catalog(server, name: str) -> Iterator[SharedCatalog]:
    """A fresh database `name` on `server` as the shared catalog; dropped afterwards."""
    from tests.pg_server import fresh_database

    if not re.fullmatch(r"[a-z][a-z0-9_]{0,40}", name):
        raise ValueError(f"database name {name!r}: lower-case letters, digits and _ only")
    with fresh_database(server.dsn, name) as dsn:
        yield SharedCatalog(
            "postgres", dsn.replace("postgresql://", "postgresql+psycopg2://", 1),
            f"jdbc:postgresql://{server.host}:{server.port}/{name}", {"jdbc.user": server.user},
            env={PASSWORD_ENV: server.password})


def pyiceberg_catalog(shared: SharedCatalog, wh: Path):
    from pyiceberg.catalog import load_catalog

    return load_catalog("local", type="sql", uri=shared.sqlalchemy_uri, warehouse=f"file://{wh}")
