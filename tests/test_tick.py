"""The sensor tick planner over a small estate, with plain functions as its metadata reader.

The estate below is data (files and snapshots per table); `health` computes real TableHealth from it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from collections import Counter

import pytest

from icemaint.config import parse_config
from icemaint.domain.verdicts import DEFER, NOOP, REFUSE, RUN
from icemaint.domain.health import FileEntry, SnapshotEntry, compute_health
from icemaint.domain.tick import (RECHECK_AFTER_RUN_SECONDS, RECHECK_APPROVAL_SECONDS, RECHECK_CLAIM_BUSY_SECONDS,
                           KeptHealths, TableCursor, decode_cursor, encode_cursor, plan_compaction_tick)

KiB, MiB = 2**10, 2**20
NOW = dt.datetime(2024, 6, 10, 12, 0, tzinfo=dt.timezone.utc)
DAY = "2024-06-01"


def small_files(n, day=DAY):
    return [FileEntry(0, 100 * KiB, 100, dt.date.fromisoformat(day))] * n


class Estate:
    """Tables as metadata: location, files and writer-commit time. Counts how often health is read."""

    def __init__(self):
        self.tables: dict[str, dict] = {}
        self.now = NOW
        self.health_reads: Counter[str] = Counter()
        self.approvals: set[tuple[str, str]] = set()
        self.approval_asks: list[tuple[str, str]] = []
        self.holders: dict[str, str] = {}
        self.history: dict[str, list[dict]] = {}
        self.broken_location: set[str] = set()
        self.broken_health: set[str] = set()

    def add(self, table, files, writer_at=NOW - dt.timedelta(days=2), version=1):
        self.tables[table] = {"files": files, "writer_at": writer_at, "version": version}

    def commit(self, table, **changes):
        self.tables[table].update(changes)
        self.tables[table]["version"] += 1

    def metadata_location(self, table):
        if table in self.broken_location:
            raise FileNotFoundError(f"no metadata for {table}")
        return f"/wh/{table}/metadata/v{self.tables[table]['version']}.metadata.json"

    def health(self, table):
        self.health_reads[table] += 1
        if table in self.broken_health:
            raise OSError(f"corrupt manifest list in {table}")
        t = self.tables[table]
        # the table's last commit (its version) wrote every file that does not name another writer commit
        files = [f if f.added_snapshot_id is not None else replace(f, added_snapshot_id=t["version"])
                 for f in t["files"]]
        return compute_health(
            table=table, metadata_location=self.metadata_location(table), snapshot_id=t["version"], schema_id=0,
            spec_id=0, time_column="ts", time_transform="day", files=files, manifest_lengths=[4 * KiB],
            snapshots=[SnapshotEntry(t["version"], None, t["writer_at"], "append")], metadata_files=t["version"],
            small_file_size_bytes=MiB, small_manifest_bytes=8 * MiB, now=self.now)

    def approved(self, table, date):
        self.approval_asks.append((table, date))
        return (table, date) in self.approvals

    def tick(self, config, cursor=None, now=None, **kw):
        self.now = now or self.now
        return plan_compaction_tick(
            config, list(self.tables), metadata_location=self.metadata_location, health=self.health,
            claim_holder=self.holders.get, approved=self.approved,
            past_runs=lambda t: self.history.get(t, []), cursor=cursor or {}, now=self.now, **kw)


@pytest.fixture
def tick_config(tmp_path, monkeypatch):
    monkeypatch.setenv("ICEMAINT_IDENTITY", "maint-bot")
    return parse_config({
        "defaults": {"small_file_size_bytes": "1MiB", "target_file_size_bytes": "8MiB", "min_input_files": 3,
                     "writer_idle": "5m", "hot_partition_age": "1h", "max_rewrite_bytes": "100MiB"},
        "tables": {"t.locked": {"enabled": False}, "t.big": {"max_rewrite_bytes": "200KiB"}},
    }, tmp_path)


def verdicts(plan):
    return {(d.table, d.date): d.verdict for d in plan.decisions}


def test_unchanged_table_is_not_evaluated(tick_config):
    estate = Estate()
    estate.add("t.a", small_files(3))
    estate.add("t.b", small_files(1))
    first = estate.tick(tick_config)
    assert first.evaluated == ["t.a", "t.b"] and first.unchanged == []
    assert verdicts(first) == {("t.a", DAY): RUN, ("t.b", DAY): NOOP}
    assert [(d.table, h.snapshot_id) for d, h in first.runs] == [("t.a", 1)]
    # the table whose run was requested is looked at again a minute later, unless its run moved its metadata
    assert {t: (c.metadata_location, c.recheck_at) for t, c in first.cursor.items()} == {
        "t.a": ("/wh/t.a/metadata/v1.metadata.json", (NOW + dt.timedelta(seconds=RECHECK_AFTER_RUN_SECONDS)).timestamp()),
        "t.b": ("/wh/t.b/metadata/v1.metadata.json", None)}

    second = estate.tick(tick_config, decode_cursor(encode_cursor(first.cursor)), NOW + dt.timedelta(seconds=30))
    assert second.unchanged == ["t.a", "t.b"] and second.evaluated == []
    assert second.decisions == [] and second.runs == []
    assert estate.health_reads == {"t.a": 1, "t.b": 1}  # O(1): only the metadata location was read
    assert second.cursor == first.cursor

    estate.commit("t.a", files=small_files(1))  # its run published: a new metadata location
    estate.commit("t.b", files=small_files(4))
    third = estate.tick(tick_config, second.cursor, NOW + dt.timedelta(seconds=30))
    assert third.evaluated == ["t.a", "t.b"] and third.unchanged == []
    assert estate.health_reads == {"t.a": 2, "t.b": 2}
    assert verdicts(third) == {("t.a", DAY): NOOP, ("t.b", DAY): RUN}
    assert third.cursor["t.b"].metadata_location.endswith("/v2.metadata.json")
    assert third.cursor["t.a"].recheck_at is None  # nothing requested: only a change brings it back

    fourth = estate.tick(tick_config, third.cursor, NOW + dt.timedelta(hours=5))
    assert fourth.evaluated == ["t.b"] and fourth.unchanged == ["t.a"]


def test_a_requested_run_that_did_not_publish_is_decided_again_not_forgotten(tick_config):
    """A sensor's run can end without publishing and without moving the table's metadata (it deferred at run time
    on a busy claim): the table is decided again a minute later and requested again. Before, the cursor held it
    as unchanged until a writer's next commit, so the date stayed uncompacted."""
    estate = Estate()
    estate.add("t.a", small_files(3))
    first = estate.tick(tick_config)
    assert verdicts(first) == {("t.a", DAY): RUN}
    later = estate.tick(tick_config, first.cursor, NOW + dt.timedelta(seconds=RECHECK_AFTER_RUN_SECONDS + 1))
    assert later.evaluated == ["t.a"] and verdicts(later) == {("t.a", DAY): RUN}
    assert [d.table for d, _ in later.runs] == ["t.a"]


