"""The streaming soak's arithmetic (reliability/streaming_figures.py): per-date lag from the writer's last commit to
the compaction that covered it, the dates' end states, the publishes proven and the verdict. Pure: no Java."""

from __future__ import annotations

import datetime as dt

from reliability.figures import check_rows
from reliability.streaming_figures import (COMPACTED, NEVER, NOT_DUE, SETTLED, Compaction, compactions_from_audit,
                                           date_lags, lag_summary, publish_figures, streaming_verdict)

T0 = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def ms(seconds: float) -> int:
    return int(at(seconds).timestamp() * 1000)


def day(last_begin: float, last_end: float, appends: int = 100, late: int = 0, deletes: int = 0) -> dict:
    return {"last_begin": at(last_begin).isoformat(), "last_end": at(last_end).isoformat(), "appends": appends,
            "late": late, "deletes": deletes, "last_kind": "append"}


def record(date: str, ts: float, base: int | None, *, published: bool = True, passed: bool | None = True,
           decision: str = "run", run_id: str = "r") -> dict:
    return {"operation": "compact", "decision": decision, "date": date, "ts": at(ts).isoformat(),
            "before_snapshot_id": base, "run_id": run_id, "validation": {"passed": passed},
            "details": {"published": published}}


def test_lag_is_measured_to_the_first_compaction_planned_after_the_last_commit():
    # base snapshot 1 predates the last commit (a compaction while the date was still written: not covering);
    # base snapshot 2 was committed after it: that compaction covers the date.
    records = [record("2026-01-01", 200, 1, run_id="early"), record("2026-01-01", 400, 2, run_id="late"),
               record("2026-01-01", 500, 3, run_id="again")]
    comps = compactions_from_audit(records, {1: ms(150), 2: ms(330), 3: ms(450)})
    lags = date_lags({"2026-01-01": day(299.5, 300)}, comps, {"2026-01-01": {"data_files": 1, "small_data_files": 1}},
                     writing_stopped_at=at(1000), writer_idle_seconds=30, min_input_files=3)
    (x,) = lags
    assert x.status == COMPACTED and x.compactions == 3 and x.cold_while_writing
    assert x.lag_minutes == round(100 / 60, 2) and x.compacted_at == at(400).isoformat(timespec="seconds")
    assert x.base_known is True


def test_base_commit_during_the_writers_call_counts_as_covering():
    # the writer's snapshot lands between its call and its return: a base committed in that span is its own
    comps = compactions_from_audit([record("d", 100, 7)], {7: ms(50.2)})
    (x,) = date_lags({"d": day(50, 50.5)}, comps, {}, at(500), 30, 3)
    assert x.status == COMPACTED and x.lag_minutes == round(49.5 / 60, 2)


def test_unknown_base_falls_back_to_the_publish_time_and_says_so():
    comps = compactions_from_audit([record("d", 100, 9)], {})
    (x,) = date_lags({"d": day(50, 50.5)}, comps, {}, at(500), 30, 3)
    assert x.status == COMPACTED and x.base_known is False
    assert lag_summary([x])["base_unknown"] == ["d"]


def test_end_states_settled_not_due_and_never_compacted():
    comps = compactions_from_audit([record("settled", 100, 1)], {1: ms(90)})
    dates = {"settled": day(200, 201, late=2), "quiet": day(10, 11, appends=2), "stuck": day(20, 21),
             "live": day(995, 996)}
    files = {"settled": {"data_files": 3, "small_data_files": 2}, "quiet": {"data_files": 2, "small_data_files": 2},
             "stuck": {"data_files": 40, "small_data_files": 40}, "live": {"data_files": 9, "small_data_files": 9}}
    lags = {x.date: x for x in date_lags(dates, comps, files, at(1000), 30, 3)}
    assert lags["settled"].status == SETTLED and lags["settled"].lag_minutes is None
    assert lags["quiet"].status == NOT_DUE
    assert lags["stuck"].status == NEVER
    assert lags["live"].status == NEVER and not lags["live"].cold_while_writing
    summary = lag_summary(lags.values())
    assert summary["never_compacted"] == ["live", "stuck"]
    assert summary["cold_while_writing"] == 3 and summary["lag_max_minutes"] is None


def test_summary_takes_max_and_median_over_dates_cold_while_writing_only():
    dates = {f"d{i}": day(100 * i, 100 * i + 1) for i in range(4)}
    # lags 1, 2, 4 minutes for d0..d2; d3 is live at the stop (its 10-minute lag is the harness's wait)
    recs = [record("d0", 1 + 60, None), record("d1", 101 + 120, None), record("d2", 201 + 240, None),
            record("d3", 301 + 600, None)]
    lags = date_lags(dates, compactions_from_audit(recs, {}), {}, at(320), 30, 3)
    s = lag_summary(lags)
    assert s["lag_max_minutes"] == 4.0 and s["lag_median_minutes"] == 2.0 and s["lag_dates"] == 3
    assert s["lag_at_stop_max_minutes"] == 10.0 and s["by_status"] == {COMPACTED: 4}


def test_only_published_run_records_count():
    recs = [record("d", 100, None, published=False), record("d", 110, None, decision="defer"),
            {"operation": "expire", "decision": "run", "ts": at(5).isoformat()}]
    comps = compactions_from_audit(recs, {})
    assert len(comps) == 1 and not comps[0].published
    (x,) = date_lags({"d": day(10, 11)}, comps, {"d": {"small_data_files": 5}}, at(500), 30, 3)
    assert x.status == NEVER and x.compactions == 0
    assert publish_figures(comps, {})["runs_not_published"] == 1


def test_publishes_and_verdict():
    comps = [Compaction("d", at(1), True, True, 1, at(0), "a"), Compaction("e", at(2), True, False, 2, at(0), "b")]
    pub = publish_figures(comps, {"not_published": 1, "conflicts": 2, "failed": 0})
    assert pub["published"] == 2 and pub["proven"] == 1 and pub["unproven"] == ["b"] and pub["not_published"] == 1
    rows = check_rows("t", [1, 2, 3], {1, 2, 3, 4}, {4})
    lag = lag_summary(date_lags({"d": day(0, 1)}, comps[:1], {}, at(100), 30, 3))
    meta = {"snapshots_end": 12, "snapshots_peak": 130, "manifests_end": 3, "manifests_peak": 40}
    writer = {"commits": 900, "commit_errors": 2, "errors_by_kind": {"CommitFailedException": 2}}
    ok, line = streaming_verdict(20, rows, lag, publish_figures(comps[:1], {}), writer, meta)
    assert ok and line.startswith("soak-streaming 20 min: PASS: rows lost 0, duplicated 0, resurrected 0 (3 rows)")
    assert "failed 2 (CommitFailedException 2)" in line and "snapshots 12 (peak 130), manifests 3 (peak 40)" in line
    assert "lag max 0.0 min" in line
    ok, line = streaming_verdict(20, rows, lag, pub, writer, meta)
    assert not ok and "FAIL" in line  # a publish without a passed proof
    lost = check_rows("t", [1, 2], {1, 2, 3}, set())
    assert not streaming_verdict(20, lost, lag, publish_figures(comps[:1], {}), writer, meta)[0]
    never = lag_summary(date_lags({"d": day(0, 1)}, [], {"d": {"small_data_files": 3}}, at(100), 30, 3))
    ok, line = streaming_verdict(20, rows, never, publish_figures([], {}), writer, meta)
    assert not ok and "never compacted 1" in line and "lag max n/a" in line
