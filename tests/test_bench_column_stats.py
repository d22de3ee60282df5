"""The column-statistics benchmark's report (no Spark, no catalog)."""

from __future__ import annotations

from benchmarks.column_stats import SECTION, _java_line, render


def result(**over) -> dict:
    doc = {"date": "2026-11-25T10:00:00+00:00", "reps": 2, "machine": {"cores": 2, "cpu_model": "AMD EPYC",
                                                                      "spark": "3.5.9", "iceberg": "1.10.2"},
           "load_start": (0.5, 0.5, 0.5), "load_end": (1.0, 0.8, 0.6), "rows": 5_000_000, "files": 48,
           "columns": ["event_id", "status"], "quiet": {"icemaint": [4.0, 4.4], "procedure": [3.8, 4.0]},
           "quiet_cpu": {"others_average_cores": 0.01}, "busy_cpu": {"others_average_cores": 0.02},
           "estimates": {"icemaint": {"event_id": 4_900_000, "status": 3},
                         "procedure": {"event_id": 4_900_000, "status": 3}},
           "exact": {"event_id": 5_000_000, "status": 3},
           "busy": {"icemaint": [{"committed": True, "attempts": 2, "writer_commits": 9},
                                 {"committed": True, "attempts": 1, "writer_commits": 8}],
                    "procedure": [{"committed": False, "error": "CommitFailedException: Version 15 already exists",
                                   "writer_commits": 9},
                                  {"committed": True, "attempts": 1, "writer_commits": 0}]},
           "writer": {"commits": 40, "rows": 4000, "failures": [], "failed": 0},
           "rows_after": 5_004_000, "rows_expected_after": 5_004_000,
           "cli": {"seconds": 12.5, "returncode": 0, "outcome": {}}}
    doc.update(over)
    return doc


def test_report_puts_both_contenders_their_estimates_and_the_writer_side_by_side():
    text = render(result(), note="at abc123")
    assert text.startswith(SECTION)
    assert "| icemaint (`compute_statistics`) | 4.20 s | 4.00, 4.40 | 2 of 2 | 9, 8 |" in text
    assert "| `CALL system.compute_table_stats` | 3.90 s | 3.80, 4.00 | 1 of 2 | 9, 0 |" in text
    assert "| event_id | 5,000,000 | 4,900,000 (-2.0%) | 4,900,000 (-2.0%) |" in text
    assert "| status | 3 | 3 (+0.0%) | 3 (+0.0%) |" in text
    assert "icemaint 4.20 s against the procedure's 3.90 s (1.08x)" in text
    assert "icemaint committed 2 of 2 (commit attempts 2, 1), the procedure 1 of 2: CommitFailedException" in text
    assert "Rows after the writer: 5,004,000 of 5,004,000" in text
    assert text.rstrip().endswith("> at abc123")


def test_a_column_the_procedure_left_out_reads_as_a_dash():
    text = render(result(estimates={"icemaint": {"event_id": 1, "status": 3}, "procedure": {"status": 3}}))
    assert "| event_id | 5,000,000 | 1 (-100.0%) | - |" in text


def test_a_python_error_is_named_by_its_type_and_first_line():
    assert _java_line(ValueError("bad\nmore")) == "ValueError: bad"