def test_writer_active_table_is_rechecked_when_the_idle_window_ends(tick_config):
    estate = Estate()
    estate.add("t.w", small_files(3), writer_at=NOW - dt.timedelta(seconds=100))
    first = estate.tick(tick_config)
    (decision,) = first.decisions
    assert decision.verdict == DEFER and decision.reason.startswith(f"writer active on {DAY}: last commit 1.7m ago")
    assert first.cursor["t.w"].recheck_at == (NOW + dt.timedelta(seconds=200)).timestamp()

    early = estate.tick(tick_config, first.cursor, NOW + dt.timedelta(seconds=150))
    assert early.unchanged == ["t.w"] and estate.health_reads["t.w"] == 1

    due = estate.tick(tick_config, early.cursor, NOW + dt.timedelta(seconds=201))
    assert due.evaluated == ["t.w"] and estate.health_reads["t.w"] == 2
    assert verdicts(due) == {("t.w", DAY): RUN}
    assert due.cursor["t.w"].recheck_at == (NOW + dt.timedelta(seconds=201 + RECHECK_AFTER_RUN_SECONDS)).timestamp()


@pytest.mark.parametrize("setup, reason, recheck_at", [
    (lambda e: e.add("t.hot", small_files(3, day="2024-06-10")), "hot partition: 2024-06-10",
     dt.datetime(2024, 6, 11, 1, 0, tzinfo=dt.timezone.utc).timestamp()),
    (lambda e: (e.add("t.busy", small_files(3)), e.holders.update({"t.busy": "run-7@host"})),
     "claim busy: held by run-7@host", NOW.timestamp() + RECHECK_CLAIM_BUSY_SECONDS),
    (lambda e: e.add("t.big", small_files(3)), "awaiting approval",
     NOW.timestamp() + RECHECK_APPROVAL_SECONDS),
    (lambda e: e.add("t.locked", small_files(3)), "enabled: false", None),
])
def test_recheck_time_per_reason(tick_config, setup, reason, recheck_at):
    estate = Estate()
    setup(estate)
    plan = estate.tick(tick_config)
    (decision,) = plan.decisions
    (table,) = estate.tables
    assert reason in decision.reason
    assert plan.cursor[table].recheck_at == recheck_at
    assert plan.runs == []


