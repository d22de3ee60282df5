"""Snapshot expiry, orphan-file removal, manifest rewrites and column statistics under the operating contract.

Each run is policy-gated (read_only, allowed_operations, allowed_identities), claimed (a busy claim
defers, naming the holder), decided (run / noop / refuse), carried out on Spark by `icemaint.engine`
(retention, orphans, manifests), and recorded as exactly one audit record. Spark- and Dagster-agnostic,
like `Compactor`.

Writers need not take the claim, so expiry and manifest rewrites meet their commits as compaction
does: a conflict (Iceberg refused the commit, or the table moved since planning) is planned again on
the table as it is then, after `retry_backoff` (doubling), up to `max_commit_retries`, then deferred with
the reason; an unknown commit state is settled by re-reading the table. Neither is a failed run.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from icemaint.config import MaintenanceConfig
from icemaint.operations.contract import ContractOperation, ContractRun, first_line
from icemaint.domain.decisions import DEFER, NOOP, REFUSE, RUN, Operation, launched_by_a_person
from icemaint.domain.policy import cleans_metadata, metadata_properties
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.domain.retention import (
    MAX_AGE_SECONDS, ORPHAN_MIN_AGE, ConcurrentExpiry, QuarantineMoveFailed, RetentionError, StaleExpiryPlan,
    check_retain_last, manifests_due, plan_expiry,
)
from icemaint.engine.manifests import rewrite_manifests
from icemaint.engine.metadata_cleanup import remove_old_metadata_files
from icemaint.engine.orphans import remove_orphan_files
from icemaint.engine.retention import (
    RetentionCommitUnknown, RetentionConflict, expire_snapshots, read_snapshots, set_table_properties, table_properties,
)
from icemaint.engine.staging import RUN_ID_KEY
from icemaint.operations.statistics import StatisticsRequest, act_statistics
from icemaint.domain.units import format_duration, human_size
from icemaint.errors import one_line

log = logging.getLogger(__name__)

EXPIRE, ORPHANS, MANIFESTS, STATISTICS = Operation.EXPIRE, Operation.ORPHANS, Operation.MANIFESTS, Operation.STATISTICS
# Audit records keep at most this many paths; the counts are always complete.
MAX_LISTED_PATHS = 100
# Test seam: called with (operation, attempt) right before each expiry or manifest commit.
BeforeCommit = Callable[[str, int], None]


def check_age(seconds: float | None, setting: str) -> float | None:
    """A validated age in seconds (None passes through).

    Raises:
        RetentionError: not a finite number of zero or more seconds, at most 100 years.
    """
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise RetentionError(f"{setting}={seconds!r} is not a number of seconds")
    if seconds < 0:
        raise RetentionError(f"{setting}={seconds!r} is negative; an age must be zero or more")
    if seconds > MAX_AGE_SECONDS:
        raise RetentionError(f"{setting}={seconds:g} seconds is more than 100 years; an age must be at most that")
    return float(seconds)


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


@dataclass(frozen=True)
class OrphanRequest:
    """Remove (or quarantine) unreferenced files older than a cutoff (default: the policy's orphan age)."""

    table: str
    dry_run: bool = False
    older_than_seconds: float | None = None
    force: bool = False
    quarantine: bool = False
    trigger: str = "manual"
    run_id: str | None = None
    identity: str | None = None
    agent_reason: str | None = None

    def __post_init__(self) -> None:
        check_age(self.older_than_seconds, "older_than")


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


@dataclass
class RetentionOutcome:
    """What one expiry / orphan / manifest run decided and did.

    `metrics` holds the numbers a dashboard plots (counts and bytes); `evidence` the why (the
    expiry plan's protected snapshots and notes, the orphan candidates, ...).
    """

    table: str
    operation: str
    decision: str
    reason: str
    dry_run: bool = False
    settings: dict = field(default_factory=dict)
    before_snapshot_id: int | None = None
    after_snapshot_id: int | None = None
    metadata_location_before: str | None = None
    metadata_location_after: str | None = None
    claim_holder: str | None = None
    metrics: dict = field(default_factory=dict)
    evidence: dict = field(default_factory=dict)
    durations: dict = field(default_factory=dict)
    attempts: int = 0  # plan-and-commit attempts made (expiry and manifests; conflicts in evidence["conflicts"])

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def changed_table(self) -> bool:
        """Whether this run really changed the table or its files (not a dry run, defer, refusal or noop)."""
        return self.decision == RUN and not self.dry_run


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _listed(paths) -> list[str]:
    paths = list(paths)
    return paths[:MAX_LISTED_PATHS] + ([f"... and {len(paths) - MAX_LISTED_PATHS} more"]
                                       if len(paths) > MAX_LISTED_PATHS else [])


class Housekeeper(ContractOperation):
    """Runs expiry, orphan removal and manifest rewrites, one request at a time. Not thread-safe."""

    def __init__(self, config: MaintenanceConfig, spark, reader: CatalogReader, claims, audit, *,
                 clock: Callable[[], dt.datetime] = _utcnow, progress: Callable[[str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, before_commit: BeforeCommit | None = None):
        super().__init__(config, spark, reader, claims, audit, progress=progress, sleep=sleep)
        self.clock = clock
        self.before_commit = before_commit

    @property
    def catalog(self) -> str:
        return self.config.catalog.name

    # -- public -----------------------------------------------------------------------------
    def expire(self, request: ExpiryRequest) -> RetentionOutcome:
        """Expire snapshots by policy (or the request's overrides), never inside the owner's
        window, never a branch head, tag or in-flight run's snapshot.

        Raises:
            InvalidTableName, TableNotFound, RetentionError: bad input, before anything is touched.
        """
        settings = {"older_than_seconds": request.older_than_seconds, "retain_last": request.retain_last,
                    "keep_files": request.keep_files, "in_flight_snapshot_ids": list(request.in_flight_snapshot_ids)}
        return self._run(EXPIRE, request, settings, self._expire)

    def remove_orphans(self, request: OrphanRequest) -> RetentionOutcome:
        """Delete, or move to `<state_dir>/quarantine`, files no snapshot references and older than the cutoff.

        Raises:
            InvalidTableName, TableNotFound, RetentionError: bad input, before anything is touched.
        """
        settings = {"older_than_seconds": request.older_than_seconds, "force": request.force,
                    "quarantine": request.quarantine}
        return self._run(ORPHANS, request, settings, self._remove_orphans)

    def rewrite_manifests(self, request: ManifestRequest) -> RetentionOutcome:
        """Merge small manifests when `manifests_due` (or `force`).

        Raises:
            InvalidTableName, TableNotFound: bad input, before anything is touched.
        """
        return self._run(MANIFESTS, request, {"force": request.force}, self._rewrite_manifests)

    def compute_statistics(self, request: StatisticsRequest) -> RetentionOutcome:
        """Compute the current snapshot's column statistics when stale (`icemaint.operations.statistics`).

        Raises:
            InvalidTableName, TableNotFound: bad input, before anything is touched.
        """
        return self._run(STATISTICS, request, {"force": request.force},
                         lambda name, policy, req, outcome: act_statistics(self, name, policy, req, outcome))

    # -- the contract -----------------------------------------------------------------------
    def _run(self, operation: str, request, settings: dict, act) -> RetentionOutcome:
        return self.contract.run(
            operation, request.table, request.run_id,
            new_outcome=lambda run: RetentionOutcome(
                table=run.name.key, operation=operation, decision=NOOP, reason="", dry_run=request.dry_run,
                settings=settings, metadata_location_before=run.metadata_location),
            act=lambda run, outcome: act(run.name, run.policy, request, outcome),
            record=lambda run, outcome: self._finish(request, outcome, run),
            wait_for_claim=launched_by_a_person(request.trigger), progress=self.progress, sleep=self.sleep,
            identity=request.identity, trigger=request.trigger)

    def _finish(self, request, outcome: RetentionOutcome, run: ContractRun) -> RetentionOutcome:
        from icemaint.safety.audit import AuditRecord

        outcome.claim_holder = outcome.claim_holder or run.claim_holder
        try:
            outcome.metadata_location_after = self.reader.metadata_location(outcome.table)
        except Exception as exc:  # the record must still be written; say why the location is missing
            outcome.evidence["metadata_location_error"] = f"{type(exc).__name__}: {exc}"
        outcome.durations["duration_seconds"] = round(time.perf_counter() - run.started, 3)
        self.progress(f"{outcome.table} {outcome.operation}: {outcome.decision}: {outcome.reason}")
        self.audit.append(AuditRecord(
            table=outcome.table, operation=outcome.operation, decision=outcome.decision, reason=outcome.reason,
            trigger=request.trigger, identity=run.identity, run_id=request.run_id,
            before_snapshot_id=outcome.before_snapshot_id, after_snapshot_id=outcome.after_snapshot_id,
            writer_check={"claim_holder": outcome.claim_holder} if outcome.claim_holder else {},
            durations=outcome.durations,
            details={**({"agent_reason": request.agent_reason} if getattr(request, "agent_reason", None) else {}),
                     "dry_run": outcome.dry_run, "settings": outcome.settings, "metrics": outcome.metrics,
                     "evidence": outcome.evidence,
                     "metadata_location_before": outcome.metadata_location_before,
                     "metadata_location_after": outcome.metadata_location_after},
        ))
        return outcome

    # -- conflicts --------------------------------------------------------------------------
    def _seam(self, operation: str, attempt: int):
        return None if self.before_commit is None else (lambda: self.before_commit(operation, attempt))

    def _properties(self, request) -> dict[str, str]:
        return {RUN_ID_KEY: request.run_id} if request.run_id else {}

    def _try_again(self, what: str, name: TableName, policy, outcome: RetentionOutcome, attempt: int,
                   planned_on: int | None, exc: Exception) -> bool:
        """Records a conflict; True to plan again (after the backoff), False when the outcome is now a defer."""
        log.warning("%s of %s conflicted (attempt %d): %s", what, name.key, attempt, exc)
        conflict = first_line(exc)
        outcome.evidence.setdefault("conflicts", []).append(f"attempt {attempt}: {conflict}")
        if attempt > policy.max_commit_retries:
            outcome.decision = DEFER
            outcome.reason = (f"a writer's commit conflicted with the {what} (planned on snapshot {planned_on}) after "
                              f"{attempt} attempts (max_commit_retries {policy.max_commit_retries}): {conflict}; "
                              "nothing changed; the next run plans again")
            return False
        self.sleep(policy.retry_backoff_seconds * 2 ** (attempt - 1))
        return True

    # -- expiry -----------------------------------------------------------------------------
    def _expire(self, name: TableName, policy, request: ExpiryRequest, outcome: RetentionOutcome) -> None:
        cleaned = self._clean_staging(name, request, outcome)
        aligned = self._align_metadata_properties(name, policy, request.dry_run, outcome)
        self._expire_snapshots(name, policy, request, outcome)
        if outcome.decision in (RUN, NOOP):  # after the expiry's own commit, which moves the log on by one
            self._clean_metadata_files(name, policy, request, outcome)
        if cleaned:
            outcome.reason += f"; {cleaned}"
        if aligned:
            verb = "would set" if request.dry_run else "set"
            outcome.reason += f"; table properties {verb}: {aligned}"

    def _clean_staging(self, name: TableName, request: ExpiryRequest, outcome: RetentionOutcome) -> str:
        """First, the staging branches dead runs left (they keep the files they replaced from expiring); what was
        (or, in a dry run, would be) removed, '' when there are none."""
        from icemaint.domain.health import STAGE_PREFIX
        from icemaint.operations.cleanup import clean_stale_staging

        left = sorted(ref for ref in self.reader.load(name.key).metadata.refs if ref.startswith(STAGE_PREFIX))
        if not left:
            return ""
        if request.dry_run:
            return f"would first remove {len(left)} staging branch(es) dead runs left: {', '.join(left)}"
        removed = clean_stale_staging(self.spark, self.catalog, name, self.audit, identity=self.config.identity(),
                                      run_id=request.run_id, trigger=request.trigger)
        outcome.evidence["cleaned_staging"] = removed
        return f"removed {len(removed)} staging branch(es) dead runs left first (audited as cleanup)"

    def _align_metadata_properties(self, name: TableName, policy, dry_run: bool, outcome: RetentionOutcome) -> str:
        """The policy's `write.metadata.*` properties on the table (the expiry step owns them: both bound what
        a table keeps); returns what was (or, in a dry run, would be) set, '' when the table already agrees."""
        wanted = metadata_properties(policy)
        if not wanted:
            return ""
        current = table_properties(self.spark, self.catalog, name)
        differ = {key: value for key, value in wanted.items() if current.get(key) != value}
        if not differ:
            return ""
        outcome.evidence["metadata_properties"] = {"before": {k: current.get(k) for k in differ}, "after": differ,
                                                   "applied": not dry_run}
        if not dry_run:
            set_table_properties(self.spark, self.catalog, name, differ)
        return ", ".join(f"{key}={value}" for key, value in sorted(differ.items()))

    def _clean_metadata_files(self, name: TableName, policy, request: ExpiryRequest, outcome: RetentionOutcome) -> None:
        """The metadata.json files that dropped out of the table's metadata log, removed as Iceberg's
        delete-after-commit would have (`domain.metadata_files`); not when the policy keeps them or files."""
        keep_files = policy.keep_files if request.keep_files is None else request.keep_files
        if not cleans_metadata(policy) or keep_files:
            return
        try:
            tbl = self.reader.load(name.key)
            done = remove_old_metadata_files(self.spark, self.catalog, name, tbl.metadata_location,
                                             [entry.metadata_file for entry in tbl.metadata.metadata_log],
                                             now=self.clock(), dry_run=request.dry_run)
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

    def _expire_snapshots(self, name: TableName, policy, request: ExpiryRequest, outcome: RetentionOutcome) -> None:
        # A writer that does not take the claim may commit between planning and the call. Commits on top do
        # not disturb the plan (the call names its snapshots); a planned snapshot tagged or gone since, or a
        # commit Iceberg refuses: plan again on the table as it is then, up to max_commit_retries, then defer.
        attempt, io = 0, None
        while True:
            attempt += 1
            outcome.attempts = attempt
            t0 = time.perf_counter()
            snapshots, refs = read_snapshots(self.spark, self.catalog, name, policy.checkpoint_markers)
            main = refs.get("main")
            outcome.before_snapshot_id = outcome.after_snapshot_id = main.snapshot_id if main else None
            try:
                plan = plan_expiry(snapshots, refs, self.clock(), policy,
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
                    io = self.reader.load(name.key).io
                result = expire_snapshots(self.spark, self.catalog, name, plan, io=io, dry_run=request.dry_run,
                                          before_commit=self._seam(EXPIRE, attempt))
            except (StaleExpiryPlan, RetentionConflict) as exc:
                if self._try_again("snapshot expiry", name, policy, outcome, attempt, outcome.before_snapshot_id, exc):
                    continue
                return
            except RetentionCommitUnknown as exc:
                outcome.decision, outcome.reason = DEFER, f"{exc}; not retried, the next run plans again"
                return
            except ConcurrentExpiry as exc:
                # The commit landed: a run, with what the table did differently said in the reason.
                result = exc.result
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

    # -- orphans ----------------------------------------------------------------------------
    def _remove_orphans(self, name: TableName, policy, request: OrphanRequest, outcome: RetentionOutcome) -> None:
        now = self.clock()
        age = policy.orphan_older_than_seconds if request.older_than_seconds is None else request.older_than_seconds
        cutoff = now - dt.timedelta(seconds=age)
        quarantine = self.config.quarantine_location if request.quarantine else None
        outcome.settings.update(older_than=cutoff.isoformat(), quarantine_dir=quarantine)
        forced_young = request.force and dt.timedelta(seconds=age) < ORPHAN_MIN_AGE
        refs = read_snapshots(self.spark, self.catalog, name)[1]
        main = refs.get("main")
        outcome.before_snapshot_id = outcome.after_snapshot_id = main.snapshot_id if main else None
        t0 = time.perf_counter()
        try:
            result = remove_orphan_files(self.spark, self.catalog, name, older_than=cutoff, now=now,
                                         force=request.force, dry_run=request.dry_run, quarantine_dir=quarantine,
                                         within=self.config.catalog.warehouse_root)
        except QuarantineMoveFailed:
            raise  # some files may already be in quarantine: a failure, not a refusal
        except RetentionError as exc:
            outcome.decision, outcome.reason = REFUSE, str(exc)
            return
        outcome.durations["act_seconds"] = round(time.perf_counter() - t0, 3)
        removed = len(result.moved) if result.quarantined_to else len(result.deleted)
        outcome.metrics = {"candidates": len(result.candidates), "removed": removed, "bytes": result.bytes}
        outcome.evidence = {"table_location": result.table_location, "candidates": _listed(result.candidates),
                            "forced_cutoff_under_24h": forced_young, "quarantined_to": result.quarantined_to}
        where = f"files older than {format_duration(age)} ({cutoff.isoformat()})"
        if not result.candidates:
            outcome.decision, outcome.reason = NOOP, f"no orphan {where}"
            return
        outcome.decision = RUN
        verb = "quarantined" if quarantine else "deleted"
        if request.dry_run:
            outcome.reason = f"dry-run: {len(result.candidates)} orphan {where}, {human_size(result.bytes)}; nothing changed"
        else:
            outcome.reason = f"{verb} {removed} orphan {where}, {human_size(result.bytes)}"
        if forced_young:
            outcome.reason += "; FORCED cutoff under 24 h"

    # -- manifests --------------------------------------------------------------------------
    def _rewrite_manifests(self, name: TableName, policy, request: ManifestRequest,
                           outcome: RetentionOutcome) -> None:
        attempt = 0
        while True:
            attempt += 1
            outcome.attempts = attempt
            refs = read_snapshots(self.spark, self.catalog, name)[1]
            main = refs.get("main")
            planned_on = main.snapshot_id if main else None
            if attempt == 1:
                outcome.before_snapshot_id = outcome.after_snapshot_id = planned_on
            lengths = [int(r["length"]) for r in self.spark.sql(
                f"SELECT length FROM {name.sql(self.catalog)}.`manifests`").collect()]
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
                result = rewrite_manifests(self.spark, self.catalog, name, dry_run=request.dry_run,
                                           properties=self._properties(request),
                                           before_commit=self._seam(MANIFESTS, attempt))
            except RetentionConflict as exc:
                if self._try_again("manifest rewrite", name, policy, outcome, attempt, planned_on, exc):
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
