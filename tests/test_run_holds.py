"""After a run that did not do its work, automation neither forgets the scope nor repeats what would fail again.

A run can end without publishing: it deferred at run time (a busy claim, a writer's conflicting commit), its
proof failed, or it failed or was interrupted. A deferral is retried (the tick decides the table again a minute
after requesting it, under a new run key); a failed proof, or several failed runs in a row, hold the scope for
automation until an operator approves it. Pure: audit records and decisions, no Spark, no Dagster instance.
"""

from __future__ import annotations

import datetime as dt

import pytest

from icemaint.config import parse_config
from icemaint.domain.decisions import Gates, decide_compaction
from icemaint.domain.verdicts import DEFER, RUN, ReasonKind
from icemaint.domain.health import FileEntry, SnapshotEntry, compute_health
from icemaint.domain.tick import RECHECK_AFTER_RUN_SECONDS, RECHECK_APPROVAL_SECONDS, plan_compaction_tick
from icemaint.safety.approvals import MAX_FAILED_RUNS, held_runs
from icemaint.safety.audit import AuditRecord

DAY = "2024-06-01"
NOW = dt.datetime(2024, 6, 10, 12, 0, tzinfo=dt.timezone.utc)
T0 = dt.datetime(2024, 6, 10, 9, 0, tzinfo=dt.timezone.utc)


def record(minute: int, decision: str, operation: str = "compact", date: str | None = DAY, run: bool = True,
           **kw) -> AuditRecord:
    return AuditRecord(table="t.a", operation=operation, decision=decision, reason=kw.pop("reason", decision),
                       date=date, run_id=f"run-{minute}" if run else None, ts=T0 + dt.timedelta(minutes=minute), **kw)


def test_a_failed_proof_holds_its_date_until_an_approval_and_again_after_the_next_failure():
    failed = [record(1, "not_published", reason="proof failed for t.a 2024-06-01: aggregates differ")]
    [(scope, hold)] = held_runs(failed).items()
    assert scope == DAY and hold.kind == ReasonKind.PROOF_FAILED
    assert "run-1 at 2024-06-10 09:01 UTC" in hold.note and "aggregates differ" in hold.note
    approved = failed + [record(2, "approved", operation="approve", run=False)]
    assert held_runs(approved) == {}
    assert set(held_runs(approved + [record(3, "not_published")])) == {DAY}
    assert held_runs(approved + [record(3, "not_published"), record(4, "run")]) == {}  # published since
    assert held_runs([record(1, "not_published", date="2024-06-02")]).keys() == {"2024-06-02"}


def test_runs_that_keep_failing_are_held_but_deferrals_and_sensor_decisions_are_not_counted():
    failures = [record(i, "failed" if i % 2 else "interrupted") for i in range(MAX_FAILED_RUNS)]
    assert held_runs(failures[:-1]) == {}
    [hold] = held_runs(failures).values()
    assert hold.kind == ReasonKind.RUNS_FAILED and f"its last {MAX_FAILED_RUNS} runs failed" in hold.note
    deferred = [record(i, "defer") for i in range(10)] + [record(20, "defer", run=False)]
    assert held_runs(deferred) == {}  # a deferral is retried, however often
    assert held_runs(failures + [record(30, "run")]) == {}
    dry = [record(i, "failed", details={"dry_run": True}) for i in range(MAX_FAILED_RUNS)]
    assert held_runs(dry) == {}


@pytest.fixture
def policy(tmp_path):
    return parse_config({"defaults": {"small_file_size_bytes": "1MiB", "min_input_files": 2, "writer_idle": "1m",
                                      "hot_partition_age": "0s"}}, tmp_path)


