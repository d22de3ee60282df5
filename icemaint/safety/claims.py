"""Table claims: the per-table lock that maintenance and cooperating writers both take, so a
maintenance commit never races a writer. Backends: `flock` files (embedded) and PostgreSQL
advisory locks (production).

Both backends live here (~460 lines): they implement one interface whose subtle part, who holds a
claim and whether that holder is still alive, must read the same for both.
"""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from icemaint.config.parse import ConfigError
from icemaint.domain.names import TableName
from icemaint.safety.postgres import PostgresConnector, dsn_from_env
from icemaint.errors import OperationalError

if TYPE_CHECKING:
    from icemaint.config import MaintenanceConfig


@dataclass(frozen=True)
class ClaimInfo:
    """Who holds a claim: the holder's name, its OS process and host, and since when."""

    table: str
    holder: str
    pid: int | None = None
    host: str | None = None
    since: dt.datetime | None = None

    def describe(self) -> str:
        """E.g. `'ingest' (pid 123 on host x) since 2026-01-02T03:04:05+00:00`."""
        where = []
        if self.pid is not None:
            where.append(f"pid {self.pid}")
        if self.host:
            where.append(f"on host {self.host}")
        text = repr(self.holder)
        if where:
            text += f" ({' '.join(where)})"
        if self.since is not None:
            text += f" since {self.since.isoformat(timespec='seconds')}"
        return text


class ClaimBusy(OperationalError):
    """The table's claim is held by someone else; `holder`/`since` say who and since when."""

    def __init__(self, table: str, info: ClaimInfo | None = None):
        super().__init__(table, info)
        self.table = table
        self.info = info
        self.holder = info.holder if info else None
        self.since = info.since if info else None

    def __str__(self) -> str:
        who = self.info.describe() if self.info else "an unknown holder"
        return f"claim on {self.table} is held by {who}"


