"""The audit log: one append-only record per maintenance decision (run, defer, refuse, noop,
rollback, failed, approved, ...), kept in a JSON-lines file or a PostgreSQL table.
"""

from __future__ import annotations

import abc
import datetime as dt
import fcntl
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from icemaint.config import ConfigError
from icemaint.safety.postgres import PostgresConnector, dsn_from_env

if TYPE_CHECKING:
    from icemaint.config import MaintenanceConfig

# The usual values; others are allowed (lowercase words), so a new step needs no change here.
OPERATIONS = ("compact", "expire", "orphans", "manifests", "approve", "purge_quarantine", "cleanup")
DECISIONS = ("run", "defer", "refuse", "noop", "not_published", "failed", "approved")

_log = logging.getLogger(__name__)
_WORD = re.compile(r"^[a-z][a-z0-9_]*$")
_DICT_FIELDS = ("writer_check", "partition_rationale", "cost_estimate", "validation", "rollback",
                "durations", "details")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class AuditLogCorrupt(RuntimeError):
    """A stored audit line that cannot be read back; the message names where it is."""


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    """One maintenance decision: what was decided for which table, why, and the evidence.

    The dict fields hold JSON-serialisable evidence (they are copied on construction, so the
    record does not change when the caller's dicts do).
    """

    ts: dt.datetime = field(default_factory=_utcnow)
    table: str
    operation: str
    decision: str
    reason: str
    date: str | None = None
    trigger: str | None = None
    identity: str | None = None
    run_id: str | None = None
    before_snapshot_id: int | None = None
    after_snapshot_id: int | None = None
    writer_check: dict = field(default_factory=dict)
    partition_rationale: dict = field(default_factory=dict)
    cost_estimate: dict = field(default_factory=dict)
    validation: dict = field(default_factory=dict)
    rollback: dict = field(default_factory=dict)
    durations: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.ts, dt.datetime) or self.ts.tzinfo is None:
            raise ValueError(f"audit ts {self.ts!r} must be a timezone-aware datetime")
        object.__setattr__(self, "ts", self.ts.astimezone(dt.timezone.utc))
        if not isinstance(self.table, str) or not self.table:
            raise ValueError(f"audit table {self.table!r} must be a non-empty string")
        for name in ("operation", "decision"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _WORD.match(value):
                raise ValueError(f"audit {name} {value!r} must be a lowercase word, e.g. "
                                 f"{(OPERATIONS if name == 'operation' else DECISIONS)[:3]}")
            object.__setattr__(self, name, str(value))  # a Verdict or Operation is stored as its word
        if not isinstance(self.reason, str):
            raise ValueError(f"audit reason {self.reason!r} must be a string")
        for name in ("date", "trigger", "identity", "run_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"audit {name} {value!r} must be a string or None")
        for name in ("before_snapshot_id", "after_snapshot_id"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"audit {name} {value!r} must be an integer snapshot id or None")
        for name in _DICT_FIELDS:
            value = getattr(self, name)
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise ValueError(f"audit {name} must be a dict, got {type(value).__name__}")
            try:
                copied = json.loads(json.dumps(dict(value), allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"audit {name} is not JSON-serialisable: {exc}") from None
            object.__setattr__(self, name, copied)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `ts` as an ISO-8601 string in UTC."""
        out = asdict(self)
        out["ts"] = self.ts.isoformat()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AuditRecord":
        """The inverse of `to_dict`. Keys this version does not know are ignored (old logs
        outlive the code that wrote them)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"an audit record is a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        ts = kwargs.get("ts")
        if isinstance(ts, str):
            kwargs["ts"] = dt.datetime.fromisoformat(ts)
        return cls(**kwargs)


class AuditLog(abc.ABC):
    """Where audit records go. Append-only: there is no way to change or delete a record."""

    @abc.abstractmethod
    def append(self, record: AuditRecord) -> None:
        """Store one record durably."""

    @abc.abstractmethod
    def records(self, table: str | None = None, operation: str | None = None,
                since: dt.datetime | None = None, limit: int | None = None) -> list[AuditRecord]:
        """Stored records in the order they were appended, optionally filtered.

        Args:
            table: only this table.
            operation: only this operation.
            since: only records with `ts >= since` (timezone-aware).
            limit: only the most recent `limit` matching records (still oldest first).
        """


def _check_filters(since: dt.datetime | None, limit: int | None) -> None:
    if since is not None and (not isinstance(since, dt.datetime) or since.tzinfo is None):
        raise ValueError(f"since {since!r} must be a timezone-aware datetime")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit {limit!r} must be a whole number >= 0")


class FileAuditLog(AuditLog):
    """JSON lines at `<state_dir>/audit/audit.jsonl`, appended under an exclusive `flock` so
    concurrent processes never interleave lines."""

    def __init__(self, state_dir: str | os.PathLike):
        self.path = Path(state_dir) / "audit" / "audit.jsonl"

    def append(self, record: AuditRecord) -> None:
        line = (json.dumps(record.to_dict(), sort_keys=True, allow_nan=False) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A writer that died mid-line left no newline: start on a fresh line so that torn
            # line does not swallow this record.
            size = os.fstat(fd).st_size
            if size and not self._ends_with_newline(size):
                line = b"\n" + line
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the flock

    def _ends_with_newline(self, size: int) -> bool:
        with open(self.path, "rb") as fh:
            return os.pread(fh.fileno(), 1, size - 1) == b"\n"

    def records(self, table: str | None = None, operation: str | None = None,
                since: dt.datetime | None = None, limit: int | None = None) -> list[AuditRecord]:
        _check_filters(since, limit)
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return []
        with fh:
            # A shared lock: no appender is halfway through a line while we read.
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
            data = fh.read()
        out = []
        for number, raw in enumerate(data.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except ValueError:
                # A line torn by a writer that died mid-write: its record was never complete.
                _log.warning("%s:%d: skipping a torn (incomplete) audit line", self.path, number)
                continue
            try:
                record = AuditRecord.from_dict(data)
            except (ValueError, TypeError) as exc:
                raise AuditLogCorrupt(f"{self.path}:{number}: not an audit record: {exc}") from None
            if table is not None and record.table != table:
                continue
            if operation is not None and record.operation != operation:
                continue
            if since is not None and record.ts < since:
                continue
            out.append(record)
        return _last(out, limit)


def _last(items: list, limit: int | None) -> list:
    if limit is None:
        return items
    return items[len(items) - limit:] if limit else []


_AUDIT_DDL = (
    """
    CREATE TABLE IF NOT EXISTS icemaint_audit (
        id         bigserial PRIMARY KEY,
        ts         timestamptz NOT NULL,
        table_name text NOT NULL,
        operation  text NOT NULL,
        decision   text NOT NULL,
        record     jsonb NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS icemaint_audit_table_ts ON icemaint_audit (table_name, ts)",
    """
    CREATE OR REPLACE FUNCTION icemaint_audit_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'icemaint_audit is append-only: % refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END
    $$
    """,
)
_AUDIT_TRIGGERS = {
    "icemaint_audit_no_change": "CREATE TRIGGER icemaint_audit_no_change BEFORE UPDATE OR DELETE "
                                "ON icemaint_audit FOR EACH ROW EXECUTE FUNCTION icemaint_audit_append_only()",
    "icemaint_audit_no_truncate": "CREATE TRIGGER icemaint_audit_no_truncate BEFORE TRUNCATE "
                                  "ON icemaint_audit FOR EACH STATEMENT EXECUTE FUNCTION icemaint_audit_append_only()",
}
# Serialises concurrent first-time DDL (CREATE ... IF NOT EXISTS can still collide).
_DDL_LOCK_KEY = 0x1CE3A1_A0D1


def _create_schema(cur) -> None:
    for statement in _AUDIT_DDL:
        cur.execute(statement)
    cur.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'icemaint_audit'::regclass")
    present = {name for (name,) in cur.fetchall()}
    for name, statement in _AUDIT_TRIGGERS.items():
        if name not in present:
            cur.execute(statement)


class PostgresAuditLog(AuditLog):
    """Rows of `icemaint_audit`; triggers in the database refuse UPDATE, DELETE and TRUNCATE,
    so the log stays append-only whoever connects."""

    def __init__(self, dsn: str, connect_timeout_s: int = 10):
        self._db = PostgresConnector(dsn, connect_timeout_s)

    def _connect(self):
        conn = self._db.connect("icemaint audit")
        try:
            self._db.ensure_schema(conn, _DDL_LOCK_KEY, _create_schema)
        except BaseException:
            conn.close()
            raise
        return conn

    def append(self, record: AuditRecord) -> None:
        from psycopg2.extras import Json

        conn = self._connect()
        try:
            with conn, conn.cursor() as cur:
                cur.execute(
                    "INSERT INTO icemaint_audit (ts, table_name, operation, decision, record) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    (record.ts, record.table, record.operation, record.decision, Json(record.to_dict())),
                )
        finally:
            conn.close()

    def records(self, table: str | None = None, operation: str | None = None,
                since: dt.datetime | None = None, limit: int | None = None) -> list[AuditRecord]:
        _check_filters(since, limit)
        where, params = [], []
        for column, value in (("table_name", table), ("operation", operation)):
            if value is not None:
                where.append(f"{column} = %s")  # column names are constants of this module
                params.append(value)
        if since is not None:
            where.append("ts >= %s")
            params.append(since)
        sql = "SELECT id, record FROM icemaint_audit"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        conn = self._connect()
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                rows = cur.fetchall()
        finally:
            conn.close()
        out = []
        for row_id, data in reversed(rows):
            try:
                out.append(AuditRecord.from_dict(data))
            except (ValueError, TypeError) as exc:
                raise AuditLogCorrupt(f"icemaint_audit id {row_id}: not an audit record: {exc}") from None
        return out


def open_audit(config: "MaintenanceConfig") -> AuditLog:
    """The audit log named by `config.audit.sink`.

    Raises:
        ConfigError: the postgres sink is chosen and `$<audit.dsn_env>` is unset.
    """
    sink = config.audit.sink
    if sink == "file":
        return FileAuditLog(config.state_dir)
    if sink == "postgres":
        return PostgresAuditLog(dsn_from_env(config.audit.dsn_env, "audit.dsn_env"))
    raise ConfigError(f"audit.sink: {sink!r} is not a known audit sink")
