"""Health numbers, writer activity, every branch of the compaction decision, ranking and snapshot lineage."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from icemaint.domain.decisions import (DEFAULT_REWRITE_BYTES_PER_SECOND, Decision, Gates, decide_compaction,
                                       decide_table_compactions, measured_throughput, rank_within_budget)
from icemaint.domain.verdicts import DEFER, NOOP, REFUSE, RUN
from icemaint.domain.health import FileEntry, SnapshotEntry, compute_health, last_writer_commit
from icemaint.domain.policy import TablePolicy

KiB, MiB = 2**10, 2**20
NOW = dt.datetime(2024, 6, 10, 12, 0, tzinfo=dt.timezone.utc)
DAY = "2024-06-01"
TABLE = "t.events"
POLICY = TablePolicy(small_file_size_bytes=1 * MiB, target_file_size_bytes=8 * MiB, min_input_files=3,
                     max_delete_ratio=0.1, writer_idle_seconds=300, hot_partition_age_seconds=3600,
                     max_rewrite_bytes=100 * MiB)


def snap(snapshot_id, parent_id, seconds_ago, operation="append", **summary):
    return SnapshotEntry(snapshot_id, parent_id, NOW - dt.timedelta(seconds=seconds_ago), operation,
                         {k.replace("_", "-"): v for k, v in summary.items()})


QUIET = (snap(1, None, 2 * 86400),)  # one writer commit two days ago


def data(n, size, day=DAY, records=100, by=None):
    """`n` data files on `day`; `by`: the snapshot that added them (writer activity per date)."""
    return [FileEntry(0, size, records, dt.date.fromisoformat(day) if day else None, added_snapshot_id=by)] * n


def deletes(records, day=DAY, content=1, n=1):
    return [FileEntry(content, 2 * KiB, records, dt.date.fromisoformat(day))] * n


def health(files, snapshots=QUIET, time_column="ts", now=NOW, table=TABLE, touched=(), known=True):
    return compute_health(table=table, metadata_location=f"/wh/{table}/metadata/v3.metadata.json",
                          touched=touched, writer_partitions_known=known,
                          snapshot_id=max((s.snapshot_id for s in snapshots), default=None), schema_id=0,
                          spec_id=0, time_column=time_column, time_transform="day" if time_column else None,
                          files=files, manifest_lengths=[4 * KiB, 20 * MiB], snapshots=snapshots,
                          metadata_files=3, small_file_size_bytes=POLICY.small_file_size_bytes,
                          small_manifest_bytes=8 * MiB, now=now)


SMALL3 = data(3, 100 * KiB) + data(1, 4 * MiB)

# (case id, health kwargs, policy overrides, gate overrides, date, verdict, substrings of the reason)
CASES = [
    ("below thresholds", dict(files=data(2, 100 * KiB) + data(1, 4 * MiB)), {}, {}, DAY, NOOP,
     ["below thresholds: 2 small files < min_input_files 3", "deleted-row ratio 0.000 <= 0.1"]),
    ("small files reach min_input_files", dict(files=SMALL3), {}, {}, DAY, RUN, ["3 small files >= 3"]),
    ("delete ratio over the limit", dict(files=data(1, 4 * MiB, records=1000) + deletes(200)), {}, {}, DAY, RUN,
     ["deleted-row ratio 0.200 > 0.1"]),
    ("equality deletes count too", dict(files=data(1, 4 * MiB, records=1000) + deletes(300, content=2)), {}, {},
     DAY, RUN, ["deleted-row ratio 0.300 > 0.1"]),
    ("delete ratio under the limit", dict(files=data(1, 4 * MiB, records=1000) + deletes(50)), {}, {}, DAY, NOOP,
     ["below thresholds", "deleted-row ratio 0.050 <= 0.1", "1 position-delete files < min_position_delete_files 10"]),
    ("many position-delete files over fine data files",
     dict(files=data(2, 4 * MiB, records=10000) + deletes(5, n=12)), {}, {}, DAY, RUN,
     ["12 position-delete files >= min_position_delete_files 10", "only the deletes are rewritten"]),
    ("position-delete files under their threshold",
     dict(files=data(2, 4 * MiB, records=10000) + deletes(5, n=12)), dict(min_position_delete_files=13), {}, DAY,
     NOOP, ["12 position-delete files < min_position_delete_files 13"]),
    ("equality-delete files are not position deletes",
     dict(files=data(2, 4 * MiB, records=10000) + deletes(5, content=2, n=12)), {}, {}, DAY, NOOP,
     ["0 position-delete files < min_position_delete_files 10"]),
    ("no partition on that date", dict(files=SMALL3), {}, {}, "2024-06-02", NOOP, ["no data files on 2024-06-02"]),
    ("undated files are named, not silently skipped", dict(files=data(3, 100 * KiB, day=None)), {}, {}, DAY, NOOP,
     [f"no data files on {DAY}; 3 data files of the table have no date (their ts is NULL, or the manifests hold "
      "no bounds for it)"]),
    ("only delete files on that date", dict(files=SMALL3 + deletes(5, day="2024-06-02")), {}, {}, "2024-06-02",
     NOOP, ["no data files on 2024-06-02"]),
    ("no time column", dict(files=data(5, 100 * KiB, day=None), time_column=None), {}, {}, DAY, REFUSE,
     ["no time column", "without --date"]),
    ("disabled", dict(files=SMALL3), dict(enabled=False), {}, DAY, REFUSE, ["disabled", "enabled: false"]),
    ("read only", dict(files=SMALL3), dict(read_only=True), {}, DAY, REFUSE, ["read-only", "read_only: true"]),
    ("operation not allowed", dict(files=SMALL3), dict(allowed_operations=frozenset({"orphans", "expire"})), {},
     DAY, REFUSE, ["operation 'compact' is not allowed by policy (allowed_operations: expire, orphans)"]),
    ("identity not allowed", dict(files=SMALL3), dict(allowed_identities=frozenset({"alice", "ops"})),
     dict(identity="bob"), DAY, REFUSE, ["identity 'bob' is not allowed by policy (allowed_identities: alice, ops)"]),
    ("allowed identity passes", dict(files=SMALL3), dict(allowed_identities=frozenset({"alice", "ops"})),
     dict(identity="alice"), DAY, RUN, ["3 small files >= 3"]),
    ("refusal wins over every deferral", dict(files=SMALL3, snapshots=(snap(1, None, 5),)), dict(enabled=False),
     dict(claim_holder="x"), "2024-06-10", REFUSE, ["enabled: false"]),
    ("today is hot", dict(files=data(3, 100 * KiB, day="2024-06-10")), {}, {}, "2024-06-10", DEFER,
     ["hot partition: 2024-06-10 has not ended yet (ends in 12h), within hot_partition_age 1h"]),
    ("yesterday within the hot age", dict(files=data(3, 100 * KiB, day="2024-06-09"),
                                         now=NOW.replace(hour=0, minute=30)),
     {}, dict(now=NOW.replace(hour=0, minute=30)), "2024-06-09", DEFER,
     ["hot partition: 2024-06-09 ended 30m ago, within hot_partition_age 1h"]),
    ("yesterday past the hot age", dict(files=data(3, 100 * KiB, day="2024-06-09"),
                                       now=NOW.replace(hour=1, minute=30)),
     {}, dict(now=NOW.replace(hour=1, minute=30)), "2024-06-09", RUN, ["3 small files >= 3"]),
    ("writer active on the table (writer_scope table)",
     dict(files=SMALL3, snapshots=(snap(1, None, 86400), snap(2, 1, 100))), dict(writer_scope="table"), {}, DAY,
     DEFER, ["writer active: last writer commit 1.7m ago, within the 5m idle window"]),
    ("a writer on another date does not hold this one",
     dict(files=data(3, 100 * KiB, by=1) + data(1, 100 * KiB, day="2024-06-10", by=2),
          snapshots=(snap(1, None, 86400), snap(2, 1, 5))), {}, {}, DAY, RUN, ["3 small files >= 3"]),
    ("the date being written is deferred, naming its last commit (before the hot gate)",
     dict(files=data(3, 100 * KiB, day="2024-06-10", by=2), snapshots=(snap(1, None, 86400), snap(2, 1, 5))), {}, {},
     "2024-06-10", DEFER, ["writer active on 2024-06-10: last commit 5s ago, within the 5m idle window"]),
    ("late rows into a cold date defer it",
     dict(files=data(3, 100 * KiB, by=1) + data(1, 100 * KiB, by=2), snapshots=(snap(1, None, 86400), snap(2, 1, 100))),
     {}, {}, DAY, DEFER, ["writer active on 2024-06-01: last commit 1.7m ago"]),
    ("a late commit past the idle window does not",
     dict(files=data(3, 100 * KiB, by=1) + data(1, 100 * KiB, by=2), snapshots=(snap(1, None, 86400), snap(2, 1, 400))),
     {}, {}, DAY, RUN, ["4 small files >= 3"]),
    ("a writer commit that only removed files of the date (read from its manifests)",
     dict(files=data(3, 100 * KiB, by=1), snapshots=(snap(1, None, 86400), snap(2, 1, 30, "delete")),
          touched=[(2, DAY)]), {}, {}, DAY, DEFER, ["writer active on 2024-06-01: last commit 30s ago"]),
    ("partitions unknown (too many recent commits to read): the table's check",
     dict(files=data(3, 100 * KiB, by=1), snapshots=(snap(1, None, 86400), snap(2, 1, 30)), known=False), {}, {},
     DAY, DEFER, ["writer active: last writer commit 30s ago"]),
    ("a maintenance commit adding files of the date is not a writer's",
     dict(files=data(3, 100 * KiB, by=2), snapshots=(snap(1, None, 86400), snap(2, 1, 10, "replace"))), {}, {}, DAY,
     RUN, ["3 small files >= 3"]),
    ("maintenance commit is not writer activity",
     dict(files=SMALL3, snapshots=(snap(1, None, 86400), snap(2, 1, 10, "replace"))), {}, {}, DAY, RUN,
     ["3 small files >= 3"]),
    ("tagged maintenance overwrite is not writer activity",
     dict(files=SMALL3, snapshots=(snap(1, None, 86400), snap(2, 1, 10, "overwrite", **{"icemaint.maintenance": "true"}))),
     {}, {}, DAY, RUN, ["3 small files >= 3"]),
    ("republish of an old commit is activity at the source's time",
     dict(files=SMALL3, snapshots=(snap(1, None, 86400), snap(2, 1, 1000), snap(3, 1, 10, source_snapshot_id="2"))),
     {}, {}, DAY, RUN, ["3 small files >= 3"]),
    ("republish of a recent commit is writer activity",
     dict(files=data(3, 100 * KiB, by=3),
          snapshots=(snap(1, None, 86400), snap(2, 1, 100), snap(3, 1, 10, source_snapshot_id="2"))),
     {}, {}, DAY, DEFER, ["writer active on 2024-06-01: last commit 1.7m ago"]),
    ("claim busy", dict(files=SMALL3), {}, dict(claim_holder="run-42@host-a"), DAY, DEFER,
     ["claim busy: held by run-42@host-a"]),
    ("over the cost ceiling", dict(files=SMALL3), dict(max_rewrite_bytes=200 * KiB), {}, DAY, DEFER,
     ["awaiting approval: rewrite of 300 KiB exceeds max_rewrite_bytes 200 KiB",
      f"approve with: icemaint approve {TABLE} --date {DAY}"]),
    ("over the cost ceiling but approved", dict(files=SMALL3), dict(max_rewrite_bytes=200 * KiB),
     dict(approved=True), DAY, RUN, ["3 small files >= 3"]),
    ("deferrals in order: writer before hot, claim and cost",
     dict(files=data(3, 100 * KiB, day="2024-06-10", by=1), snapshots=(snap(1, None, 5),)), dict(max_rewrite_bytes=1),
     dict(claim_holder="x"), "2024-06-10", DEFER, ["writer active on 2024-06-10"]),
    ("hot before claim and cost", dict(files=data(3, 100 * KiB, day="2024-06-10"), snapshots=(snap(1, None, 5),)),
     dict(max_rewrite_bytes=1), dict(claim_holder="x"), "2024-06-10", DEFER, ["hot partition"]),
    ("writer before claim and cost", dict(files=data(3, 100 * KiB, by=1), snapshots=(snap(1, None, 5),)),
     dict(max_rewrite_bytes=1), dict(claim_holder="x"), DAY, DEFER, ["writer active"]),
    ("claim before cost", dict(files=SMALL3), dict(max_rewrite_bytes=1), dict(claim_holder="x"), DAY, DEFER,
     ["claim busy: held by x"]),
    ("a run in flight on the table before its claim (the run's own)", dict(files=SMALL3), {},
     dict(claim_holder="run 9f2c", runs_in_flight=frozenset({"compaction_job", "expiry_job"})), DAY, DEFER,
     ["waiting for runs in flight on the table: compaction_job, expiry_job"]),
    ("writer before runs in flight", dict(files=data(3, 100 * KiB, by=1), snapshots=(snap(1, None, 5),)), {},
     dict(runs_in_flight=frozenset({"compaction_job"})), DAY, DEFER, ["writer active"]),
    ("a date an operator reverted is held", dict(files=SMALL3), {},
     dict(reverted={DAY: "alice reverted snapshot 7 at 2024-06-10 09:00 UTC"}), DAY, DEFER,
     ["held after a revert: alice reverted snapshot 7 at 2024-06-10 09:00 UTC",
      f"to compact it again: icemaint approve {TABLE} --date {DAY}"]),
    ("a reverted date approved again runs", dict(files=SMALL3), {},
     dict(reverted={DAY: "alice reverted snapshot 7"}, approved=True), DAY, RUN, ["3 small files >= 3"]),
    ("another date's revert holds only that date", dict(files=SMALL3), {},
     dict(reverted={"2024-05-31": "alice reverted snapshot 7"}), DAY, RUN, ["3 small files >= 3"]),
]


@pytest.mark.parametrize("health_kw, policy_kw, gates_kw, date, verdict, reasons",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide_compaction(health_kw, policy_kw, gates_kw, date, verdict, reasons):
    from dataclasses import replace

    gates = Gates(**{"now": NOW, "identity": "maint", **gates_kw})
    decision = decide_compaction(health(**health_kw), date, replace(POLICY, **policy_kw), gates)
    assert (decision.table, decision.operation, decision.date) == (TABLE, "compact", date)
    assert decision.verdict == verdict, decision.reason
    for part in reasons:
        assert part in decision.reason, f"{part!r} not in {decision.reason!r}"
    assert decision.needs_approval == any(w in decision.reason for w in ("awaiting approval", "held after a revert"))


def test_small_file_trigger_rationale_and_cost():
    decision = decide_compaction(health(data(3, 100 * KiB, by=1) + data(1, 4 * MiB, by=1)), DAY, POLICY,
                                 Gates(now=NOW, identity="maint"))
    assert decision.rationale["trigger"] == "small_files"
    assert (decision.rationale["small_files"], decision.rationale["data_files"]) == (3, 4)
    # only the small files are rewritten; the 4 MiB file stays
    assert decision.cost_estimate == {"rewrite_bytes": 300 * KiB, "files": 3,
                                      "bytes_per_second": DEFAULT_REWRITE_BYTES_PER_SECOND,
                                      "throughput_source": "default",
                                      "seconds": round(300 * KiB / DEFAULT_REWRITE_BYTES_PER_SECOND, 3)}
    assert decision.writer_check == {"scope": "partition", "partition": DAY,
                                     "last_writer_commit_at": (NOW - dt.timedelta(days=2)).isoformat(),
                                     "seconds_since_writer_commit": 172800.0, "writer_idle_seconds": 300,
                                     "idle": True}
    assert decision.benefit == pytest.approx(2 / (300 * KiB) * MiB)


def test_delete_trigger_rewrites_whole_partition():
    files = data(1, 4 * MiB, records=1000) + data(1, 100 * KiB, records=10) + deletes(300)
    decision = decide_compaction(health(files), DAY, POLICY, Gates(now=NOW, identity="maint"))
    assert decision.verdict == RUN and decision.rationale["trigger"] == "delete_ratio"
    assert decision.cost_estimate["rewrite_bytes"] == 4 * MiB + 100 * KiB
    assert decision.cost_estimate["files"] == 2


def test_cost_estimate_uses_measured_throughput():
    rate = measured_throughput([{"rewritten_bytes": 3 * MiB, "rewrite_seconds": 2.0},
                                {"rewritten_bytes": 1 * MiB, "rewrite_seconds": 2.0},
                                {"rewritten_bytes": 5 * MiB, "rewrite_seconds": 0},  # no duration: ignored
                                {"dry_run": True}])
    assert rate == MiB
    decision = decide_compaction(health(SMALL3), DAY, POLICY, Gates(now=NOW, identity="maint", bytes_per_second=rate))
    assert decision.cost_estimate["throughput_source"] == "measured"
    assert decision.cost_estimate["bytes_per_second"] == MiB
    assert decision.cost_estimate["seconds"] == round(300 * KiB / MiB, 3)


def test_measured_throughput_without_history():
    assert measured_throughput([]) is None
    assert measured_throughput([{"rewritten_bytes": 0, "rewrite_seconds": 4}]) is None


def test_decide_table_compactions_covers_each_partition():
    files = data(3, 100 * KiB) + data(1, 100 * KiB, day="2024-06-02")
    decisions = decide_table_compactions(health(files), POLICY, Gates(now=NOW, identity="maint"))
    assert [(d.date, d.verdict) for d in decisions] == [(DAY, RUN), ("2024-06-02", NOOP)]


def run(table, benefit, rewrite_bytes=MiB, date=DAY):
    return Decision(table=table, operation="compact", verdict=RUN, reason="x", date=date, benefit=benefit,
                    cost_estimate={"rewrite_bytes": rewrite_bytes})


def test_rank_orders_by_benefit_and_defers_past_max_runs():
    noop = Decision(table="t.q", operation="compact", verdict=NOOP, reason="below thresholds", date=DAY)
    ranked = rank_within_budget([run("t.low", 1.0), noop, run("t.high", 9.0), run("t.mid", 5.0)], max_runs=2)
    assert [(d.table, d.verdict) for d in ranked] == [("t.high", RUN), ("t.mid", RUN), ("t.low", DEFER),
                                                      ("t.q", NOOP)]
    assert ranked[2].reason == "tick budget: at most 2 runs per tick; ranked lower"
    assert ranked[3] is noop


def test_rank_counts_runs_by_run_of_so_a_kept_tables_other_dates_join_its_run():
    decisions = [run("t.a", 9.0, date="2024-06-01"), run("t.b", 8.0), run("t.a", 1.0, date="2024-06-02"),
                 run("t.c", 0.5)]
    by_date = rank_within_budget(decisions, max_runs=2)
    assert [(d.table, d.date, d.verdict) for d in by_date] == [
        ("t.a", "2024-06-01", RUN), ("t.b", DAY, RUN), ("t.a", "2024-06-02", DEFER), ("t.c", DAY, DEFER)]
    by_table = rank_within_budget(decisions, max_runs=2, run_of=lambda d: d.table)
    assert [(d.table, d.date, d.verdict) for d in by_table] == [
        ("t.a", "2024-06-01", RUN), ("t.b", DAY, RUN), ("t.a", "2024-06-02", RUN), ("t.c", DAY, DEFER)]
    # a joining date still spends bytes
    capped = rank_within_budget([run("t.a", 9.0, 80, "2024-06-01"), run("t.a", 8.0, 50, "2024-06-02")],
                                max_runs=1, max_bytes=100, run_of=lambda d: d.table)
    assert [d.verdict for d in capped] == [RUN, DEFER]


def test_rank_byte_budget_keeps_at_least_one_and_does_not_spend_run_slots():
    ranked = rank_within_budget([run("t.a", 3, 80), run("t.b", 2, 50), run("t.c", 1, 10)],
                                max_runs=2, max_bytes=100)
    assert [(d.table, d.verdict) for d in ranked] == [("t.a", RUN), ("t.c", RUN), ("t.b", DEFER)]
    assert ranked[2].reason == "tick budget: 100 B per tick used; ranked lower"
    only = rank_within_budget([run("t.huge", 1, 10**12)], max_bytes=100)
    assert [d.verdict for d in only] == [RUN]


def test_rank_without_budget_keeps_all_runs():
    assert [d.verdict for d in rank_within_budget([run("t.a", 1), run("t.b", 2)])] == [RUN, RUN]


def test_benefit_prefers_many_small_files_per_mib():
    gates = Gates(now=NOW, identity="maint")
    many_tiny = decide_compaction(health(data(10, 10 * KiB), table="t.tiny"), DAY, POLICY, gates)
    few_bigger = decide_compaction(health(data(3, 500 * KiB), table="t.bigger"), DAY, POLICY, gates)
    ranked = rank_within_budget([few_bigger, many_tiny], max_runs=1)
    assert [(d.table, d.verdict) for d in ranked] == [("t.tiny", RUN), ("t.bigger", DEFER)]


def test_compute_health_counts():
    files = (data(3, 100 * KiB) + data(1, 4 * MiB, records=1000) + deletes(110)
             + data(2, 2 * MiB, day="2024-06-02") + data(1, 10 * KiB, day=None))
    snapshots = (snap(1, None, 3 * 86400), snap(2, 1, 86400), snap(3, 2, 60, "replace"))
    h = health(files, snapshots)
    assert (h.data_files, h.small_files, h.delete_files, h.delete_records) == (7, 4, 1, 110)
    assert h.records == 3 * 100 + 1000 + 2 * 100 + 100
    assert h.total_bytes == 3 * 100 * KiB + 4 * MiB + 4 * MiB + 10 * KiB
    assert h.median_file_bytes == 100 * KiB  # 10K, 3x100K, 2x2M, 4M
    assert (h.manifests, h.small_manifests, h.manifest_bytes) == (2, 1, 4 * KiB + 20 * MiB)
    assert (h.snapshots, h.oldest_snapshot_age_seconds) == (3, 3 * 86400.0)
    assert (h.last_commit_operation, h.last_commit_by) == ("replace", "maintenance")
    assert h.seconds_since_writer_commit == 86400.0
    day = h.partition(DAY)
    assert (day.data_files, day.small_files, day.small_bytes, day.total_bytes) == (4, 3, 300 * KiB, 300 * KiB + 4 * MiB)
    assert (day.records, day.delete_files, day.delete_records) == (1300, 1, 110)
    assert day.deleted_row_ratio == pytest.approx(110 / 1300)
    assert h.partition("2024-06-02").small_files == 0
    assert [p.date for p in h.partitions] == [DAY, "2024-06-02"]  # undated files are in no partition
    assert h.to_dict()["partitions"][0]["date"] == DAY


def test_compute_health_of_an_empty_table():
    h = health([], snapshots=())
    assert (h.data_files, h.avg_file_bytes, h.snapshots, h.last_commit_by) == (0, 0.0, 0, None)
    assert h.seconds_since_writer_commit is None
    assert decide_compaction(h, DAY, POLICY, Gates(now=NOW, identity="m")).verdict == NOOP


@pytest.mark.parametrize("operation, summary, by_maintenance", [
    ("append", {}, False), ("overwrite", {}, False), ("delete", {}, False), ("replace", {}, True),
    ("append", {"source-snapshot-id": "7"}, True), ("overwrite", {"icemaint.maintenance": "true"}, True),
    ("overwrite", {"icemaint.maintenance": "false"}, False),
])
def test_snapshot_by_maintenance(operation, summary, by_maintenance):
    assert SnapshotEntry(1, None, NOW, operation, summary).by_maintenance is by_maintenance


@pytest.mark.parametrize("snapshots, seconds_ago", [
    ((), None),
    ((snap(1, None, 500, "replace"),), None),
    ((snap(1, None, 500), snap(2, 1, 50, "replace")), 500),
    ((snap(1, None, 500), snap(2, 1, 900, "delete")), 500),  # newest by time, not by position
    ((snap(1, None, 9000), snap(2, 1, 700), snap(3, 1, 20, source_snapshot_id="2")), 700),
    ((snap(1, None, 9000), snap(3, 1, 20, source_snapshot_id="2")), 9000),  # source expired: not counted
])
def test_last_writer_commit(snapshots, seconds_ago):
    expected = None if seconds_ago is None else NOW - dt.timedelta(seconds=seconds_ago)
    assert last_writer_commit(snapshots) == expected


def test_writer_activity_counts_only_mains_lineage():
    # 1 <- 2 on main; 3 is a staging branch's append on 1 (newer than every main commit)
    snapshots = (snap(1, None, 900), snap(2, 1, 600), snap(3, 1, 10, "append", **{"icemaint.maintenance": "true"}),
                 snap(4, 1, 5))  # 4: an append on another branch, not main
    assert last_writer_commit(snapshots, head_id=2) == NOW - dt.timedelta(seconds=600)
    assert last_writer_commit(snapshots, head_id=4) == NOW - dt.timedelta(seconds=5)


@pytest.mark.parametrize("head, ids", [(2, [2, 1]), (3, [3, 1]), (None, []), (9, [])])
def test_lineage(head, ids):
    from icemaint.domain.health import lineage

    snapshots = (snap(1, None, 900), snap(2, 1, 600), snap(3, 1, 10))
    assert [s.snapshot_id for s in lineage(snapshots, head)] == ids


def test_a_time_column_that_is_no_plain_identifier_is_refused_in_one_line():
    decision = decide_compaction(health(SMALL3, time_column="event-time"), DAY, POLICY, Gates(now=NOW, identity="m"))
    assert decision.verdict == REFUSE and "\n" not in decision.reason
    assert decision.reason.startswith("time column 'event-time' is not a plain identifier")


def test_a_format_v3_table_is_compacted_like_any_other():
    from dataclasses import replace as with_

    decision = decide_compaction(with_(health(SMALL3), format_version=3), DAY, POLICY, Gates(now=NOW, identity="m"))
    assert decision.verdict == RUN


def test_a_struct_field_is_a_column_path():
    from icemaint.domain.names import is_column_path, quote_column

    assert quote_column("st.ts") == "`st`.`ts`" and is_column_path("st.ts")
    assert not is_column_path("event-time") and not is_column_path("a..b")


def test_files_on_no_date_are_counted_as_undated():
    h = health(data(2, 100 * KiB) + [FileEntry(content=0, size_bytes=10, record_count=3, date=None)])
    assert h.data_files == 3 and sum(p.data_files for p in h.partitions) + h.undated_files == 3
    assert h.undated_records == 3


# -- tables without a time column: one decision over the partitions of their layout ----------------------

def part_files(key, n, size, records=100, content=0, by=1):
    return [FileEntry(content, size, records, None, partition=key, added_snapshot_id=by)] * n


def layout(*files, snapshots=QUIET):
    return health([f for group in files for f in group], snapshots=snapshots, time_column=None)


def decide_layout(h, gates=None, **policy):
    from icemaint.domain.decisions import decide_layout_compaction

    return decide_layout_compaction(h, replace(POLICY, **policy), Gates(**{"now": NOW, "identity": "maint",
                                                                           **(gates or {})}))


def test_a_table_without_a_time_column_is_one_decision_over_its_due_partitions_best_first():
    h = layout(part_files("k=a", 3, 100 * KiB), part_files("k=b", 10, 100 * KiB), part_files("k=c", 2, 100 * KiB),
               part_files("k=d", 1, 4 * MiB))
    assert not h.dated and [p.key for p in h.partitions] == ["k=a", "k=b", "k=c", "k=d"]
    [d] = decide_table_compactions(h, POLICY, Gates(now=NOW, identity="maint"))
    assert (d.verdict, d.date, d.scope) == (RUN, None, "(table)"), d.reason
    # k=b removes 9 files per MiB, k=a 2: b first; c (2 small files) and d (one big file) are not due
    assert d.rationale["partitions"] == ["k=b", "k=a"] and d.rationale["partitions_waiting"] == []
    assert "2 of 4 partitions due (k=b, k=a; best: 10 small files >= 3)" in d.reason
    assert d.cost_estimate["rewrite_bytes"] == 13 * 100 * KiB


def test_the_cost_ceiling_takes_the_best_partitions_and_leaves_the_rest_for_the_next_run():
    h = layout(part_files("k=a", 3, 100 * KiB), part_files("k=b", 10, 100 * KiB))
    d = decide_layout(h, max_rewrite_bytes=1000 * KiB)
    assert d.verdict == RUN and d.rationale["partitions"] == ["k=b"] and d.rationale["partitions_waiting"] == ["k=a"]
    assert "1 more due partitions wait for the next run (max_rewrite_bytes 1000 KiB)" in d.reason
    # the best partition alone over the ceiling: approval, named without a date
    d = decide_layout(h, max_rewrite_bytes=500 * KiB)
    assert (d.verdict, d.kind.value, d.needs_approval) == (DEFER, "awaiting_approval", True)
    assert "partition k=b" in d.reason and f"icemaint approve {TABLE})" in d.reason
    assert decide_layout(h, gates={"approved": True}, max_rewrite_bytes=500 * KiB).rationale["partitions"] == ["k=b", "k=a"]


@pytest.mark.parametrize("case, files, gates, policy, verdict, words", [
    ("unpartitioned, below thresholds", [part_files("", 2, 100 * KiB)], {}, {}, NOOP,
     ["below thresholds in the whole table", "2 small files < min_input_files 3"]),
    ("unpartitioned, deletes over the ratio", [part_files("", 1, 4 * MiB, records=100),
                                               part_files("", 1, 2 * KiB, records=30, content=1)], {}, {}, RUN,
     ["the whole table is due: deleted-row ratio 0.300 > 0.1"]),
    ("no data files", [], {}, {}, NOOP, ["no data files"]),
    ("claim busy", [part_files("k=a", 3, 1 * KiB)], {"claim_holder": "other@host"}, {}, DEFER, ["held by other@host"]),
    ("writer active", [part_files("k=a", 3, 1 * KiB)], {}, {"writer_idle_seconds": 3 * 86400}, DEFER,
     ["writer active on k=a: last commit 2d ago"]),
    ("writer active on the table", [part_files("k=a", 3, 1 * KiB, by=None)], {},
     {"writer_idle_seconds": 3 * 86400, "writer_scope": "table"}, DEFER, ["writer active: last writer commit 2d ago"]),
    ("disabled", [part_files("k=a", 3, 1 * KiB)], {}, {"enabled": False}, REFUSE, ["enabled: false"]),
])
def test_layout_decisions(case, files, gates, policy, verdict, words):
    d = decide_layout(layout(*files), gates, **policy)
    assert d.verdict == verdict, d.reason
    for word in words:
        assert word in d.reason, (word, d.reason)


def test_a_dated_table_with_no_dates_still_gets_a_decision():
    [d] = decide_table_compactions(health([]), POLICY, Gates(now=NOW, identity="maint"))
    assert (d.verdict, d.date, d.reason) == (NOOP, None, "no data files on any date")


def test_an_unusable_policy_time_column_is_refused_with_its_reason_not_compacted_another_way():
    from dataclasses import replace as with_

    problem = "policy time_column 'when' has type string: only a date or timestamp column can date-scope a table"
    h = with_(layout(part_files("k=a", 5, 1 * KiB)), time_column_problem=problem)
    [d] = decide_table_compactions(h, POLICY, Gates(now=NOW, identity="maint"))
    assert (d.verdict, d.kind.value, d.reason) == (REFUSE, "no_time_column", problem)
    assert decide_layout(h).verdict == REFUSE


def test_a_position_delete_rewrite_has_its_own_kind_cost_and_no_place_on_bound_dated_tables():
    from icemaint.domain.verdicts import ReasonKind

    files = data(2, 4 * MiB, records=10000) + deletes(5, n=12)
    decision = decide_compaction(health(files), DAY, POLICY, Gates(now=NOW, identity="m"))
    assert decision.verdict == RUN and decision.kind == ReasonKind.POSITION_DELETES_DUE
    assert decision.rationale["trigger"] == "position_deletes" and decision.rationale["position_delete_files"] == 12
    # the cost gate weighs what the proof reads: the date's data files
    assert decision.cost_estimate["rewrite_bytes"] == 2 * 4 * MiB and decision.cost_estimate["files"] == 12
    # Small files too: the data rewrite goes first (it applies the deletes as well).
    both = decide_compaction(health(files + SMALL3), DAY, POLICY, Gates(now=NOW, identity="m"))
    assert both.verdict == RUN and both.kind == ReasonKind.DUE and both.rationale["trigger"] == "small_files"
    # Dated by a policy time_column's bounds: delete files have no date of their own, no delete rewrite.
    bounded = replace(health(files), time_transform="bounds")
    assert decide_compaction(bounded, DAY, POLICY, Gates(now=NOW, identity="m")).verdict == NOOP
    # A v3 table takes deletion vectors only: its Parquet position deletes are not rewritten as such.
    v3 = replace(health(files), format_version=3)
    assert decide_compaction(v3, DAY, POLICY, Gates(now=NOW, identity="m")).verdict == NOOP


def test_a_sort_order_that_does_not_fit_refuses_data_rewrites_only():
    """A policy sort order naming no column refuses a date whose data files are rewritten (it would fail the run),
    and leaves a merge of position deletes alone, which sorts nothing; the same for a table without dates."""
    from dataclasses import replace as with_
    from icemaint.domain.verdicts import ReasonKind

    problem = "policy sort_order column 'nope' is not a column of the table (id, ts)"
    gates = Gates(now=NOW, identity="m")
    small = with_(health(SMALL3), sort_order_problem=problem)
    refused = decide_compaction(small, DAY, POLICY, gates)
    assert (refused.verdict, refused.kind, refused.reason) == (REFUSE, ReasonKind.POLICY, problem)
    merges = with_(health(data(2, 4 * MiB, records=10000) + deletes(5, n=12)), sort_order_problem=problem)
    assert decide_compaction(merges, DAY, POLICY, gates).kind == ReasonKind.POSITION_DELETES_DUE
    quiet = with_(health(data(1, 4 * MiB)), sort_order_problem=problem)
    assert decide_compaction(quiet, DAY, POLICY, gates).verdict == NOOP, "nothing due: nothing to refuse"
    flat = with_(health(SMALL3, time_column=None), sort_order_problem=problem)
    [layout_decision] = decide_table_compactions(flat, POLICY, gates)
    assert (layout_decision.verdict, layout_decision.reason) == (REFUSE, problem)


def test_a_layout_partition_being_written_is_left_out_and_the_others_run():
    h = layout(part_files("k=a", 3, 100 * KiB, by=2), part_files("k=b", 10, 100 * KiB, by=1),
               snapshots=(snap(1, None, 86400), snap(2, 1, 20)))
    d = decide_layout(h)
    assert d.verdict == RUN and d.rationale["partitions"] == ["k=b"], d.reason
    assert "1 due partitions wait for their writer (k=a)" in d.reason
    assert d.writer_check["scope"] == "partition" and d.writer_check["partitions_written"] == ["k=a"]
    # under writer_scope table the same table waits as a whole
    assert decide_layout(h, writer_scope="table").kind.value == "writer_active"
