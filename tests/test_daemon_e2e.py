"""The real daemon, end to end: a writer commits small files to two dates of two tables in scope, and with
nobody calling anything, the Dagster daemon registers the tables (discovery sensor), its compaction
sensor launches one run over both tables' two dates (neighbouring tables due on the same dates share a run:
one run worker and Spark start where each table had its own), and the run publishes each table-date's
rewrite, each proven by three passing checks; no row is lost.

The tables are written before the daemon starts, so the discovery sensor registers both in one tick and
the compaction sensor finds both due in one tick (a writer still committing holds the table's claim and is
deferred: tests/test_compaction.py and tests/test_sensors.py).

Measured from the writer's last commit to the run's success (2026-11, 2 cores shared with other test runs,
load average 7-8): 77, 97 and 116 s with one table, most of it waiting for the sensors' default minimum
intervals (60 s for discovery, then 30 s for compaction); the run itself took 19-31 s, Spark's start included.
Every sensor ticks as the daemon starts, in no set order. Polling every 5 s, the compaction sensor met the tables
while the discovery's health run was still in flight, whichever ticked first: it deferred them (a run in flight on
the table), looked again 60 s later (`RECHECK_CLAIM_BUSY_SECONDS`), and its ticks in between cost CPU for nothing.
So the test's config (`automation.*_interval`, as an operator may set them) has the compaction sensor tick every
20 s: when its first tick comes before the discovery's it finds no table, and its second finds them with the health
run done (else it defers them as before); the discovery and retention sensors tick only as the daemon starts: the
tables are there by then, and nothing is due for expiry. The wait has no fixed bound (a CI machine 4x slower failed
one of 420 s while its run progressed): it fails after 300 s without progress (a run's status or events, the
tables' registration) or after CAP_S in all (tests/waiting.py). The daemon runs alone (`dagster-daemon run`, as a
deployment runs it beside its webserver): nothing here asks the webserver anything, and `dagster dev`'s webserver
and code-server proxy cost a tenth of the test's CPU. It and everything it started (its code server, run workers,
their Spark JVMs) are stopped by process group, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest import write_config
from icemaint.app.instance import ensure_dagster_home
from icemaint.config import load_config
from test_dagster_dev import REPO, STARTUP_TIMEOUT_S, dagster_executable, free_port, stop, wait_until_loaded
from waiting import Patience, run_progress

pytestmark = pytest.mark.slow

# The wait for the daemon's run fails after this in all however it progresses. 3x the 420 s bound it replaced was
# too little: at 0.3 of a core on a loaded host the run was still publishing its fourth table-date at 1,260 s.
CAP_S = 3600
BATCHES, ROWS_PER_DAY = 3, 10  # three small files a date (min_input_files), one batch of deletes
DATES = ["2026-01-01", "2026-01-02"]  # WorkloadSpec's start date and the next: two consecutive day partitions
CHECKS = {"row_count_parity", "sample_comparison", "column_aggregates"}


def processes_with_env(marker: str) -> list[int]:
    """Pids of live processes whose environment holds `marker` (e.g. `ICEMAINT_CONFIG=<this test's file>`).

    Everything `dagster dev` starts inherits its environment, so this finds the ones that left its group.
    """
    found = []
    needle = marker.encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # ended while we looked, or not ours to read
    return found


@contextlib.contextmanager
def dagster_dev(workdir: Path, config_path: Path, home: Path, module: str | None = None,
                env: dict | None = None, webserver: bool = True) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    """`dagster dev` (webserver + daemon) on a free loopback port for the instance `home`, serving the
    project's code location with ICEMAINT_CONFIG=`config_path` (`module`: a module of tests/ standing in for
    it under its name, `env`: more environment). Yields (process, port, log path) once the
    location has loaded; stops the whole process group on the way out, then makes sure nothing that
    carries this config in its environment is left (a run worker or JVM that left the group is killed,
    and the test fails saying so). Without `webserver`: `dagster-daemon run` alone, yielded once its run queue
    beats (the port is then unused)."""
    workdir.mkdir(parents=True, exist_ok=True)
    location = {"module_name": "maint_assets.definitions", "working_directory": str(REPO)}
    if module:
        location = {"module_name": module, "working_directory": str(REPO / "tests"),
                    "location_name": "maint_assets.definitions"}
    (workdir / "workspace.yaml").write_text(yaml.safe_dump({"load_from": [{"python_module": location}]}))
    port = free_port()
    log_path = workdir / "dagster-dev.log"
    marker = f"ICEMAINT_CONFIG={config_path}"
    env = {**os.environ, **(env or {}), "ICEMAINT_CONFIG": str(config_path), "DAGSTER_HOME": str(home)}
    command = [dagster_executable(), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    if not webserver:
        command = [str(Path(dagster_executable()).with_name("dagster-daemon")), "run", "-w", "workspace.yaml"]
        # The instance's SQLite storage made here first, as `dagster dev` makes it before its processes start: a
        # daemon and this process making it at once both stamped its schema version ("more than one head").
        from dagster import DagsterInstance

        with DagsterInstance.from_config(str(home)):
            pass
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    failed = False
    try:
        if webserver:
            wait_until_loaded(proc, port, log_path)
        else:
            wait_until_beating(proc, home, log_path)
        yield proc, port, log_path
    except BaseException:
        failed = True
        raise
    finally:
        stop(proc)
        strays = processes_with_env(marker)
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if strays and not failed:
            pytest.fail(f"processes started by dagster dev outlived its process group: {strays}")


def wait_until_beating(proc: subprocess.Popen, home: Path, log_path: Path) -> None:
    """Until the daemon's run queue has beaten once on the instance `home` (its daemons are up by then)."""
    from dagster import DagsterInstance

    from icemaint.app.queued_runs import heartbeat_age

    patience = Patience("the daemon's first beat", cap_s=3 * STARTUP_TIMEOUT_S)
    with DagsterInstance.from_config(str(home)) as instance:
        while heartbeat_age(instance) is None:
            if proc.poll() is not None:
                pytest.fail(f"the daemon exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            patience.check(log_path.stat().st_size, log_path.read_text()[-4000:])
            time.sleep(1.0)


def main_snapshot(spark, table_sql: str):
    """The snapshot `main` points at: its id and summary."""
    return spark.sql(f"SELECT s.snapshot_id, s.summary FROM {table_sql}.`snapshots` s "
                     f"JOIN {table_sql}.`refs` r ON r.snapshot_id = s.snapshot_id WHERE r.name = 'main'").first()


def test_the_daemon_compacts_what_a_writer_committed(spark, tmp_path, lake_root, isolated_dagster_home):
    from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

    from icemaint.app.simulator import StreamingWriter, WorkloadSpec
    from icemaint.domain.names import TableName
    from maint_assets.partitions import (
        PLANNED_SNAPSHOT_TAG, RANGE_END_TAG, RANGE_START_TAG, TABLE_TAG, TABLES_TAG, TRIGGER_TAG, slot_tags,
        table_slot, tables_of,
    )

    started = time.monotonic()
    namespace = f"e2e_{uuid.uuid4().hex[:8]}"
    # two tables in different queue slots (one run carries one slot tag per table)
    tables = [f"{namespace}.events"] + [t for t in (f"{namespace}.clicks{i}" for i in range(50))
                                        if table_slot(t) != table_slot(f"{namespace}.events")][:1]
    # Only this test's namespace is in scope, and one run at a time (the sensor spreads a stretch of tables
    # over as many runs as the queue runs at once): the daemon leaves the shared warehouse's other tables alone.
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [f"{namespace}.*"]}, max_runs_total=1,
                        automation={"discovery_interval": "1d", "compaction_interval": "20s",
                                    "retention_interval": "1d"})
    config = load_config(path)
    home = ensure_dagster_home(config)
    writers = {table: StreamingWriter(spark, "lake", WorkloadSpec(table=table, days=len(DATES),
                                                                  rows_per_day=ROWS_PER_DAY, delete_every=2))
               for table in tables}
    for writer in writers.values():
        writer.create_table()
        writer.run(BATCHES)
    last_commit = time.time()  # the last commit has just returned
    last = {table: main_snapshot(spark, TableName.parse(table).sql("lake")) for table in tables}
    timings: dict[str, float] = {"writers done": time.monotonic() - started}

    with contextlib.ExitStack() as stack:
        proc, port, log_path = stack.enter_context(dagster_dev(tmp_path / "dev", path, home, webserver=False))
        timings["daemon up"] = time.monotonic() - started
        instance = stack.enter_context(DagsterInstance.from_config(str(home)))
        patience = Patience(f"a successful compaction run for {tables}", cap_s=CAP_S)
        registered_at, run, ours = None, None, []
        while run is None:
            if proc.poll() is not None:
                pytest.fail(f"the daemon exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            if registered_at is None and all(instance.has_dynamic_partition("table", t) for t in tables):
                registered_at = time.time()
            ours = [r for r in instance.get_run_records(RunsFilter(job_name="compaction_job"))
                    if set(tables_of(r.dagster_run.tags)) & set(tables)]
            ended = [r for r in ours if r.dagster_run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)]
            if ended:
                bad = ended[0].dagster_run
                errors = [e.message for e in instance.all_logs(bad.run_id, of_type=DagsterEventType.STEP_FAILURE)]
                pytest.fail(f"the daemon's compaction run {bad.run_id} ended {bad.status.value}: {errors}")
            if ours and all(r.dagster_run.status == DagsterRunStatus.SUCCESS for r in ours):
                run = ours[0]
                break
            runs = [r.run_id for r in instance.get_runs(limit=20)]  # the discovery's health run, then the compaction
            patience.check((registered_at is not None, run_progress(instance, runs)),
                           f"runs: {[(r.dagster_run.run_id, r.dagster_run.status.value) for r in ours]}; registered: "
                           f"{registered_at is not None}:\n{log_path.read_text()[-4000:]}")
            time.sleep(2.0)
        latency = run.end_time - last_commit
        timings["run succeeded"] = time.monotonic() - started

        order = [t for t in instance.get_dynamic_partitions("table") if t in tables]
        run_id = run.dagster_run.run_id
        tags = run.dagster_run.tags
        evaluations = {e.dagster_event.event_specific_data.check_name: e.dagster_event.event_specific_data.passed
                       for e in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)}
        materialized = [e.dagster_event.partition for e in
                        instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
                        if e.dagster_event.asset_key.path == ["compaction"]]
        discovered = [r for r in instance.get_run_records(RunsFilter(job_name="health_job"))
                      if set(tables_of(r.dagster_run.tags)) & set(tables)]

    after = {table: main_snapshot(spark, TableName.parse(table).sql("lake")) for table in tables}
    print(f"\n[daemon e2e] writers' last commit -> run success: {latency:.1f}s (tables registered "
          f"{(registered_at or float('nan')) - last_commit:.1f}s, run created "
          f"{run.create_timestamp.timestamp() - last_commit:.1f}s, started {run.start_time - last_commit:.1f}s, "
          f"ran {run.end_time - run.start_time:.1f}s after its start); phases since test start: "
          + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))

    # The daemon's compaction sensor launched it: one run over both tables' two dates (neighbours in the
    # partitions' order), each table-date decided again under its table's claim.
    assert len(ours) == 1, [(r.dagster_run.run_id, r.dagster_run.tags) for r in ours]
    assert tags.get("dagster/sensor_name") == "compaction_sensor", tags
    assert tags.get(TABLES_TAG) == ",".join(order) and TABLE_TAG not in tags, tags
    assert (tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)) == (f"{DATES[0]}|{order[0]}",
                                                                  f"{DATES[-1]}|{order[-1]}"), tags
    assert {k: v for k, v in tags.items() if k.startswith(".dagster/icemaint/slot/")} == slot_tags(order), tags
    assert tags.get(TRIGGER_TAG) == "sensor" and PLANNED_SNAPSHOT_TAG not in tags, tags
    assert tags.get("dagster/run_key", "").startswith(f"compact:{order[0]}..{order[-1]}:{DATES[0]}..{DATES[-1]}:")
    # The discovery sensor registered the tables and requested one health run over both.
    assert [(r.dagster_run.tags.get("dagster/sensor_name"), tables_of(r.dagster_run.tags), r.dagster_run.status)
            for r in discovered] == [("table_discovery", tuple(sorted(tables)), DagsterRunStatus.SUCCESS)], discovered
    # Three blocking proofs, all passed (each over every table-date of the run); each table-date materialized
    # and published as a forward commit of its own.
    assert evaluations == {name: True for name in CHECKS}, evaluations
    assert sorted(materialized) == sorted(f"{d}|{t}" for t in tables for d in DATES), materialized
    for table in tables:
        table_sql = TableName.parse(table).sql("lake")
        summary = after[table]["summary"]
        assert after[table]["snapshot_id"] != last[table]["snapshot_id"]
        assert summary.get("icemaint.run-id") == run_id and summary.get("icemaint.proof") is not None, summary
        files = spark.sql(f"SELECT count(*) FROM {table_sql}.`data_files`").first()[0]
        assert files == len(DATES), f"{table}: {files} data files left on {DATES}"
        # Nothing lost, nothing duplicated, every delete still applied.
        rows = [r[0] for r in spark.sql(f"SELECT event_id FROM {table_sql}").collect()]
        assert len(rows) == len(set(rows)) and set(rows) == writers[table].ledger.expected_ids(), table
        assert len(writers[table].ledger.deleted) > 0
    assert latency > 0, latency  # how long is printed above: a speed target is a benchmark's, not this test's
