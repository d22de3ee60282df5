"""The retention sensor: expiry when due, orphan removal once an expiry finished, and manifest rewrites.

Observes metadata with pyiceberg; an unchanged table costs one metadata-location read. The decision
per table is `decide_retention`, a pure function; `evaluate_retention` is shared with `icemaint tick`.
"""


import datetime as dt
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Optional

import dagster as dg

from icemaint.audit import AuditRecord
from icemaint.decisions import DEFER, NOOP, REFUSE, RUN, refusal_for
from icemaint.housekeeping import EXPIRE, MANIFESTS, ORPHANS
from icemaint.policy import TablePolicy
from icemaint.retention import expiry_due, manifests_due
from icemaint.tick import policy_fingerprint
from maint_assets.partitions import TABLE_TAG, TRIGGER_TAG, table_partitions
from maint_assets.retention import run_table, runs_in_flight
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource

JOBS = {EXPIRE: "expiry_job", ORPHANS: "orphans_job", MANIFESTS: "manifests_job"}
ASSETS = {EXPIRE: "expired_snapshots", ORPHANS: "orphan_files", MANIFESTS: "rewritten_manifests"}


@dataclass(frozen=True)
class RetentionSignals:
    """What the sensor reads of one table (pyiceberg, no Spark)."""

    table: str
    metadata_location: str
    snapshots: int
    oldest_snapshot_at: Optional[float]  # epoch seconds, of the oldest snapshot no branch or tag points at
    manifests: int
    small_manifests: int


@dataclass(frozen=True)
class RetentionDecision:
    table: str
    operation: str
    verdict: str
    reason: str
    run_key: Optional[str] = None


@dataclass
class RetentionCursor:
    """Per table: the metadata location and policy last evaluated, and when to look again."""

    metadata_location: str
    policy: str
    recheck_at: Optional[float] = None   # epoch seconds: expiry becomes due by age alone
    pending: bool = False                # a deferral: evaluate again next tick even if unchanged
    requested: dict = field(default_factory=dict)  # operation -> run key last requested
    recorded: Optional[str] = None       # digest of the refusals/defers last written to the audit


@dataclass
class RetentionTickPlan:
    runs: list = field(default_factory=list)        # RetentionDecisions with verdict run
    decisions: list = field(default_factory=list)
    cursor: dict = field(default_factory=dict)
    evaluated: list = field(default_factory=list)
    unchanged: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)
    to_record: list = field(default_factory=list)

    def summary(self) -> str:
        text = (f"retention: {len(self.evaluated)} tables evaluated, {len(self.unchanged)} unchanged; "
                f"{len(self.runs)} runs requested")
        reasons = [f"{d.table} {d.operation}: {d.verdict}: {d.reason}" for d in self.decisions]
        reasons += [f"{t}: ERROR {e}" for t, e in self.errors.items()]
        return text + ("\n" + "\n".join(reasons[:50]) if reasons else "")


def encode_cursor(cursor: dict) -> str:
    return json.dumps({t: asdict(c) for t, c in sorted(cursor.items())})


def decode_cursor(text: Optional[str]) -> dict:
    if not text:
        return {}
    return {t: RetentionCursor(**v) for t, v in json.loads(text).items()}


def read_signals(tbl, table: str, policy: TablePolicy) -> RetentionSignals:
    """Snapshot count and age and manifest sizes from a pyiceberg table (reads the manifest list only)."""
    snapshots = tbl.metadata.snapshots
    # Branch heads and tagged snapshots never expire: an old tag must not make expiry due forever.
    referenced = {ref.snapshot_id for ref in tbl.metadata.refs.values()}
    expirable = [s.timestamp_ms for s in snapshots if s.snapshot_id not in referenced]
    lengths = tbl.inspect.manifests().column("length").to_pylist() if tbl.current_snapshot() else []
    return RetentionSignals(
        table=table, metadata_location=tbl.metadata_location, snapshots=len(snapshots),
        oldest_snapshot_at=min(expirable) / 1000 if expirable else None,
        manifests=len(lengths), small_manifests=sum(1 for n in lengths if n < policy.manifest_small_bytes))


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def expiry_due_at(signals: RetentionSignals, policy: TablePolicy) -> Optional[float]:
    """When expiry becomes due by age alone on an unchanged table (epoch seconds), or None if never."""
    if signals.oldest_snapshot_at is None or signals.snapshots <= policy.snapshot_retain_last:
        return None
    threshold = (policy.snapshot_min_age_seconds if signals.snapshots > policy.snapshot_max_count
                 else max(policy.snapshot_older_than_seconds, policy.snapshot_min_age_seconds))
    return signals.oldest_snapshot_at + threshold + 1.0


