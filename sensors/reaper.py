"""The run reaper: a maintenance run left STARTING or STARTED (or, in process, NOT_STARTED) by a process
that died is marked failed,
so it stops holding its table's slot in the run queue (one run per table) and the UI stops showing it
as running.

Death is proven, never guessed: only a run whose process is on this host and is gone (or whose pid now
belongs to a process that started later) is reaped. A run's process is known from
- the tags `MaintenanceRunner` writes on every in-process (CLI, tick, demo) run: pid, host and the
  process's start, bound to the run id (a re-execution that copies the tags is not judged by them);
- for a run a run launcher started (it carries Dagster's grpc_info tag), the pid of the run worker
  from Dagster's own engine event, when the code server that ran it was local (loopback or a socket).

Dagster 1.13's run monitoring cannot do this for our launcher: `DefaultRunLauncher` has no
`check_run_worker_health`, so monitoring only times out runs that never start (enabled in
`icemaint.app.instance`). The code server marks a launched run failed when its worker exits while the
server lives; a run whose worker and code server both died (the daemon killed, the host rebooted), or
an in-process run, is left STARTED: that is what the reaper is for. The pure part (`decide_reaping`)
is apart from the Dagster calls (`reap_dead_runs`), which the sensor and `icemaint tick` share.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Callable, Mapping

import dagster as dg

from icemaint.safety.process import ProcessRef, ProcessState, probe_process
from maint_assets.partitions import tables_of

PID_TAG = "icemaint/pid"
HOST_TAG = "icemaint/host"
PROCESS_START_TAG = "icemaint/process_start"  # "<boot id>:<start ticks>": tells a reused pid apart
PROCESS_RUN_TAG = "icemaint/process_run"  # the run id the process tags were written for
GRPC_INFO_TAG = ".dagster/grpc_info"  # set by DefaultRunLauncher when it launches a run
# NOT_STARTED: an in-process run whose process died after creating it and before starting it (a tick
# killed at that instant); the retention sensor counts such a run as in flight for good otherwise.
REAPED_STATUSES = ("NOT_STARTED", "STARTING", "STARTED")
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def process_tags(run_id: str, process: ProcessRef | None = None) -> dict[str, str]:
    """The tags an in-process run carries so that its death can be proven later."""
    process = process or ProcessRef.current()
    tags = {PID_TAG: str(process.pid), HOST_TAG: process.host or "", PROCESS_RUN_TAG: run_id}
    if process.start:
        tags[PROCESS_START_TAG] = process.start
    return tags


# -- decisions (pure) -------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunFacts:
    """What the reaper knows of one active run: Dagster's record, and the pid of its run worker, if any."""

    run_id: str
    job_name: str
    status: str
    tags: Mapping[str, str] = field(default_factory=dict)
    worker_pid: int | None = None  # from Dagster's "process for run (pid: N)" engine event
    worker_seen_at: float | None = None  # that event's timestamp: the worker ran then


@dataclass(frozen=True)
class Reaping:
    run_id: str
    job_name: str
    table: str | None
    reap: bool
    reason: str

    def line(self) -> str:
        verb = "marked failed" if self.reap else "left running"
        return f"reaper: run {self.run_id} ({self.job_name}, {self.table or 'no table'}) {verb}: {self.reason}"


def run_process(run: RunFacts) -> tuple[ProcessRef | None, str]:
    """The process that executes the run, and where that knowledge comes from (or why there is none)."""
    tags = run.tags
    if GRPC_INFO_TAG in tags:
        if run.worker_pid is None:
            return None, "launched, its run worker has not reported a pid"
        try:
            grpc = json.loads(tags[GRPC_INFO_TAG])
        except ValueError:
            grpc = {}
        if not (grpc.get("socket") or grpc.get("host") in _LOOPBACK):
            return None, f"its run worker ran beside the code server on {grpc.get('host')!r}, not on this host"
        return ProcessRef(run.worker_pid, existed_at=run.worker_seen_at), "run worker"
    if tags.get(PROCESS_RUN_TAG) == run.run_id and tags.get(PID_TAG, "").isdigit():
        return ProcessRef(int(tags[PID_TAG]), tags.get(HOST_TAG) or None, tags.get(PROCESS_START_TAG) or None), \
            "in-process run"
    return None, "no record of the process that runs it"