def test_runs_in_flight_are_waited_for_read_once_and_not_recorded(tick_config):
    estate = Estate()
    for table in ("t.a", "t.b", "t.c"):
        estate.add(table, small_files(3))
    estate.holders["t.a"] = "run 1f2e"  # the in-flight run's own claim
    asks = []

    def in_flight():
        asks.append(1)
        return {"t.a": {"compaction_job"}, "t.b": {"expiry_job", "compaction_job"}}

    plan = estate.tick(tick_config, in_flight=in_flight)
    assert asks == [1]  # the instance's runs are read once per tick
    assert verdicts(plan) == {("t.a", DAY): DEFER, ("t.b", DAY): DEFER, ("t.c", DAY): RUN}
    reasons = {d.table: d.reason for d in plan.decisions}
    assert reasons["t.a"] == "waiting for runs in flight on the table: compaction_job"
    assert reasons["t.b"] == "waiting for runs in flight on the table: compaction_job, expiry_job"
    assert plan.to_record == []  # a wait for a run, the tick's own among them, is no one else's busy claim
    assert plan.cursor["t.a"].recheck_at == NOW.timestamp() + RECHECK_CLAIM_BUSY_SECONDS

    estate.holders.clear()
    assert verdicts(estate.tick(tick_config, in_flight=dict)) == {(t, DAY): RUN for t in ("t.a", "t.b", "t.c")}


def test_erroring_tables_are_reported_and_do_not_stop_the_others(tick_config):
    estate = Estate()
    estate.add("t.gone", small_files(3))
    estate.add("t.corrupt", small_files(3))
    estate.add("t.a", small_files(3))
    estate.broken_location.add("t.gone")
    estate.broken_health.add("t.corrupt")
    plan = estate.tick(tick_config)
    assert plan.errors == {"t.gone": "FileNotFoundError: no metadata for t.gone",
                           "t.corrupt": "OSError: corrupt manifest list in t.corrupt"}
    assert plan.evaluated == ["t.a"]
    assert [d.table for d, _ in plan.runs] == ["t.a"]
    assert set(plan.cursor) == {"t.a"}  # the failed ones are read again next tick
    assert "t.corrupt: ERROR OSError: corrupt manifest list" in plan.summary()

    estate.broken_health.clear()
    again = estate.tick(tick_config, plan.cursor)
    assert again.evaluated == ["t.corrupt"] and "t.gone" in again.errors


def test_cursor_round_trip():
    cursor = {"t.b": TableCursor("/wh/t.b/metadata/v9.metadata.json", 1718020800.5),
              "a.x.y": TableCursor("s3://bucket/wh/a/x/y/metadata/00001-abc.metadata.json", None)}
    text = encode_cursor(cursor)
    assert text.index('"a.x.y"') < text.index('"t.b"')  # stable order
    assert decode_cursor(text) == cursor
    assert decode_cursor(None) == {} and decode_cursor("") == {}


def test_needs_approval_then_approved_runs(tick_config):
    estate = Estate()
    estate.add("t.big", small_files(3))
    waiting = estate.tick(tick_config)
    (decision,) = waiting.decisions
    assert decision.verdict == DEFER and decision.needs_approval
    assert "icemaint approve t.big --date 2024-06-01" in decision.reason
    assert estate.approval_asks == [("t.big", DAY)]

    estate.approvals.add(("t.big", DAY))
    later = NOW + dt.timedelta(seconds=RECHECK_APPROVAL_SECONDS + 1)
    approved = estate.tick(tick_config, waiting.cursor, later)
    assert approved.evaluated == ["t.big"]  # the approval recheck is due although the metadata did not change
    (decision,) = approved.decisions
    assert decision.verdict == RUN and not decision.needs_approval
    assert [d.table for d, _ in approved.runs] == ["t.big"]


