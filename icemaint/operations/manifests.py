"""Manifest rewrites under the operating contract (`Housekeeper.rewrite_manifests`): the current snapshot's small
manifests merged when `icemaint.domain.retention.manifests_due` says so (or always when forced). A writer's
conflicting commit is planned again, as `retention_outcome.plan_again` says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from icemaint.domain.verdicts import DEFER, NOOP, RUN
from icemaint.domain.names import TableName
from icemaint.domain.retention import manifests_due
from icemaint.engine.manifest_list import read_current_manifests
from icemaint.engine.manifests import rewrite_manifests
from icemaint.engine.retention import RetentionCommitUnknown, RetentionConflict
from icemaint.engine.staging import RUN_ID_KEY
from icemaint.operations.retention_outcome import MANIFESTS, RetentionOutcome, commit_seam, plan_again


@dataclass(frozen=True)
class ManifestRequest:
    """Rewrite the current snapshot's manifests when `manifests_due` says so (or always with `force`)."""

    table: str
    dry_run: bool = False
    force: bool = False
    trigger: str = "manual"
    run_id: str | None = None
    identity: str | None = None
    agent_reason: str | None = None


def act_manifests(keeper, name: TableName, policy, request: ManifestRequest, outcome: RetentionOutcome) -> None:
    """The manifest-rewrite step of `keeper` (a `Housekeeper`) on one claimed table: fills `outcome`."""
    attempt = 0
    while True:
        attempt += 1
        outcome.attempts = attempt
        # One load and one read of main's manifest list: the decision, the figures before and the rewrite's plan.
        current = read_current_manifests(keeper.spark, keeper.catalog, name)
        planned_on = current.snapshot_id
        if attempt == 1:
            outcome.before_snapshot_id = outcome.after_snapshot_id = planned_on
        lengths = [m.length for m in current.manifests]
        small = sum(1 for n in lengths if n < policy.manifest_small_bytes)
        due, why = manifests_due(len(lengths), small, policy)
        outcome.evidence.update({"due": due, "why": why, "small_manifests": small,
                                 "manifest_small_bytes": policy.manifest_small_bytes,
                                 "planned_on_snapshot_id": planned_on})
        outcome.metrics = {"manifests_before": len(lengths), "bytes_before": sum(lengths)}
        if not due and not request.force:
            outcome.decision = NOOP
            outcome.reason = f"not due: {why}" + (f" (planned again after {attempt - 1} conflict(s))"
                                                  if attempt > 1 else "")
            return
        t0 = time.perf_counter()
        try:
            result = rewrite_manifests(keeper.spark, keeper.catalog, name, dry_run=request.dry_run,
                                       properties=_properties(request), current=current,
                                       before_commit=commit_seam(keeper.before_commit, MANIFESTS, attempt))
        except RetentionConflict as exc:
            if plan_again("manifest rewrite", name, policy, outcome, attempt, planned_on, exc, keeper.sleep):
                continue
            return
        except RetentionCommitUnknown as exc:
            outcome.decision, outcome.reason = DEFER, f"{exc}; not retried, the next run plans again"
            return
        outcome.durations["act_seconds"] = round(time.perf_counter() - t0, 3)
        outcome.metrics = {"manifests_before": result.manifests_before, "manifests_after": result.manifests_after,
                           "bytes_before": result.bytes_before, "bytes_after": result.bytes_after,
                           "rewritten_manifests": result.rewritten_manifests,
                           "added_manifests": result.added_manifests}
        if not request.dry_run:
            outcome.after_snapshot_id = result.snapshot_id if result.snapshot_id is not None else planned_on
        trigger = why if due else f"forced ({why})"
        outcome.decision = RUN
        if request.dry_run:
            outcome.reason = (f"dry-run: would rewrite {result.manifests_before} manifests into about "
                              f"{result.manifests_after}: {trigger}; nothing changed")
        elif not result.rewritten_manifests:
            outcome.decision = NOOP
            outcome.reason = f"rewrite_manifests found nothing to merge ({trigger})"
        else:
            outcome.reason = (f"rewrote {result.rewritten_manifests} manifests into {result.added_manifests}: "
                              f"{trigger}")
            if result.state_was_unknown:
                outcome.reason += (f"; the catalog could not confirm the commit, a re-read found it on main "
                                   f"(snapshot {result.snapshot_id})")
        if attempt > 1 and not request.dry_run:
            outcome.reason += f" [attempt {attempt}: planned again after {attempt - 1} conflict(s)]"
        return


def _properties(request: ManifestRequest) -> dict[str, str]:
    return {RUN_ID_KEY: request.run_id} if request.run_id else {}
