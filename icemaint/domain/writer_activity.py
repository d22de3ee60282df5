"""Writer activity, pure: whether writers are idle where a decision would rewrite (the writer-idle gate).

A date (or a partition of a table without a time column) that a writer committed into within the policy's
`writer_idle` window is left alone; under `writer_scope: table` the table's last writer commit decides for all of
it. `icemaint.domain.decisions` defers on what these return; `icemaint explain` shows them.
"""

from __future__ import annotations

from typing import Any, Mapping

from icemaint.domain.health import TableHealth
from icemaint.domain.layout import WHOLE_TABLE, describe
from icemaint.domain.policy import TablePolicy
from icemaint.domain.units import human_duration


def writer_check(health: TableHealth, policy: TablePolicy, key: str | None = None) -> dict[str, Any]:
    """Whether writers are idle where a decision would rewrite: on partition `key` (a date, or a layout
    partition) under `writer_scope: partition`, else (`writer_scope: table`, or no partition named, or the
    observer could not tell partitions apart) on the whole table."""
    per_partition = policy.writer_scope == "partition" and key is not None and health.writer_partitions_known
    if per_partition:
        part = health.partition(key)
        at = part.last_writer_commit_at if part else None
        idle_for = part.seconds_since_writer_commit if part else None
    else:
        at, idle_for = health.last_writer_commit_at, health.seconds_since_writer_commit
    return {
        "scope": "partition" if per_partition else "table",
        **({"partition": key} if per_partition else {}),
        "last_writer_commit_at": at,
        "seconds_since_writer_commit": idle_for,
        "writer_idle_seconds": policy.writer_idle_seconds,
        # A commit newer than `now` (it landed while health was read, or the writer's clock runs
        # ahead) has been idle for 0 s, not for a negative time.
        "idle": idle_for is None or max(idle_for, 0.0) >= policy.writer_idle_seconds,
    }


def writer_active_reason(wc: Mapping[str, Any], policy: TablePolicy) -> str:
    """The deferral's words for a `writer_check` that is not idle."""
    ago = human_duration(max(wc["seconds_since_writer_commit"], 0.0))
    window = f"within the {human_duration(policy.writer_idle_seconds)} idle window"
    if wc.get("scope") == "partition":
        return (f"writer active on {describe(wc['partition']) if wc['partition'] != WHOLE_TABLE else 'the table'}: "
                f"last commit {ago} ago, {window}")
    return f"writer active: last writer commit {ago} ago, {window}"


def active_partitions(health: TableHealth, policy: TablePolicy) -> frozenset[str]:
    """The partitions of a table without a time column that a writer committed into within `writer_idle` (none
    under `writer_scope: table`, whose check is on the whole table)."""
    if policy.writer_scope != "partition" or not health.writer_partitions_known:
        return frozenset()
    return frozenset(p.key for p in health.partitions if not writer_check(health, policy, p.key)["idle"])


def layout_writer_check(health: TableHealth, policy: TablePolicy, active: frozenset[str]) -> dict[str, Any]:
    """A layout decision's writer check: the table's under `writer_scope: table`; else the partitions being
    written (left out of the choice) beside the table's last writer commit, and idle for what is chosen."""
    table = writer_check(health, policy)
    if policy.writer_scope != "partition" or not health.writer_partitions_known:
        return table
    return {**table, "scope": "partition", "partitions_written": sorted(active), "idle": True}