def test_tick_budget_defers_the_lower_ranked_and_looks_again_next_tick(tick_config):
    estate = Estate()
    estate.add("t.many", small_files(10))
    estate.add("t.few", small_files(3))
    plan = estate.tick(tick_config, max_runs=1)
    assert [d.table for d, _ in plan.runs] == ["t.many"]
    few = next(d for d in plan.decisions if d.table == "t.few")
    assert few.verdict == DEFER and few.reason == "tick budget: at most 1 run per tick; ranked lower"
    assert plan.cursor["t.few"].recheck_at == NOW.timestamp()
    assert plan.cursor["t.many"].recheck_at == NOW.timestamp() + RECHECK_AFTER_RUN_SECONDS  # unless its run publishes

    nxt = estate.tick(tick_config, plan.cursor, NOW + dt.timedelta(seconds=30), max_runs=1)
    assert nxt.evaluated == ["t.few"] and [d.table for d, _ in nxt.runs] == ["t.few"]


def test_a_budget_deferral_is_decided_again_from_its_kept_health_while_the_table_has_not_moved(tick_config):
    estate, kept = Estate(), KeptHealths()
    estate.add("t.many", small_files(10))
    estate.add("t.few", small_files(3), writer_at=NOW - dt.timedelta(minutes=1))  # writer active: 5m idle
    estate.add("t.more", small_files(4))
    plan = estate.tick(tick_config, max_runs=1, kept=kept)
    assert [d.table for d, _ in plan.runs] == ["t.many"]
    assert {t for t, _, _ in kept.entries} == {"t.more"}  # t.few deferred for its writer, not the budget
    reads = dict(estate.health_reads)

    later = NOW + dt.timedelta(minutes=10)  # t.few's writer has been idle 11 minutes by now
    estate.commit("t.many", files=small_files(1))  # t.many moved: read again
    nxt = estate.tick(tick_config, plan.cursor, later, max_runs=5, kept=kept)
    assert estate.health_reads["t.more"] == reads["t.more"]  # decided from the kept health: not read
    assert estate.health_reads["t.many"] == reads["t.many"] + 1
    assert estate.health_reads["t.few"] == reads["t.few"] + 1  # its writer recheck: read, not kept
    assert sorted(d.table for d, _ in nxt.runs) == ["t.few", "t.more"]
    kept_health = next(h for d, h in nxt.runs if d.table == "t.more")
    read_now = estate.health("t.more")  # what a read at `later` says, ages and all
    assert kept_health == read_now
    assert kept.entries == {}  # nothing deferred for the budget this tick


def test_a_kept_health_is_not_used_after_a_commit_or_a_policy_change(tick_config, tmp_path):
    estate, kept = Estate(), KeptHealths()
    estate.add("t.many", small_files(10))
    estate.add("t.few", small_files(3))
    plan = estate.tick(tick_config, max_runs=1, kept=kept)
    assert [t for t, _, _ in kept.entries] == ["t.few"]
    estate.commit("t.many", files=small_files(1))  # its run published
    estate.commit("t.few", files=small_files(4))
    reads = estate.health_reads["t.few"]
    nxt = estate.tick(tick_config, plan.cursor, NOW + dt.timedelta(seconds=30), max_runs=1, kept=kept)
    assert estate.health_reads["t.few"] == reads + 1
    assert next(h for d, h in nxt.runs if d.table == "t.few").data_files == 4

    estate.commit("t.few", files=small_files(6))
    estate.add("t.other", small_files(5))
    plan = estate.tick(tick_config, nxt.cursor, NOW + dt.timedelta(seconds=60), max_runs=1, kept=kept)
    deferred = [t for t, _, _ in kept.entries]
    assert deferred == ["t.other"]
    stricter = parse_config({"defaults": {"small_file_size_bytes": "1MiB", "min_input_files": 50}}, tmp_path)
    reads = estate.health_reads[deferred[0]]
    again = estate.tick(stricter, plan.cursor, NOW + dt.timedelta(seconds=90), max_runs=1, kept=kept)
    assert estate.health_reads[deferred[0]] == reads + 1  # another policy: its health is read again
    assert not again.runs


