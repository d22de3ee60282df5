"""Purging the quarantine: files that orphan removal moved aside, deleted for good later.

`icemaint orphans --quarantine` (or `quarantine: true` on the orphan_files asset) moves unreferenced
files into `<quarantine_dir>/<table>/<stamp>/` (default `<state_dir>/quarantine`; an object-store URI
such as s3://bucket/prefix works the same) instead of deleting them; once the grace period
has shown nothing needed them, `purge` deletes the batches older than a cutoff. A table whose policy
refuses orphan removal (read_only, allowed_operations, allowed_identities) keeps its batches. One
audit record per table with batches (run, dry run or refuse).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from dataclasses import asdict, dataclass, field

from icemaint.config import MaintenanceConfig
from icemaint.domain.decisions import refusal_for
from icemaint.domain.verdicts import REFUSE, RUN, Operation
from icemaint.operations.retention_outcome import MAX_LISTED_PATHS, ORPHANS, check_age
from icemaint.engine.orphans import delete_batches, quarantine_batches
from icemaint.domain.units import format_duration

PURGE = Operation.PURGE_QUARANTINE


@dataclass
class PurgeOutcome:
    table: str
    decision: str
    reason: str
    batches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def purge(config: MaintenanceConfig, spark, audit, *, older_than_seconds: float, dry_run: bool = False,
          now: dt.datetime | None = None) -> list[PurgeOutcome]:
    """Deletes quarantine batches older than `older_than_seconds` (all tables whose policy allows it).

    Raises:
        RetentionError: a negative or non-numeric age, before anything is touched.
    """
    from icemaint.safety.audit import STARTED, AuditRecord, audit_call
    from icemaint.safety.process import ProcessRef

    started = time.perf_counter()
    age = check_age(older_than_seconds, "older_than")
    cutoff = (now or dt.datetime.now(dt.timezone.utc)) - dt.timedelta(seconds=age)
    identity = config.identity()
    root = config.quarantine_location
    catalog = config.catalog.name
    listed = quarantine_batches(spark, catalog, root, cutoff)
    within = f"quarantined more than {format_duration(age)} ago (before {cutoff.isoformat(timespec='seconds')})"
    outcomes = []
    for table, batches in listed.items():
        refused = refusal_for(config.policy(table), ORPHANS, identity)
        if refused:
            outcome = PurgeOutcome(table, REFUSE, refused, batches)
        elif dry_run:
            outcome = PurgeOutcome(table, RUN, f"dry-run: would purge {len(batches)} batch(es) {within}", batches)
        else:
            outcome = None
        with audit_call(uuid.uuid4().hex):  # pairs the started marker with the table's record
            if outcome is None:
                # A kill while deleting leaves this marker, read back as interrupted (every mutating call has one).
                audit.append(AuditRecord(
                    table=table, operation=PURGE, decision=STARTED, trigger="manual", identity=identity,
                    reason=f"started purging {len(batches)} batch(es) {within}",
                    details={"process": ProcessRef.current().to_dict(), "quarantine_dir": root,
                             "batches": batches[:MAX_LISTED_PATHS], "batch_count": len(batches)}))
                gone = delete_batches(spark, catalog, batches)
                outcome = PurgeOutcome(table, RUN, f"purged {len(gone)} batch(es) {within}", gone)
            audit.append(AuditRecord(
                table=table, operation=PURGE, decision=outcome.decision, reason=outcome.reason, trigger="manual",
                identity=identity, durations={"duration_seconds": round(time.perf_counter() - started, 3)},
                details={"dry_run": dry_run, "quarantine_dir": root, "cutoff": cutoff.isoformat(),
                         "batches": outcome.batches[:MAX_LISTED_PATHS], "batch_count": len(outcome.batches)}))
        outcomes.append(outcome)
    return outcomes
