"""A table's last observed health in a dozen numbers: what a tick persists for `icemaint metrics` to export.

The Prometheus endpoint must not read 10,000 tables' metadata per scrape, so each tick keeps the figures of the
tables it evaluated (an unchanged table's stay as they were: its metadata did not move). Ages are kept as instants
(`observed_at`, `oldest_due_date`) and measured at scrape time.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Mapping

from icemaint.domain.decisions import Decision
from icemaint.domain.verdicts import DEFER, NOOP, REFUSE, RUN, ReasonKind
from icemaint.domain.health import TableHealth

# Decisions that hold a scope until a person acts: awaiting approval, held after a failed proof, failed runs or
# an operator's revert.
HELD_KINDS = frozenset({ReasonKind.AWAITING_APPROVAL, ReasonKind.PROOF_FAILED, ReasonKind.RUNS_FAILED,
                        ReasonKind.REVERTED})
# Deferrals that wait on a writer by design: a partition above its threshold while one writes is not lagging.
WAITING_KINDS = frozenset({ReasonKind.HOT_PARTITION, ReasonKind.WRITER_ACTIVE})


@dataclass(frozen=True)
class HealthSummary:
    """What the metrics endpoint exports for one table. None: not known from the read that produced it (a
    table screened from its manifest list alone has no small-file count)."""

    table: str
    observed_at: str
    metadata_location: str
    data_files: int | None = None
    small_files: int | None = None
    small_files_max_partition: int | None = None
    small_files_threshold: int | None = None
    delete_files: int | None = None
    deleted_row_ratio: float | None = None
    snapshots: int | None = None
    manifests: int | None = None
    metadata_bytes: int | None = None
    oldest_due_date: str | None = None  # ISO date: the oldest date decided run, defer or refuse
    lagging_partitions: int = 0  # partitions at or above their small-file threshold, not waiting on a writer
    held: bool = False
    held_kind: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HealthSummary":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _lagging(decision: Decision) -> bool:
    rationale = decision.rationale or {}
    small, threshold = rationale.get("small_files"), rationale.get("min_input_files")
    return (decision.verdict in (RUN, DEFER, REFUSE) and decision.kind not in WAITING_KINDS
            and isinstance(small, int) and isinstance(threshold, int) and small >= threshold)


def _held(decisions: Iterable[Decision]) -> str | None:
    for d in decisions:
        if d.kind in HELD_KINDS or (d.needs_approval and d.verdict != RUN):
            return str(d.kind)
    return None


def summarize_health(health: TableHealth, decisions: Iterable[Decision], min_input_files: int,
                     now: dt.datetime) -> HealthSummary:
    """The summary of a table whose metadata a tick read in full, with the decisions it made from it."""
    decisions = [d for d in decisions if d.operation == "compact"]
    due = sorted(d.date for d in decisions if d.date and d.verdict != NOOP)
    held = _held(decisions)
    return HealthSummary(
        table=health.table, observed_at=(health.observed_at or now.isoformat()),
        metadata_location=health.metadata_location, data_files=health.data_files, small_files=health.small_files,
        small_files_max_partition=max((p.small_files for p in health.partitions), default=0),
        small_files_threshold=min_input_files, delete_files=health.delete_files,
        deleted_row_ratio=health.deleted_row_ratio, snapshots=health.snapshots, manifests=health.manifests,
        metadata_bytes=health.metadata_bytes, oldest_due_date=due[0] if due else None,
        lagging_partitions=sum(1 for d in decisions if _lagging(d)), held=held is not None, held_kind=held)


def summarize_screened(table: str, metadata_location: str, data_files: int | None, snapshots: int | None,
                       manifests: int | None, min_input_files: int, now: dt.datetime) -> HealthSummary:
    """The summary of a table the tick screened from its manifest list: no delete files, nothing due."""
    return HealthSummary(table=table, observed_at=now.isoformat(), metadata_location=metadata_location,
                         data_files=data_files, delete_files=0, deleted_row_ratio=0.0, snapshots=snapshots,
                         manifests=manifests, small_files_threshold=min_input_files)

