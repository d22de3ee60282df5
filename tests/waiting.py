"""Waiting for a daemon, a browser or a run in a test: fail on a stall, not on a fixed wall-clock bound.

A bound sized on one machine fails on a slower one while everything works (CI, 2 cores, three workers, about 4x
slower than the machine the bounds were measured on, failed four tests so). A wait here goes on while what it waits
for makes progress (a run's status or its event log moved, a tick happened, a page's text changed), fails after
`stall_s` without progress, or after `cap_s` in all however it progresses, and says which and what it saw last.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

from benchmarks.machine import tree_cpu_seconds

STALL_S = 300.0  # no progress for this long is a hang on any machine a test runs on


class Stalled(AssertionError):
    """A wait that ended without what it waited for: no progress for its stall limit, or past its overall cap."""


class Patience:
    """Usage, in a polling loop: `patience.check(progress, detail)` after each look that did not find it done.

    `progress` is anything hashable that changes when the awaited thing moves; `detail` goes into the failure."""

    def __init__(self, what: str, *, cap_s: float, stall_s: float = STALL_S):
        self.what, self.cap_s, self.stall_s = what, cap_s, stall_s
        self.started = self.moved = time.monotonic()
        self.last: Hashable = object()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def check(self, progress: Hashable, detail: Any = "") -> None:
        """Raises Stalled when `progress` has not changed for `stall_s`, or `cap_s` has passed since the start."""
        now = time.monotonic()
        if progress != self.last:
            self.last, self.moved = progress, now
        if now - self.moved >= self.stall_s:
            raise Stalled(f"{self.what}: stalled, no progress for {now - self.moved:.0f}s "
                          f"({now - self.started:.0f}s in all): {detail}")
        if now - self.started >= self.cap_s:
            raise Stalled(f"{self.what}: not done within the {self.cap_s:.0f}s cap, though still progressing "
                          f"(last progress {now - self.moved:.0f}s ago): {detail}")


CPU_STEP_S = 5.0  # CPU seconds a run's processes must use to count as progress: more than idle JVMs use in STALL_S


def cpu_steps(pid: int) -> int:
    """CPU used so far by process `pid` and everything under it, in steps of CPU_STEP_S: a progress reading for a
    subprocess whose only sign of life is work (a JVM starting, a Spark job); 0 when it is gone."""
    return int((tree_cpu_seconds(pid) or 0.0) // CPU_STEP_S)


def run_progress(instance, run_ids) -> tuple:
    """What a set of Dagster runs has done so far: each run's status, the id of its latest event (a step's log, a
    materialization, a check's evaluation) and the CPU its worker's processes used, in steps of CPU_STEP_S (a step
    of a slow machine's run can go minutes without an event while its Spark works). Changes when any of them moves."""
    from sensors.reaper import run_worker

    out = []
    for run_id in sorted(run_ids):
        record = instance.get_run_record_by_id(run_id)
        events = instance.get_records_for_run(run_id, limit=1, ascending=False).records
        pid, _ = run_worker(instance, run_id)
        cpu = cpu_steps(pid) if pid and record and not record.dagster_run.is_finished else None
        out.append((run_id, record.dagster_run.status.value if record else None,
                    events[0].storage_id if events else None, cpu))
    return tuple(out)
