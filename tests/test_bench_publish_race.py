"""The publish-race benchmark's pure part: the writer's ledger summed up, maintenance's commit calls sorted, the
rows check, the verdict and the section rendered from a small results document (no Spark, no Java)."""

from __future__ import annotations

import copy

import numpy as np

from benchmarks import publish_race
from benchmarks.publish_race import (
    SECTION, WRITER_BASE, WRITER_ROWS, check_ids, commit_summary, metadata_version, render, verdict, writer_summary,
)


def entry(start: float, seconds: float, ok: bool = True, first: int = WRITER_BASE, **extra) -> dict:
    return {"start": start, "seconds": seconds, "ok": ok, "first": first, **extra}


def test_writer_summary_counts_failures_inside_the_window_and_commit_times_alone():
    ledger = [entry(0.0, 0.2), entry(0.5, 0.3), entry(1.0, 0.4, ok=False, error="java.CommitFailedException"),
              entry(1.5, 0.9, retries=2), entry(3.0, 0.1)]
    s = writer_summary(ledger, (0.9, 2.0))
    assert (s["commits"], s["ok"], s["failed"], s["during"], s["failed_during"]) == (5, 4, 1, 2, 1)
    assert s["retries"] == 2
    assert s["errors"] == {"java.CommitFailedException": 1}
    assert s["commit_seconds_alone_median"] == 0.2  # 0.2, 0.3 and 0.1 outside the window
    assert s["interval_median"] == 0.5
    assert writer_summary([], None)["commit_seconds_median"] is None


def test_commit_summary_sorts_both_versions_calls():
    before = [{"name": "open_branch", "seconds": 0.3}, {"name": "commit_to_branch", "seconds": 0.5},
              {"name": "publish", "seconds": 2.0}, {"name": "discard", "seconds": 0.2}]
    after = [{"name": "commit_to_branch", "seconds": 0.6},
             {"name": "_commit_publish", "seconds": 4.0, "error": "org.apache.iceberg.exceptions.CommitFailedException"},
             {"name": "_commit_publish", "seconds": 3.5}, {"name": "discard", "seconds": 0.01}]
    b, a = commit_summary(before), commit_summary(after)
    assert (b["branch_seconds"], b["stage_seconds"], b["publish_seconds"]) == ([0.3], [0.5], [2.0])
    assert (a["stage_seconds"], a["publish_seconds"], a["publish_errors"]) == ([0.6], [4.0, 3.5],
                                                                               ["CommitFailedException"])


def test_metadata_version_reads_both_namings():
    assert metadata_version("file:/w/t/metadata/v3001.metadata.json") == 3001
    assert metadata_version("file:/w/t/metadata/00012-4b0f0c1e-aaaa.metadata.json") == 12


def test_check_ids_finds_lost_duplicated_and_failed_batches():
    ledger = [entry(0, 0.1, first=WRITER_BASE), entry(1, 0.1, ok=False, first=WRITER_BASE + WRITER_ROWS)]
    good = np.concatenate([np.arange(50), np.arange(WRITER_BASE, WRITER_BASE + WRITER_ROWS)])
    assert check_ids(good, 50, ledger)["ok"]
    lost = check_ids(good[1:], 50, ledger)
    assert not lost["ok"] and lost["missing"] == 1
    dup = check_ids(np.concatenate([good, good[:2]]), 50, ledger)
    assert not dup["ok"] and dup["duplicated"] == 2
    failed_landed = np.concatenate([good, np.arange(WRITER_BASE + WRITER_ROWS, WRITER_BASE + 2 * WRITER_ROWS)])
    c = check_ids(failed_landed, 50, ledger)
    assert not c["ok"] and c["unexpected"] == WRITER_ROWS and c["failed_batches_present"] == WRITER_ROWS


def run_doc(catalog: str, version: str, interval: float, failed: int, published: bool = True) -> dict:
    calls = ([{"name": "open_branch", "seconds": 0.2}] if version == "before" else []) + \
        [{"name": "commit_to_branch", "seconds": 0.4}, {"name": "_commit_publish", "seconds": 1.5}]
    ledger = [entry(i * interval, 0.05) for i in range(20)] + \
        [entry(20 * interval + i, 0.05, ok=False, error="builtins.ValueError") for i in range(failed)]
    return {"catalog": catalog, "interval": interval, "version": version, "published": published,
            "reason": "" if published else "PublishConflict: CommitFailedException", "commits": commit_summary(calls),
            "maintenance_commits": 4 if version == "before" else 2, "writer": writer_summary(ledger, (0.0, 5.0)),
            "writer_errors": [{"error": "builtins.ValueError", "message": "Cannot add snapshot with sequence number 9 "
                               "older than last sequence number 9"}] if failed else [],
            "compaction_seconds": 12.3, "rows": {"ok": True, "rows": 300_200, "missing": 0, "duplicated": 0,
                                                  "unexpected": 0},
            "load_before": [9.0, 8.0, 7.0], "load_after": [10.0, 8.5, 7.1]}


