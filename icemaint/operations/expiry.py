"""Snapshot expiry under the operating contract (`Housekeeper.expire`).

One run first removes the staging branches dead runs left, aligns the table's `write.metadata.*` properties with
its policy, expires the snapshots `icemaint.domain.retention.plan_expiry` names (never inside the owner's window,
never a branch head, tag or in-flight run's snapshot), then removes the metadata.json files that dropped out of the
table's metadata log. A writer's conflicting commit is planned again, as `retention_outcome.plan_again` says.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import cast

from icemaint.domain.verdicts import DEFER, NOOP, REFUSE, RUN
from icemaint.domain.names import TableName
from icemaint.domain.policy import cleans_metadata, metadata_properties
from icemaint.domain.retention import ConcurrentExpiry, RetentionError, StaleExpiryPlan, check_retain_last, plan_expiry
from icemaint.domain.units import human_size
from icemaint.engine.metadata_cleanup import remove_old_metadata_files
from icemaint.engine.retention import (
    ExpiryResult, RetentionCommitUnknown, RetentionConflict, expire_snapshots, read_snapshots, set_table_properties,
    table_properties,
)
from icemaint.errors import one_line
from icemaint.operations.retention_outcome import EXPIRE, RetentionOutcome, check_age, commit_seam, plan_again

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpiryRequest:
    """Expire a table's old snapshots. None settings fall back to the table's policy."""

    table: str
    dry_run: bool = False
    older_than_seconds: float | None = None
    retain_last: int | None = None
    keep_files: bool | None = None
    # Snapshots that queued or running maintenance was planned on: never expired.
    in_flight_snapshot_ids: tuple[int, ...] = ()
    trigger: str = "manual"
    run_id: str | None = None
    identity: str | None = None  # who asked, when not the process's identity (an agent's run: the agent)
    agent_reason: str | None = None  # the reason the agent gave for the request that launched the run

    def __post_init__(self) -> None:
        check_age(self.older_than_seconds, "older_than")
        if self.retain_last is not None:
            check_retain_last(self.retain_last)


def act_expiry(keeper, name: TableName, policy, request: ExpiryRequest, outcome: RetentionOutcome) -> None:
    """The expiry step of `keeper` (a `Housekeeper`) on one claimed table: fills `outcome`."""
    cleaned = _clean_staging(keeper, name, request, outcome)
    aligned = _align_metadata_properties(keeper, name, policy, request.dry_run, outcome)
    _expire_snapshots(keeper, name, policy, request, outcome)
    if outcome.decision in (RUN, NOOP):  # after the expiry's own commit, which moves the log on by one
        _clean_metadata_files(keeper, name, policy, request, outcome)
    if cleaned:
        outcome.reason += f"; {cleaned}"
    if aligned:
        verb = "would set" if request.dry_run else "set"
        outcome.reason += f"; table properties {verb}: {aligned}"


def _clean_staging(keeper, name: TableName, request: ExpiryRequest, outcome: RetentionOutcome) -> str:
    """First, the staging branches dead runs left (they keep the files they replaced from expiring); what was
    (or, in a dry run, would be) removed, '' when there are none."""
    from icemaint.domain.health import STAGE_PREFIX
    from icemaint.operations.cleanup import clean_stale_staging

    left = sorted(ref for ref in keeper.reader.load(name.key).metadata.refs if ref.startswith(STAGE_PREFIX))
    if not left:
        return ""
    if request.dry_run:
        return f"would first remove {len(left)} staging branch(es) dead runs left: {', '.join(left)}"
    removed = clean_stale_staging(keeper.spark, keeper.catalog, name, keeper.audit, identity=keeper.config.identity(),
                                  run_id=request.run_id, trigger=request.trigger)
    outcome.evidence["cleaned_staging"] = removed
    return f"removed {len(removed)} staging branch(es) dead runs left first (audited as cleanup)"


def _align_metadata_properties(keeper, name: TableName, policy, dry_run: bool, outcome: RetentionOutcome) -> str:
    """The policy's `write.metadata.*` properties on the table (the expiry step owns them: both bound what
    a table keeps); returns what was (or, in a dry run, would be) set, '' when the table already agrees."""
    wanted = metadata_properties(policy)
    if not wanted:
        return ""
    current = table_properties(keeper.spark, keeper.catalog, name)
    differ = {key: value for key, value in wanted.items() if current.get(key) != value}
    if not differ:
        return ""
    outcome.evidence["metadata_properties"] = {"before": {k: current.get(k) for k in differ}, "after": differ,
                                               "applied": not dry_run}
    if not dry_run:
        set_table_properties(keeper.spark, keeper.catalog, name, differ)
    return ", ".join(f"{key}={value}" for key, value in sorted(differ.items()))


def _clean_metadata_files(keeper, name: TableName, policy, request: ExpiryRequest, outcome: RetentionOutcome) -> None:
    """The metadata.json files that dropped out of the table's metadata log, removed as Iceberg's
    delete-after-commit would have (`domain.metadata_files`); not when the policy keeps them or files."""
    keep_files = policy.keep_files if request.keep_files is None else request.keep_files
    if not cleans_metadata(policy) or keep_files:
        return
    try:
        tbl = keeper.reader.load(name.key)
        done = remove_old_metadata_files(keeper.spark, keeper.catalog, name, tbl.metadata_location,
                                         [entry.metadata_file for entry in tbl.metadata.metadata_log],
                                         now=keeper.clock(), dry_run=request.dry_run)
    except Exception as exc:  # the expiry stands: a cleanup that failed is said, and the next expiry tries again
        log.warning("metadata.json cleanup of %s failed: %s", name.key, exc)
        outcome.evidence["metadata_files_error"] = f"{type(exc).__name__}: {one_line(exc)}"
        outcome.reason += f"; metadata.json cleanup failed ({type(exc).__name__}: {one_line(exc)})"
        return
    figures = done.to_dict()
    outcome.evidence["metadata_files"] = figures
    outcome.metrics.update({k: figures[k] for k in ("metadata_files_removed", "metadata_bytes_removed",
                                                      "metadata_files_in_log")})
    planned = done.plan.remove
    if planned:
        files = len(planned) if request.dry_run else len(done.removed)
        size = done.plan.remove_bytes if request.dry_run else done.removed_bytes
        verb = "would remove" if request.dry_run else "removed"
        outcome.reason += (f"; {verb} {files} metadata.json file{'s' if files != 1 else ''} ({human_size(size)}) "
                           f"older than the table's metadata log (v{done.plan.oldest_listed_version}..)")


def _expire_snapshots(keeper, name: TableName, policy, request: ExpiryRequest, outcome: RetentionOutcome) -> None:
    # A writer that does not take the claim may commit between planning and the call. Commits on top do
    # not disturb the plan (the call names its snapshots); a planned snapshot tagged or gone since, or a
    # commit Iceberg refuses: plan again on the table as it is then, up to max_commit_retries, then defer.
    attempt, io = 0, None
    while True:
        attempt += 1
        outcome.attempts = attempt
        t0 = time.perf_counter()
        snapshots, refs = read_snapshots(keeper.spark, keeper.catalog, name, policy.checkpoint_markers)
        main = refs.get("main")
        outcome.before_snapshot_id = outcome.after_snapshot_id = main.snapshot_id if main else None
        try:
            plan = plan_expiry(snapshots, refs, keeper.clock(), policy,
                               older_than_seconds=request.older_than_seconds, retain_last=request.retain_last,
                               keep_files=request.keep_files,
                               in_flight_snapshot_ids=request.in_flight_snapshot_ids)
        except RetentionError as exc:  # inside the owner's window, or a protected snapshot no cutoff keeps
            outcome.decision, outcome.reason = REFUSE, str(exc)
            return
        outcome.durations["plan_seconds"] = round(time.perf_counter() - t0, 3)
        outcome.settings.update(older_than=plan.older_than.isoformat(), retain_last=plan.retain_last,
                                keep_files=plan.keep_files)
        outcome.evidence.update({
            "requested_older_than": plan.requested_older_than.isoformat(),
            "older_than": plan.older_than.isoformat(),
            "expiring_snapshot_ids": list(plan.expiring_snapshot_ids),
            "protected": {str(k): v for k, v in plan.protected.items()},
            "dropped_refs": list(plan.dropped_refs), "notes": list(plan.notes)})
        outcome.metrics = {"snapshots_before": plan.snapshot_count,
                           "snapshots_after": plan.snapshot_count - len(plan.expiring_snapshot_ids),
                           "snapshots_removed": len(plan.expiring_snapshot_ids)}
        if plan.is_noop:
            outcome.decision = NOOP
            outcome.reason = (f"nothing to expire: all {plan.snapshot_count} snapshots are protected or not older "
                              f"than {plan.older_than.isoformat()}")
            return
        t1 = time.perf_counter()
        note = ""
        try:
            if io is None:  # the table's file IO, loaded once for every attempt
                io = keeper.reader.load(name.key).io
            result = expire_snapshots(keeper.spark, keeper.catalog, name, plan, io=io, dry_run=request.dry_run,
                                      before_commit=commit_seam(keeper.before_commit, EXPIRE, attempt))
        except (StaleExpiryPlan, RetentionConflict) as exc:
            if plan_again("snapshot expiry", name, policy, outcome, attempt, outcome.before_snapshot_id, exc,
                          keeper.sleep):
                continue
            return
        except RetentionCommitUnknown as exc:
            outcome.decision, outcome.reason = DEFER, f"{exc}; not retried, the next run plans again"
            return
        except ConcurrentExpiry as exc:
            # The commit landed: a run, with what the table did differently said in the reason.
            result = cast(ExpiryResult, exc.result)
            note = (f"; other snapshots are gone than the {len(plan.expiring_snapshot_ids)} planned "
                    f"(a concurrent commit changed the table): planned {list(plan.expiring_snapshot_ids)}")
        except RetentionError as exc:
            outcome.decision, outcome.reason = REFUSE, str(exc)  # e.g. gc.enabled=false
            return
        outcome.durations["act_seconds"] = round(time.perf_counter() - t1, 3)
        outcome.metrics = {
            "snapshots_before": result.snapshots_before, "snapshots_after": result.snapshots_after,
            "snapshots_removed": len(result.expired_snapshot_ids),
            "data_files_deleted": result.data_files_deleted, "delete_files_deleted": result.delete_files_deleted,
            "manifests_deleted": result.manifests_deleted, "manifest_lists_deleted": result.manifest_lists_deleted,
            "bytes_reclaimed": result.bytes_reclaimed, "files_left_unreferenced": result.files_left_unreferenced,
            "bytes_left_unreferenced": result.bytes_left_unreferenced}
        outcome.evidence["expired_snapshot_ids"] = list(result.expired_snapshot_ids)
        outcome.evidence["procedure_counts"] = dict(result.procedure_counts)
        outcome.evidence["cleanup"] = result.cleanup
        if result.state_was_unknown:
            note += ("; the catalog could not confirm the commit, a re-read shows the planned snapshots gone "
                     "(their files were not deleted: orphan removal reclaims them)")
        verb = "would expire" if request.dry_run else "expired"
        outcome.decision = RUN
        outcome.reason = (f"{verb} {len(result.expired_snapshot_ids)} of {result.snapshots_before} snapshots older "
                          f"than {plan.older_than.isoformat()} (retain_last={plan.retain_last}"
                          f"{', files kept' if plan.keep_files else ''}){note}")
        if attempt > 1:
            outcome.reason += f" [attempt {attempt}: planned again after {attempt - 1} conflict(s)]"
        if request.dry_run:
            outcome.reason = f"dry-run: {outcome.reason}; nothing changed"
        return