def decide_reaping(run: RunFacts, probe: Callable[[ProcessRef], tuple[ProcessState, str]]) -> Reaping:
    """Reap a STARTING/STARTED run only when its process is provably dead."""
    table = ", ".join(tables_of(run.tags)) or None
    if run.status not in REAPED_STATUSES:
        return Reaping(run.run_id, run.job_name, table, False, f"status {run.status}")
    process, source = run_process(run)
    if process is None:
        return Reaping(run.run_id, run.job_name, table, False, f"cannot prove its process dead: {source}")
    if run.status == "NOT_STARTED" and source != "in-process run":
        return Reaping(run.run_id, run.job_name, table, False, "not started, and not an in-process run")
    state, why = probe(process)
    if state is not ProcessState.DEAD:
        return Reaping(run.run_id, run.job_name, table, False, why)
    return Reaping(run.run_id, run.job_name, table, True,
                   f"its {source}'s process is gone ({why}); the run cannot finish, so it no longer holds "
                   "a slot of the run queue. What it left is recovered by the next run of the table "
                   "(see `icemaint audit`)")


# -- the Dagster side -------------------------------------------------------------------------------

def run_worker(instance, run_id: str) -> tuple[int | None, float | None]:
    """The pid of the process that executed the run's steps (Dagster's engine event), and when."""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        event = entry.dagster_event
        data = getattr(event, "engine_event_data", None) if event is not None else None
        pid = getattr(data, "metadata", {}).get("pid") if data is not None else None
        if pid is not None:
            text = str(getattr(pid, "value", pid))
            if text.isdigit():
                return int(text), entry.timestamp
    return None, None


def active_runs(instance) -> list[RunFacts]:
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.NOT_STARTED,
                                                             dg.DagsterRunStatus.STARTING,
                                                             dg.DagsterRunStatus.STARTED]))
    out = []
    for run in runs:
        pid, seen = run_worker(instance, run.run_id) if GRPC_INFO_TAG in run.tags else (None, None)
        out.append(RunFacts(run.run_id, run.job_name, run.status.value, dict(run.tags), pid, seen))
    return out


def reap_dead_runs(instance, *, dry_run: bool = False,
                   probe: Callable[[ProcessRef], tuple[ProcessState, str]] = probe_process) -> list[Reaping]:
    """Marks failed every STARTING/STARTED run whose process is provably dead; returns every decision."""
    decisions = []
    for facts in active_runs(instance):
        decision = decide_reaping(facts, probe)
        if decision.reap and not dry_run:
            run = instance.get_run_by_id(facts.run_id)
            if run is None or run.is_finished:  # it ended while we looked
                continue
            instance.report_run_failed(run, f"marked failed by the icemaint reaper on {socket.gethostname()}: "
                                            f"{decision.reason}")
        decisions.append(decision)
    return decisions


def build_reaper_sensor() -> dg.SensorDefinition:
    @dg.sensor(name="run_reaper", minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
               description="Marks failed the maintenance runs left STARTING/STARTED by a process that died "
                           "(proven on this host by pid and process start), so no dead run holds its "
                           "table's slot in the run queue.")
    def run_reaper(context: dg.SensorEvaluationContext):
        decisions = reap_dead_runs(context.instance)
        for decision in decisions:
            context.log.info(decision.line())
        reaped = [d for d in decisions if d.reap]
        return dg.SkipReason(f"{len(reaped)} dead runs marked failed, {len(decisions) - len(reaped)} active runs "
                             f"left running" + (f": {', '.join(d.run_id for d in reaped)}" if reaped else ""))

    return run_reaper
