"""`icemaint metrics` without Spark: the audit tally from a real audit log, the incremental tail, the health
summaries a tick persists, and the collector's exposition as Prometheus parses it."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from icemaint.app.metrics_server import EstateExposition, build_registry, make_metrics_server
from icemaint.config import parse_config
from icemaint.domain.audit_tally import AuditTally, reason_kind
from icemaint.domain.decisions import Decision
from icemaint.domain.verdicts import DEFER, NOOP, ReasonKind
from icemaint.domain.health_summary import HealthSummary, summarize_health
from icemaint.safety.audit import AuditRecord, FileAuditLog
from icemaint.safety.audit_tail import FileAuditTail
from icemaint.safety.health_store import HealthStore
from conftest import run_cli
from test_tick import DAY, NOW, Estate, small_files

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.timezone.utc)


def _compaction(table="db.t", decision="run", published=True, passed=True, ts=T0, **details):
    staged = [{"verdict": "published" if published else "not_published", "replaced_files": 12, "new_files": 1,
               "publish_attempts": 2 if published else 0}]
    return AuditRecord(ts=ts, table=table, operation="compact", decision=decision, reason="r", date=DAY,
                       trigger="sensor", validation={"passed": passed},
                       durations={"plan_seconds": 0.1, "rewrite_seconds": 4.0, "validation_seconds": 6.0,
                                  "publish_seconds": 0.4, "total_seconds": 11.0},
                       details={"published": published, "rewritten_bytes": 3 * 2**20, "staged": staged,
                                "dry_run": False, **details})


def audit_fixture(log: FileAuditLog) -> None:
    """A week of one table's trail: each kind of record the tally reads."""
    log.append(AuditRecord(ts=T0, table="db.t", operation="compact", decision="started", reason="started"))
    log.append(_compaction(reason_kind="due"))
    log.append(_compaction(decision="not_published", published=False, passed=False))  # proof failed
    log.append(_compaction(ts=T0 + dt.timedelta(hours=1), reason_kind="due"))
    log.append(_compaction(table="db.dry", dry_run=True))  # a dry run counts nothing
    log.append(AuditRecord(table="db.t", operation="compact", decision="defer", reason="writer active: ...",
                           details={"reason_kind": "writer_active"}))
    log.append(AuditRecord(table="db.t", operation="compact", decision="defer", reason="claim busy: held by x",
                           writer_check={"claim_holder": "x"}))
    log.append(AuditRecord(table="db.t", operation="expire", decision="run", reason="expired 4",
                           durations={"duration_seconds": 0.3, "act_seconds": 0.25},
                           details={"metrics": {"snapshots_removed": 4}}))
    log.append(AuditRecord(table="db.t", operation="orphans", decision="run", reason="deleted 11",
                           details={"metrics": {"removed": 11}, "dry_run": False}))


def test_the_tally_counts_each_kind_of_record_once(tmp_path):
    log = FileAuditLog(tmp_path)
    audit_fixture(log)
    tally = AuditTally()
    for record in FileAuditTail(tmp_path).read_new():
        tally.add(record)
    assert dict(tally.operations) == {
        ("compact", "run", "due"): 2, ("compact", "not_published", "proof_failed"): 1,
        ("compact", "defer", "writer_active"): 1, ("compact", "defer", "claim_busy"): 1,
        ("expire", "run", "due"): 1, ("orphans", "run", "due"): 1}
    assert tally.records == 7 and dict(tally.proof_failures) == {"compact": 1}
    assert (tally.rewritten_files, tally.written_files, tally.publish_attempts) == (24, 2, 4)
    assert tally.rewritten_bytes == 6 * 2**20
    assert (tally.snapshots_expired, tally.orphans_removed) == (4, 11)
    assert tally.last_published == {"db.t": (T0 + dt.timedelta(hours=1)).timestamp()}
    proof = tally.step_seconds[("compact", "proof")]
    assert proof.count == 3 and proof.total == 18.0 and dict(proof.buckets())["5.0"] == 0
    assert tally.run_seconds["compact"].count == 3 and tally.run_seconds["expire"].count == 1
    assert tally.proof_to_rewrite.count == 3 and dict(tally.proof_to_rewrite.buckets())["1.5"] == 3


def test_a_reason_kind_is_never_read_from_the_reason_text():
    assert reason_kind({"decision": "defer", "reason": "claim busy: held by x"}) == "unclassified"
    assert reason_kind({"decision": "refuse", "reason": "read-only"}) == "policy"
    assert reason_kind({"decision": "defer", "details": {"kind": "rate_limited"}}) == "rate_limited"


