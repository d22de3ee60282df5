"""Layout drift (pure): health counts drifted files per date, the `layout_drift` decision, its policy keys and the
files its rewrite plan takes."""

from __future__ import annotations

import datetime as dt

import pytest

from icemaint.domain.decisions import Gates, decide_compaction
from icemaint.domain.verdicts import NOOP, REFUSE, RUN, DEFER, ReasonKind
from icemaint.domain.drift import LayoutTarget, drift_line
from icemaint.domain.health import FileEntry, SnapshotEntry, compute_health
from icemaint.domain.policy import PolicyError, TablePolicy, apply_overrides
from icemaint.domain.rewrite_plan import CandidateFile, plan_groups

KiB, MiB, GiB = 2**10, 2**20, 2**30
NOW = dt.datetime(2024, 6, 10, 12, 0, tzinfo=dt.timezone.utc)
DAY, OTHER = "2024-06-01", "2024-06-02"
QUIET = (SnapshotEntry(1, None, NOW - dt.timedelta(days=2), "append"),)
POLICY = TablePolicy(small_file_size_bytes=1 * MiB, target_file_size_bytes=8 * MiB, min_input_files=3,
                     drift_min_files=2, drift_min_bytes=16 * MiB, max_rewrite_bytes=1 * GiB)


def files(n, size, day=DAY, spec=1, order=0, content=0):
    return [FileEntry(content, size, 100, dt.date.fromisoformat(day) if day else None, spec_id=spec,
                      sort_order_id=order)] * n


def health(entries, spec_id=1, sort_order_id=0, policy=POLICY, sort_order_problem=None, specs=None):
    return compute_health(table="t.events", metadata_location="/wh/t/metadata/v3.metadata.json", snapshot_id=1,
                          schema_id=0, spec_id=spec_id, time_column="ts", time_transform="hour", files=entries,
                          manifest_lengths=[4 * KiB], snapshots=QUIET, metadata_files=1,
                          small_file_size_bytes=policy.small_file_size_bytes, small_manifest_bytes=8 * MiB, now=NOW,
                          sort_order_id=sort_order_id, max_file_size_bytes=policy.max_file_size_bytes,
                          sort_order_problem=sort_order_problem, specs=specs)


def test_health_counts_each_drift_per_date_and_table_and_each_drifted_file_once():
    entries = (files(3, 10 * MiB, spec=0)                        # old spec
               + files(2, 5 * MiB, spec=1, order=0)              # unsorted on a sorted table
               + files(1, 20 * MiB, spec=0, order=0)             # old spec, unsorted and oversized (> 14.4 MiB)
               + files(4, 6 * MiB, spec=1, order=2)              # in layout
               + files(1, 7 * MiB, spec=1, order=1)              # written under an older sort order
               + files(2, 30 * MiB, day=OTHER, spec=1, order=2)  # oversized only
               + files(1, 2 * KiB, content=1, spec=0))           # a delete file never drifts
    h = health(entries, sort_order_id=2)
    day, other = h.partition(DAY), h.partition(OTHER)
    assert (day.old_spec_files, day.old_spec_bytes) == (4, 50 * MiB)
    assert (day.unsorted_files, day.unsorted_bytes) == (7, 67 * MiB)
    assert (day.oversized_files, day.oversized_bytes) == (1, 20 * MiB)
    # the two files that only record no sort order are rewritten too (Spark before Iceberg 1.11 records none, so they
    # cannot be told from files written before the order; the rewrite records it on its files)
    assert (day.drift_files, day.drift_bytes) == (7, 67 * MiB)
    assert day.old_spec_ids == (0,)
    assert (other.drift_files, other.oversized_files, other.old_spec_files) == (2, 2, 0)
    assert (h.drift_files, h.drift_bytes, h.oversized_files) == (9, 127 * MiB, 3)
    summed = h.partition(None)
    assert (summed.drift_files, summed.old_spec_ids) == (9, (0,))
    out = h.to_dict()
    assert out["partitions"][0]["old_spec_ids"] == (0,) and out["sort_order_id"] == 2
    assert drift_line(out) == ("127 MiB in 9 files (old spec: 50 MiB in 4 files; not in sort order: 67 MiB in 7 "
                               "files; oversized: 80 MiB in 3 files)")
    assert drift_line(health(files(3, 1 * MiB)).to_dict()) == "none"


