"""The audit log: one append-only record per maintenance decision (run, defer, refuse, noop,
rollback, failed, approved, ...), kept in a JSON-lines file or a PostgreSQL table.

A call of the operating contract that acts also stores a `started` marker before its act, naming its
process (pid, host and the process's start, so a reused pid is never taken for it). `records()` reads
every call back as exactly one record: its decision once written; else `started` while its process
runs; else `interrupted` (the process died before it could record what it did). Marker and decision
are paired by `call_id`, which every record written inside the call carries (`audit_call`).
"""

from __future__ import annotations

import abc
import datetime as dt
import fcntl
import json
import logging
import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from icemaint.config.parse import ConfigError
from icemaint.safety.postgres import PostgresConnector, dsn_from_env
from icemaint.safety.process import Probe, ProcessRef, ProcessState, probe_process
from icemaint.errors import OperationalError

if TYPE_CHECKING:
    from icemaint.config import MaintenanceConfig

# The usual values; others are allowed (lowercase words), so a new step needs no change here.
OPERATIONS = ("compact", "expire", "orphans", "manifests", "statistics", "approve", "purge_quarantine", "cleanup",
              "ingest")
DECISIONS = ("run", "defer", "refuse", "noop", "not_published", "failed", "approved", "started", "interrupted")
STARTED, INTERRUPTED = "started", "interrupted"

_log = logging.getLogger(__name__)
_WORD = re.compile(r"^[a-z][a-z0-9_]*$")
_DICT_FIELDS = ("writer_check", "partition_rationale", "cost_estimate", "validation", "rollback",
                "durations", "details")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# -- calls: a started marker and the decision that ends it -----------------------------------

_CALL: ContextVar[str | None] = ContextVar("icemaint_audit_call", default=None)


@contextmanager
def audit_call(call_id: str) -> Iterator[str]:
    """Every record built in the block carries `call_id` (the contract's calls use it)."""
    token = _CALL.set(call_id)
    try:
        yield call_id
    finally:
        _CALL.reset(token)


def _current_call() -> str | None:
    return _CALL.get()