class Claim(abc.ABC):
    """A held claim. Release it (idempotent), or use it as a context manager."""

    def __init__(self, info: ClaimInfo):
        self.info = info
        self._released = False
        self._release_lock = threading.Lock()

    @property
    def table(self) -> str:
        return self.info.table

    @property
    def holder(self) -> str:
        return self.info.holder

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Give the claim up; a second call does nothing."""
        with self._release_lock:
            if self._released:
                return
            self._released = True
            self._release()

    @abc.abstractmethod
    def _release(self) -> None: ...

    @abc.abstractmethod
    def is_held(self) -> bool:
        """Whether the lock is still ours (e.g. the claim's database session is still alive).

        Check it right before a commit that relies on the claim.
        """

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<{type(self).__name__} {self.table} by {self.holder!r} ({state})>"


class TableClaims(abc.ABC):
    """A claims backend. Claims are not re-entrant: a second acquire of a held table is busy,
    even from the same process or thread."""

    @abc.abstractmethod
    def acquire(self, table: str, holder: str) -> Claim:
        """Take the claim on `table` for `holder` now.

        Raises:
            ClaimBusy: someone holds it (never waits).
            InvalidTableName: `table` is not `namespace.table`.
        """

    @abc.abstractmethod
    def holder_of(self, table: str) -> ClaimInfo | None:
        """Who holds the claim on `table` right now, without taking it; None when it is free."""


def _table_key(table: str) -> str:
    return TableName.parse(table).key


def _check_holder(holder: str) -> str:
    if not isinstance(holder, str) or not holder.strip():
        raise ValueError(f"claim holder {holder!r} must be a non-empty name, e.g. 'ingest' or 'maintenance'")
    return holder


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _parse_ts(value) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------- file


class FileClaim(Claim):
    def __init__(self, info: ClaimInfo, fd: int, sidecar: Path, token: str):
        super().__init__(info)
        self._fd = fd
        self._sidecar = sidecar
        self._token = token

    def _release(self) -> None:
        try:
            # Remove our holder note while still holding the lock, so it never describes a
            # later holder; a note left by a crash is only informational (see FileClaims).
            with contextlib.suppress(OSError, ValueError):
                if json.loads(self._sidecar.read_text()).get("token") == self._token:
                    self._sidecar.unlink()
        finally:
            os.close(self._fd)  # closing the last descriptor releases the flock

    def is_held(self) -> bool:
        return not self.released


class FileClaims(TableClaims):
    """Claims as `flock` locks on `<state_dir>/claims/<table>.lock`, for one machine.

    The OS releases a flock when its holder dies, so a crashed holder never blocks. Who holds
    a claim is noted in `<table>.holder.json` beside the lock; that note is informational only.
    Lock files are never deleted: unlinking a lock file lets two processes lock different inodes
    under the same name.
    """

    # holder_of probes with a shared lock for an instant; an acquire that hits a probe retries.
    _BUSY_RETRIES = 3
    _BUSY_RETRY_SLEEP_S = 0.005

    def __init__(self, state_dir: str | os.PathLike):
        self.directory = Path(state_dir) / "claims"

    def _paths(self, key: str) -> tuple[Path, Path]:
        return self.directory / f"{key}.lock", self.directory / f"{key}.holder.json"

    def acquire(self, table: str, holder: str) -> Claim:
        key = _table_key(table)
        _check_holder(holder)
        lock_path, sidecar = self._paths(key)
        self.directory.mkdir(parents=True, exist_ok=True)
        # os.open descriptors are non-inheritable, so a child process (e.g. Spark's JVM) never
        # keeps a claim alive after we release it.
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for attempt in range(self._BUSY_RETRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    if attempt + 1 == self._BUSY_RETRIES:
                        raise ClaimBusy(key, self._read_note(key, sidecar)) from None
                    time.sleep(self._BUSY_RETRY_SLEEP_S)
            info = ClaimInfo(key, holder, os.getpid(), socket.gethostname(), _now())
            token = uuid.uuid4().hex
            self._write_note(sidecar, info, token)
        except BaseException:
            os.close(fd)
            raise
        return FileClaim(info, fd, sidecar, token)

    def holder_of(self, table: str) -> ClaimInfo | None:
        key = _table_key(table)
        lock_path, sidecar = self._paths(key)
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            return self._read_note(key, sidecar)
        finally:
            os.close(fd)
        return None  # free; any note left beside it is from a holder that died

    @staticmethod
    def _write_note(sidecar: Path, info: ClaimInfo, token: str) -> None:
        note = {"table": info.table, "holder": info.holder, "pid": info.pid, "host": info.host,
                "since": info.since.isoformat(), "token": token}
        tmp = sidecar.with_name(f"{sidecar.name}.{token}.tmp")
        tmp.write_text(json.dumps(note))
        os.replace(tmp, sidecar)  # readers see the old note or the new one, never half of one

    @staticmethod
    def _read_note(key: str, sidecar: Path) -> ClaimInfo:
        try:
            note = json.loads(sidecar.read_text())
            return ClaimInfo(key, str(note["holder"]), note.get("pid"), note.get("host"),
                             _parse_ts(note.get("since")))
        except (OSError, ValueError, KeyError, TypeError):
            # Held, but the holder has not written its note yet (or wrote none).
            return ClaimInfo(key, "unknown")


# ------------------------------------------------------------------------------------ postgres

_CLAIMS_DDL = """
CREATE TABLE IF NOT EXISTS icemaint_claims (
    table_name  text PRIMARY KEY,
    holder      text NOT NULL,
    pid         integer,
    host        text,
    since       timestamptz NOT NULL,
    backend_pid integer NOT NULL
)
"""
# Serialises concurrent first-time DDL (CREATE TABLE IF NOT EXISTS can still collide).
_DDL_LOCK_KEY = 0x1CE3A1_C1A1

_HOLDER_SQL = """
SELECT l.pid, c.holder, c.pid, c.host, c.since, a.application_name, host(a.client_addr)
FROM pg_locks l
LEFT JOIN icemaint_claims c ON c.table_name = %(table)s AND c.backend_pid = l.pid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = %(classid)s AND l.objid::bigint = %(objid)s AND l.objsubid = 1
"""
_APP_PREFIX = "icemaint claim: "


def advisory_key(table: str) -> int:
    """The signed 64-bit advisory-lock key of a table name (stable across processes and hosts)."""
    digest = hashlib.blake2b(f"icemaint-claim:{table}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _key_parts(key: int) -> tuple[int, int]:
    # pg_locks shows a bigint advisory key as two oids: high 32 bits (classid), low (objid).
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


class PostgresClaim(Claim):
    def __init__(self, info: ClaimInfo, conn, key: int):
        super().__init__(info)
        self._conn = conn
        self._key = key

    def _release(self) -> None:
        try:
            with self._conn.cursor() as cur:
                cur.execute("DELETE FROM icemaint_claims WHERE table_name = %s AND backend_pid = pg_backend_pid()",
                            (self.table,))
                cur.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
        except Exception:
            pass  # the session is gone, and with it the lock; closing below is what matters
        finally:
            self._conn.close()

    def is_held(self) -> bool:
        if self.released or self._conn.closed:
            return False
        classid, objid = _key_parts(self._key)
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
                            "AND pid = pg_backend_pid() AND classid::bigint = %s AND objid::bigint = %s "
                            "AND objsubid = 1", (classid, objid))
                return cur.fetchone() is not None
        except Exception:
            return False


class PostgresClaims(TableClaims):
    """Claims as session-level PostgreSQL advisory locks, for holders on many machines.

    Each held claim keeps its own connection open; the server frees the lock when that session
    ends, so a crashed holder never blocks. `icemaint_claims` notes who holds what.
    """

    def __init__(self, dsn: str, connect_timeout_s: int = 10):
        self._db = PostgresConnector(dsn, connect_timeout_s)

    def _connect(self, application_name: str = "icemaint"):
        # A claim's session may idle for the length of a maintenance run; keepalives let both ends
        # notice a dead peer instead of holding the lock forever.
        return self._db.connect(application_name, keepalives=True, autocommit=True)

    def _ensure_schema(self, conn) -> None:
        self._db.ensure_schema(conn, _DDL_LOCK_KEY, lambda cur: cur.execute(_CLAIMS_DDL))

    def acquire(self, table: str, holder: str) -> Claim:
        key = _table_key(table)
        _check_holder(holder)
        lock_key = advisory_key(key)
        conn = self._connect(_APP_PREFIX + holder)
        try:
            self._ensure_schema(conn)
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", (lock_key,))
                (locked,) = cur.fetchone()
                if not locked:
                    raise ClaimBusy(key, self._holder(cur, key))
                info = ClaimInfo(key, holder, os.getpid(), socket.gethostname(), _now())
                cur.execute(
                    "INSERT INTO icemaint_claims (table_name, holder, pid, host, since, backend_pid) "
                    "VALUES (%s, %s, %s, %s, %s, pg_backend_pid()) ON CONFLICT (table_name) DO UPDATE "
                    "SET holder = EXCLUDED.holder, pid = EXCLUDED.pid, host = EXCLUDED.host, "
                    "since = EXCLUDED.since, backend_pid = EXCLUDED.backend_pid",
                    (key, info.holder, info.pid, info.host, info.since),
                )
        except BaseException:
            conn.close()  # also frees the advisory lock if we took it
            raise
        return PostgresClaim(info, conn, lock_key)

    def holder_of(self, table: str) -> ClaimInfo | None:
        key = _table_key(table)
        conn = self._connect()
        try:
            self._ensure_schema(conn)
            with conn.cursor() as cur:
                return self._holder(cur, key)
        finally:
            conn.close()

    @staticmethod
    def _holder(cur, key: str) -> ClaimInfo | None:
        classid, objid = _key_parts(advisory_key(key))
        cur.execute(_HOLDER_SQL, {"table": key, "classid": classid, "objid": objid})
        row = cur.fetchone()
        if row is None:
            return None  # free; a row left in icemaint_claims is from a session that died
        _backend_pid, holder, pid, host, since, app_name, client_addr = row
        if holder is not None:
            return ClaimInfo(key, holder, pid, host, since)
        # Locked, but the holder's row is not written yet: name it from its session.
        name = app_name[len(_APP_PREFIX):] if app_name and app_name.startswith(_APP_PREFIX) else "unknown"
        return ClaimInfo(key, name, None, client_addr)


# ------------------------------------------------------------------------------------ entry points


def open_claims(config: "MaintenanceConfig") -> TableClaims:
    """The claims backend named by `config.claims.backend`.

    Raises:
        ConfigError: the postgres backend is chosen and `$<claims.dsn_env>` is unset.
    """
    backend = config.claims.backend
    if backend == "file":
        return FileClaims(config.state_dir)
    if backend == "postgres":
        return PostgresClaims(dsn_from_env(config.claims.dsn_env, "claims.dsn_env"))
    raise ConfigError(f"claims.backend: {backend!r} is not a known claims backend")


@contextlib.contextmanager
def table_claim(config: "MaintenanceConfig", table: str, holder: str, wait_seconds: float = 0.0,
                poll_seconds: float = 0.2) -> Iterator[Claim]:
    """Hold the claim on `table` for the body of a `with` block; what cooperating writers use.

        with table_claim(cfg, "db.events", holder="ingest", wait_seconds=30):
            ...  # write; maintenance defers meanwhile

    Args:
        config: names the claims backend.
        table: `namespace.table`.
        holder: who is writing, shown to whoever finds the claim busy.
        wait_seconds: how long to keep retrying while the claim is busy (0: try once).
        poll_seconds: pause between retries.

    Raises:
        ClaimBusy: still held by someone else after `wait_seconds`.
        InvalidTableName: `table` is not `namespace.table`.
    """
    key = _table_key(table)
    _check_holder(holder)
    if wait_seconds < 0 or poll_seconds <= 0:
        raise ValueError(f"wait_seconds ({wait_seconds}) must be >= 0 and poll_seconds ({poll_seconds}) > 0")
    claims = open_claims(config)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            claim = claims.acquire(key, holder)
            break
        except ClaimBusy:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise
            time.sleep(min(poll_seconds, remaining))
    with claim:
        yield claim
