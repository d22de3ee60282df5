"""Layout drift: whether a date's data files have drifted from the table's current layout enough to rewrite.

A table evolves (its partition spec moves from days to hours, a sort order is added, a writer's target size
changes) and the files written before stay in the old layout for good: queries on the new spec cannot prune
them, sorted scans skip nothing, and a file of several GiB is as costly to read as many small ones. Health counts
the drifted files per date (`icemaint.domain.health`); this module decides when they are worth a rewrite and
says why in words, and which files of a date a rewrite takes (`drifted`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from icemaint.domain.health import PartitionHealth, TableHealth, file_drift, rewrite_drift
from icemaint.domain.policy import TablePolicy
from icemaint.domain.units import counted, human_size


@dataclass(frozen=True)
class LayoutTarget:
    """The layout a rewrite writes: the table's default spec and sort order (0: unsorted), and the size above which
    a file is split. A file outside it has drifted (`drifted`)."""

    spec_id: int
    sort_order_id: int = 0
    max_file_size_bytes: int | None = None
    min_bytes: int = 0  # the drifted bytes a date needs to be due (policy drift_min_bytes)

    @classmethod
    def of(cls, health: TableHealth, policy: TablePolicy) -> LayoutTarget:
        return cls(health.spec_id, health.sort_order_id, policy.max_file_size_bytes, policy.drift_min_bytes)


def drifted(spec_id: int, sort_order_id: int | None, size_bytes: int, target: LayoutTarget) -> bool:
    """Whether a rewrite for layout drift takes a data file (its spec, its recorded sort order, its size): the rule
    health counts `drift_files` by (`icemaint.domain.health.rewrite_drift`)."""
    kinds = file_drift(spec_id, sort_order_id, size_bytes, target.spec_id, target.sort_order_id,
                       target.max_file_size_bytes)
    return rewrite_drift(kinds, sort_order_id)


def drift_text(part: PartitionHealth, health: TableHealth, policy: TablePolicy) -> str:
    """The date's drift as people read it: '412 MiB in 37 files under spec 0, table spec 1; ...'."""
    pieces = []
    if part.old_spec_files:
        specs = ", ".join(_spec(health, s) for s in part.old_spec_ids) or "another"
        pieces.append(f"{human_size(part.old_spec_bytes)} in {counted(part.old_spec_files, 'file')} under spec "
                      f"{specs}, table spec {_spec(health, health.spec_id)}")
    if part.unsorted_files:
        pieces.append(f"{human_size(part.unsorted_bytes)} in {counted(part.unsorted_files, 'file')} not in the table's "
                      f"sort order {health.sort_order_id}")

    if part.oversized_files:
        pieces.append(f"{human_size(part.oversized_bytes)} in {counted(part.oversized_files, 'file')} above "
                      f"{policy.max_file_size_ratio:g} x target ({human_size(policy.max_file_size_bytes)})")
    return "; ".join(pieces)


def _spec(health: TableHealth, spec_id: int) -> str:
    """'0 (day(ts))': a spec's id with its fields when health knows them."""
    fields = health.specs.get(spec_id)
    return f"{spec_id} ({fields})" if fields else str(spec_id)


@dataclass(frozen=True)
class DriftDue:
    """Whether one date's drifted files are due for a rewrite into the table's current layout."""

    due: bool
    why: str          # the drift, when due
    why_not: str      # the thresholds it stays under, when not
    rewrite_bytes: int
    rewrite_files: int
    benefit: float    # drifted files brought to the layout per MiB rewritten
    rationale: dict[str, Any]


def drift_due(part: PartitionHealth, health: TableHealth, policy: TablePolicy) -> DriftDue | None:
    """The drift decision of one date; None when the policy turns drift off or the date has no drifted file."""
    if not policy.layout_drift or not part.drift_files:
        return None
    rationale: dict[str, Any] = {
        "trigger": "layout_drift", "drift_files": part.drift_files, "drift_bytes": part.drift_bytes,
        "old_spec_files": part.old_spec_files, "old_spec_bytes": part.old_spec_bytes,
        "old_spec_ids": list(part.old_spec_ids), "table_spec_id": health.spec_id,
        "unsorted_files": part.unsorted_files, "unsorted_bytes": part.unsorted_bytes,
        "table_sort_order_id": health.sort_order_id,
        "oversized_files": part.oversized_files, "oversized_bytes": part.oversized_bytes,
        "max_file_size_bytes": policy.max_file_size_bytes,
        "drift_min_files": policy.drift_min_files, "drift_min_bytes": policy.drift_min_bytes,
    }
    due = part.drift_files >= policy.drift_min_files and part.drift_bytes >= policy.drift_min_bytes
    text = drift_text(part, health, policy)
    why_not = (f"layout drift {text} under drift_min_files {policy.drift_min_files} or drift_min_bytes "
               f"{human_size(policy.drift_min_bytes)}")
    return DriftDue(due=due, why=f"layout drift: {text}", why_not=why_not, rewrite_bytes=part.drift_bytes,
                    rewrite_files=part.drift_files, benefit=part.drift_files / max(part.drift_bytes, 1) * 2**20,
                    rationale=rationale)


def drift_line(counts: Mapping[str, Any]) -> str:
    """A health report's drift counts (a `TableHealth` or `PartitionHealth` as a dict) as people read them:
    '412 MiB in 37 files (old spec: 300 MiB in 30 files; oversized: 112 MiB in 7 files)', or 'none'."""
    if not counts.get("drift_files"):
        return "none"
    kinds = [f"{label}: {human_size(counts[f'{kind}_bytes'])} in {counted(counts[f'{kind}_files'], 'file')}"
             for kind, label in (("old_spec", "old spec"), ("unsorted", "not in sort order"),
                                 ("oversized", "oversized")) if counts.get(f"{kind}_files")]
    return f"{human_size(counts['drift_bytes'])} in {counted(counts['drift_files'], 'file')} ({'; '.join(kinds)})"
