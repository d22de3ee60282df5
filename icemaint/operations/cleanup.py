"""Staging branches dead runs left: removed under the table's claim, each removal audited as `cleanup`.

Under the claim no run's staging is live, so every `icemaint_stage_*` branch is a dead run's: one killed before
its publish (`main` never saw the branch's files) or between its publish and the branch's removal (its rewrite is on
`main`; the branch only kept the replaced files referenced, against expiry and orphan removal). Compaction removes
them before it plans; snapshot expiry removes them first too (the retention tick makes expiry due for them), so a
branch is not left for good on a table where nothing becomes due.
"""

from __future__ import annotations

from icemaint.domain.names import TableName


def clean_stale_staging(spark, catalog: str, name: TableName, audit, *, identity: str, run_id: str | None,
                        trigger: str | None, date: str | None = None) -> list[dict]:
    """Removes the table's staging branches (call under the claim); returns one entry per branch removed."""
    from icemaint.engine.staging import StagingArea
    from icemaint.safety.audit import AuditRecord

    staging = StagingArea(spark, catalog, name, run_id or "cleanup")
    removed = []
    for branch, snapshot_id in staging.stale_branches():
        published = staging.find_published(snapshot_id)  # a run killed between its publish and the removal
        staging.discard(branch)
        if published is not None:
            reason = (f"removed staging branch {branch} (snapshot {snapshot_id}) left by a run that ended after "
                      f"publishing it: its rewrite is on main as snapshot {published.snapshot_id}; the branch only "
                      "kept the replaced files referenced")
        else:
            reason = (f"removed staging branch {branch} (snapshot {snapshot_id}) left by a run that ended before "
                      "publishing; main was never changed by it, its files are reclaimed by snapshot expiry")
        audit.append(AuditRecord(
            table=name.key, operation="cleanup", decision="run", date=date, identity=identity, run_id=run_id,
            trigger=trigger, reason=reason,
            details={"branch": branch, "staged_snapshot_id": snapshot_id,
                     "published_snapshot_id": published.snapshot_id if published else None}))
        removed.append({"branch": branch, "staged_snapshot_id": snapshot_id,
                        "published_snapshot_id": published.snapshot_id if published else None})
    return removed
