"""The audit log on both sinks: a JSON-lines file and a PostgreSQL table (real server)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg2
import pytest

from conftest import make_config
from icemaint.safety.audit import (
    AuditLogCorrupt,
    AuditRecord,
    FileAuditLog,
    PostgresAuditLog,
    open_audit,
)
from icemaint.config.parse import ConfigError
from pg_server import fresh_database

REPO = Path(__file__).resolve().parents[1]
DSN_ENV = "ICEMAINT_TEST_AUDIT_DSN"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
_db_counter = itertools.count()


@pytest.fixture
def audit_dsn(postgres_dsn):
    """An empty database per test, so each test sees only its own audit rows and a fresh schema."""
    with fresh_database(postgres_dsn, f"audit_{next(_db_counter)}") as dsn:
        yield dsn


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def cfg(request, tmp_path, monkeypatch):
    if request.param == "postgres":
        monkeypatch.setenv(DSN_ENV, request.getfixturevalue("audit_dsn"))
        return make_config(tmp_path, audit={"sink": "postgres", "dsn_env": DSN_ENV})
    return make_config(tmp_path)


@pytest.fixture
def log(cfg):
    return open_audit(cfg)


def full_record(**overrides) -> AuditRecord:
    fields = dict(
        ts=T0, table="db.events", operation="compact", decision="run", reason="42 small files in 2026-02-28",
        date="2026-02-28", trigger="sensor:small_files", identity="maint-test", run_id="r-1",
        before_snapshot_id=7_000_000_000_000_000_001, after_snapshot_id=-5,
        writer_check={"last_commit_age_s": 3600, "writer_idle_s": 900, "ok": True},
        partition_rationale={"partition": "2026-02-28", "small_files": 42, "hot": False},
        cost_estimate={"bytes": 123456, "files": 42, "ceiling_bytes": 10**9},
        validation={"row_count": {"before": 1000, "after": 1000, "passed": True}},
        rollback={}, durations={"compact_s": 2.25, "validate_s": 0.5},
        details={"note": "naïve → UTF-8 ok", "nested": [1, {"a": None}]},
    )
    fields.update(overrides)
    return AuditRecord(**fields)


# --- the record ------------------------------------------------------------------------------


def test_record_round_trips_through_dict_and_json():
    record = full_record()
    assert AuditRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert record.to_dict()["ts"] == "2026-03-01T12:00:00+00:00"


def test_record_defaults_to_now_in_utc_and_normalises_timezones():
    record = AuditRecord(table="db.events", operation="expire", decision="noop", reason="nothing to expire")
    assert record.ts.tzinfo == dt.timezone.utc
    assert abs(dt.datetime.now(dt.timezone.utc) - record.ts) < dt.timedelta(seconds=10)
    plus2 = dt.timezone(dt.timedelta(hours=2))
    shifted = full_record(ts=dt.datetime(2026, 3, 1, 14, 0, tzinfo=plus2))
    assert shifted.ts == T0 and shifted.ts.tzinfo == dt.timezone.utc


def test_record_copies_its_evidence():
    details = {"files": [1, 2]}
    record = full_record(details=details)
    details["files"].append(3)
    assert record.details == {"files": [1, 2]}


@pytest.mark.parametrize("overrides, message", [
    ({"ts": dt.datetime(2026, 1, 1)}, "timezone-aware"),
    ({"operation": "Compact now"}, "operation"),
    ({"decision": ""}, "decision"),
    ({"table": ""}, "table"),
    ({"before_snapshot_id": "12"}, "before_snapshot_id"),
    ({"after_snapshot_id": True}, "after_snapshot_id"),
    ({"details": {"when": dt.date(2026, 1, 1)}}, "details is not JSON-serialisable"),
    ({"cost_estimate": {"bytes": float("nan")}}, "cost_estimate is not JSON-serialisable"),
    ({"validation": ["not", "a", "dict"]}, "validation must be a dict"),
])
def test_record_refuses_bad_values_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        full_record(**overrides)


# --- both sinks ------------------------------------------------------------------------------


def test_open_audit_picks_the_configured_sink(cfg, log):
    assert isinstance(log, PostgresAuditLog if cfg.audit.sink == "postgres" else FileAuditLog)


def test_append_then_read_back_every_field(log):
    assert log.records() == []
    first = full_record()
    second = full_record(ts=T0 + dt.timedelta(minutes=1), decision="defer", reason="claim busy",
                         writer_check={"claim": "held by 'ingest'"}, before_snapshot_id=None,
                         after_snapshot_id=None)
    log.append(first)
    log.append(second)
    assert log.records() == [first, second]


def test_filters_and_limit(log):
    rows = [
        full_record(ts=T0 + dt.timedelta(hours=i), table=table, operation=op, run_id=f"r-{i}")
        for i, (table, op) in enumerate([("db.a", "compact"), ("db.b", "compact"), ("db.a", "expire"),
                                         ("db.a", "compact"), ("db.b", "orphans")])
    ]
    for row in rows:
        log.append(row)
    ids = lambda records: [r.run_id for r in records]  # noqa: E731
    assert ids(log.records(table="db.a")) == ["r-0", "r-2", "r-3"]
    assert ids(log.records(operation="compact")) == ["r-0", "r-1", "r-3"]
    assert ids(log.records(table="db.a", operation="compact")) == ["r-0", "r-3"]
    assert ids(log.records(since=T0 + dt.timedelta(hours=2))) == ["r-2", "r-3", "r-4"]
    assert ids(log.records(limit=2)) == ["r-3", "r-4"]  # the most recent, oldest first
    assert ids(log.records(table="db.a", limit=1)) == ["r-3"]
    assert log.records(limit=0) == []
    assert log.records(table="db.none") == []
    with pytest.raises(ValueError, match="timezone-aware"):
        log.records(since=dt.datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="limit"):
        log.records(limit=-1)


def test_concurrent_appends_from_threads_stay_intact(cfg):
    writers, per_writer = 4, 20
    big = "x" * 9000  # larger than a pipe buffer / page: interleaving would tear these lines

    def write(writer: int) -> None:
        sink = open_audit(cfg)  # its own object (and for postgres its own first schema check)
        for seq in range(per_writer):
            sink.append(full_record(run_id=f"w{writer}-{seq}", details={"pad": big}))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = open_audit(cfg).records()
    assert sorted(r.run_id for r in records) == sorted(f"w{w}-{s}" for w in range(writers) for s in range(per_writer))
    assert all(r.details == {"pad": big} for r in records)
    for w in range(writers):  # each writer's records keep its own order
        mine = [r.run_id for r in records if r.run_id.startswith(f"w{w}-")]
        assert mine == [f"w{w}-{s}" for s in range(per_writer)]


_APPEND_MANY = """
import sys
from icemaint.safety.audit import AuditRecord, FileAuditLog, PostgresAuditLog
sink, where, writer, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
log = FileAuditLog(where) if sink == "file" else PostgresAuditLog(where)
for seq in range(count):
    log.append(AuditRecord(table="db.events", operation="compact", decision="run", reason="r",
                           run_id=f"{writer}-{seq}", details={"pad": "y" * 9000}))