def test_the_tail_reads_only_what_was_appended_and_never_half_a_line(tmp_path):
    log, tail = FileAuditLog(tmp_path), FileAuditTail(tmp_path)
    assert tail.read_new() == []  # no log yet
    log.append(AuditRecord(table="db.a", operation="compact", decision="defer", reason="one"))
    assert [r["reason"] for r in tail.read_new()] == ["one"]
    assert tail.read_new() == []
    with open(log.path, "ab") as fh:
        fh.write(b'{"table": "db.a", "operation": "comp')  # a writer mid-line
    assert tail.read_new() == []
    log.append(AuditRecord(table="db.a", operation="compact", decision="run", reason="two"))
    assert [r["reason"] for r in tail.read_new()] == ["two"] and tail.skipped == 1  # the torn line, skipped


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def sink_config(request, tmp_path, monkeypatch):
    """A config on each audit sink: the JSON-lines file, and an empty PostgreSQL database."""
    if request.param == "file":
        yield parse_config({"state_dir": str(tmp_path / "state")}, tmp_path)
        return
    from pg_server import fresh_database

    with fresh_database(request.getfixturevalue("postgres_dsn"), f"metrics_{tmp_path.name[-12:]}") as dsn:
        monkeypatch.setenv("ICEMAINT_TEST_METRICS_DSN", dsn)
        yield parse_config({"state_dir": str(tmp_path / "state"),
                            "audit": {"sink": "postgres", "dsn_env": "ICEMAINT_TEST_METRICS_DSN"}}, tmp_path)


def test_each_sink_is_tailed_from_where_the_last_read_stopped(sink_config):
    from icemaint.safety.audit import open_audit
    from icemaint.safety.audit_tail import open_audit_tail

    tail = open_audit_tail(sink_config)
    assert tail.read_new() == []  # nothing audited yet (no file, no table)
    log = open_audit(sink_config)
    for reason in ("one", "two"):
        log.append(AuditRecord(table="db.a", operation="compact", decision="defer", reason=reason))
    assert [r["reason"] for r in tail.read_new()] == ["one", "two"]
    assert tail.read_new() == []
    log.append(AuditRecord(table="db.a", operation="compact", decision="run", reason="three"))
    assert [r["reason"] for r in tail.read_new()] == ["three"]


def test_a_health_summary_says_what_is_due_held_and_lagging(tick_config):
    estate = Estate()
    estate.add("t.a", small_files(5) + small_files(4, "2024-06-03"))
    estate.add("t.hot", small_files(5), writer_at=NOW - dt.timedelta(seconds=10))
    plan = estate.tick(tick_config)
    health = plan.observed["t.a"]
    summary = summarize_health(health, [d for d in plan.decisions if d.table == "t.a"], 3, NOW)
    assert (summary.data_files, summary.small_files, summary.small_files_max_partition) == (9, 9, 5)
    assert (summary.oldest_due_date, summary.lagging_partitions, summary.held) == (DAY, 2, False)
    hot = summarize_health(plan.observed["t.hot"], [d for d in plan.decisions if d.table == "t.hot"], 3, NOW)
    assert hot.oldest_due_date == DAY and hot.lagging_partitions == 0  # waiting on its writer: not lagging
    held = Decision("t.a", "compact", DEFER, "proof failed", DAY, kind=ReasonKind.PROOF_FAILED)
    summary = summarize_health(health, [held, Decision("t.a", "compact", NOOP, "-", "2024-06-03")], 3, NOW)
    assert (summary.held, summary.held_kind, summary.oldest_due_date) == (True, "proof_failed", DAY)
    assert HealthSummary.from_dict(json.loads(json.dumps(summary.to_dict()))) == summary


def test_the_store_replaces_summaries_drops_gone_tables_and_rewrites_only_on_change(tmp_path):
    store = HealthStore(tmp_path)
    assert store.tables() == {} and store.last_tick() == {}
    a, b = (HealthSummary(t, T0.isoformat(), f"/{t}/v1", data_files=9) for t in ("db.a", "db.b"))
    store.record([a, b], {"at": T0.isoformat()}, estate=["db.a", "db.b"])
    assert set(store.tables()) == {"db.a", "db.b"}
    mtime = os.stat(store.path).st_mtime_ns
    store.record([], {"at": (T0 + dt.timedelta(seconds=30)).isoformat()}, estate=["db.a", "db.b"])  # unchanged
    assert os.stat(store.path).st_mtime_ns == mtime and store.last_tick()["at"].endswith("12:00:30+00:00")
    store.record([HealthSummary("db.a", T0.isoformat(), "/db.a/v2", data_files=1)], {"at": "x"}, estate=["db.a"])
    assert store.tables() == {"db.a": {"table": "db.a", "observed_at": T0.isoformat(),
                                       "metadata_location": "/db.a/v2", "data_files": 1, "lagging_partitions": 0,
                                       "held": False}}


