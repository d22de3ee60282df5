"""The audit log read incrementally: each call returns the records appended since the previous one.

`icemaint metrics` tallies the trail as it grows, so a scrape reads only what is new: the JSON-lines file from the
byte offset it reached (complete lines only), PostgreSQL's `icemaint_audit` from the last row id. Records come back
as the stored JSON objects; `started` markers are left to the reader (a tally skips them).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icemaint.safety.postgres import PostgresConnector, dsn_from_env

if TYPE_CHECKING:
    from icemaint.config import MaintenanceConfig

_log = logging.getLogger(__name__)
PAGE_ROWS = 20_000  # rows per PostgreSQL round trip


class FileAuditTail:
    """`<state_dir>/audit/audit.jsonl` from the offset last read."""

    def __init__(self, state_dir: str | os.PathLike):
        self.path = Path(state_dir) / "audit" / "audit.jsonl"
        self.offset = 0
        self.skipped = 0  # lines that were not JSON (torn by a writer that died mid-line)

    def read_new(self) -> list[dict[str, Any]]:
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return []
        with fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH)  # no appender is halfway through a line
            if os.fstat(fh.fileno()).st_size < self.offset:  # replaced by a shorter file: read it from the start
                _log.warning("%s is shorter than the offset read (%d): reading it again from the start",
                             self.path, self.offset)
                self.offset = 0
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                self.skipped += 1
                continue
            if isinstance(record, dict):
                out.append(record)
        return out


class PostgresAuditTail:
    """Rows of `icemaint_audit` after the last id read (none yet when the table does not exist)."""

    def __init__(self, dsn: str, connect_timeout_s: int = 10):
        self._db = PostgresConnector(dsn, connect_timeout_s)
        self.last_id = 0
        self.skipped = 0

    def read_new(self) -> list[dict[str, Any]]:
        import psycopg2

        out: list[dict[str, Any]] = []
        conn = self._db.connect("icemaint metrics", autocommit=True)
        try:
            with conn.cursor() as cur:
                while True:
                    try:
                        cur.execute("SELECT id, record FROM icemaint_audit WHERE id > %s ORDER BY id LIMIT %s",
                                    (self.last_id, PAGE_ROWS))
                    except psycopg2.errors.UndefinedTable:
                        return out  # nothing audited yet: the first record creates the table
                    rows = cur.fetchall()
                    for row_id, record in rows:
                        self.last_id = row_id
                        if isinstance(record, dict):
                            out.append(record)
                        else:
                            self.skipped += 1
                    if len(rows) < PAGE_ROWS:
                        return out
        finally:
            conn.close()


def open_audit_tail(config: "MaintenanceConfig") -> FileAuditTail | PostgresAuditTail:
    """The incremental reader of the audit log `config.audit.sink` names."""
    if config.audit.sink == "postgres":
        return PostgresAuditTail(dsn_from_env(config.audit.dsn_env, "audit.dsn_env"))
    return FileAuditTail(config.state_dir)
