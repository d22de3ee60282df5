"""Counters and histograms of what maintenance did, tallied from audit records as they are appended.

Pure: the records arrive as the JSON objects the audit log stores (`AuditRecord.to_dict()`), read incrementally by
`icemaint.safety.audit_tail`; `icemaint metrics` exports the tally. Labels stay bounded: operation, decision, reason
kind and step are small fixed vocabularies; the one per-table figure (the last published compaction) is a gauge.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

# Run and step durations (seconds): a metadata-only decision to an hour-long catch-up.
DURATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, math.inf)
# The proof's seconds per rewrite second.
RATIO_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0, 8.0, math.inf)
# The audit's duration keys, as the steps of the operating contract.
STEPS = {"plan_seconds": "plan", "rewrite_seconds": "stage", "validation_seconds": "proof",
         "publish_seconds": "publish", "act_seconds": "act"}
RUN_SECONDS = ("total_seconds", "duration_seconds")
# Decisions of records that end no call of their own, or no decision at all.
SKIPPED_DECISIONS = frozenset({"started"})
# When a record names no reason kind: the kind its decision implies.
FALLBACK_KINDS = {"run": "due", "noop": "nothing_to_do", "failed": "error", "interrupted": "interrupted",
                  "refuse": "policy", "approved": "approved"}


def reason_kind(record: Mapping[str, Any]) -> str:
    """The record's typed reason kind: the one it stores (`details.reason_kind`, an agent's `details.kind`), else
    what its structured fields say (a claim holder on a deferral: the claim was busy; a proof that did not pass),
    else the kind its decision implies. Never read from the reason's text."""
    details = record.get("details") or {}
    stored = details.get("reason_kind") or details.get("kind")
    if isinstance(stored, str) and stored:
        return stored
    decision = record.get("decision")
    if decision == "defer" and (record.get("writer_check") or {}).get("claim_holder"):
        return "claim_busy"
    if (record.get("validation") or {}).get("passed") is False:
        return "proof_failed"
    return FALLBACK_KINDS.get(str(decision), "unclassified")


@dataclass
class Histogram:
    """Cumulative-bucket histogram as Prometheus exposes it."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.total += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    @property
    def count(self) -> int:
        return self.counts[-1]

    def buckets(self) -> list[tuple[str, int]]:
        return [("+Inf" if math.isinf(b) else repr(float(b)), c) for b, c in zip(self.bounds, self.counts)]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _epoch(ts: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(ts).timestamp() if isinstance(ts, str) else None
    except ValueError:
        return None


@dataclass
class AuditTally:
    """Everything `icemaint metrics` counts from the audit trail, fed one stored record at a time."""

    records: int = 0
    operations: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # operation, decision, kind
    proof_failures: Counter[str] = field(default_factory=Counter)  # by operation
    rewritten_bytes: float = 0.0
    rewritten_files: int = 0
    written_files: int = 0
    publish_attempts: int = 0
    snapshots_expired: int = 0
    orphans_removed: int = 0
    manifests_rewritten: int = 0
    run_seconds: dict[str, Histogram] = field(default_factory=dict)  # by operation
    step_seconds: dict[tuple[str, str], Histogram] = field(default_factory=dict)  # by operation, step
    proof_to_rewrite: Histogram = field(default_factory=lambda: Histogram(RATIO_BUCKETS))
    last_published: dict[str, float] = field(default_factory=dict)  # table -> its last publish (epoch s)

    def add(self, record: Mapping[str, Any]) -> None:
        """Counts one stored record; a dry run or a `started` marker counts nothing."""
        decision, operation = record.get("decision"), record.get("operation")
        details = record.get("details") or {}
        if decision in SKIPPED_DECISIONS or not isinstance(operation, str) or not isinstance(decision, str) \
                or details.get("dry_run") is True:
            return
        self.records += 1
        self.operations[(operation, decision, reason_kind(record))] += 1
        if (record.get("validation") or {}).get("passed") is False:
            self.proof_failures[operation] += 1
        self._durations(operation, record.get("durations") or {})
        metrics = details.get("metrics") or {}
        if operation == "compact":
            self._compaction(record, details)
        elif operation == "expire" and decision == "run":
            self.snapshots_expired += int(_number(metrics.get("snapshots_removed")) or 0)
        elif operation == "orphans" and decision == "run":
            self.orphans_removed += int(_number(metrics.get("removed")) or 0)
        elif operation == "manifests" and decision == "run":
            self.manifests_rewritten += int(_number(metrics.get("rewritten_manifests")) or 0)

    def _compaction(self, record: Mapping[str, Any], details: Mapping[str, Any]) -> None:
        for group in details.get("staged") or []:
            if not isinstance(group, Mapping):
                continue
            self.publish_attempts += int(_number(group.get("publish_attempts")) or 0)
            if group.get("verdict") == "published":
                self.rewritten_files += int(_number(group.get("replaced_files")) or 0)
                self.written_files += int(_number(group.get("new_files")) or 0)
        if details.get("published") is True:
            self.rewritten_bytes += _number(details.get("rewritten_bytes")) or 0.0
            when = _epoch(record.get("ts"))
            table = record.get("table")
            if when is not None and isinstance(table, str):
                self.last_published[table] = max(when, self.last_published.get(table, when))

    def _durations(self, operation: str, durations: Mapping[str, Any]) -> None:
        total = next((v for v in (_number(durations.get(k)) for k in RUN_SECONDS) if v is not None), None)
        if total is not None:
            self.run_seconds.setdefault(operation, Histogram(DURATION_BUCKETS)).observe(total)
        for key, step in STEPS.items():
            seconds = _number(durations.get(key))
            if seconds is not None:
                self.step_seconds.setdefault((operation, step), Histogram(DURATION_BUCKETS)).observe(seconds)
        proof, rewrite = _number(durations.get("validation_seconds")), _number(durations.get("rewrite_seconds"))
        if proof is not None and rewrite:
            self.proof_to_rewrite.observe(proof / rewrite)
