"""Column statistics, pure: when a table's statistics file is stale, and which columns it covers.

A statistics file (Puffin, one Apache DataSketches theta sketch per column with its distinct-value estimate, `ndv`)
is what cost-based optimisers read (Trino's, Spark's): join order and broadcast choices depend on it. It belongs to
one snapshot; readers of a later snapshot use the newest file on its lineage, so a file goes stale as rows change,
not as snapshots pass. Compaction and manifest rewrites (`replace` snapshots) change no row and age no statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from icemaint.errors import UserError

THETA_BLOB = "apache-datasketches-theta-v1"  # the Puffin blob type of a column's theta sketch

# Snapshot summary keys that count changed rows: added and removed data rows, and rows deleted by delete files.
CHANGE_KEYS = ("added-records", "deleted-records", "added-position-deletes", "added-equality-deletes")
UNCHANGING_OPERATIONS = frozenset({"replace"})  # a rewrite keeps every row


class StatisticsError(UserError, ValueError):
    """Statistics that cannot be computed as asked (a column that is not there or not a primitive)."""


@dataclass(frozen=True)
class SnapshotRows:
    """One snapshot of `main`'s lineage, as its summary counts rows."""

    snapshot_id: int
    operation: str | None
    changed_rows: int  # the summary's CHANGE_KEYS, summed
    total_rows: int | None  # the summary's total-records (None when the writer left it out)


@dataclass(frozen=True)
class StatisticsState:
    """Where a table's statistics stand against `main`."""

    current_snapshot_id: int | None
    total_rows: int | None  # at the current snapshot
    statistics_snapshot_id: int | None  # the newest snapshot on main's lineage that has a statistics file
    statistics_rows: int | None  # total rows at that snapshot
    changed_rows: int | None  # rows changed on main since it (None: no statistics on the lineage)
    covered_columns: frozenset[str] | None = None  # the columns that file has a sketch of (None: not read)
    columns: tuple[str, ...] = ()  # the current schema's top-level primitive columns


def summary_rows(summary: Mapping[str, Any]) -> tuple[int, int | None]:
    """(changed rows, total rows) from a snapshot summary; a value that is not a number counts as absent."""
    def number(key: str) -> int | None:
        try:
            return int(summary[key])
        except (KeyError, TypeError, ValueError):
            return None

    return sum(number(k) or 0 for k in CHANGE_KEYS), number("total-records")


def statistics_state(lineage: Sequence[SnapshotRows], with_statistics: Iterable[int],
                     covered: Mapping[int, frozenset[str]] | None = None, columns: Sequence[str] = ()
                     ) -> StatisticsState:
    """The state of `main`'s statistics, from its lineage (newest first) and the snapshots that have a file
    (`covered`: the columns each snapshot's file has a sketch of; `columns`: the current schema's primitive ones)."""
    have = set(with_statistics)
    if not lineage:
        return StatisticsState(None, None, None, None, None, columns=tuple(columns))
    changed = 0
    for snap in lineage:
        if snap.snapshot_id in have:
            return StatisticsState(lineage[0].snapshot_id, lineage[0].total_rows, snap.snapshot_id, snap.total_rows,
                                   changed, None if covered is None else covered.get(snap.snapshot_id, frozenset()),
                                   tuple(columns))
        if (snap.operation or "") not in UNCHANGING_OPERATIONS:
            changed += snap.changed_rows
    return StatisticsState(lineage[0].snapshot_id, lineage[0].total_rows, None, None, None, columns=tuple(columns))


def statistics_due(state: StatisticsState, stale_fraction: float,
                   wanted: Sequence[str] | None = None) -> tuple[bool, str]:
    """Whether to compute statistics for the current snapshot, and why (with the numbers compared). `wanted`: the
    columns to keep statistics of (the policy's `statistics_columns`; None: every primitive column)."""
    if state.current_snapshot_id is None:
        return False, "the table has no snapshot: nothing to compute statistics of"
    if state.statistics_snapshot_id is not None and state.covered_columns is not None:
        missing = [c for c in (wanted or state.columns) if c not in state.covered_columns]
        if missing:  # e.g. computed for a few columns only: the rest have no statistics at all
            return True, (f"the statistics of snapshot {state.statistics_snapshot_id} have no sketch of "
                          f"{', '.join(missing)}")
    if state.statistics_snapshot_id == state.current_snapshot_id:
        return False, f"the statistics are of the current snapshot {state.current_snapshot_id}"
    if state.statistics_snapshot_id is None:
        return True, "no statistics file on main's lineage"
    base = state.statistics_rows or 0
    changed = state.changed_rows or 0
    if base == 0:
        if changed == 0:
            return False, (f"no row changed since the statistics of snapshot {state.statistics_snapshot_id}")
        return True, (f"{changed:,} rows changed since the statistics of snapshot {state.statistics_snapshot_id}, "
                      "which had none")
    share = changed / base
    text = (f"{changed:,} of {base:,} rows changed since the statistics of snapshot {state.statistics_snapshot_id} "
            f"({share:.1%}")
    if share >= stale_fraction:
        return True, f"{text} >= statistics_stale_fraction {stale_fraction:.1%})"
    return False, f"{text} < statistics_stale_fraction {stale_fraction:.1%})"


def statistics_columns(fields: Sequence[tuple[str, bool]], requested: Sequence[str] | None) -> tuple[str, ...]:
    """The columns to compute statistics of: `requested`, or every top-level primitive column.

    Args:
        fields: The snapshot schema's top-level columns as (name, is a primitive type).
        requested: Column names, or None for every primitive one.

    Raises:
        StatisticsError: a requested column the schema does not have, or one of a nested type.
    """
    primitive = {name: is_primitive for name, is_primitive in fields}
    if requested is None:
        chosen = tuple(name for name, is_primitive in fields if is_primitive)
        if not chosen:
            raise StatisticsError("the table has no column of a primitive type to compute statistics of")
        return chosen
    chosen = tuple(dict.fromkeys(requested))
    missing = [c for c in chosen if c not in primitive]
    if missing:
        raise StatisticsError(f"no column {', '.join(repr(c) for c in missing)} in the table's schema; columns: "
                              f"{', '.join(name for name, _ in fields)}")
    nested = [c for c in chosen if not primitive[c]]
    if nested:
        raise StatisticsError(f"column {', '.join(repr(c) for c in nested)} is not of a primitive type: statistics "
                              "are computed of primitive columns only")
    if not chosen:
        raise StatisticsError("no column named to compute statistics of")
    return chosen