def decide_retention(signals: RetentionSignals, policy: TablePolicy, identity: str, now: dt.datetime, *,
                     claim_holder: Optional[str], in_flight_jobs: set, expiry_mark: Optional[int],
                     orphans_mark: Optional[int], requested: Optional[dict] = None) -> list[RetentionDecision]:
    """Expiry, orphan and manifest decisions for one table.

    Args:
        signals: The table's metadata, as the sensor read it.
        policy: The table's policy.
        identity: Who maintenance runs as.
        now: The tick's time (timezone-aware).
        claim_holder: Who holds the table's claim, or None.
        in_flight_jobs: Jobs with a queued or running run on this table.
        expiry_mark: Event id of the table's latest expired_snapshots materialization (None: never).
        orphans_mark: Event id of its latest orphan_files materialization (None: never).
        requested: Operation -> run key already requested; the same key again is not a new run.
    """
    table = signals.table
    location_key = _digest(signals.metadata_location)
    age = max(now.timestamp() - signals.oldest_snapshot_at, 0.0) if signals.oldest_snapshot_at else 0.0

    def gated(operation: str, why: str, run_key: str, busy_jobs: set) -> RetentionDecision:
        refused = refusal_for(policy, operation, identity)
        if refused:
            return RetentionDecision(table, operation, REFUSE, refused)
        if busy_jobs:
            return RetentionDecision(table, operation, DEFER,
                                     f"{why}; waiting for runs in flight on the table: {', '.join(sorted(busy_jobs))}")
        if claim_holder:
            return RetentionDecision(table, operation, DEFER, f"claim busy: held by {claim_holder}")
        if (requested or {}).get(operation) == run_key:
            # Dagster skips a repeated run key anyway; saying so keeps the tick honest.
            return RetentionDecision(table, operation, NOOP, f"already requested ({run_key}): {why}")
        return RetentionDecision(table, operation, RUN, why, run_key)

    if expiry_mark is None:
        orphans = RetentionDecision(table, ORPHANS, NOOP, "no snapshot expiry yet: orphan removal follows an expiry")
    elif orphans_mark is not None and orphans_mark > expiry_mark:
        orphans = RetentionDecision(table, ORPHANS, NOOP, "orphan files were removed after the latest expiry")
    else:
        # Never while anything runs on the table: its files in flight would look orphaned.
        orphans = gated(ORPHANS, "an expiry finished after the last orphan removal",
                        f"orphans:{table}:{expiry_mark}", set(in_flight_jobs))

    due, why = expiry_due(signals.snapshots, age, policy)
    if not due:
        expire = RetentionDecision(table, EXPIRE, NOOP, why)
    elif orphans.verdict in (RUN, DEFER):
        # The finished expiry's orphans go first: on a busy table expiry is due again at every
        # change, and orphan removal must not starve behind it (nor run at the same time).
        expire = RetentionDecision(table, EXPIRE, DEFER, f"{why}; orphan removal after the previous expiry goes first")
    else:
        expire = gated(EXPIRE, why, f"expire:{table}:{location_key}", in_flight_jobs & {JOBS[EXPIRE]})

    due, why = manifests_due(signals.manifests, signals.small_manifests, policy)
    manifests = (gated(MANIFESTS, why, f"manifests:{table}:{location_key}", in_flight_jobs & {JOBS[MANIFESTS]})
                 if due else RetentionDecision(table, MANIFESTS, NOOP, why))
    return [expire, orphans, manifests]


def _latest_materialization(instance, asset: str, table: str) -> Optional[int]:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[table]), limit=1).records
    return records[0].storage_id if records else None


def in_flight_jobs_by_table(instance) -> dict:
    """Table -> names of jobs with a queued or running run on it."""
    out: dict = {}
    for run in runs_in_flight(instance):
        table = run_table(run)
        if table:
            out.setdefault(table, set()).add(run.job_name)
    return out


