"""Crash recovery, per phase, with real processes: `icemaint` killed with SIGKILL (its whole process
group, Spark's JVM included) while it holds the claim, while its staging branch exists and while it
expires snapshots. After each kill the table reads the writer's rows (pyiceberg, an independent
reader), `main` never moved backwards, the claim is free, the Dagster run is reaped (by the real
daemon's sensor, with a queued run waiting on the table's slot), `icemaint audit` shows the run as
`interrupted`, and the next run succeeds and cleans up after the dead one.

Also: the audit's started/interrupted folding on both sinks, the proof of death, the reaper's pure
decisions and a real instance, and the lineage check that reports an unproven rewrite on `main`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from conftest import make_config, run_cli, streaming_table, write_config
from icemaint.config import load_config
from icemaint.engine.staging import PROOF_KEY, RUN_ID_KEY, STAGE_KEY
from staged_faults import staging_refs
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.contract import LINEAGE, UNPROVEN, unproven_rewrites
from icemaint.safety.audit import AuditRecord, FileAuditLog, audit_call, open_audit
from icemaint.safety.process import ProcessRef, ProcessState, probe_process
from icemaint.safety.claims import open_claims
from sensors.reaper import (GRPC_INFO_TAG, HOST_TAG, PID_TAG, PROCESS_RUN_TAG, RunFacts, decide_reaping,
                            reap_dead_runs, run_worker)

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DATE = "2026-01-02"
OTHER_DATE = "2026-01-03"  # the estate's other date of small files (`estate_table`)
PHASE_TIMEOUT_S = 240


# -- helpers --------------------------------------------------------------------------------------

def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def marker(table="db.events", operation="compact", process=None, call_id="c1", **kw) -> AuditRecord:
    process = process or ProcessRef.current()
    return AuditRecord(table=table, operation=operation, decision="started", reason="started under claim x",
                       call_id=call_id, details={"process": process.to_dict()}, **kw)


def ended(table="db.events", operation="compact", call_id="c1", decision="run") -> AuditRecord:
    return AuditRecord(table=table, operation=operation, decision=decision, reason="done", call_id=call_id)


def raw_audit(state_dir: Path) -> list[dict]:
    """The audit file's stored lines as they are (no folding)."""
    path = audit_file(state_dir)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def reader_ids(config, table: str) -> list[int]:
    return CatalogReader(config).load(table).scan().to_arrow().column("event_id").to_pylist()


def assert_rows(config, table: str, expected: set[int]) -> None:
    ids = reader_ids(config, table)
    duplicated = sorted(i for i, n in Counter(ids).items() if n > 1)
    assert not duplicated, f"{len(duplicated)} duplicated rows, e.g. {duplicated[:5]}"
    missing, extra = expected - set(ids), set(ids) - expected
    assert not missing and not extra, f"{len(missing)} lost rows, e.g. {sorted(missing)[:5]}; {len(extra)} unexpected"


def main_chain(config, table: str) -> list[int]:
    """main's snapshot ids, newest first (pyiceberg)."""
    tbl = CatalogReader(config).load(table)
    out, snap = [], tbl.current_snapshot()
    while snap is not None:
        out.append(snap.snapshot_id)
        snap = tbl.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return out


def assert_forward(config, table: str, head_before: int) -> None:
    assert head_before in main_chain(config, table), f"main moved backwards: {head_before} left main's lineage"


