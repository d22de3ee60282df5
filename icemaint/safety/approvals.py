"""Approvals for runs over the cost ceiling, kept in the append-only audit log itself.

An approval is an audit record (operation `approve`, decision `approved`) for a table and date (no
date: the partitions of a table without a time column); it holds until a compaction of that scope runs.
The same approval lets a scope be compacted again after an operator reverted its compaction
(`reverted_scopes`): automation does not redo what a person undid. And after runs a retry would repeat
(`held_runs`): a proof that failed, or runs that kept failing, are not retried by automation until approved.
"""

from __future__ import annotations

import datetime as dt

from icemaint.domain.decisions import RunHold, refusal_for
from icemaint.domain.verdicts import ReasonKind
from icemaint.errors import UserError, one_line

# Runs in a row that failed or were interrupted before automation stops requesting the scope.
MAX_FAILED_RUNS = 3
# How a compaction run ends (its audit record's decision) when it publishes nothing: failed, and also deferred.
FAILED_RUN_ENDS = frozenset({"not_published", "failed", "interrupted"})
UNPUBLISHED_RUN_ENDS = FAILED_RUN_ENDS | {"defer"}


class ApprovalRefused(UserError, PermissionError):
    """The policy does not let this identity approve the table."""


def approve(config, audit, table: str, date: str | None, note: str | None = None):
    """Record an approval by the current identity; refused when policy forbids that identity."""
    from icemaint.safety.audit import AuditRecord
    from icemaint.domain.names import TableName
    from icemaint.domain.scope import parse_date

    key = TableName.parse(table).key
    tomorrow = dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1)  # the last date a run can target
    date = parse_date(date, config.dates_start, tomorrow).isoformat() if date is not None else None
    identity = config.identity()
    why = refusal_for(config.policy(key), "compact", identity)
    if why:
        raise ApprovalRefused(f"cannot approve compaction of {key} {date or '(its partitions)'}: {why}")
    record = AuditRecord(table=key, operation="approve", decision="approved", date=date, identity=identity,
                         reason=note or "cost ceiling approved by operator", trigger="operator")
    audit.append(record)
    return record


def is_approved(records, date: str | None) -> bool:
    """Whether one table's audit records hold an approval for `date` newer than its last compaction run."""
    latest_approval = latest_run = None
    for r in records:
        if r.date != date:
            continue
        if r.operation == "approve" and r.decision == "approved":
            latest_approval = max(latest_approval or r.ts, r.ts)
        elif r.operation == "compact" and r.decision in ("run", "rollback") and not r.details.get("dry_run"):
            latest_run = max(latest_run or r.ts, r.ts)
    return latest_approval is not None and (latest_run is None or latest_approval > latest_run)


def reverted_scopes(records) -> dict[str | None, str]:
    """One table's scopes (dates; None: its partitions) whose published compaction an operator reverted, and no
    approval or compaction of the scope since: scope -> who reverted which snapshot, when."""
    reverts = {}  # reverted snapshot id -> the latest revert record of it
    for r in records:
        if r.operation == "revert" and r.decision == "run" and not r.details.get("dry_run") \
                and r.details.get("reverted_snapshot_id") is not None:
            reverts[int(r.details["reverted_snapshot_id"])] = r
    if not reverts:
        return {}
    held, since = {}, {}  # scope -> its revert; scope -> the latest approval or compaction run of it
    for r in records:
        if r.operation == "compact" and r.decision == "run" and not r.details.get("dry_run"):
            published = {r.after_snapshot_id, *(r.details.get("committed_snapshot_ids") or ())} - {None}
            for snapshot_id in published & set(reverts):
                if r.date not in held or reverts[snapshot_id].ts > held[r.date].ts:
                    held[r.date] = reverts[snapshot_id]
        if (r.operation == "approve" and r.decision == "approved") or \
                (r.operation == "compact" and r.decision == "run" and not r.details.get("dry_run")):
            since[r.date] = max(since.get(r.date, r.ts), r.ts)
    return {scope: f"{revert.identity} reverted snapshot {revert.details['reverted_snapshot_id']} at "
                   f"{revert.ts:%Y-%m-%d %H:%M} UTC"
            for scope, revert in held.items() if since.get(scope) is None or since[scope] <= revert.ts}


def held_runs(records, max_failed: int = MAX_FAILED_RUNS) -> dict[str | None, RunHold]:
    """One table's scopes whose runs since their latest approval or publish a retry would repeat: a failed proof
    (the staged rewrite differed from the rows it replaced: data or a bug to look at, and each retry rewrites the
    scope again), or `max_failed` runs in a row that failed or were interrupted. A run that deferred (a busy claim,
    a writer's conflicting commit) is not counted: automation tries it again."""
    ended: dict[str | None, list] = {}
    for r in sorted(records, key=lambda r: r.ts):
        if r.details.get("dry_run"):
            continue
        if (r.operation == "approve" and r.decision == "approved") or (r.operation == "compact" and r.decision == "run"):
            ended[r.date] = []
        elif r.operation == "compact" and r.run_id and r.decision in FAILED_RUN_ENDS:
            ended.setdefault(r.date, []).append(r)
    held = {}
    for scope, runs in ended.items():
        proofs = [r for r in runs if r.decision == "not_published"]
        if proofs:
            last = proofs[-1]
            held[scope] = RunHold(ReasonKind.PROOF_FAILED, (
                f"run {last.run_id} at {last.ts:%Y-%m-%d %H:%M} UTC: {one_line(last.reason, 200)}"))
        elif len(runs) >= max_failed:
            last = runs[-1]
            held[scope] = RunHold(ReasonKind.RUNS_FAILED, (
                f"its last {len(runs)} runs failed or were interrupted, the last ({last.run_id}) at "
                f"{last.ts:%Y-%m-%d %H:%M} UTC: {one_line(last.reason, 200)}"))
    return held

