"""Every command that opens the Dagster instance first marks failed the runs of dead processes: a run whose
process was killed stayed STARTED (holding its table's queue slot) until a tick's reaper came by, so a person's
`compact` waited behind it. A dry run changes nothing, this included."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli, write_config
from icemaint.config import load_config
from sensors.reaper import PID_TAG

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("isolated_dagster_home")

# A real in-process Dagster run of this project's shape (the reaper's process tags), hanging in its op.
HANGING_RUN = """
import os, sys, time, uuid
import dagster as dg
from sensors.reaper import process_tags

@dg.op
def hang():
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(600)

@dg.job
def stuck():
    hang()

run_id = str(uuid.uuid4())
stuck.execute_in_process(instance=dg.DagsterInstance.from_config(sys.argv[1]), run_id=run_id,
                         tags={"icemaint/table": "t.killed", **process_tags(run_id)})
"""


def killed_run(config, tmp_path: Path) -> tuple:
    """(instance, run id) of a STARTED run whose process was killed with SIGKILL."""
    from dagster import DagsterInstance

    from icemaint.app.instance import ensure_dagster_home

    home = ensure_dagster_home(config)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", HANGING_RUN, str(home), str(ready)], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), f"the run never started (rc {proc.poll()})"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    instance = DagsterInstance.from_config(str(home))
    [run] = [r for r in instance.get_runs() if r.tags.get(PID_TAG) == str(proc.pid)]
    assert run.status.value == "STARTED"
    return instance, run.run_id


def test_a_persons_compact_reaps_the_run_of_a_killed_process_first(tmp_path, lake_root, capsys):
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    instance, run_id = killed_run(load_config(path), tmp_path)
    compact = ["--config", str(path), "compact", "t.absent", "--date", "2026-01-02"]

    code, out, err = run_cli(capsys, *compact, "--dry-run")
    assert code == 2 and "t.absent" in err, err  # the table is not there: exit 2 either way
    assert instance.get_run_by_id(run_id).status.value == "STARTED", "a dry run changed the instance"

    code, out, err = run_cli(capsys, *compact)
    assert code == 2, err
    assert instance.get_run_by_id(run_id).status.value == "FAILURE"
    reaped, error = err.strip().splitlines()
    assert reaped.startswith(f"reaper: run {run_id} (stuck, t.killed) marked failed: ") and error.startswith("error: ")
    assert "icemaint reaper" in instance.all_logs(run_id)[-1].dagster_event.message