def icemaint(config_path: Path, *args: str, log: Path) -> subprocess.Popen:
    """`icemaint --config PATH ARGS` in its own process group (so a kill reaches Spark's JVM too)."""
    out = open(log, "ab")
    try:
        return subprocess.Popen([str(BIN / "icemaint"), "--config", str(config_path), *args], cwd=REPO,
                                env={**os.environ, "ICEMAINT_IDENTITY": "maint-test"}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()


@pytest.fixture
def rerun(capsys, monkeypatch, isolated_dagster_home):
    """`icemaint` in this process, as a CompletedProcess: the run after a killed one. Its subject is what the dead
    process left behind, not a process boundary of its own, and each process of its own costs a JVM's start."""
    monkeypatch.setenv("ICEMAINT_IDENTITY", "maint-test")

    def run(config_path: Path, *args: str) -> subprocess.CompletedProcess:
        code, out, err = run_cli(capsys, "--config", str(config_path), *args)
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def wait_for(what: str, probe, proc: subprocess.Popen, log: Path, poll: float = 0.02):
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"icemaint exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(poll)
    pytest.fail(f"icemaint never reached {what} in {PHASE_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")


def on_change(probe, *paths: Path):
    """`probe`, asked again only when one of `paths` changed (a directory: its entries' names, sizes and times; a
    file: its size and time), else its last answer. A wait polls every few milliseconds, and a catalog read
    (pyiceberg parses the table's whole metadata) or an audit read that often took a core from the process being
    waited for; a few stats do not. The paths are read before the probe, so a change during the probe is seen
    at the next poll."""
    last: list = [object(), None]

    def signature(path: Path):
        try:
            if path.is_dir():
                return frozenset((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(path))
            st = path.stat()
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime_ns

    def gated():
        seen = tuple(signature(p) for p in paths)
        if seen != last[0]:
            last[0], last[1] = seen, probe()
        return last[1]

    return gated


def metadata_dir(config, table: str) -> Path:
    """The table's metadata directory (the Hadoop catalog's): each commit and each ref change writes a file in it."""
    return Path(config.catalog.warehouse, *table.split("."), "metadata")


def audit_file(state_dir: Path) -> Path:
    return state_dir / "audit" / "audit.jsonl"


def freeze(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGSTOP)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL to the whole group (Python and Spark's JVM): no cleanup runs anywhere."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    assert proc.wait(timeout=60) == -signal.SIGKILL


def started_markers(state_dir: Path, table: str, operation: str) -> list[dict]:
    return [r for r in raw_audit(state_dir) if r["table"] == table and r["operation"] == operation
            and r["decision"] == "started"]


def instance_for(config):
    from dagster import DagsterInstance

    from icemaint.app.instance import ensure_dagster_home

    return DagsterInstance.from_config(str(ensure_dagster_home(config)))


def run_of(instance, pid: int):
    """The Dagster run an in-process `icemaint` with this pid executed."""
    runs = [r for r in instance.get_runs() if r.tags.get(PID_TAG) == str(pid)]
    assert len(runs) == 1, [(r.run_id, r.status) for r in runs]
    return runs[0]


# -- the audit: started markers fold into one record per call ----------------------------------------

@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def audit_log(request, tmp_path, monkeypatch):
    if request.param == "postgres":
        from pg_server import fresh_database

        with fresh_database(request.getfixturevalue("postgres_dsn"), f"crash_{uuid.uuid4().hex[:8]}") as dsn:
            monkeypatch.setenv("ICEMAINT_TEST_CRASH_DSN", dsn)
            yield open_audit(make_config(tmp_path, audit={"sink": "postgres", "dsn_env": "ICEMAINT_TEST_CRASH_DSN"}))
        return
    yield open_audit(make_config(tmp_path))


def test_a_call_reads_back_as_one_record_started_running_or_interrupted(audit_log):
    audit_log.append(marker(call_id="ended"))
    audit_log.append(AuditRecord(table="db.events", operation="cleanup", decision="run", reason="branch removed",
                                 call_id="ended"))  # written by the act: a decision of its own
    audit_log.append(ended(call_id="ended"))
    audit_log.append(marker(call_id="running"))  # this process: alive
    audit_log.append(marker(call_id="dead", process=ProcessRef(dead_pid(), ProcessRef.current().host)))
    audit_log.append(marker(call_id="elsewhere", process=ProcessRef(1, "another-host")))
    audit_log.append(marker(operation="expire", call_id="dead-expiry",
                            process=ProcessRef(dead_pid(), ProcessRef.current().host)))

    got = [(r.call_id, r.operation, r.decision) for r in audit_log.records()]
    assert got == [("ended", "cleanup", "run"), ("ended", "compact", "run"), ("running", "compact", "started"),
                   ("dead", "compact", "interrupted"), ("elsewhere", "compact", "started"),
                   ("dead-expiry", "expire", "interrupted")]
    by_call = {r.call_id: r for r in audit_log.records(operation="compact")}
    assert "still running" in by_call["running"].reason
    assert by_call["dead"].reason.startswith("interrupted: the compact started at ")
    assert "no process has pid" in by_call["dead"].reason
    assert "another host" in by_call["elsewhere"].reason and "cannot be checked" in by_call["elsewhere"].reason
    # limit counts calls: an ended call's marker is left out before the limit applies
    assert [r.call_id for r in audit_log.records(limit=2)] == ["elsewhere", "dead-expiry"]
    assert [r.decision for r in audit_log.records(operation="expire")] == ["interrupted"]


def test_records_built_inside_a_call_carry_its_id_and_stored_ones_never_take_the_readers(tmp_path):
    log = FileAuditLog(tmp_path)
    log.append(AuditRecord(table="db.events", operation="compact", decision="run", reason="old record"))
    with audit_call("abc"):
        inside = AuditRecord(table="db.events", operation="compact", decision="run", reason="x")
        assert inside.call_id == "abc"
        assert [r.call_id for r in log.records()] == [None]  # read inside a call: not stamped with it
    assert AuditRecord(table="db.events", operation="compact", decision="run", reason="x").call_id is None


def test_a_process_is_dead_only_on_proof():
    me = ProcessRef.current()
    assert me.probe()[0] is ProcessState.ALIVE
    state, why = ProcessRef(dead_pid(), me.host).probe()
    assert state is ProcessState.DEAD and "no process has pid" in why
    if me.start:  # Linux: the same pid with another start is another process
        boot, _, ticks = me.start.partition(":")
        state, why = ProcessRef(me.pid, me.host, f"{boot}:{int(ticks) + 1}").probe()
        assert state is ProcessState.DEAD and "another process" in why
        state, why = ProcessRef(me.pid, me.host, f"not-this-boot:{ticks}").probe()
        assert state is ProcessState.DEAD and "rebooted" in why
        # a pid known to have run long before this process started belongs to someone else now
        assert ProcessRef(me.pid, existed_at=time.time() - 3600).probe()[0] is ProcessState.DEAD
        assert ProcessRef(me.pid, existed_at=time.time()).probe()[0] is ProcessState.ALIVE
    assert ProcessRef(me.pid, "another-host").probe()[0] is ProcessState.UNKNOWN


# -- the reaper's decisions --------------------------------------------------------------------------

def _facts(status="STARTED", run_id="r1", **tags) -> RunFacts:
    return RunFacts(run_id, "compaction_job", status, {"icemaint/table": "db.events", **tags})


DEAD = lambda ref: (ProcessState.DEAD, f"no process has pid {ref.pid}")  # noqa: E731
ALIVE = lambda ref: (ProcessState.ALIVE, f"pid {ref.pid} is running")  # noqa: E731


@pytest.mark.parametrize("facts, probe, reap, says", [
    (_facts(**{PID_TAG: "42", HOST_TAG: "h", PROCESS_RUN_TAG: "r1"}), DEAD, True, "in-process run's process is gone"),
    (_facts(**{PID_TAG: "42", HOST_TAG: "h", PROCESS_RUN_TAG: "r1"}), ALIVE, False, "is running"),
    (_facts("STARTING", **{PID_TAG: "42", HOST_TAG: "h", PROCESS_RUN_TAG: "r1"}), DEAD, True, "gone"),
    # a re-execution that copied its parent's process tags is not judged by them
    (_facts(**{PID_TAG: "42", HOST_TAG: "h", PROCESS_RUN_TAG: "parent"}), DEAD, False, "no record of the process"),
    (_facts(), DEAD, False, "no record of the process"),
    (_facts("QUEUED", **{PID_TAG: "42", PROCESS_RUN_TAG: "r1"}), DEAD, False, "status QUEUED"),
    # an in-process run whose process died between creating and starting it (found by the soak)
    (_facts("NOT_STARTED", **{PID_TAG: "42", HOST_TAG: "h", PROCESS_RUN_TAG: "r1"}), DEAD, True, "gone"),
    (_facts("NOT_STARTED", **{PID_TAG: "42", HOST_TAG: "h", PROCESS_RUN_TAG: "r1"}), ALIVE, False, "is running"),
    (RunFacts("r1", "compaction_job", "NOT_STARTED", {GRPC_INFO_TAG: '{"host": "localhost", "port": 1}'}, 42, 1.0),
     DEAD, False, "not an in-process run"),
    (RunFacts("r1", "compaction_job", "STARTED", {GRPC_INFO_TAG: '{"host": "localhost", "port": 1}'}, 42, 1.0),
     DEAD, True, "run worker's process is gone"),
    (RunFacts("r1", "compaction_job", "STARTED", {GRPC_INFO_TAG: '{"host": "localhost", "socket": "/s"}'}),
     DEAD, False, "has not reported a pid"),
    (RunFacts("r1", "compaction_job", "STARTED", {GRPC_INFO_TAG: '{"host": "10.0.0.9", "port": 1}'}, 42, 1.0),
     DEAD, False, "not on this host"),
])
def test_reaper_reaps_only_a_run_whose_process_is_proven_dead(facts, probe, reap, says):
    decision = decide_reaping(facts, probe)
    assert decision.reap is reap and says in decision.reason, decision.reason
    assert decision.table == "db.events" or GRPC_INFO_TAG in facts.tags


HANGING_RUN = textwrap.dedent("""
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
                             tags={"icemaint/table": sys.argv[3], **process_tags(run_id)})
""")


def test_reaper_marks_failed_the_run_of_a_killed_process_and_leaves_a_live_one(tmp_path, lake_root):
    config = make_config(lake_root, state_dir=str(tmp_path / "state"))
    instance = instance_for(config)
    home = str(config.dagster_home.resolve())
    procs = []
    for name in ("killed", "alive"):
        ready = tmp_path / name
        procs.append((subprocess.Popen([sys.executable, "-c", HANGING_RUN, home, str(ready), f"t.{name}"], cwd=REPO),
                      ready))
    try:
        for proc, ready in procs:
            deadline = time.monotonic() + 120
            while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert ready.exists(), f"the run never started (rc {proc.poll()})"
        killed = procs[0][0]
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert {r.tags["icemaint/table"]: r.status.value for r in instance.get_runs()} == \
            {"t.killed": "STARTED", "t.alive": "STARTED"}

        assert [d.run_id for d in reap_dead_runs(instance, dry_run=True) if d.reap] == [run_of(instance, killed.pid).run_id]
        assert instance.get_run_by_id(run_of(instance, killed.pid).run_id).status.value == "STARTED"  # dry run
        decisions = {d.table: d for d in reap_dead_runs(instance)}
        assert decisions["t.killed"].reap and not decisions["t.alive"].reap, decisions
        runs = {r.tags["icemaint/table"]: r for r in instance.get_runs()}
        assert runs["t.killed"].status.value == "FAILURE" and runs["t.alive"].status.value == "STARTED"
        failure = instance.all_logs(runs["t.killed"].run_id)[-1]
        assert "icemaint reaper" in failure.dagster_event.message and str(killed.pid) in failure.dagster_event.message
        assert not [d for d in reap_dead_runs(instance) if d.reap]  # nothing more to reap
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


# -- the lineage check ------------------------------------------------------------------------------

@pytest.mark.parametrize("operation, summary, unproven", [
    ("replace", {"icemaint.maintenance": "true", RUN_ID_KEY: "r", PROOF_KEY: "passed", "added-data-files": "1",
                 "deleted-data-files": "4"}, False),
    ("replace", {"icemaint.maintenance": "true", RUN_ID_KEY: "r", "added-data-files": "1",
                 "deleted-data-files": "4"}, True),
    ("replace", {RUN_ID_KEY: "r", PROOF_KEY: "failed", "added-data-files": "1", "deleted-data-files": "4"}, True),
    # a manifest rewrite of ours changes no file: no proof needed
    ("replace", {"icemaint.maintenance": "true", RUN_ID_KEY: "r", "manifests-created": "1"}, False),
    # somebody else's rewrite is not ours to judge
    ("replace", {"added-data-files": "1", "deleted-data-files": "4"}, False),
    ("append", {"added-data-files": "1"}, False),
    ("append", {"icemaint.maintenance": "true", STAGE_KEY: "icemaint_stage_x_1", "added-data-files": "1"}, True),
])
def test_lineage_check_finds_what_stage_prove_publish_cannot_produce(operation, summary, unproven):
    found = unproven_rewrites([(2, 1, operation, summary), (1, None, "append", {"added-data-files": "3"})])
    assert [f["snapshot_id"] for f in found] == ([2] if unproven else [])


# -- real processes killed at a phase --------------------------------------------------------------

@pytest.fixture(scope="module")
def estate_table(spark) -> tuple[str, set[int]]:
    """A day-partitioned table of small files (and a merge-on-read delete), written once for the module's kill
    tests: three small files on each date (min_input_files), in four commits. Returns (its name, the writer's rows).
    Each test needs only what no other test takes from it: the compaction kills compact DATE, the terminal's Ctrl-C
    compacts OTHER_DATE, and the expiry and orphan kills need any state of it; each asserts on main's head and the
    rows as it found them."""
    table = f"t.crash_estate_{uuid.uuid4().hex[:8]}"
    writer = streaming_table(spark, "lake", table, batches=3, days=3, rows_per_day=15, delete_every=3)
    return table, writer.ledger.expected_ids()


@pytest.fixture
def estate(estate_table, lake_root, tmp_path):
    """The module's table, with a config of the test's own state dir (claims, audit, Dagster instance), as an
    operator's `icemaint` would use it."""
    from types import SimpleNamespace

    table, expected = estate_table
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    return SimpleNamespace(table=table, path=path, config=load_config(path), state=tmp_path / "state",
                           expected=expected, tmp=tmp_path)


def assert_recovered(estate, proc: subprocess.Popen, head_before: int, operation: str):
    """After a kill: rows as the writer left them, main forward, claim free, the run STARTED (a zombie
    until reaped), and the call read back from the audit as `interrupted`. Returns (run, record)."""
    assert_rows(estate.config, estate.table, estate.expected)
    assert_forward(estate.config, estate.table, head_before)
    assert open_claims(estate.config).holder_of(estate.table) is None, "the dead run's claim is still held"
    run = run_of(instance_for(estate.config), proc.pid)
    assert run.status.value == "STARTED", run.status
    [record] = [r for r in open_audit(estate.config).records(table=estate.table, operation=operation)
                if r.details.get("process", {}).get("pid") == proc.pid]
    assert record.decision == "interrupted" and record.run_id == run.run_id, record
    assert f"pid {proc.pid}" in record.reason and "no process has pid" in record.reason
    return run, record


def submit_queued_health_run(config_path: Path, table: str, workspace: Path) -> str:
    """A health run for the table submitted to the run queue (QueuedRunCoordinator) for the daemon's code location,
    in this process, as an agent's run is (`MaintenanceRunner.submit`): `dagster job launch` cost two Python
    processes of their own (the command's and its code server's), each loading Dagster and the definitions."""
    from icemaint.app.queued_runs import code_location_origin
    from icemaint.app.runner import JobCall, MaintenanceRunner

    # reap=False: the dead runs are the daemon's reaper's to find, not this submitter's
    runner = MaintenanceRunner(load_config(config_path), str(config_path), reap=False)
    try:
        key = runner.check_table(table)
        run = runner.submit(JobCall("health_job", key, {}, {"icemaint/table": key}), code_location_origin(workspace),
                            str(uuid.uuid4()))
    finally:
        runner.instance.dispose()
    assert run.remote_job_origin.location_name == "maint_assets.definitions", run.remote_job_origin
    return run.run_id


def stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.slow
def test_compaction_killed_under_the_claim_and_while_staging_recovers_and_the_daemon_reaps(estate, lake_root, rerun):
    config, table, state = estate.config, estate.table, estate.state
    head = main_chain(config, table)[0]

    # 1. killed while holding the claim, after its started marker, before any staging
    log1 = estate.tmp / "kill-claim.log"
    first = icemaint(estate.path, "compact", table, "--date", DATE, log=log1)
    try:
        wait_for("the started marker", on_change(lambda: started_markers(state, table, "compact"), audit_file(state)),
                 first, log1, poll=0.005)
        freeze(first)
        assert not staging_refs(config, table), "too late: staging had begun before the freeze"
        holder = open_claims(config).holder_of(table)
        assert holder is not None and holder.pid == first.pid, holder
    finally:
        kill(first)
    run1, _ = assert_recovered(estate, first, head, "compact")

    # 2. killed while its staged files are on the branch: proving them (main never saw them)
    log2 = estate.tmp / "kill-staging.log"
    second = icemaint(estate.path, "compact", table, "--date", DATE, log=log2)
    try:
        wait_for("staged files on a branch", on_change(lambda: set(staging_refs(config, table).values()) - {head},
                                                       metadata_dir(config, table)), second, log2, poll=0.02)
        freeze(second)
        branches = staging_refs(config, table)
        assert branches, "too late: the run discarded its branch before the freeze"
        assert main_chain(config, table)[0] == head, "the rewrite was published before the freeze"
    finally:
        kill(second)
    run2, _ = assert_recovered(estate, second, head, "compact")
    # the second compact reaped the first's run as it opened the instance (a person's command does, not only ticks)
    assert instance_for(config).get_run_by_id(run1.run_id).status.value == "FAILURE"
    assert staging_refs(config, table) == branches  # left behind by the dead run, not on main
    assert not set(branches.values()) & set(main_chain(config, table))

    # 3. the real daemon: its reaper sensor frees the table's queue slot the second dead run held
    workspace = estate.tmp / "daemon" / "workspace.yaml"
    workspace.parent.mkdir()
    workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": {
        "module_name": "maint_assets.definitions", "working_directory": str(REPO)}}]}))
    # The daemon's own sensors must not compact the table meanwhile: it is disabled for them.
    daemon_config = write_config(estate.tmp / "daemon.yaml", lake_root, state_dir=str(state),
                                 scope={"include": [table]}, tables={table: {"enabled": False}})
    env = {**os.environ, "DAGSTER_HOME": str(config.dagster_home.resolve()), "ICEMAINT_CONFIG": str(daemon_config),
           "ICEMAINT_IDENTITY": "maint-test"}
    queued = submit_queued_health_run(daemon_config, table, workspace)
    instance = instance_for(config)
    assert instance.get_run_by_id(queued).status.value == "QUEUED"
    daemon_log = estate.tmp / "daemon" / "daemon.log"
    with open(daemon_log, "wb") as out:
        daemon = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], cwd=workspace.parent,
                                  env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            statuses = {r: instance.get_run_by_id(r).status.value for r in (run1.run_id, run2.run_id, queued)}
            if statuses[queued] in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            assert daemon.poll() is None, daemon_log.read_text()[-3000:]
            time.sleep(1.0)
        else:
            pytest.fail(f"the queue never ran the health run: {statuses}\n{daemon_log.read_text()[-3000:]}")
    finally:
        stop_group(daemon)
    assert statuses == {run1.run_id: "FAILURE", run2.run_id: "FAILURE", queued: "SUCCESS"}, statuses
    for dead in (run1, run2):
        [failure] = [e for e in instance.all_logs(dead.run_id) if e.dagster_event and e.dagster_event.is_run_failure]
        assert "icemaint reaper" in failure.dagster_event.message, failure.dagster_event.message
        # the queued run of the same table waited for the reaper: one run per table
        assert instance.get_run_record_by_id(queued).start_time >= failure.timestamp
    # a launched run is judged by its run worker's pid, as Dagster recorded it (the worker has exited now)
    launched = instance.get_run_by_id(queued)
    pid, seen = run_worker(instance, queued)
    assert GRPC_INFO_TAG in launched.tags and pid is not None and seen is not None, launched.tags
    verdict = decide_reaping(RunFacts(queued, launched.job_name, "STARTED", dict(launched.tags), pid, seen),
                             probe_process)
    assert verdict.reap and "run worker's process is gone" in verdict.reason, verdict

    # 4. `icemaint audit` shows both dead runs as interrupted, not missing
    shown = rerun(estate.path, "audit", "--table", table, "--json")
    assert shown.returncode == 0, shown.stderr
    interrupted = {r["run_id"]: r for r in json.loads(shown.stdout) if r["decision"] == "interrupted"}
    assert set(interrupted) == {run1.run_id, run2.run_id}, interrupted
    text = rerun(estate.path, "audit", "--table", table)
    assert text.stdout.count("interrupted") >= 2, text.stdout

    # 5. the next compaction runs as usual: it removes the dead run's branch (audited) and publishes
    done = rerun(estate.path, "compact", table, "--date", DATE, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    [outcome] = json.loads(done.stdout)
    assert outcome["decision"] == "run" and outcome["published"], outcome
    assert outcome["cleaned_staging"] == [{"branch": b, "staged_snapshot_id": s} for b, s in branches.items()]
    cleanup = open_audit(config).records(table=table, operation="cleanup")
    assert [r.details["branch"] for r in cleanup] == list(branches)
    assert not staging_refs(config, table)
    assert_rows(config, table, estate.expected)
    assert_forward(config, table, head)
    last = [r for r in raw_audit(state) if r["decision"] == "started" and r["run_id"] == outcome["run_id"]]
    assert last and last[0]["details"]["lineage"]["unproven"] == [], last
    assert [r.decision for r in open_audit(config).records(table=table, operation="compact")][-1] == "run"


def test_a_terminal_ctrl_c_while_proving_answers_in_one_line_and_leaves_the_table_as_it_was(estate):
    """A terminal's Ctrl-C reaches the whole foreground process group: icemaint, Spark's JVM (pyspark starts it
    ignoring SIGINT) and Dagster's compute-log mirrors (`tail -F` and a Python watcher each, which printed a
    KeyboardInterrupt traceback apiece before `icemaint.app.compute_logs`)."""
    config, table = estate.config, estate.table
    head = main_chain(config, table)[0]
    log = estate.tmp / "ctrl-c.log"
    proc = icemaint(estate.path, "compact", table, "--date", OTHER_DATE, log=log)
    try:
        wait_for("staged files on a branch", on_change(lambda: set(staging_refs(config, table).values()) - {head},
                                                       metadata_dir(config, table)), proc, log, poll=0.02)
        freeze(proc)
        assert main_chain(config, table)[0] == head, "too late: the rewrite was published before the freeze"
        group = subprocess.run(["ps", "-ww", "-o", "args=", "-g", str(proc.pid)], capture_output=True, text=True).stdout
        assert "watch_orphans.py" in group, group  # the step's log mirrors are running
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends
        os.killpg(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            kill(proc)
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    [line] = [ln for ln in text.splitlines() if ln.startswith(f"{table} {OTHER_DATE}:")]
    assert "failed: interrupted" in line and "main is unchanged" in line, line
    assert not staging_refs(config, table), text[-6000:]
    assert main_chain(config, table)[0] == head
    assert_rows(config, table, estate.expected)
    assert open_claims(config).holder_of(table) is None


def three_files_a_date(spark, table: str, days: int) -> set[int]:
    """The streaming writer's table (its schema and partitioning, its first three batches' rows) in one commit:
    three small files on each date (one per task of a three-way round-robin split, which the write keeps: no
    distribution by partition, fanout writers), as three batches leave it, which the tick finds due
    (min_input_files 3). Returns the ids it holds. The writer commits a batch at a time: the tick test's six
    tables took 18 commits, now 6."""
    from icemaint.app.simulator import StreamingWriter, WorkloadSpec, _spark_schema, batch_rows

    writer = StreamingWriter(spark, "lake", WorkloadSpec(table=table, days=days, rows_per_day=8, delete_every=0))
    writer.create_table()
    rows = [row for batch in range(3) for row in batch_rows(writer.spec, batch)]
    (spark.createDataFrame(rows, _spark_schema()).repartition(3).writeTo(writer.table_sql)
     .option("distribution-mode", "none").option("fanout-enabled", "true").append())
    return {row[0] for row in rows}


def test_a_ctrl_c_stops_the_whole_tick_every_lane_and_every_later_run(spark, lake_root, tmp_path):
    """A Ctrl-C in `icemaint tick --until-idle` running two tables at once stops the command: the runs in flight stop
    at their next step boundary, neither lane starts another run, and no later tick starts. Before, the interrupt
    stopped only the run that saw it: the other lane, both lanes' next runs and the next ticks went on."""
    import datetime as dt

    expected = {f"ctrlc_{uuid.uuid4().hex[:8]}.events": None for _ in range(6)}
    for i, table in enumerate(expected):
        expected[table] = three_files_a_date(spark, table, days=2 + i)
    tables = list(expected)
    state = tmp_path / "state"
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(state), max_runs_total=2,
                        scope={"include": tables})
    config = load_config(path)
    heads = {t: main_chain(config, t)[0] for t in tables}
    log = tmp_path / "tick.log"
    proc = icemaint(path, "tick", "--until-idle", log=log)
    try:
        staging = [on_change(lambda t=t: staging_refs(config, t), metadata_dir(config, t)) for t in tables]
        staged = wait_for("staged files on a branch", lambda: [t for t, refs in zip(tables, staging) if refs()], proc,
                          log, poll=0.02)
        freeze(proc)
        interrupted_at = dt.datetime.now(dt.timezone.utc)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends
        os.killpg(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=180) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill(proc)
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert text.rstrip().endswith("error: interrupted (Ctrl-C)"), text[-2000:]
    started = [r for r in raw_audit(state) if r["operation"] == "compact" and r["decision"] == "started"]
    later = [r for r in started if dt.datetime.fromisoformat(r["ts"]) > interrupted_at]
    # A lane that had just passed its boundary as the signal came may still begin that one call.
    assert len(later) <= 2, [(r["table"], r["date"], r["ts"]) for r in later]
    begun = {r["table"] for r in started}
    assert set(staged) <= begun and len(begun) <= 4, begun  # two runs in flight; the lanes' later runs never began
    records = open_audit(config).records(operation="compact")
    assert any(r.decision == "interrupted" and r.table in staged for r in records), \
        [(r.table, r.decision, r.reason) for r in records]
    for table in tables:
        assert not staging_refs(config, table), table
        assert_rows(config, table, expected[table])
        assert_forward(config, table, heads[table])
        assert open_claims(config).holder_of(table) is None
        if table not in begun:
            assert main_chain(config, table)[0] == heads[table], f"{table} was compacted after the interrupt"


@pytest.mark.slow
def test_expiry_killed_mid_act_recovers(estate, rerun):
    config, table, state = estate.config, estate.table, estate.state
    head = main_chain(config, table)[0]
    reader = CatalogReader(config)
    location = reader.metadata_location(table)  # cheap for the hadoop catalog: one small file
    log = estate.tmp / "kill-expiry.log"
    proc = icemaint(estate.path, "expire", table, "--older-than", "0s", log=log)
    try:
        wait_for("the started marker", on_change(lambda: started_markers(state, table, "expire"), audit_file(state)),
                 proc, log, poll=0.005)
        # the expiry commit (metadata) lands first, its file deletions follow: kill in between if we can
        deadline = time.monotonic() + 120
        while reader.metadata_location(table) == location and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.002)
        freeze(proc)
        ends = [r for r in raw_audit(state) if r["operation"] == "expire" and r["decision"] != "started"]
        assert not ends, f"too late: the expiry ended before the freeze: {ends}"
    finally:
        kill(proc)
    committed = reader.metadata_location(table) != location
    print(f"expiry killed {'after its commit' if committed else 'before its commit'}")
    assert_recovered(estate, proc, head, "expire")
    assert main_chain(config, table)[0] == head  # expiry never moves main

    done = rerun(estate.path, "expire", table, "--older-than", "0s", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["decision"] in (("run", "noop") if committed else ("run",)), outcome
    assert_rows(config, table, estate.expected)
    assert main_chain(config, table) == [head], "every older snapshot expired, main unchanged"
    assert [r.decision for r in open_audit(config).records(table=table, operation="expire")][-1] == outcome["decision"]


def test_orphan_quarantine_killed_mid_move_loses_no_file_and_the_rerun_finishes(estate, rerun):
    """kill -9 while orphans are being moved into quarantine: every orphan is whole, in place or in quarantine
    (none lost, none half-moved), the table's own files untouched, and the next run moves the rest."""
    config, table, state = estate.config, estate.table, estate.state
    head = main_chain(config, table)[0]
    data = Path(config.catalog.warehouse, *table.split("."), "data", f"ts_day={DATE}")
    referenced = {p: Path(p).read_bytes() for p in (str(f) for f in data.glob("*.parquet"))}
    orphans = {}
    for i in range(400):
        path = data / f"orphan-{i:04d}.parquet"
        path.write_bytes(f"orphan {i} ".encode() * 50)
        os.utime(path, (0, 0))  # decades old: an orphan by any cutoff
        orphans[path.name] = path.read_bytes()
    quarantine = state / "quarantine"
    log = estate.tmp / "kill-orphans.log"
    proc = icemaint(estate.path, "orphans", table, "--quarantine", log=log)
    try:
        wait_for("the first file in quarantine", lambda: any(quarantine.rglob("orphan-*.parquet")), proc, log,
                 poll=0.002)
        freeze(proc)
    finally:
        kill(proc)
    moved = {p.name: p.read_bytes() for p in quarantine.rglob("orphan-*.parquet")}
    in_place = {p.name: p.read_bytes() for p in data.glob("orphan-*.parquet")}
    print(f"killed with {len(moved)} of {len(orphans)} orphans in quarantine")
    assert moved and in_place, "the kill did not land mid-move"
    assert set(moved) | set(in_place) == set(orphans) and not set(moved) & set(in_place)
    assert all(body == orphans[name] for name, body in {**moved, **in_place}.items()), "a file was half-moved"
    assert {p: Path(p).read_bytes() for p in referenced} == referenced
    assert_recovered(estate, proc, head, "orphans")

    done = rerun(estate.path, "orphans", table, "--quarantine", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["decision"] == "run"
    assert not list(data.glob("orphan-*.parquet"))
    finished = {p.name: p.read_bytes() for p in quarantine.rglob("orphan-*.parquet")}
    assert finished == orphans
    assert_rows(config, table, estate.expected)


@pytest.mark.slow
def test_revert_killed_mid_act_leaves_main_forward_and_the_rerun_reverts(spark, lake_root, tmp_path, table_name,
                                                                        rerun):
    """kill -9 during `icemaint revert`: the rows are the same either side of a revert, main only forward,
    the claim free, the call `interrupted`; the next revert of the same rewrite does it (or finds it done)."""
    from types import SimpleNamespace

    writer = streaming_table(spark, "lake", table_name, batches=3, days=2, rows_per_day=15, delete_every=0)
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    estate = SimpleNamespace(table=table_name, path=path, config=load_config(path), state=tmp_path / "state",
                             expected=writer.ledger.expected_ids(), tmp=tmp_path)
    compacted = rerun(path, "compact", table_name, "--date", DATE, "--json")
    assert compacted.returncode == 0, compacted.stdout + compacted.stderr
    [outcome] = json.loads(compacted.stdout)
    assert outcome["decision"] == "run" and outcome["validation"]["passed"] is True, outcome
    published = outcome["after_snapshot_id"]
    head = main_chain(estate.config, table_name)[0]
    assert head == published

    log = tmp_path / "kill-revert.log"
    proc = icemaint(path, "revert", table_name, "--snapshot", str(published), log=log)
    try:
        # Frozen the moment its act begins (the claim taken, the marker written): a revert is metadata only
        # (its files exist), so its one commit lands whole or not at all; either way the rows are the same.
        wait_for("the revert's started marker", on_change(lambda: started_markers(estate.state, table_name, "revert"),
                                                          audit_file(estate.state)), proc, log, poll=0.002)
        freeze(proc)
    finally:
        kill(proc)
    # as assert_recovered, without a Dagster run: a revert is the operator's, run by the CLI itself
    assert_rows(estate.config, table_name, estate.expected)
    assert_forward(estate.config, table_name, head)
    assert open_claims(estate.config).holder_of(table_name) is None, "the dead run's claim is still held"
    [record] = [r for r in open_audit(estate.config).records(table=table_name, operation="revert")
                if r.details.get("process", {}).get("pid") == proc.pid]
    assert record.decision == "interrupted" and f"pid {proc.pid}" in record.reason, record

    done = rerun(path, "revert", table_name, "--snapshot", str(published), "--json")
    assert done.returncode in (0, 2), done.stdout + done.stderr
    assert_rows(estate.config, table_name, estate.expected)
    assert_forward(estate.config, table_name, head)
    reverts = [r for r in open_audit(estate.config).records(table=table_name, operation="revert")]
    assert reverts[-1].decision in ("run", "refuse"), reverts[-1]
    if reverts[-1].decision == "refuse":  # the killed run's commit had landed: it says the revert is done
        assert "revert" in reverts[-1].reason, reverts[-1].reason
    assert not staging_refs(estate.config, table_name)


@pytest.mark.slow
def test_an_unproven_rewrite_on_main_is_reported_loudly_by_the_next_run(spark, lake_root, tmp_path, table_name,
                                                                       caplog):
    """stage -> prove -> publish cannot put an unproven rewrite on main, so the next run checks that it
    did not happen: a rewrite tagged as ours without `icemaint.proof=passed` (forged here with Iceberg's
    own rewrite action) is reported as an error and audited once; a proven publish is not."""
    from icemaint.domain.names import TableName
    from icemaint.engine.spark_session import iceberg_table
    from icemaint.operations.compaction import CompactionRequest, Compactor

    writer = streaming_table(spark, "lake", table_name, batches=3, days=3, rows_per_day=10, delete_every=0)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"))

    def compact(date: str, run_id: str):
        return Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config)).run(
            CompactionRequest(table_name, date, run_id=run_id))

    proven = compact("2026-01-01", "proven-run")
    assert proven.decision == "run" and proven.published, proven.reason
    jtable = iceberg_table(spark, "lake", TableName.parse(table_name))
    (spark._jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession).rewriteDataFiles(jtable)
     .option("min-input-files", "2").snapshotProperty("icemaint.maintenance", "true")
     .snapshotProperty(RUN_ID_KEY, "forged-run").execute())
    forged = main_chain(config, table_name)[0]
    assert forged != proven.after_snapshot_id

    with caplog.at_level("ERROR", logger="icemaint.operations.contract"):
        compact("2026-01-02", "next-run")
        compact("2026-01-03", "run-after")
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2 and all(f"snapshot {forged} on main is an icemaint rewrite (run forged-run) without a "
                                    f"passing proof ({PROOF_KEY}=missing)" in e for e in errors), errors
    [reported] = open_audit(config).records(table=table_name, operation=LINEAGE)  # audited once, not per run
    assert reported.decision == UNPROVEN and reported.after_snapshot_id == forged and reported.run_id == "next-run"
    assert reported.details["summary"][RUN_ID_KEY] == "forged-run"
    markers = {r["run_id"]: r["details"]["lineage"] for r in raw_audit(tmp_path / "state") if r["decision"] == "started"}
    assert markers["proven-run"]["unproven"] == [] and markers["next-run"]["unproven"] == [forged]
    assert_rows(config, table_name, writer.ledger.expected_ids())
