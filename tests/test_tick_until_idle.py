"""`icemaint tick --until-idle`: an estate catch-up in one process, tick after tick until nothing is launched."""

from __future__ import annotations

import json
import uuid

import pytest

from conftest import run_cli, streaming_table, write_config
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader

pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


def three_due_dates(spark, lake_root, tmp_path, monkeypatch, tables: int = 1):
    """Simulated tables with 3 due dates each (3 small files a date: the test config's min_input_files), their
    config, and the sensor's budget cut to one run a tick (`icemaint tick` runs a table's dates as one run, so the
    budget counts tables)."""
    import sensors.compaction

    writers = [streaming_table(spark, "lake", f"idle_{uuid.uuid4().hex[:8]}.events", batches=3, rows_per_day=8,
                               delete_every=0) for _ in range(tables)]
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [w.name.key for w in writers]})
    monkeypatch.setattr(sensors.compaction, "MAX_RUNS_PER_TICK", 1)
    return writers, path


def test_until_idle_ticks_past_the_run_budget_fails_when_cut_short_and_stops_when_a_tick_publishes_nothing(
        capsys, spark, lake_root, tmp_path, monkeypatch):
    """Three tables, one a tick: cut short after two ticks (runs still publishing), the catch-up fails; run again,
    it compacts the third and stops at the first tick that launches nothing."""
    writers, path = three_due_dates(spark, lake_root, tmp_path, monkeypatch, tables=3)

    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--until-idle", "--max-ticks", "2", "--json")
    assert code == 1 and "stopped after --max-ticks 2" in err and "not finished" in err
    reports = json.loads(out)
    assert len(reports) == 2
    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--until-idle", "--json")
    assert code == 0, err
    reports += json.loads(out)
    launched = [[d for d in r["decisions"] if d.get("run_id")] for r in reports]
    # one table a tick (the budget), its three dates in one run
    assert [len(runs) for runs in launched] == [3, 3, 3, 0], [r["lines"] for r in reports]
    assert [len({d["table"] for d in runs}) for runs in launched[:3]] == [1, 1, 1]
    assert [len({d["run_id"] for d in runs}) for runs in launched[:3]] == [1, 1, 1]
    assert {runs[0]["table"] for runs in launched[:3]} == {w.name.key for w in writers}
    for runs in launched[:3]:
        assert sorted(d["date"] for d in runs) == ["2026-01-01", "2026-01-02", "2026-01-03"]
        assert all(d["published"] and d["validation"] and d["success"] for d in runs)
    reader = CatalogReader(load_config(path))
    for writer in writers:
        assert [p.data_files for p in reader.health(writer.name.key).partitions] == [1, 1, 1]
        ids = reader.load(writer.name.key).scan().to_arrow().column("event_id").to_pylist()
        assert sorted(ids) == sorted(writer.ledger.expected_ids())

    code, out, _ = run_cli(capsys, "--config", str(path), "tick", "--json")  # without it: one report, as before
    assert code == 0 and isinstance(json.loads(out), dict)


def test_max_ticks_must_be_a_positive_whole_number(capsys, tmp_path, lake_root):
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    code, _, err = run_cli(capsys, "--config", str(path), "tick", "--until-idle", "--max-ticks", "0")
    assert code == 2 and "must be at least 1" in err and "Traceback" not in err
