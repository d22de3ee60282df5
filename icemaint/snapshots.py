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
