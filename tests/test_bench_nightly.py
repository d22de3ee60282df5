"""The nightly-habit benchmark's own arithmetic and report (no Spark, no catalog)."""

from __future__ import annotations

import datetime as dt

import pytest

from benchmarks.nightly import (
    POLICY_SMALL_BYTES, SECTION, Estate, human_seconds, human_size, layout, render, rewrite_figures, shown_command,
    time_profile, totals, verdicts, write_amplification,
)

KiB = 2**10


@pytest.mark.parametrize("rewritten, small, expected", [
    (100, 100, 1.0),
    (250, 100, 2.5),
    (0, 100, 0.0),
    (100, 0, None),  # nothing was small: no ratio, not a division by zero
])
def test_write_amplification_is_bytes_rewritten_per_small_byte(rewritten, small, expected):
    assert write_amplification(rewritten, small) == expected


def test_rewrite_figures_count_what_left_and_what_came_by_date():
    before = {"a": (10 * KiB, "2026-01-01"), "b": (20 * KiB, "2026-01-01"),  # small
              "c": (200 * KiB, "2026-01-02"), "d": (210 * KiB, "2026-01-02"),  # healthy
              "e": (220 * KiB, "2026-01-03")}  # healthy, left alone
    after = {"c": before["c"], "d": before["d"], "e": before["e"], "n1": (29 * KiB, "2026-01-01")}
    f = rewrite_figures(before, after, POLICY_SMALL_BYTES, healthy_dates={"2026-01-02", "2026-01-03"})
    assert (f["files_before"], f["files_after"], f["files_rewritten"], f["files_written"]) == (5, 4, 2, 1)
    assert f["bytes_rewritten"] == 30 * KiB and f["bytes_rewritten_not_small"] == 0
    assert f["small_bytes_before"] == 30 * KiB and f["small_files_after"] == 1
    assert f["dates_touched"] == ["2026-01-01"] and f["healthy_dates_touched"] == []

    # the nightly habit's way: the healthy date goes too
    after = {"e": before["e"], "n1": (29 * KiB, "2026-01-01"), "n2": (400 * KiB, "2026-01-02")}
    f = rewrite_figures(before, after, POLICY_SMALL_BYTES, healthy_dates={"2026-01-02", "2026-01-03"})
    assert f["bytes_rewritten"] == 440 * KiB and f["bytes_rewritten_not_small"] == 410 * KiB
    assert f["dates_touched"] == ["2026-01-01", "2026-01-02"] and f["healthy_dates_touched"] == ["2026-01-02"]
    assert write_amplification(f["bytes_rewritten"], f["small_bytes_before"]) == pytest.approx(440 / 30, abs=1e-3)


def test_totals_sum_tables_and_take_the_ratio_of_the_sums():
    t = {"x": {"bytes_rewritten": 300, "small_bytes_before": 100, "dates_touched": ["a", "b"],
               "healthy_dates_touched": ["b"]},
         "y": {"bytes_rewritten": 100, "small_bytes_before": 100, "dates_touched": ["a"], "healthy_dates_touched": []}}
    out = totals(t)
    assert out["bytes_rewritten"] == 400 and out["small_bytes_before"] == 200
    assert out["write_amplification"] == 2.0  # not the mean of 3.0 and 1.0
    assert (out["dates_touched"], out["healthy_dates_touched"]) == (3, 1)


def test_layout_gives_each_id_once_with_healthy_dates_before_the_recent_ones():
    estate = Estate(tables=1, healthy_files=(6, 3), recent_dates=3, small_files_per_date=5, commits_per_recent_date=2,
                    rows_per_healthy_file=10, rows_per_small_file=4)
    anchor = dt.date(2026, 3, 1)
    specs = layout(estate, anchor)
    assert [s.first for s in specs] == [sum(x.rows for x in specs[:i]) for i in range(len(specs))]
    assert sum(1 for s in specs if s.healthy) == 9 and sum(1 for s in specs if not s.healthy) == 15
    recent = sorted({s.date for s in specs if not s.healthy})
    assert recent == [anchor - dt.timedelta(days=k) for k in (3, 2, 1)]
    assert max(s.date for s in specs if s.healthy) < min(recent)
    assert {s.commit for s in specs if s.healthy} == {0}
    assert len({s.commit for s in specs if not s.healthy}) == 6  # 2 commits a recent date


