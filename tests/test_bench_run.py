"""`python -m benchmarks.run` rewrites RESULTS.md: the sections other benchmarks wrote must survive it."""

from __future__ import annotations

from benchmarks.run import write_report


def test_the_report_replaces_its_own_sections_and_keeps_every_other_benchmarks(tmp_path):
    out = tmp_path / "RESULTS.md"
    out.write_text("# icemaint benchmarks\n\nold preamble\n\n## 1. Cost\n\nold cost\n\n"
                   "## Tables at once: the tick's runs of different tables on one Spark session\n\n| 1 | 45.9 s |\n\n"
                   "## 6. Sensor scale\n\nold sensor\n\n## Streaming shape (3,000 single-file commits)\n\nstreaming\n")
    write_report(out, "# icemaint benchmarks\n\nnew preamble\n\n## 1. Cost\n\nnew cost\n\n## 6. Sensor scale\n\nnew sensor\n")
    text = out.read_text()
    assert "new preamble" in text and "new cost" in text and "new sensor" in text
    assert "old" not in text
    assert "## Tables at once: the tick's runs of different tables on one Spark session\n\n| 1 | 45.9 s |\n" in text
    assert "## Streaming shape (3,000 single-file commits)\n\nstreaming\n" in text
    assert text.count("## ") == 4
