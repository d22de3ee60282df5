"""benchmarks/serve_hours.py's account of fresh starts: the peak against the limit, and what each start cost."""

from benchmarks.serve_hours import MiB, restart_lines


def tick(n: int, finished_at: float, seconds: float) -> dict:
    return {"event": "tick", "tick": n, "finished_at": finished_at, "seconds": seconds, "published": 1}


def test_a_fresh_start_is_told_by_its_gap_and_its_first_tick_and_the_peak_by_every_sample():
    # ticks 45 s apart; after tick 2 serve starts afresh: tick 3 begins 20 s after tick 2 ended and takes 12 s
    ticks = [tick(1, 100.0, 5.0), tick(2, 150.0, 5.0), tick(3, 182.0, 12.0), tick(4, 232.0, 5.0)]
    result = {"ticks": ticks, "interval": "45s", "recycle_above": "450MiB",
              "recycles": [{"event": "recycle", "tick": 2, "rss_python_bytes": 452 * MiB,
                            "recycle_above_bytes": 450 * MiB}],
              "samples": [{"rss_python": 300 * MiB}, {"rss_python": 455 * MiB}, {"rss_python": ""}]}
    text = "\n".join(restart_lines(result, {"ticks": {"median_seconds": 5.0}}))
    assert "peaked at 455 MiB" in text and "limit of 450 MiB" in text
    assert "afresh 1 time, after ticks 2 (at 452 MiB)" in text
    assert "began 20-20 s after the last one ended" in text and "took 12-12 s against the run's median tick of 5 s" in text


def test_a_first_tick_cut_short_by_the_sigterm_is_no_measure_of_a_fresh_start():
    ticks = [tick(1, 100.0, 5.0), tick(2, 182.0, 12.0)]
    ticks[1]["failed"] = True
    result = {"ticks": ticks, "interval": "45s", "recycle_above": "450MiB",
              "recycles": [{"tick": 1, "rss_python_bytes": 451 * MiB, "recycle_above_bytes": 450 * MiB}],
              "samples": [{"rss_python": 451 * MiB}]}
    text = "\n".join(restart_lines(result, {"ticks": {"median_seconds": 5.0}}))
    assert "began 70-70 s after" in text and "cut short by the harness's SIGTERM" in text and "took 12" not in text


def test_no_fresh_start_no_lines():
    assert restart_lines({"ticks": [], "recycles": [], "samples": []}, {}) == []
