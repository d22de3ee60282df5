"""The streaming-shape benchmark's pure part: the planning verdict, the manifests-first finding and the report
rendered from a small results document (no Spark)."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks import streaming
from benchmarks.streaming import (
    SECTION, human_bytes, human_ms, main, manifests_first_finding, render, speedup, verdict,
)


def probe(total: float, iceberg: float, manifests: int, files: int) -> dict:
    return {"probe": {"scan_probe": {"planning_ms": total, "spark_planning_ms": total - iceberg,
                                     "iceberg_planning_ms": iceberg, "scan_ms": 120.0,
                                     "scannedDataManifests": manifests, "files_opened": files,
                                     "planned_before_execution": True}}}


def state(total: float, iceberg: float, manifests: int, files: int, snapshots: int, metadata_bytes: int) -> dict:
    return {**probe(total, iceberg, manifests, files),
            "figures": {"data_files": files, "data_manifests": manifests, "snapshots": snapshots,
                        "snapshots_on_main": snapshots, "metadata_json_bytes": metadata_bytes,
                        "manifest_list_bytes": 90 * manifests, "metadata_dir_bytes": 5 * 2**30,
                        "metadata_dir_files": 12_000, "data_manifest_bytes": 7_500 * manifests,
                        "metadata_json_files": 3_003, "metadata_json_files_bytes": 4 * 2**30,
                        "data_dir_files": 3_001},
            "profile": {"metadata_json_parse_ms": 31.0, "manifest_list_read_ms": 4.0},
            "check": {"rows": 300_000, "ok": True}}


def step(seconds: float, decision: str = "run", **extra) -> dict:
    return {"wall_seconds": seconds, "decision": decision, "summary": "done", **extra}


RESULTS = {
    "date": "2026-11-23T08:00:00+00:00", "commit": "abc1234", "dirty": False,
    "command": "python -m benchmarks.streaming", "load_start": [1.0, 1.0, 1.0], "load_end": [2.0, 2.0, 2.0],
    "note": "", "reps": 5, "cpu": {"wall_seconds": 900.0, "others_average_cores": 1.4}, "target": 10.0,
    "quick": False, "probe_sql": "SELECT count(*) ...",
    "machine": {"cores": 2, "cpu_model": "cpu", "memory_gib": 23.5, "java": "17", "spark": "3.5.9",
                "spark_master": "local[2]", "iceberg": "1.10.2", "pyiceberg": "0.12.0"},
    "build": {"commits": 3000, "rows_per_commit": 100, "data_bytes": 13 * 2**20, "write_seconds": 1.5,
              "commit_seconds": 300.0, "last_100_commit_seconds": 12.0, "snapshots_on_main": 3000,
              "data_manifests": 3000, "data_files": 3000, "metadata_json_bytes": 3 * 2**20},
    "states": {"before": state(8_000.0, 7_900.0, 3000, 3000, 3000, 3 * 2**20),
               "compacted": state(300.0, 5.0, 1, 1, 3001, 3 * 2**20),
               "maintained": state(100.0, 4.0, 1, 1, 100, 100 * 2**10)},
    "steps": {"compact": step(90.0), "manifests": step(12.0, "noop"),
              "expire": step(300.0, metrics={"data_files_deleted": 0}),
              "manifests_first": step(30.0), "compact_after_manifests": step(40.0)},
    "checks": {"before": {"rows": 300_000, "ok": True}, "maintained": {"rows": 300_000, "ok": True}},
}


@pytest.mark.parametrize("before, after, target, met", [
    (1000.0, 100.0, 10.0, True),    # exactly the target
    (1000.0, 101.0, 10.0, False),   # just under
    (8000.0, 70.0, 10.0, True),
    (1000.0, 0.0, 10.0, False),     # no figure after: no speed-up, no pass
    (None, 100.0, 10.0, False),
])
def test_verdict_on_total_planning(before, after, target, met):
    v = verdict({"planning_ms": before, "iceberg_planning_ms": 50.0, "spark_planning_ms": 10.0},
                {"planning_ms": after, "iceberg_planning_ms": 1.0, "spark_planning_ms": 10.0}, target)
    assert v["met"] is met
    assert v["total"]["met"] is met
    assert v["iceberg"]["speedup"] == 50.0 and v["iceberg"]["met"]  # shown beside, never the headline
    assert v["spark"]["speedup"] == 1.0


def test_speedup():
    assert speedup(300.0, 100.0) == 3.0
    assert speedup(None, 1.0) is None and speedup(1.0, None) is None and speedup(1.0, 0.0) is None


@pytest.mark.parametrize("alone, rewrite, after, compaction_faster, sum_faster, compaction, total", [
    (90.0, 30.0, 40.0, True, True, "faster", "faster"),
    (90.0, 60.0, 40.0, True, False, "faster", "slower"),
    (50.0, 30.0, 53.0, False, False, "about the same", "slower"),
    (65.7, 32.2, 29.9, True, True, "faster", "about the same"),   # the first full run: 62.1 s against 65.7 s
])
def test_manifests_first_finding(alone, rewrite, after, compaction_faster, sum_faster, compaction, total):
    f = manifests_first_finding({"compact": alone, "manifests_first": rewrite, "compact_after_manifests": after})
    assert f["compaction_faster"] is compaction_faster
    assert f["sum_faster"] is sum_faster
    assert (f["compaction"], f["sum"]) == (compaction, total)
    assert f["sum_first"] == rewrite + after
    assert f["compaction_speedup"] == pytest.approx(alone / after)


def test_human_units():
    assert human_bytes(8 * 2**20) == "8.0 MiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"
    assert human_bytes(512) == "512 B"
    assert human_ms(1234.0) == "1.2 s"
    assert human_ms(45.4) == "45 ms"
    assert human_ms(4.5) == "4.5 ms"


def test_render_met():
    text = render(RESULTS)
    assert text.startswith(SECTION + "\n")
    assert "| planning, total (the verdict's figure) | 8.0 s | 100 ms | 80.0x | >= 10x | met |" in text
    assert "| planning, Iceberg's own metric | 7.9 s | 4.0 ms | 1975.0x | >= 10x | met |" in text
    assert "**missed**" not in text and "The miss:" not in text
    assert "| (a) before | 8.0 s | 100 ms | 7.9 s |" in text
    assert "3,000 (3,000) | 3.0 MiB |" in text
    assert "Where planning time goes:" in text
    # manifests first: 40 s after a 30 s rewrite against 90 s alone
    assert "it took 40.0 s (2.2x faster than the compaction alone), 70.0 s for both steps" in text
    assert "The compaction itself: faster; the two steps together against the compaction alone: faster" in text
    assert "on commit `abc1234`;" in text
    assert "other processes used 1.4 of the 2 cores on average during the run (900 s)" in text
    assert "quick smoke run" not in text


def test_render_missed_names_the_floor():
    results = copy.deepcopy(RESULTS)
    results["states"]["maintained"] = state(900.0, 20.0, 1, 1, 100, 100 * 2**10)
    text = render(results)
    assert "| planning, total (the verdict's figure) | 8.0 s | 900 ms | 8.9x | >= 10x | **missed** |" in text
    assert "Where planning time goes (the target is missed):" in text
    assert "The miss: after the full maintenance Spark's part (880 ms" in text


def test_render_says_a_wrong_row_check():
    results = copy.deepcopy(RESULTS)
    results["checks"]["maintained"] = {"rows": 299_999, "ok": False}
    assert "maintained 299,999 rows **WRONG**" in render(results)


def test_from_results_replaces_only_its_section(tmp_path):
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(RESULTS))
    out = tmp_path / "RESULTS.md"
    out.write_text("# Results\n\n## Other\n\nkept\n\n" + SECTION + "\n\nold figures\n\n## Last\n\nkept too\n")
    assert main(["--from-results", str(saved), "--out", str(out)]) == 0
    text = out.read_text()
    assert "old figures" not in text
    assert "## Other\n\nkept\n" in text and "## Last\n\nkept too\n" in text
    assert text.count(SECTION) == 1 and "80.0x" in text


def test_quick_results_never_overwrite_the_report(tmp_path, monkeypatch, capsys):
    results = {**copy.deepcopy(RESULTS), "quick": True}
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(results))
    monkeypatch.setattr(streaming, "HERE", tmp_path)  # the default report would be tmp_path/RESULTS.md
    assert main(["--from-results", str(saved)]) == 0
    assert not (tmp_path / "RESULTS.md").exists()
    assert "quick smoke run" in capsys.readouterr().out


def test_render_reports_a_failed_step_and_its_retry():
    results = copy.deepcopy(RESULTS)
    results["steps"]["expire_failed"] = {"wall_seconds": 250.0, "decision": "failed", "failed": True,
                                         "driver_memory": "2g", "summary": "OOM",
                                         "java_failure": "java.lang.OutOfMemoryError: Java heap space"}
    results["steps"]["expire"]["driver_memory"] = "6g"
    text = render(results)
    assert "| expire, first attempt (driver 2g) | 250 s | failed: OOM |" in text
    assert "**Expiry failed** at the benchmark's driver memory (2g) after 250 s: java.lang.OutOfMemoryError" in text
    assert "Run again with 6g: 300 s." in text


def test_render_reports_expiring_the_rest():
    results = copy.deepcopy(RESULTS)
    assert "expire the rest" not in render(results)
    results["steps"]["expire_rest"] = step(80.0, metrics={"data_files_deleted": 3000, "manifests_deleted": 3001,
                                                          "manifest_lists_deleted": 99, "bytes_reclaimed": 2**30},
                                           driver_memory="2g")
    results["checks"]["expired_rest"] = {"rows": 300_000, "ok": True}
    text = render(results)
    assert "| expire the rest (every snapshot but the current, the writer's newest checkpoint too; driver 2g) | " \
           "80.0 s | run: done |" in text
    assert ("Expiring the rest (policy {\"snapshot_max_count\": 1, \"checkpoint_markers\": []}, after state (c)) "
            "released the small files: 3,000 data files, 3,001 manifests and 99 manifest lists deleted, "
            "1.0 GiB reclaimed, at driver memory 2g.") in text
    assert "expired_rest 300,000 rows ok" in text
