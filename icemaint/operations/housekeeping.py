"""Snapshot expiry, orphan-file removal, manifest rewrites and column statistics under the operating contract.

Each run is policy-gated (read_only, allowed_operations, allowed_identities), claimed (a busy claim
defers, naming the holder), decided (run / noop / refuse), carried out on Spark by `icemaint.engine`
(retention, orphans, manifests), and recorded as exactly one audit record. Spark- and Dagster-agnostic,
like `Compactor`. `Housekeeper` runs the contract; each operation's own step is its module's:
`expiry`, `orphans`, `manifests` and `statistics` (what they share: `retention_outcome`).

Writers need not take the claim, so expiry and manifest rewrites meet their commits as compaction
does: a conflict (Iceberg refused the commit, or the table moved since planning) is planned again on
the table as it is then, after `retry_backoff` (doubling), up to `max_commit_retries`, then deferred with
the reason; an unknown commit state is settled by re-reading the table. Neither is a failed run.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Callable

from icemaint.config import MaintenanceConfig
from icemaint.domain.verdicts import NOOP, launched_by_a_person
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.contract import ContractOperation, ContractRun
from icemaint.operations.expiry import ExpiryRequest, act_expiry
from icemaint.operations.manifests import ManifestRequest, act_manifests
from icemaint.operations.orphans import OrphanRequest, act_orphans
from icemaint.operations.retention_outcome import (
    EXPIRE, MANIFESTS, ORPHANS, STATISTICS, BeforeCommit, RetentionOutcome,
)
from icemaint.operations.statistics import StatisticsRequest, act_statistics


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Housekeeper(ContractOperation):
    """Runs expiry, orphan removal, manifest rewrites and column statistics, one request at a time. Not thread-safe."""

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
        return self._run(EXPIRE, request, settings, act_expiry)

    def remove_orphans(self, request: OrphanRequest) -> RetentionOutcome:
        """Delete, or move to `<state_dir>/quarantine`, files no snapshot references and older than the cutoff.

        Raises:
            InvalidTableName, TableNotFound, RetentionError: bad input, before anything is touched.
        """
        settings = {"older_than_seconds": request.older_than_seconds, "force": request.force,
                    "quarantine": request.quarantine}
        return self._run(ORPHANS, request, settings, act_orphans)

    def rewrite_manifests(self, request: ManifestRequest) -> RetentionOutcome:
        """Merge small manifests when `manifests_due` (or `force`).

        Raises:
            InvalidTableName, TableNotFound: bad input, before anything is touched.
        """
        return self._run(MANIFESTS, request, {"force": request.force}, act_manifests)

    def compute_statistics(self, request: StatisticsRequest) -> RetentionOutcome:
        """Compute the current snapshot's column statistics when stale (`icemaint.operations.statistics`).

        Raises:
            InvalidTableName, TableNotFound: bad input, before anything is touched.
        """
        return self._run(STATISTICS, request, {"force": request.force}, act_statistics)

    # -- the contract -----------------------------------------------------------------------
    def _run(self, operation: str, request, settings: dict, act) -> RetentionOutcome:
        return self.contract.run(
            operation, request.table, request.run_id,
            new_outcome=lambda run: RetentionOutcome(
                table=run.name.key, operation=operation, decision=NOOP, reason="", dry_run=request.dry_run,
                settings=settings, metadata_location_before=run.metadata_location),
            act=lambda run, outcome: act(self, run.name, run.policy, request, outcome),
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