RESULTS = {
    "date": "2026-11-28T15:00:00+00:00", "commit": "abc1234", "dirty": False, "command": "python -m x", "note": "",
    "quick": False, "load_start": [12.0, 11.0, 9.0], "load_end": [14.0, 12.0, 10.0], "catalogs": ["hadoop", "jdbc"],
    "intervals": [0.5, 0.1], "before": "3c688b6", "postgres": "15.8",
    "machine": {"cores": 2, "cpu_model": "x86", "memory_gib": 24, "java": "17", "spark": "3.5.9",
                "iceberg": "1.10.2", "pyiceberg": "0.12.0", "python": "3.11"},
    "build": {"commits": 3000, "snapshots": 3000, "data_manifests": 3000, "commit_seconds": 300.0},
    "bound": {"reps": 5, "metadata_json_mib": 2.7, "parse_ms": 40.0, "write_ms": 60.0, "manifest_list_read_ms": 9.0,
              "manifest_list_kib": 170, "manifests": 3000, "build_commit_ms": 90.0},
    "runs": [run_doc("hadoop", "after", 0.5, 0), run_doc("hadoop", "before", 0.5, 0),
             run_doc("jdbc", "after", 0.1, 1), run_doc("jdbc", "before", 0.1, 3)],
}


def test_verdict_and_render():
    v = verdict(RESULTS["runs"])
    assert v["after_all_landed"] and v["rows_ok"]
    assert v["writer_failures"]["jdbc/before"]["failed"] == 3 and v["writer_failures"]["jdbc/after"]["failed"] == 1
    text = render(RESULTS)
    assert text.startswith(SECTION + "\n")
    assert "**A loaded machine**" in text and "2 cores" in text and "12.0 / 11.0 / 9.0" in text
    assert "| hadoop | 0.5 s | after | 1 | 1.50 | 0.40 | landed | 2 |" in text
    assert "| jdbc | 0.1 s | before | 1 | 1.50 | 0.20, 0.40 | landed | 4 | 20 ok, **3 failed** |" in text
    assert "jdbc: 3 -> 1" in text and "`ValueError`" in text
    assert "parsing the 2.7 MiB metadata.json 40 ms" in text
    assert "all ok" in text


def test_render_says_a_publish_that_did_not_land_and_a_wrong_row_check():
    res = copy.deepcopy(RESULTS)
    res["runs"][0].update(published=False, reason="PublishConflict: lost races for 120 s")
    res["runs"][1]["commits"]["publish_errors"] = ["CommitFailedException"]
    res["runs"][1]["published"] = False
    res["runs"][1]["rows"] = {"ok": False, "rows": 1, "missing": 2, "duplicated": 0, "unexpected": 0}
    assert verdict(res["runs"])["after_all_landed"] is False
    text = render(res)
    assert "**not landed** (PublishConflict: lost races for 120 s)" in text
    assert "**not landed**: lost 1 race(s) (CommitFailedException)" in text
    assert "**WRONG**: 2 lost" in text and "**a check failed**" in text


def test_quick_results_are_printed_not_written(tmp_path, capsys, monkeypatch):
    import json

    res = copy.deepcopy(RESULTS)
    res["quick"] = True
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps(res))
    monkeypatch.setattr(publish_race, "HERE", tmp_path)
    assert publish_race.main(["--from-results", str(saved)]) == 0
    assert capsys.readouterr().out.startswith(SECTION)
    assert not (tmp_path / "RESULTS.md").exists()


def test_findings_name_the_starving_publish_and_the_sequence_number_race_only_when_seen():
    runs = copy.deepcopy(RESULTS["runs"])
    text = "\n".join(publish_race.findings(runs))
    assert "starves" not in text
    assert "no pyiceberg setting makes these zero" in text  # the jdbc runs' writers met the ValueError
    assert "the Java writer lost no commit" in text
    runs[0].update(published=False)
    runs[0]["commits"]["publish_seconds"] = [4.0, 5.5]
    runs[0]["commits"]["publish_errors"] = ["CommitFailedException", "CommitFailedException"]
    runs[1]["writer"]["failed"] = 2
    for r in runs:
        r["writer_errors"] = []
    text = "\n".join(publish_race.findings(runs))
    assert "**The publish starves** in 1 of 2 runs" in text and "2 attempts of 4.0-5.5 s" in text
    assert "pyiceberg" not in text
    assert "lost 2 commit(s)" in text
    assert "The version before lost" not in text
    runs[1].update(published=False)
    assert "The version before lost too (1 of 2 runs)" in "\n".join(publish_race.findings(runs))