"""


def test_concurrent_appends_from_processes_stay_intact(cfg):
    where = cfg.state_dir if cfg.audit.sink == "file" else cfg_dsn(cfg)
    procs = [subprocess.Popen([sys.executable, "-c", _APPEND_MANY, cfg.audit.sink, where, f"p{p}", "25"], cwd=REPO)
             for p in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    records = open_audit(cfg).records()
    assert sorted(r.run_id for r in records) == sorted(f"p{p}-{s}" for p in range(4) for s in range(25))
    if cfg.audit.sink == "file":
        lines = (Path(cfg.state_dir) / "audit" / "audit.jsonl").read_text().splitlines()
        assert len(lines) == 100 and all(json.loads(line)["details"]["pad"] == "y" * 9000 for line in lines)


def cfg_dsn(cfg) -> str:
    return os.environ[cfg.audit.dsn_env]


def test_postgres_sink_without_dsn_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("ICEMAINT_TEST_NO_SUCH_DSN", raising=False)
    config = make_config(tmp_path, audit={"sink": "postgres", "dsn_env": "ICEMAINT_TEST_NO_SUCH_DSN"})
    with pytest.raises(ConfigError, match="ICEMAINT_TEST_NO_SUCH_DSN is not set"):
        open_audit(config)


# --- file sink -------------------------------------------------------------------------------


def test_file_sink_survives_a_torn_line(tmp_path, caplog):
    log = FileAuditLog(tmp_path)
    log.append(full_record(run_id="before"))
    with open(log.path, "a") as fh:
        fh.write('{"table": "db.events", "operation": "comp')  # a writer died mid-line
    log.append(full_record(run_id="after"))
    assert [r.run_id for r in log.records()] == ["before", "after"]
    assert f"{log.path}:2: skipping a torn" in caplog.text


def test_file_sink_names_a_line_that_is_not_a_record(tmp_path):
    log = FileAuditLog(tmp_path)
    log.append(full_record())
    with open(log.path, "a") as fh:
        fh.write(json.dumps({"table": "db.events", "operation": "compact"}) + "\n")
    with pytest.raises(AuditLogCorrupt, match=r"audit\.jsonl:2: not an audit record"):
        log.records()


# --- postgres sink ---------------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_refuses_update_delete_and_truncate(audit_dsn):
    log = PostgresAuditLog(audit_dsn)
    record = full_record()
    log.append(record)
    conn = psycopg2.connect(audit_dsn)  # the same role that appends, which owns the table
    try:
        for statement in ("UPDATE icemaint_audit SET decision = 'noop'",
                          "UPDATE icemaint_audit SET record = record || '{\"reason\": \"edited\"}'::jsonb",
                          "DELETE FROM icemaint_audit",
                          "TRUNCATE icemaint_audit"):
            with pytest.raises(psycopg2.Error, match="icemaint_audit is append-only"):
                with conn, conn.cursor() as cur:
                    cur.execute(statement)
    finally:
        conn.close()
    assert log.records() == [record]
    # A new log object on the existing schema (no DDL collision, triggers not duplicated) still appends.
    PostgresAuditLog(audit_dsn).append(full_record(run_id="r-2"))
    assert [r.run_id for r in log.records()] == ["r-1", "r-2"]


@pytest.mark.postgres
def test_postgres_columns_mirror_the_record(audit_dsn):
    PostgresAuditLog(audit_dsn).append(full_record(table="db.orders", operation="expire", decision="noop"))
    conn = psycopg2.connect(audit_dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT ts, table_name, operation, decision, record->>'reason' FROM icemaint_audit")
            assert cur.fetchall() == [(T0, "db.orders", "expire", "noop", "42 small files in 2026-02-28")]
    finally:
        conn.close()


# --- reverted scopes: automation does not redo what a person undid ----------------------------------------


def _at(minutes: int, operation: str, decision: str, date=None, **kw) -> AuditRecord:
    return AuditRecord(ts=T0 + dt.timedelta(minutes=minutes), table="db.events", operation=operation,
                       decision=decision, reason="r", date=date, identity=kw.pop("identity", "maint"), **kw)


def test_a_reverted_compaction_holds_its_scope_until_an_approval_or_a_later_compaction():
    from icemaint.safety.approvals import reverted_scopes

    published = [_at(0, "compact", "run", "2026-01-01", after_snapshot_id=11),
                 _at(1, "compact", "run", "2026-01-02", after_snapshot_id=22, details={"committed_snapshot_ids": [21, 22]}),
                 _at(2, "compact", "run", None, after_snapshot_id=33)]
    revert = [_at(5, "revert", "run", identity="alice", details={"reverted_snapshot_id": 11}),
              _at(6, "revert", "run", identity="bob", details={"reverted_snapshot_id": 21}),
              _at(7, "revert", "run", details={"reverted_snapshot_id": 33, "dry_run": True}),  # a dry run holds nothing
              _at(8, "revert", "not_published", details={"reverted_snapshot_id": 33})]  # nor a failed revert
    held = reverted_scopes(published + revert)
    assert held == {"2026-01-01": "alice reverted snapshot 11 at 2026-03-01 12:05 UTC",
                    "2026-01-02": "bob reverted snapshot 21 at 2026-03-01 12:06 UTC"}
    assert reverted_scopes(published + revert + [_at(9, "approve", "approved", "2026-01-01")]) == {
        "2026-01-02": held["2026-01-02"]}
    assert reverted_scopes(published + revert + [_at(9, "compact", "run", "2026-01-02", after_snapshot_id=44)]) == {
        "2026-01-01": held["2026-01-01"]}
    assert reverted_scopes(published) == {}


def test_one_tables_records_are_those_of_the_whole_log_with_its_name(log):
    """A table's records read alone equal the whole log's filtered by table: names that contain one another, a
    reason naming another table, a non-ASCII name, and a call's started marker folded into its decision."""
    from icemaint.safety.process import ProcessRef

    tables = ["db.t1", "db.t10", "db.t1x", "db.naïve"]
    for n, table in enumerate(tables * 2):
        log.append(full_record(table=table, run_id=f"r{n}", reason=f"after {tables[(n + 1) % 4]}: done"))
    log.append(AuditRecord(table="db.t1", operation="compact", decision="started", reason="started", call_id="c9",
                           details={"process": ProcessRef.current().to_dict()}))
    log.append(AuditRecord(table="db.t1", operation="compact", decision="run", reason="done", call_id="c9"))
    everything = log.records()
    for table in tables:
        alone = log.records(table=table)
        assert alone == [r for r in everything if r.table == table] and alone, table
    assert [r.decision for r in log.records(table="db.t1")][-1] == "run"
    assert "started" not in [r.decision for r in log.records(table="db.t1")]