def test_an_unsorted_table_has_no_sort_drift_and_unknown_specs_no_spec_drift():
    h = health(files(3, 10 * MiB, spec=None, order=None), sort_order_id=0)
    assert h.drift_files == 0


# (case, files, table sort order, policy overrides, gates, verdict, kind, substrings of the reason)
CASES = [
    ("old-spec files pass both thresholds", files(37, 11 * MiB, spec=0), 0, {}, {}, RUN, ReasonKind.LAYOUT_DRIFT,
     ["layout drift: 407 MiB in 37 files under spec 0, table spec 1"]),
    ("files written under an older sort order", files(3, 10 * MiB, order=1), 2, {}, {}, RUN,
     ReasonKind.LAYOUT_DRIFT, ["30 MiB in 3 files not in the table's sort order 2"]),
    ("files that record no sort order are due for it", files(3, 10 * MiB, order=None) + files(3, 10 * MiB),
     2, {}, {}, RUN, ReasonKind.LAYOUT_DRIFT, ["60 MiB in 6 files not in the table's sort order 2"]),
    ("one oversized file is under drift_min_files", files(1, 3 * GiB) + files(1, 4 * MiB), 0, {}, {}, NOOP,
     ReasonKind.BELOW_THRESHOLDS, ["3 GiB in 1 file above 1.8 x target (14.4 MiB)",
                                   "under drift_min_files 2 or drift_min_bytes 16 MiB"]),
    ("two oversized files from a backfill", files(2, 3 * GiB), 0, {}, {}, DEFER, ReasonKind.AWAITING_APPROVAL,
     ["awaiting approval: rewrite of 6 GiB exceeds max_rewrite_bytes 1 GiB"]),
    ("approved backfill", files(2, 3 * GiB), 0, {}, dict(approved=True), RUN, ReasonKind.LAYOUT_DRIFT,
     ["6 GiB in 2 files above 1.8 x target"]),
    ("a larger max_file_size_ratio leaves them", files(2, 20 * MiB), 0, dict(max_file_size_ratio=3), {}, NOOP,
     ReasonKind.BELOW_THRESHOLDS, ["below thresholds"]),
    ("old-spec bytes under drift_min_bytes", files(3, 2 * MiB, spec=0), 0, {}, {}, NOOP, ReasonKind.BELOW_THRESHOLDS,
     ["6 MiB in 3 files under spec 0, table spec 1 under drift_min_files 2 or drift_min_bytes 16 MiB"]),
    ("layout_drift off", files(37, 11 * MiB, spec=0), 0, dict(layout_drift=False), {}, NOOP,
     ReasonKind.BELOW_THRESHOLDS, ["below thresholds: 0 small files < min_input_files 3"]),
    ("small files go first, as before", files(3, 100 * KiB, spec=0) + files(3, 10 * MiB, spec=0), 0, {}, {}, RUN,
     ReasonKind.DUE, ["3 small files >= 3"]),
    ("the writer gate holds drift too", files(3, 10 * MiB, spec=0), 0, {}, dict(claim_holder="flink-job"), DEFER,
     ReasonKind.CLAIM_BUSY, ["claim busy: held by flink-job"]),
    ("a disabled table refuses", files(3, 10 * MiB, spec=0), 0, dict(enabled=False), {}, REFUSE, ReasonKind.POLICY,
     ["disabled"]),
]