def test_valid_dates_and_measured_throughput_reach_the_decisions(tick_config):
    estate = Estate()
    estate.add("t.a", small_files(3) + small_files(3, day="2019-12-31"))
    estate.history["t.a"] = [{"rewritten_bytes": 4 * MiB, "rewrite_seconds": 2.0}]
    plan = estate.tick(tick_config, valid_dates=lambda d: d >= "2020-01-01")
    assert verdicts(plan) == {("t.a", DAY): RUN}
    (decision, health), = plan.runs
    assert decision.cost_estimate["throughput_source"] == "measured"
    assert decision.cost_estimate["bytes_per_second"] == 2 * MiB
    assert health.table == "t.a"


def test_summary_counts_each_verdict(tick_config):
    estate = Estate()
    estate.add("t.a", small_files(3))
    estate.add("t.locked", small_files(3))
    estate.add("t.w", small_files(3), writer_at=NOW - dt.timedelta(seconds=10))
    estate.add("t.n", small_files(1))
    plan = estate.tick(tick_config)
    assert verdicts(plan) == {("t.a", DAY): RUN, ("t.locked", DAY): REFUSE, ("t.w", DAY): DEFER,
                              ("t.n", DAY): NOOP}
    summary = plan.summary()
    assert summary.startswith("4 tables evaluated, 0 unchanged; 1 due to run; 1 deferred, 1 refused, "
                              "1 nothing to do")
    assert f"t.w {DAY}: defer: writer active" in summary
    assert f"t.locked {DAY}: refuse: maintenance is disabled" in summary
    # the next tick decides nothing again (no table moved), and still says why the held ones are held
    again = estate.tick(tick_config, plan.cursor, NOW + dt.timedelta(seconds=1)).summary()
    assert again.startswith("0 tables evaluated, 4 unchanged")
    assert f"t.locked (unchanged) {DAY}: refuse: maintenance is disabled" in again
    assert f"t.w (unchanged) {DAY}: defer: writer active" in again
    assert "t.a (unchanged)" not in again and "t.n (unchanged)" not in again
    # the repeated reason's ages are those of its decision, and it says when that was
    line = next(t for t in again.splitlines() if t.startswith("t.w (unchanged)"))
    assert line.endswith(f"(decided {NOW.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M} UTC)"), line


def test_policy_change_reevaluates_an_unchanged_table(tick_config, tmp_path):
    estate = Estate()
    estate.add("t.a", small_files(3))
    first = estate.tick(tick_config)
    assert verdicts(first) == {("t.a", DAY): RUN}
    stricter = parse_config({"defaults": {"small_file_size_bytes": "1MiB", "target_file_size_bytes": "8MiB",
                                          "min_input_files": 10, "writer_idle": "5m", "hot_partition_age": "1h"}},
                            tmp_path)
    same_policy = estate.tick(tick_config, first.cursor)
    assert same_policy.unchanged == ["t.a"]
    changed = estate.tick(stricter, first.cursor)
    assert changed.evaluated == ["t.a"] and verdicts(changed) == {("t.a", DAY): NOOP}
    assert changed.cursor["t.a"].policy != first.cursor["t.a"].policy


def test_the_same_deferral_is_recorded_once_not_every_tick(tick_config):
    estate = Estate()
    estate.add("t.w", small_files(3), writer_at=NOW - dt.timedelta(seconds=10))
    first = estate.tick(tick_config)
    assert [d.verdict for d in first.to_record] == [DEFER]
    # the writer commits again: re-evaluated, still deferred for the same reason -> nothing new to record
    estate.commit("t.w", files=small_files(4), writer_at=NOW - dt.timedelta(seconds=5))
    second = estate.tick(tick_config, first.cursor)
    assert second.evaluated == ["t.w"] and verdicts(second) == {("t.w", DAY): DEFER}
    assert second.to_record == []
    # a different reason (claim busy) is new evidence -> recorded
    estate.holders["t.w"] = "ingest"
    estate.commit("t.w", files=small_files(5), writer_at=NOW - dt.timedelta(hours=1))
    third = estate.tick(tick_config, second.cursor)
    assert [d.reason.split(":")[0] for d in third.to_record] == ["claim busy"]