def health(version: int = 1):
    files = [FileEntry(0, 100 * 2**10, 100, dt.date.fromisoformat(DAY))] * 4
    return compute_health(
        table="t.a", metadata_location=f"/wh/t.a/metadata/v{version}.metadata.json", snapshot_id=version,
        schema_id=0, spec_id=0, time_column="ts", time_transform="day", files=files, manifest_lengths=[4096],
        snapshots=[SnapshotEntry(version, None, NOW - dt.timedelta(days=2), "append")], metadata_files=version,
        small_file_size_bytes=2**20, small_manifest_bytes=8 * 2**20, now=NOW)


def test_a_held_date_defers_naming_the_run_and_the_approval_that_lifts_it(policy):
    gates = Gates(now=NOW, identity="bot", held=held_runs([record(1, "not_published", reason="proof failed: x")]))
    decision = decide_compaction(health(), DAY, policy.policy("t.a"), gates)
    assert decision.verdict == DEFER and decision.kind == ReasonKind.PROOF_FAILED and decision.needs_approval
    assert decision.reason.startswith("held: run run-1 at 2024-06-10 09:01 UTC: proof failed: x")
    assert decision.reason.endswith("to let automation run it again: icemaint approve t.a --date 2024-06-01")
    assert decide_compaction(health(), DAY, policy.policy("t.a"), Gates(now=NOW, identity="bot")).verdict == RUN


def test_the_tick_requests_again_after_a_deferred_run_and_holds_after_a_failed_proof(policy):
    records: list[AuditRecord] = []

    def tick(cursor, now):
        return plan_compaction_tick(
            policy, ["t.a"], metadata_location=lambda t: health().metadata_location, health=lambda t: health(),
            claim_holder=lambda t: None, approved=lambda t, d: False, past_runs=lambda t: [], cursor=cursor, now=now,
            held=lambda t: held_runs(records))

    first = tick({}, NOW)
    assert [d.verdict for d in first.decisions] == [RUN]
    assert first.cursor["t.a"].recheck_at == NOW.timestamp() + RECHECK_AFTER_RUN_SECONDS
    records.append(record(1, "defer", reason="claim busy: held by ingest"))  # the run deferred at run time
    soon = tick(first.cursor, NOW + dt.timedelta(seconds=10))
    assert soon.unchanged == ["t.a"] and not soon.runs
    retry = tick(first.cursor, NOW + dt.timedelta(seconds=RECHECK_AFTER_RUN_SECONDS))
    assert [d.verdict for d in retry.decisions] == [RUN]  # decided again, though its metadata never moved

    records.append(record(2, "not_published", reason="proof failed: x"))
    later = NOW + dt.timedelta(seconds=2 * RECHECK_AFTER_RUN_SECONDS)
    held = tick(retry.cursor, later)
    [decision] = held.decisions
    assert decision.verdict == DEFER and decision.kind == ReasonKind.PROOF_FAILED and not held.runs
    assert held.to_record == [decision]  # audited (once), and observed on its partition by the sensor
    assert held.cursor["t.a"].recheck_at == later.timestamp() + RECHECK_APPROVAL_SECONDS  # to see an approval


def test_a_retried_request_has_a_new_run_key_and_the_same_request_keeps_its_own(policy):
    from dataclasses import replace

    from sensors.compaction import compaction_run_request, compaction_run_requests

    decision = decide_compaction(health(), DAY, policy.policy("t.a"), Gates(now=NOW, identity="bot"))
    assert decision.verdict == RUN
    first = compaction_run_request(decision, health())
    assert first.run_key == f"compact:t.a:{DAY}:1"
    assert compaction_run_request(decision, health()).run_key == first.run_key  # Dagster skips a repeat
    retry = compaction_run_request(decision, health(), attempts=lambda table, date: 1)
    assert retry.run_key == f"compact:t.a:{DAY}:1:retry1"
    batch = [(decision, health()), (replace(decision, date="2024-06-02"), health())]
    [joined] = compaction_run_requests(batch, attempts=lambda table, date: 1 if date == DAY else 0)
    assert joined.run_key == f"compact:t.a:{DAY}..2024-06-02:1:retry1"
