"""Objects loaded for good are frozen out of the cyclic collector's full passes (`engine.long_lived`).

What it buys is a benchmark's figure (the 30-table tick, in the issue's note and RESULTS.md), not a test's.
These check that the freeze happens once per moment, where it is meant to, and that it frees nothing early.
"""

from __future__ import annotations

import pytest

from conftest import run_json_script as run_script, write_config


def test_each_moment_freezes_once_and_what_is_frozen_stays_usable():
    out = run_script("""
        import gc, json, weakref
        from icemaint.engine.long_lived import freeze_loaded
        class Node: pass
        kept = [Node() for _ in range(1000)]
        start = gc.get_freeze_count()
        first = freeze_loaded("modules")
        after_first = gc.get_freeze_count()
        more = [Node() for _ in range(1000)]
        again = freeze_loaded("modules")
        after_again = gc.get_freeze_count()
        other = freeze_loaded("gx")
        after_other = gc.get_freeze_count()
        # a frozen object with no reference left is still freed (reference counting)
        probe = weakref.ref(kept[0]); del kept[0]
        print(json.dumps({"start": start, "first": first, "after_first": after_first, "again": again,
                          "after_again": after_again, "other": other, "after_other": after_other,
                          "freed": probe() is None}))
    """)
    assert out["start"] == 0 and out["first"] and out["after_first"] >= 1000
    assert out["again"] is False and out["after_again"] == out["after_first"]
    assert out["other"] and out["after_other"] >= out["after_first"] + 1000
    assert out["freed"]


def test_the_runner_freezes_what_it_loaded(tmp_path, lake_root):
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    out = run_script("""
        import gc, json, sys
        from icemaint.config import load_config
        from icemaint.app.runner import MaintenanceRunner
        before = gc.get_freeze_count()
        runner = MaintenanceRunner(load_config(sys.argv[1]))
        print(json.dumps({"before": before, "after": gc.get_freeze_count()}))
    """, str(path))
    assert out["before"] == 0 and out["after"] > 100_000, out  # Dagster alone is hundreds of thousands


@pytest.mark.java
def test_the_proofs_great_expectations_context_is_frozen_once_built(spark):
    import gc

    from icemaint.engine import long_lived
    from icemaint.engine.validation import _Suite

    long_lived._done.discard("gx")
    before = gc.get_freeze_count()
    _Suite()
    assert "gx" in long_lived._done and gc.get_freeze_count() > before
