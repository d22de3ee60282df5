"""What would let a deferred or refused decision go: the hint people read beside its reason.

A reason says why a scope waits; the hint says when it goes by itself, which policy key changes that, or which
command lets it go. Read from the decision's typed kind and its numbers, never from the reason's text.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from icemaint.domain.decisions import Decision
from icemaint.domain.verdicts import ReasonKind, Verdict
from icemaint.domain.retention_tick import RetentionDecision
from icemaint.domain.units import human_duration


def _approve(table: str, date: str | None) -> str:
    return f"icemaint approve {table}" + (f" --date {date}" if date else "")


def _writer_hint(table: str, date: str | None, writer: Mapping[str, Any]) -> str:
    idle = float(writer.get("writer_idle_seconds") or 0.0)
    since = writer.get("seconds_since_writer_commit")
    where = f"on {date}" if writer.get("scope") == "partition" and date else "on the table"
    left = f" (about {human_duration(max(idle - max(float(since), 0.0), 0.0))} from now if the writer stops)" \
        if since is not None else ""
    scope_key = "" if writer.get("scope") == "partition" else (
        "; writer_scope: partition lets the dates a writer finished with go while it writes")
    return (f"runs by itself at the first tick after {human_duration(idle)} without writer commits {where}{left}; "
            f"policy writer_idle sets the window (tables.{table}.writer_idle in the config){scope_key}")


def hint(decision: Decision | RetentionDecision) -> str | None:
    """What would let `decision` (compaction's or retention's) go, for a deferral or a refusal; None otherwise."""
    return decision_hint(str(decision.verdict), decision.kind, decision.table, getattr(decision, "date", None),
                         getattr(decision, "writer_check", None), str(decision.operation))


def decision_hint(verdict: str, kind: ReasonKind | str, table: str, date: str | None,
                  writer: Mapping[str, Any] | None = None, operation: str = "compact") -> str | None:
    """The hint for a decision given as its parts (an outcome's `decision_detail`, a tick's entry)."""
    if verdict not in (Verdict.DEFER, Verdict.REFUSE):
        return None
    try:
        kind = ReasonKind(kind)
    except ValueError:
        return None
    scope = f"{table} --date {date}" if date else table
    hints: dict[ReasonKind, Callable[[], str]] = {
        ReasonKind.WRITER_ACTIVE: lambda: _writer_hint(table, date, writer or {}),
        ReasonKind.HOT_PARTITION: lambda: (
            f"runs by itself once {date} ended hot_partition_age ago; policy hot_partition_age sets it "
            f"(tables.{table}.hot_partition_age in the config)"),
        ReasonKind.CLAIM_BUSY: lambda: (
            "the next tick decides again once the holder releases the table's claim; a person's run waits up to "
            "policy claim_wait"),
        ReasonKind.RUNS_IN_FLIGHT: lambda: (
            "the next tick decides again once the table's runs in flight end (the Dagster UI's Runs, or "
            f"icemaint audit --table {table})"),
        ReasonKind.AWAITING_APPROVAL: lambda: (
            f"to let it run: {_approve(table, date)} (or icemaint compact {scope} --approved); to raise the "
            f"ceiling: policy max_rewrite_bytes (tables.{table}.max_rewrite_bytes in the config)"),
        ReasonKind.REVERTED: lambda: f"to let automation compact it again: {_approve(table, date)}",
        ReasonKind.PROOF_FAILED: lambda: (
            f"see what differed: icemaint explain {scope}; once fixed, let automation run it again: "
            f"{_approve(table, date)}"),
        ReasonKind.RUNS_FAILED: lambda: (
            f"see the failed runs: icemaint audit --table {table}; once fixed, let automation run it again: "
            f"{_approve(table, date)}"),
        ReasonKind.TICK_BUDGET: lambda: "runs on a later tick (ranked lower); more runs per tick: max_runs_total",
        ReasonKind.ORDERING: lambda: "runs after the table's other operation; the next tick decides again",
        ReasonKind.POLICY: lambda: (
            f"the table's policy refuses {operation}: see enabled, read_only, allowed_operations, allowed_identities "
            f"and agent_operations under tables.{table} or defaults (icemaint explain {table} shows where each "
            "comes from)"),
        ReasonKind.NO_TIME_COLUMN: lambda: (
            f"compact it per partition (icemaint compact {table}, no --date), or set policy time_column to a plainly "
            "named date or timestamp column"),
        ReasonKind.UNSUPPORTED: lambda: "this table shape is not maintained by this version (docs: Limits)",
    }
    make = hints.get(kind)
    return make() if make else None