def evaluate_retention(instance, catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource,
                       cursor_text: Optional[str], now: dt.datetime) -> RetentionTickPlan:
    """The tick's retention plan: shared by the sensor and `icemaint tick`."""
    config = catalog.settings.config
    identity = config.identity()
    cursor = decode_cursor(cursor_text)
    plan = RetentionTickPlan()
    in_flight = None
    for table in instance.get_dynamic_partitions(table_partitions.name):
        try:
            location = catalog.metadata_location(table)
        except Exception as exc:  # one unreadable table must not stop the estate's tick; it is reported
            plan.errors[table] = f"{type(exc).__name__}: {exc}"
            continue
        policy = config.policy(table)
        fingerprint = policy_fingerprint(policy)
        previous = cursor.get(table)
        if (previous and previous.metadata_location == location and previous.policy == fingerprint
                and not previous.pending and (previous.recheck_at is None or now.timestamp() < previous.recheck_at)):
            plan.cursor[table] = previous
            plan.unchanged.append(table)
            continue
        try:
            signals = read_signals(catalog.reader.load(table), table, policy)
        except Exception as exc:  # as above; no cursor entry, so the next tick reads it again
            plan.errors[table] = f"{type(exc).__name__}: {exc}"
            continue
        if in_flight is None:
            in_flight = in_flight_jobs_by_table(instance)
        info = claims.holder_of(table)
        decisions = decide_retention(
            signals, policy, identity, now, claim_holder=info.holder if info else None,
            in_flight_jobs=in_flight.get(table, set()),
            expiry_mark=_latest_materialization(instance, ASSETS[EXPIRE], table),
            orphans_mark=_latest_materialization(instance, ASSETS[ORPHANS], table),
            requested=previous.requested if previous else None)
        requested = dict(previous.requested) if previous else {}
        for d in decisions:
            if d.verdict == RUN:
                requested[d.operation] = d.run_key
                plan.runs.append(d)
        final = decisions
        plan.evaluated.append(table)
        plan.decisions.extend(final)
        notable = [d for d in final if d.verdict == REFUSE or (d.verdict == DEFER and d.reason.startswith("claim busy"))]
        digest = _digest("\n".join(f"{d.operation}|{d.verdict}|{d.reason.split(':', 1)[0]}" for d in notable)) \
            if notable else None
        if digest is not None and (previous is None or previous.recorded != digest):
            plan.to_record.extend(notable)
        due_at = expiry_due_at(signals, policy)
        plan.cursor[table] = RetentionCursor(
            location, fingerprint, recheck_at=due_at if due_at is not None and due_at > now.timestamp() else None,
            pending=any(d.verdict == DEFER for d in final), requested=requested, recorded=digest)
    for d in plan.to_record:
        audit.append(AuditRecord(table=d.table, operation=d.operation, decision=d.verdict, reason=d.reason,
                                 trigger="sensor", identity=identity))
    return plan


def retention_run_request(decision: RetentionDecision, trigger: str = "sensor") -> dg.RunRequest:
    return dg.RunRequest(run_key=decision.run_key, job_name=JOBS[decision.operation], partition_key=decision.table,
                         tags={TABLE_TAG: decision.table, TRIGGER_TAG: trigger})


def build_retention_sensor(expiry_job, orphans_job, manifests_job) -> dg.SensorDefinition:
    @dg.sensor(name="retention_sensor", jobs=[expiry_job, orphans_job, manifests_job], minimum_interval_seconds=60,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Polls each table's metadata; requests snapshot expiry when due, orphan-file removal "
                           "once an expiry finished and nothing else runs on the table, and a manifest rewrite "
                           "when the manifest thresholds pass. Refusals and busy claims go to the audit trail.")
    def retention_sensor(context: dg.SensorEvaluationContext, catalog: IcebergCatalogResource,
                         claims: TableClaimResource, audit: AuditResource):
        plan = evaluate_retention(context.instance, catalog, claims, audit, context.cursor,
                                  dt.datetime.now(dt.timezone.utc))
        summary = plan.summary()
        context.log.info(summary)
        requests = [retention_run_request(d) for d in plan.runs]
        return dg.SensorResult(run_requests=requests, cursor=encode_cursor(plan.cursor),
                               skip_reason=None if requests else summary)

    return retention_sensor
