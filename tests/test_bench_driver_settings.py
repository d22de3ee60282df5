"""The driver-settings benchmark's report and variants (no Spark, no catalog)."""

from __future__ import annotations

import pytest

from benchmarks.driver_settings import SECTION, VARIANTS, _with_variant, main, render


def result(**over) -> dict:
    runs = {("estate", "default"): [60.0, 64.0], ("estate", "c1_only"): [54.0, 55.0],
            ("commits", "default"): [40.0, 50.0], ("commits", "serial_gc"): [39.0, 38.0]}
    doc = {"date": "2026-11-28T02:00:00+00:00", "command": "python -m benchmarks.driver_settings",
           "commit": "abc123456", "machine": "2 cores, AMD EPYC", "load_start": (0.1, 0.2, 0.3),
           "load_end": (1.0, 1.0, 1.0), "shapes": ["estate", "commits"], "reps": 2, "tables": 40, "commits": 1000,
           "note": "", "measurements": [{"shape": s, "variant": v, "seconds": x}
                                        for (s, v), xs in runs.items() for x in xs]}
    doc.update(over)
    return doc


def test_report_gives_each_variant_its_median_its_runs_and_its_ratio_to_the_default_of_its_shape():
    text = render(result(note="at abc"))
    assert text.startswith(SECTION)
    assert "| estate | the product as it ships | 62.0 s | 60.0, 64.0 | 1.00x |" in text
    assert "| estate | JIT: C1 only (`-XX:TieredStopAtLevel=1`) | 54.5 s | 54.0, 55.0 | 0.88x |" in text
    assert "| commits | collector: Serial" in text and "| 38.5 s | 39.0, 38.0 | 0.86x |" in text
    assert "differ by up to 25% on this machine" in text  # commits' default: 50 / 40
    assert "40 tables" in text and "4,000,000 rows" in text
    assert text.rstrip().endswith("- at abc")


def test_a_variant_adds_its_settings_to_the_configuration_with_the_catalog_named():
    doc = _with_variant({"spark": {"conf": {"spark.ui.enabled": "false"}}}, "manifest_cache", "lake")
    assert doc["spark"]["conf"] == {"spark.ui.enabled": "false",
                                    "spark.sql.catalog.lake.io.manifest.cache-enabled": "true"}
    assert VARIANTS["default"][1] == {}


def test_an_unknown_variant_is_refused_before_anything_is_built(capsys):
    with pytest.raises(SystemExit):
        main(["--variants", "default,warp_speed"])
    assert "unknown shape or variant: warp_speed" in capsys.readouterr().err
