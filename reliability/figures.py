"""The soak's arithmetic, pure: a table's rows against its writer's ledger, the audit trail counted into
runs, defers, conflicts, proofs not published and recoveries, and the one-line verdict.

Kept apart from the harness (reliability/soak.py) so the counting can be read, and checked, without
starting a process.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

SAMPLE = 5  # ids shown per kind of damage


@dataclass(frozen=True)
class RowCheck:
    """One table's rows (as an independent reader returned them) against the writer's ledger.

    lost: ids the ledger says must be there and are not; duplicated: ids read more than once;
    resurrected: ids the writer deleted that are there again; unexpected: ids no writer wrote.
    """

    table: str
    expected: int
    read: int
    lost: int
    duplicated: int
    resurrected: int
    unexpected: int
    samples: dict = field(default_factory=dict)

    @property
    def damaged(self) -> bool:
        return bool(self.lost or self.duplicated or self.resurrected or self.unexpected)

    def to_dict(self) -> dict:
        return asdict(self)


def check_rows(table: str, ids: Iterable[int], written: set[int], deleted: set[int]) -> RowCheck:
    """The final check: the writers have stopped and their ledgers are complete."""
    counts = Counter(ids)
    present = set(counts)
    expected = written - deleted
    lost = expected - present
    duplicated = {i for i, n in counts.items() if n > 1}
    resurrected = present & deleted
    unexpected = present - written
    return RowCheck(table, len(expected), sum(counts.values()), len(lost), len(duplicated), len(resurrected),
                    len(unexpected), _samples(lost=lost, duplicated=duplicated, resurrected=resurrected,
                                              unexpected=unexpected))


def check_rows_while_writing(table: str, ids: Iterable[int], before: tuple[set[int], set[int]],
                             after: tuple[set[int], set[int]]) -> RowCheck:
    """A check while writers run: `before` = (written, deleted) of the ledger read before the scan, `after`
    the same read after it. A ledger is saved after its commit landed, so:

    - an id written before the scan must be read unless a delete (recorded by `after`) removed it;
    - an id deleted before the scan must not be read;
    - an id read twice is duplicated whatever the writers do;
    - an id read that `after` does not know yet may be a commit whose ledger save is still to come, so
      `unexpected` is only counted by the final check (it is 0 here).
    """
    (written_before, deleted_before), deleted_after = before, after[1]
    counts = Counter(ids)
    present = set(counts)
    lost = (written_before - deleted_after) - present
    duplicated = {i for i, n in counts.items() if n > 1}
    resurrected = present & deleted_before
    return RowCheck(table, len(written_before - deleted_after), sum(counts.values()), len(lost), len(duplicated),
                    len(resurrected), 0, _samples(lost=lost, duplicated=duplicated, resurrected=resurrected))


def _samples(**sets: set[int]) -> dict:
    return {name: sorted(ids)[:SAMPLE] for name, ids in sets.items() if ids}


# -- the audit trail ------------------------------------------------------------------------------

def defer_kind(reason: str) -> str:
    """Why a compaction deferred, from its reason's opening words (the audit stores no kind)."""
    text = (reason or "").lower()
    if "publish conflict" in text or "conflicts with the rewrite" in text:
        return "conflict"  # a run that re-decided after a writer's conflicting commit, or gave up after retries
    if text.startswith("writer active"):
        return "writer_active"
    if text.startswith("claim busy"):
        return "claim_busy"
    if "runs in flight" in text or "already" in text:
        return "queue"
    return "other"


def audit_figures(records: Iterable[Mapping]) -> dict:
    """What maintenance did, from `icemaint audit --json` (one record per call, `started` folded).

    runs: compactions that published; conflicts: publishes Iceberg refused because a writer's commit
    conflicted (every attempt but a last one that published; a run that ended on a conflict, deferring
    or re-deciding "writer active", conflicted on its last attempt too);
    not_published: proofs that failed (nothing published: the soak's "rollbacks"); interrupted: calls
    whose process died before recording an outcome; cleanup: staging branches of dead runs removed.
    """
    records = list(records)
    by = Counter((r.get("operation"), r.get("decision")) for r in records)
    compact = [r for r in records if r.get("operation") == "compact"]
    defers = [r for r in compact if r.get("decision") == "defer"]
    defer_kinds = Counter(defer_kind(r.get("reason", "")) for r in defers)
    conflicts = 0
    for r in compact:
        attempts = int((r.get("details") or {}).get("attempts") or 0)
        conflicts += max(attempts - 1, 0)
        if r.get("decision") != "run" and defer_kind(r.get("reason", "")) == "conflict":
            conflicts += 1
    published = [r for r in compact if r.get("decision") == "run" and (r.get("details") or {}).get("published")]
    return {
        "compactions_published": len(published),
        "publish_commits": sum(len((r.get("details") or {}).get("committed_snapshot_ids") or []) for r in published),
        "compactions_noop": by[("compact", "noop")],
        "defers": len(defers),
        "defers_by_kind": dict(sorted(defer_kinds.items())),
        "defers_in_run": sum(1 for r in defers if r.get("run_id")),
        "conflicts": conflicts,
        "not_published": by[("compact", "not_published")],
        "failed": sum(n for (op, decision), n in by.items() if decision == "failed"),
        "failed_by_operation": {op: n for (op, decision), n in sorted(by.items()) if decision == "failed"},
        "refused": sum(n for (op, decision), n in by.items() if decision == "refuse"),
        "interrupted": sum(n for (op, decision), n in by.items() if decision == "interrupted"),
        "interrupted_by_operation": {op: n for (op, decision), n in sorted(by.items()) if decision == "interrupted"},
        "still_started": sum(n for (op, decision), n in by.items() if decision == "started"),
        "cleanup": by[("cleanup", "run")],
        "expiries": by[("expire", "run")],
        "orphan_runs": by[("orphans", "run")],
        "manifest_rewrites": by[("manifests", "run")],
        "unproven_on_main": by[("lineage", "unproven")],
        "records": len(records),
    }


def verdict_line(minutes: float, rows: Iterable[RowCheck], audit: Mapping, kills: int, reaped: int,
                 left_in_flight: int = 0) -> str:
    """The one line a soak ends with."""
    rows = list(rows)
    lost, dup, res = (sum(getattr(r, k) for r in rows) for k in ("lost", "duplicated", "resurrected"))
    unexpected = sum(r.unexpected for r in rows)
    ok = not (lost or dup or res or unexpected)
    recoveries = audit["cleanup"] + reaped
    extra = f", {unexpected} unexpected" if unexpected else ""
    return (f"soak {minutes:g} min: {'PASS' if ok else 'FAIL'}: rows lost {lost}, duplicated {dup}, resurrected {res}"
            f"{extra} ({sum(r.expected for r in rows)} rows in {len(rows)} tables) | runs {audit['compactions_published']}"
            f", defers {audit['defers']}, conflicts {audit['conflicts']}, rollbacks {audit['not_published']} "
            f"(proofs failed, nothing published), recoveries {recoveries} (staging cleaned {audit['cleanup']}, runs "
            f"reaped {reaped}) | kills {kills}, interrupted {audit['interrupted']}, failed {audit['failed']}, "
            f"unproven on main {audit['unproven_on_main']}, runs left in flight {left_in_flight}")
