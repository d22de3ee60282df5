"""Shared PostgreSQL plumbing for the safety layer: connections and one-time schema set-up.

Claims (advisory locks) and the audit log (append-only table) both connect with a timeout and an
application name operators can see in `pg_stat_activity`, and both create their schema once per
process, serialised across processes by a transaction-scoped advisory lock.
"""

from __future__ import annotations

import os
from typing import Callable

from icemaint.config.parse import ConfigError


def dsn_from_env(var: str, setting: str) -> str:
    """The DSN in environment variable `var` (secrets never live in the config file).

    Raises:
        ConfigError: `var` is unset; the message names the config `setting` that chose it.
    """
    dsn = os.environ.get(var)
    if not dsn:
        raise ConfigError(f"{setting}: environment variable {var} is not set; it must hold the "
                          "PostgreSQL DSN (postgresql://user:password@host:port/db)")
    return dsn


class PostgresConnector:
    """Connections to one database, and its schema made ready once."""

    def __init__(self, dsn: str, connect_timeout_s: int = 10):
        self.dsn = dsn
        self.connect_timeout_s = connect_timeout_s
        self._ready: set[int] = set()

    def connect(self, application_name: str, *, keepalives: bool = False, autocommit: bool = False):
        """A new connection; with `keepalives` both ends notice a dead peer of a long-idle session."""
        import psycopg2

        extra = dict(keepalives=1, keepalives_idle=30, keepalives_interval=10, keepalives_count=3) if keepalives else {}
        conn = psycopg2.connect(self.dsn, connect_timeout=self.connect_timeout_s,
                                application_name=application_name[:63], **extra)
        conn.autocommit = autocommit
        return conn

    def ensure_schema(self, conn, lock_key: int, create: Callable[[object], None]) -> None:
        """Runs `create(cursor)` once per process in one transaction under `pg_advisory_xact_lock(lock_key)`.

        The connection's autocommit setting is restored afterwards.
        """
        if lock_key in self._ready:
            return
        autocommit = conn.autocommit
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key,))
                create(cur)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.autocommit = autocommit
        self._ready.add(lock_key)