def _samples(text: bytes) -> dict:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_collector_exports_tables_and_counts_the_audit_incrementally(tmp_path):
    config = parse_config({"state_dir": str(tmp_path / "state")}, tmp_path)
    log = FileAuditLog(config.state_dir)
    audit_fixture(log)
    HealthStore(config.state_dir).record(
        [HealthSummary("db.t", T0.isoformat(), "/v9", data_files=40, small_files=38, small_files_max_partition=20,
                       small_files_threshold=10, delete_files=3, deleted_row_ratio=0.25, snapshots=70, manifests=12,
                       oldest_due_date="2026-10-31", lagging_partitions=1, held=True, held_kind="proof_failed")],
        {"at": T0.isoformat(), "evaluated": 1, "unchanged": 0, "errors": 0, "tables": 1})
    registry, exposition = build_registry(config), EstateExposition(config)
    first = _samples(generate_latest(registry))
    assert _samples(exposition.render()).keys() == first.keys()  # the mounted app's cached text: the same series
    t = (("table", "db.t"),)
    assert first[("icemaint_table_data_files", t)] == 40 and first[("icemaint_table_small_files", t)] == 38
    assert first[("icemaint_table_deleted_row_ratio", t)] == 0.25 and first[("icemaint_table_held", t)] == 1
    assert first[("icemaint_table_oldest_due_date_timestamp_seconds", t)] == dt.datetime(
        2026, 10, 31, tzinfo=dt.timezone.utc).timestamp()
    assert first[("icemaint_table_last_publish_timestamp_seconds", t)] == (T0 + dt.timedelta(hours=1)).timestamp()
    assert ("icemaint_table_metadata_json_bytes", t) not in first  # not measured: no sample, not a zero
    assert first[("icemaint_last_tick_timestamp_seconds", ())] == T0.timestamp()
    kind = (("decision", "defer"), ("operation", "compact"), ("reason_kind", "writer_active"))
    assert first[("icemaint_operations_total", kind)] == 1
    assert first[("icemaint_proof_failures_total", (("operation", "compact"),))] == 1
    assert first[("icemaint_step_duration_seconds_count", (("operation", "compact"), ("step", "publish")))] == 3
    log.append(AuditRecord(table="db.t", operation="compact", decision="defer", reason="writer active",
                           details={"reason_kind": "writer_active"}))
    second = _samples(generate_latest(registry))
    assert second[("icemaint_operations_total", kind)] == 2 and second[("icemaint_audit_records_total", ())] == 8
    assert _samples(exposition.render())[("icemaint_operations_total", kind)] == 2


def test_icemaint_metrics_serves_the_registry_and_refuses_a_bad_port(tmp_path, capsys):
    config = parse_config({"state_dir": str(tmp_path / "state")}, tmp_path)
    server = make_metrics_server(config, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as answer:
            body = answer.read().decode()
        assert "icemaint_audit_up 1.0" in body and "icemaint_tables 0.0" in body
        assert build_registry(config) is not None
        path = tmp_path / "maintenance.yaml"
        path.write_text(json.dumps({"state_dir": str(tmp_path / "state")}))  # JSON is YAML
        code, out, err = run_cli(capsys, "--config", str(path), "metrics", "--port", str(server.server_port))
        assert code == 2 and err.startswith("error: port") and err.count("\n") == 1, err
    finally:
        server.shutdown()
        server.server_close()
    code, out, err = run_cli(capsys, "--config", str(path), "metrics", "--port", "70000")
    assert code == 2 and "not a TCP port" in err


@pytest.fixture
def tick_config(tmp_path, monkeypatch):
    monkeypatch.setenv("ICEMAINT_IDENTITY", "maint-bot")
    return parse_config({
        "defaults": {"small_file_size_bytes": "1MiB", "target_file_size_bytes": "8MiB", "min_input_files": 3,
                     "writer_idle": "5m", "hot_partition_age": "1h", "max_rewrite_bytes": "100MiB"}}, tmp_path)