def fake_results(ice_seconds: float, nightly_seconds: float, ice_rows_ok: bool = True) -> dict:
    def side(seconds, rewritten, not_small, rows_ok):
        t = {"files_before": 366, "files_after": 78, "bytes_before": 16 * 2**20, "small_files_before": 324,
             "small_bytes_before": 6 * 2**20, "small_files_after": 0, "files_rewritten": 324,
             "bytes_rewritten": rewritten, "bytes_rewritten_not_small": not_small, "files_written": 36,
             "bytes_written": rewritten, "summary_removed_bytes": rewritten, "dates_touched": 6,
             "healthy_dates_touched": 0 if not not_small else 6}
        t["write_amplification"] = write_amplification(t["bytes_rewritten"], t["small_bytes_before"])
        return {"seconds": seconds, "totals": t, "cpu": {"others_average_cores": 0.1},
                "rows": {"rows": 1000, "missing": 0, "duplicated": 0, "wrong_values": 0, "ok": rows_ok}}

    ice = side(ice_seconds, 6 * 2**20, 0, ice_rows_ok)
    ice.update({"launched_at": 1000.0, "ticks": 2, "runs": 6, "runs_by_operation": {"compact": 6},
                "audit": {"compact": {"records": 6, "plan_seconds": 1.0, "rewrite_seconds": 10.0,
                                      "validation_seconds": 15.0, "publish_seconds": 2.0, "total_seconds": 34.0}},
                "dagster_runs": {"count": 6, "first_start": 1003.0, "last_end": 1000.0 + ice_seconds - 1.0,
                                 "seconds": 36.0}})
    nightly = side(nightly_seconds, 15 * 2**20, 9 * 2**20, True)
    nightly.update({"session_seconds": 5.0, "calls_seconds": nightly_seconds - 7, "calls": 2,
                    "slowest_call_seconds": 20.0})
    return {"date": "2026-11-23T08:00:00+00:00", "command": "python -m benchmarks.nightly --quick", "commit": "abc123",
            "dirty": False, "machine": {"cores": 2, "cpu_model": "CPU", "memory_gib": 24, "spark": "3.5.9",
                                        "pyiceberg": "0.12.0", "dagster": "1.13.27"},
            "load_start": [0.5, 0.4, 0.3], "load_end": [1.0, 0.8, 0.5],
            "estate": {"tables": 2, "healthy_files": [6, 6, 3, 6], "recent_dates": 3, "small_files_per_date": 54,
                       "commits_per_recent_date": 2, "files_per_table": 183, "healthy_file_bytes": 235 * KiB,
                       "small_file_bytes": 20 * KiB},
            "icemaint": ice, "nightly": nightly, "note": ""}


def test_render_a_slower_icemaint_shows_its_verdicts_and_where_the_time_goes():
    text = render(fake_results(ice_seconds=60.0, nightly_seconds=40.0))
    assert text.startswith(SECTION + "\n")
    assert "the nightly habit wins, icemaint takes 1.50x as long" in text
    assert "**Miss** (profile below)" in text
    assert "### Where icemaint's time goes (wall-time miss)" in text
    assert "icemaint 1.00 against the nightly habit's 2.50" in text and "icemaint wins" in text
    assert "| write amplification (rewritten / small) | **1.00** | **2.50** |" in text
    assert "| wall time (process start to exit) | **60.0 s** | **40.0 s** |" in text
    assert "abc123" in text and "0.50 / 0.40 / 0.30" in text
    assert "The machine was shared" not in text
    # no other `## ` heading inside: write_section replaces up to the next one
    assert [line for line in text.splitlines() if line.startswith("## ")] == [SECTION]


def test_render_a_faster_icemaint_has_no_profile_and_says_who_wins():
    text = render(fake_results(ice_seconds=30.0, nightly_seconds=60.0))
    assert "icemaint wins, 2.00x faster" in text
    assert "Where icemaint's time goes" not in text and "**Miss**" not in text


def test_differing_rows_are_a_miss():
    marks = {v["figure"]: v for v in verdicts(fake_results(30.0, 60.0, ice_rows_ok=False))}
    assert marks["rows"]["miss"] and "**rows differ**" in marks["rows"]["text"]
    assert not marks["wall time"]["miss"] and not marks["write amplification"]["miss"]


def test_time_profile_accounts_for_the_whole_wall_time():
    ice = fake_results(ice_seconds=60.0, nightly_seconds=40.0)["icemaint"]
    parts = dict(time_profile(ice))
    assert sum(parts.values()) == pytest.approx(60.0, abs=0.05)
    assert parts["compaction validation (audit records' step timings)"] == 15.0
    assert parts[next(k for k in parts if k.startswith("start:"))] == 3.0
    assert parts[next(k for k in parts if k.startswith("Dagster's run machinery"))] == 2.0


@pytest.mark.parametrize("n, text", [(512, "512 B"), (64 * KiB, "64 KiB"), (1.5 * 2**20, "1.5 MiB"),
                                     (8 * 2**30, "8.0 GiB"), (None, "-")])
def test_human_size(n, text):
    assert human_size(n) == text


def test_human_seconds():
    assert human_seconds(1.234) == "1.2 s" and human_seconds(600) == "10.0 min (600 s)" and human_seconds(None) == "-"


def test_shown_command_leaves_the_note_text_out():
    assert shown_command("python -m benchmarks.nightly --note 'a long note' --tables 4") == \
        "python -m benchmarks.nightly --note ... --tables 4"
    assert shown_command("python -m benchmarks.nightly --quick") == "python -m benchmarks.nightly --quick"
