"""benchmarks/plots.py: the documentation's benchmark plots, drawn from a small RESULTS.md (no Java)."""

from __future__ import annotations

import pytest

from benchmarks import plots

FIXTURE = """# icemaint benchmarks

## 1. Cost: compaction before and after stage-prove-publish, against the bare procedure

Prose.

| size | variant | wall (median) | stage / rewrite | proof | publish | rest |
|---|---|---|---|---|---|---|
| small | bare `rewrite_data_files` (in the after-worker's JVM) | 2.31 s | 2.31 s |  |  |  |
| small | before: with proof (rewrite on main, then GX proof) | 3.91 s | 1.72 s | 2.14 s |  | 0.05 s |
| small | after: with proof (stage, GX proof, publish) | 2.40 s | 1.65 s | 0.52 s | 0.06 s | 0.07 s |

| size | files |
|---|---|
| small | 300 |

## Side by side with a peer (iceberg-zamboni)

| shape | icemaint | zamboni | icemaint / zamboni |
|---|---|---|---|
| one date of 100 small files (100 appends, 100k rows) | 10.6 s | 2.1 s | 5.09x |
| one date of 10,000 files (40M rows) | 41.1 s | 24.2 s | 1.70x |
"""


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_the_plots_are_drawn_from_the_results_tables(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text(FIXTURE)
    assert plots.main(["--results", str(results), "--out", str(tmp_path / "images")]) == 0
    for name in ("bench-cost.png", "bench-peer.png"):
        data = (tmp_path / "images" / name).read_bytes()
        width, height = png_size(data)
        assert width >= 600 and height >= 200 and len(data) > 5_000, (name, width, height, len(data))
    rows = plots.section_table(FIXTURE, plots.COST_SECTION)
    assert [r["variant"][:6] for r in rows] == ["bare `", "before", "after:"]  # the first table only


def test_a_missing_section_or_a_bad_figure_is_a_one_line_error(tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    results.write_text(FIXTURE.split("## Side by side")[0])
    assert plots.main(["--results", str(results), "--out", str(tmp_path / "images")]) == 2
    assert capsys.readouterr().err.strip() == "error: no section '## Side by side with a peer' in the results"
    assert not (tmp_path / "images").exists()  # the cost plot, drawable, was not written either
    with pytest.raises(plots.PlotError, match=r"'fast' is not a duration in seconds"):
        plots.seconds("fast", "small after proof")
