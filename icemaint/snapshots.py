"""Snapshot lineage helpers (pure): which commits came after a snapshot, and which are cherry-pickable."""

from __future__ import annotations

from typing import Sequence

from icemaint.health import SnapshotEntry

# Iceberg's cherry-pick accepts appends and dynamic partition overwrites only.
CHERRY_PICKABLE = frozenset({"append"})


def chain_since(snapshots: Sequence[SnapshotEntry], current_id: int | None, base_id: int | None) -> list[SnapshotEntry]:
    """The commits on the current lineage after `base_id`, oldest first.

    Raises:
        ValueError: when `base_id` is not an ancestor of the current snapshot (the table was rolled
            back or reset by someone else).
    """
    by_id = {s.snapshot_id: s for s in snapshots}
    chain = []
    cursor = current_id
    while cursor is not None and cursor != base_id:
        snap = by_id.get(cursor)
        if snap is None:
            raise ValueError(f"snapshot {cursor} is missing from the table's metadata")
        chain.append(snap)
        cursor = snap.parent_id
    if cursor != base_id:
        raise ValueError(f"snapshot {base_id} is not an ancestor of the current snapshot {current_id}")
    return list(reversed(chain))


def proof_spans(chain: Sequence[SnapshotEntry], committed_ids: set[int]) -> list[tuple[int | None, int]]:
    """(snapshot before, snapshot after) pairs that together prove every committed snapshot.

    Consecutive maintenance commits (a rewrite and its dangling-delete cleanup) form one span, proved
    from the parent of the first to the last: the rows either side of the span are what must be
    equal, and each span costs one read per side. A writer commit between two of them splits the
    spans, since it changes rows legitimately.
    """
    spans: list[tuple[int | None, int]] = []
    start: int | None = None
    last: int | None = None
    for snap in chain:
        if snap.snapshot_id in committed_ids:
            if last is None:
                start = snap.parent_id
            last = snap.snapshot_id
        elif last is not None:
            spans.append((start, last))
            last = None
    if last is not None:
        spans.append((start, last))
    return spans