class AuditLogCorrupt(OperationalError, RuntimeError):
    """A stored audit line that cannot be read back; the message names where it is."""


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    """One maintenance decision: what was decided for which table, why, and the evidence.

    The dict fields hold JSON-serialisable evidence (they are copied on construction, so the
    record does not change when the caller's dicts do). `call_id` defaults to the contract call the
    record is built in (`audit_call`), which pairs a call's `started` marker with its decision.
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
    call_id: str | None = field(default_factory=_current_call)

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
        for name in ("date", "trigger", "identity", "run_id", "call_id"):
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
        kwargs.setdefault("call_id", None)  # a stored record is never stamped with the reader's call
        ts = kwargs.get("ts")
        if isinstance(ts, str):
            kwargs["ts"] = dt.datetime.fromisoformat(ts)
        return cls(**kwargs)


class AuditLog(abc.ABC):
    """Where audit records go. Append-only: there is no way to change or delete a record."""

    probe: Probe = staticmethod(probe_process)  # how an open call's process is checked (tests swap it)

    @abc.abstractmethod
    def append(self, record: AuditRecord) -> None:
        """Store one record durably."""

    @abc.abstractmethod
    def records(self, table: str | None = None, operation: str | None = None,
                since: dt.datetime | None = None, limit: int | None = None) -> list[AuditRecord]:
        """Stored records in the order they were appended, optionally filtered; one per call.

        A call's `started` marker is left out once its decision is stored. A marker with no decision
        reads as `interrupted` when its process is provably dead (see `ProcessRef.probe`), else as
        `started` (still running, or on a host where that cannot be checked), its reason saying which.

        Args:
            table: only this table.
            operation: only this operation.
            since: only records with `ts >= since` (timezone-aware).
            limit: only the most recent `limit` matching records (still oldest first).
        """

    def _open_call(self, marker: AuditRecord, seen: dict) -> AuditRecord:
        """A `started` marker whose call stored no decision: `interrupted` if its process is dead."""
        ref = ProcessRef.from_dict(marker.details.get("process"))
        if ref is None:
            return marker
        if ref not in seen:
            seen[ref] = self.probe(ref)
        state, why = seen[ref]
        if state is ProcessState.DEAD:
            return replace(marker, decision=INTERRUPTED, reason=(
                f"interrupted: the {marker.operation} started at {marker.ts:%Y-%m-%d %H:%M:%S} UTC by "
                f"{ref.describe()} ended without recording an outcome ({why}); its claim ended with its "
                f"process. At its start: {marker.reason}"))
        still = "still running" if state is ProcessState.ALIVE else "cannot be checked from here"
        return replace(marker, reason=f"{marker.reason} [no outcome yet; {why}: {still}]")


def _check_filters(since: dt.datetime | None, limit: int | None) -> None:
    if since is not None and (not isinstance(since, dt.datetime) or since.tzinfo is None):
        raise ValueError(f"since {since!r} must be a timezone-aware datetime")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit {limit!r} must be a whole number >= 0")


class FileAuditLog(AuditLog):
    """JSON lines at `<state_dir>/audit/audit.jsonl`, appended under an exclusive `flock` so
    concurrent processes never interleave lines."""

    def __init__(self, state_dir: str | os.PathLike, probe: Probe | None = None):
        self.path = Path(state_dir) / "audit" / "audit.jsonl"
        if probe is not None:
            self.probe = probe

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
        stored = []
        # One table's records: a line that does not even hold the table's name as a JSON string is not parsed (a
        # decision per table-date reads its table's records; parsing the whole log each time grew with the log).
        # A call's started marker and its decision name the same table, so the folding below still sees both.
        needle = json.dumps(table).encode() if table is not None else b""
        for number, raw in enumerate(data.splitlines(), start=1):
            if not raw.strip() or needle not in raw:
                continue
            try:
                data = json.loads(raw)
            except ValueError:
                # A line torn by a writer that died mid-write: its record was never complete.
                _log.warning("%s:%d: skipping a torn (incomplete) audit line", self.path, number)
                continue
            try:
                stored.append(AuditRecord.from_dict(data))
            except (ValueError, TypeError) as exc:
                raise AuditLogCorrupt(f"{self.path}:{number}: not an audit record: {exc}") from None
        # Decided over the whole log, so a filter (since, limit) never reopens a call that ended.
        ended = {(r.call_id, r.operation) for r in stored if r.call_id and r.decision != STARTED}
        out, seen = [], {}
        for record in stored:
            if record.decision == STARTED:
                if (record.call_id, record.operation) in ended:
                    continue
                record = self._open_call(record, seen)
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
    # pairs a call's started marker with its decision (see PostgresAuditLog.records)
    "CREATE INDEX IF NOT EXISTS icemaint_audit_call ON icemaint_audit ((record->>'call_id'))",
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

    def __init__(self, dsn: str, connect_timeout_s: int = 10, probe: Probe | None = None):
        self._db = PostgresConnector(dsn, connect_timeout_s)
        if probe is not None:
            self.probe = probe

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
        # A started marker whose call stored its decision is left out here, so LIMIT counts calls.
        where, params = ["NOT (a.decision = 'started' AND EXISTS (SELECT 1 FROM icemaint_audit e "
                         "WHERE e.record->>'call_id' = a.record->>'call_id' AND e.operation = a.operation "
                         "AND e.decision <> 'started'))"], []
        for column, value in (("table_name", table), ("operation", operation)):
            if value is not None:
                where.append(f"a.{column} = %s")  # column names are constants of this module
                params.append(value)
        if since is not None:
            where.append("a.ts >= %s")
            params.append(since)
        sql = "SELECT a.id, a.record FROM icemaint_audit a WHERE " + " AND ".join(where) + " ORDER BY a.id DESC"
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
        out, seen = [], {}
        for row_id, data in reversed(rows):
            try:
                record = AuditRecord.from_dict(data)
            except (ValueError, TypeError) as exc:
                raise AuditLogCorrupt(f"icemaint_audit id {row_id}: not an audit record: {exc}") from None
            out.append(self._open_call(record, seen) if record.decision == STARTED else record)
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
