"""PostgreSQL through the connector claims and the audit log use."""

from __future__ import annotations

from icemaint.app.doctor.report import NETWORK_TIMEOUT_S, Check, fail, first_line, ok, within
from icemaint.config import MaintenanceConfig


def postgres_users(config: MaintenanceConfig) -> dict[str, list[str]]:
    """The DSN variables the config uses, each with the sections (claims, audit) that chose PostgreSQL."""
    users: dict[str, list[str]] = {}
    if config.claims.backend == "postgres":
        users.setdefault(config.claims.dsn_env, []).append("claims")
    if config.audit.sink == "postgres":
        users.setdefault(config.audit.dsn_env, []).append("audit")
    return users


def check_postgres(var: str, sections: list[str], timeout_s: float = NETWORK_TIMEOUT_S) -> Check:
    """The DSN in `$var` connects (what claims and the audit log will do)."""
    import psycopg2
    from psycopg2.extensions import parse_dsn

    from icemaint.safety.postgres import PostgresConnector, dsn_from_env

    name, used = "postgres", f"{' and '.join(sections)} via ${var}"
    dsn = dsn_from_env(var, f"{sections[0]}.dsn_env")
    try:
        parts = parse_dsn(dsn)
    except psycopg2.Error:  # its message may quote the value
        return fail(name, f"${var} is not a PostgreSQL DSN (its value is not shown)")
    where = f"{parts.get('host', 'local socket')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"

    def connect():
        conn = PostgresConnector(dsn, connect_timeout_s=max(1, int(timeout_s / 2))).connect("icemaint doctor")
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW server_version")
                return cur.fetchone()[0]
        finally:
            conn.close()

    try:
        version = within(timeout_s, connect)
    except Exception as exc:
        return fail(name, f"{where} ({used}): {first_line(exc)}")
    return ok(name, f"{where}: PostgreSQL {version} ({used})")
