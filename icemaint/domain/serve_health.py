"""What `icemaint serve` answers a supervisor: alive (its loop beats) and ready (it can do maintenance).

Pure: the serve loop records what happened (`ServeState`), these functions decide from it at a given moment, so the
probes' verdicts are tested without a clock, a socket or a JVM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OPERATIONAL, BUG = "operational", "bug"  # why a tick raised instead of reporting


@dataclass
class TickRecord:
    """One finished tick, as the probes need it."""

    number: int
    finished_at: float            # wall clock, seconds since the epoch
    seconds: float
    failed: bool                  # a run failed, was refused or a table could not be evaluated (the tick's own verdict)
    raised: str | None = None     # OPERATIONAL or BUG when the tick itself raised; None when it reported
    error: str | None = None      # that error, one line


@dataclass
class ServeState:
    """What the loop last did; written by the loop, read by the probes (under the caller's lock)."""

    started_at: float
    interval: float
    stale_after: float
    heartbeat: float                      # wall clock of the loop's last beat
    spark_started: bool = False
    spark_app_id: str | None = None
    ticking: int | None = None            # the tick in progress, if any
    stopping: bool = False
    last: TickRecord | None = None
    ticks: int = 0


def stale_after(interval: float, given: float | None) -> float:
    """How long without a beat means the loop is stuck: the operator's, else three intervals and at least 15 minutes
    (the loop beats between ticks, not inside one: the longest tick must fit)."""
    return given if given is not None else max(3 * interval, 900.0)


def alive(state: ServeState, now: float) -> tuple[bool, dict[str, Any]]:
    """/healthz: the loop's last beat is recent."""
    ago = max(now - state.heartbeat, 0.0)
    ok = ago <= state.stale_after
    return ok, {"alive": ok, "heartbeat_seconds_ago": round(ago, 3), "stale_after_seconds": state.stale_after,
                "ticks": state.ticks, "ticking": state.ticking, "stopping": state.stopping}


def ready(state: ServeState, now: float) -> tuple[bool, dict[str, Any]]:
    """/readyz: Spark started, the last tick did not raise (an operational failure or a bug), not stopping.

    A tick that reported failed runs or tables it could not evaluate keeps the engine ready: one bad table must not
    take maintenance of the others out of service; its reasons are in the log and the audit trail."""
    last = state.last
    reasons = []
    if not state.spark_started:
        reasons.append("the Spark session has not started")
    if last is not None and last.raised:
        reasons.append(f"tick {last.number} failed ({last.raised}): {last.error}")
    if state.stopping:
        reasons.append("stopping")
    ok = not reasons
    return ok, {"ready": ok, "reasons": reasons, "spark_started": state.spark_started,
                "spark_app_id": state.spark_app_id, "ticks": state.ticks,
                "last_tick": None if last is None else {
                    "number": last.number, "seconds_ago": round(max(now - last.finished_at, 0.0), 3),
                    "seconds": round(last.seconds, 3), "failed": last.failed or bool(last.raised),
                    "raised": last.raised, "error": last.error}}


@dataclass(frozen=True)
class Recycle:
    """Why `serve` starts afresh after a tick: its Python process's resident set is over the operator's limit.

    A fresh process image (the same pid, a new JVM) gives back what the long-lived one kept: measured, its Python
    side grows tens of MiB an hour (docs/operations/serve.md), so a limit bounds it by construction."""

    tick: int                     # the tick after which it starts afresh
    rss: int                      # bytes, measured after the tick's heap trim
    limit: int                    # bytes, `--recycle-above`
    first_in_process: bool        # over the limit on this process's first tick: a fresh start is no smaller


def recycle_after(tick: int, rss: int | None, limit: int | None, ticks_in_process: int,
                  stopping: bool) -> Recycle | None:
    """The verdict after a tick: recycle when the resident set is over the limit, unless stopping (a stop wins: the
    process exits instead) or nothing could be measured (no /proc: never recycles on a guess)."""
    if limit is None or rss is None or stopping or rss <= limit:
        return None
    return Recycle(tick=tick, rss=rss, limit=limit, first_in_process=ticks_in_process <= 1)