@pytest.mark.parametrize("entries, sort_order, policy_kw, gates_kw, verdict, kind, reasons",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_layout_drift_decision(entries, sort_order, policy_kw, gates_kw, verdict, kind, reasons):
    policy = TablePolicy(**{**POLICY.__dict__, **policy_kw})
    d = decide_compaction(health(entries, sort_order_id=sort_order, policy=policy), DAY, policy,
                          Gates(now=NOW, identity="svc", layout_rewrite=True, **gates_kw))
    assert (d.verdict, d.kind) == (verdict, kind), d.reason
    for words in reasons:
        assert words in d.reason


def test_the_reason_names_each_spec_by_its_fields_when_health_knows_them():
    h = health(files(3, 10 * MiB, spec=0), specs={0: "day(ts)", 1: "hour(ts)"})
    d = decide_compaction(h, DAY, POLICY, Gates(now=NOW, identity="svc", layout_rewrite=True))
    assert d.reason == "layout drift: 30 MiB in 3 files under spec 0 (day(ts)), table spec 1 (hour(ts))"


def test_drift_runs_by_default_and_is_only_reported_with_layout_rewrites_off():
    h = health(files(3, 10 * MiB, spec=0))
    assert decide_compaction(h, DAY, POLICY, Gates(now=NOW, identity="svc")).verdict == RUN
    d = decide_compaction(h, DAY, POLICY, Gates(now=NOW, identity="svc", layout_rewrite=False))
    assert (d.verdict, d.kind) == (NOOP, ReasonKind.UNSUPPORTED)
    assert d.reason.startswith("layout drift: 30 MiB in 3 files under spec 0, table spec 1: due, but layout")
    assert d.rationale["trigger"] == "layout_drift" and d.cost_estimate["rewrite_bytes"] == 30 * MiB


def test_a_drift_run_costs_and_ranks_by_its_drifted_files():
    d = decide_compaction(health(files(4, 10 * MiB, spec=0) + files(4, 10 * MiB)), DAY, POLICY,
                          Gates(now=NOW, identity="svc", layout_rewrite=True))
    assert d.cost_estimate["rewrite_bytes"] == 40 * MiB and d.cost_estimate["files"] == 4
    assert d.benefit == pytest.approx(0.1)
    assert d.rationale["trigger"] == "layout_drift" and d.rationale["old_spec_ids"] == [0]


def test_a_sort_order_the_policy_cannot_apply_refuses_a_drift_rewrite():
    d = decide_compaction(health(files(3, 10 * MiB, spec=0), sort_order_problem="policy sort_order column 'x' ..."),
                          DAY, POLICY, Gates(now=NOW, identity="svc", layout_rewrite=True))
    assert (d.verdict, d.kind) == (REFUSE, ReasonKind.POLICY)


@pytest.mark.parametrize("key, value, words", [
    ("layout_drift", "yes", "is not a boolean"),
    ("drift_min_files", 0, "below the minimum 1"),
    ("drift_min_bytes", "lots", "lots"),
    ("max_file_size_ratio", 1, "is not a ratio above 1"),
    ("max_file_size_ratio", True, "is not a ratio above 1"),
])
def test_drift_policy_keys_refuse_bad_values_naming_the_key(key, value, words):
    with pytest.raises(PolicyError, match=key) as err:
        apply_overrides(TablePolicy(), {key: value}, "defaults")
    assert words in str(err.value)


def test_drift_policy_keys_parse():
    p = apply_overrides(TablePolicy(), {"layout_drift": False, "drift_min_files": 5, "drift_min_bytes": "1 GiB",
                                        "max_file_size_ratio": 2.5, "target_file_size_bytes": "100 MiB"}, "defaults")
    assert (p.layout_drift, p.drift_min_files, p.drift_min_bytes) == (False, 5, GiB)
    assert p.max_file_size_bytes == 250 * MiB
    assert TablePolicy().layout_drift and TablePolicy().max_file_size_ratio == 1.8


def cand(path, size_mib, spec=1, order=0, part="ts_hour=1"):
    return CandidateFile(path=path, size_bytes=int(size_mib * MiB), record_count=10, spec_id=spec, partition=part,
                         sort_order_id=order)


def planned(candidates, layout):
    groups = plan_groups(candidates, small_file_size_bytes=4 * MiB, delete_file_threshold=1, partial_progress=False,
                         max_group_bytes=GiB, layout=layout)
    return [[f.path for f in g.files] for g in groups]


@pytest.mark.parametrize("case, candidates, layout, groups", [
    ("without a layout, large old-spec files stay", [cand("old", 64, spec=0), cand("new", 64)], None, []),
    ("a lone large old-spec file is taken", [cand("old", 64, spec=0, part="ts_day=1"), cand("new", 64)],
     LayoutTarget(1), [["old"]]),
    ("files under an older sort order", [cand("a", 64, order=1), cand("b", 64, order=2)], LayoutTarget(1, 2),
     [["a"]]),
    ("files that record no sort order", [cand("a", 64, order=0), cand("b", 64, order=2)], LayoutTarget(1, 2),
     [["a"]]),
    ("an oversized file", [cand("huge", 300), cand("fine", 64)], LayoutTarget(1, 0, 200 * MiB), [["huge"]]),
    ("a date's drifted and small files together, of every spec", [cand("s1", 1),
                                                                  cand("old", 64, spec=0, part="ts_day=1"),
                                                                  cand("s2", 1), cand("fine", 64)],
     LayoutTarget(1), [["old", "s1", "s2"]]),
    ("nothing drifted: as before", [cand("a", 64), cand("b", 1)], LayoutTarget(1, 0, 200 * MiB), []),
], ids=lambda v: v if isinstance(v, str) else "")
def test_rewrite_plan_takes_the_drifted_files(case, candidates, layout, groups):
    assert planned(candidates, layout) == groups


def test_the_tick_screen_reads_a_table_whose_drift_the_manifest_list_cannot_rule_out():
    from icemaint.domain.screen import ManifestSummary, screen_compaction

    day = dt.date(2024, 3, 1)
    old, new = (ManifestSummary(False, 2, day, day, spec_id=0), ManifestSummary(False, 2, day, day, spec_id=1))
    assert screen_compaction([new], 5, dated=True, layout=LayoutTarget(1)) is not None  # nothing can be due
    assert screen_compaction([old, new], 5, dated=True, layout=LayoutTarget(1)) is None  # old-spec files
    assert screen_compaction([old, new], 5, dated=True) is not None                       # layout_drift off
    assert screen_compaction([ManifestSummary(False, 0, None, None, spec_id=0), new], 5, dated=True,
                             layout=LayoutTarget(1)) is not None                          # an empty old manifest
    # sizes and sort orders are in the manifests only: a sorted table, or one whose data passes the oversized-file
    # limit, is read once its data reaches drift_min_bytes
    sorted_ = LayoutTarget(1, sort_order_id=1, min_bytes=64 * MiB)
    assert screen_compaction([new], 5, dated=True, layout=sorted_, data_bytes=63 * MiB) is not None
    assert screen_compaction([new], 5, dated=True, layout=sorted_, data_bytes=64 * MiB) is None
    assert screen_compaction([new], 5, dated=True, layout=sorted_) is None  # the summary does not say
    sized = LayoutTarget(1, max_file_size_bytes=200 * MiB, min_bytes=64 * MiB)
    assert screen_compaction([new], 5, dated=True, layout=sized, data_bytes=200 * MiB) is not None
    assert screen_compaction([new], 5, dated=True, layout=sized, data_bytes=201 * MiB) is None


def test_layout_keys_order_by_the_spec_transforms_then_the_sort_order_without_repeats():
    from icemaint.domain.rewrite_plan import LayoutKey, layout_keys

    keys = [LayoutKey("hour", "ts"), LayoutKey("bucket[16]", "id"), LayoutKey("void", "x"), LayoutKey("truncate[4]", "s"),
            LayoutKey("identity", "id", descending=True, nulls_first=False), LayoutKey("hour", "ts"),
            LayoutKey("zorder?", "y")]
    assert layout_keys("lake", keys) == [
        ("`lake`.system.hours(`ts`)", False, None), ("`lake`.system.bucket(16, `id`)", False, None),
        ("`lake`.system.truncate(4, `s`)", False, None), ("`id`", True, False)]
