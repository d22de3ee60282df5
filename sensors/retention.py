"""The retention sensor: adapts the pure retention tick (`icemaint.domain.retention_tick`) to Dagster.

It supplies the tick's reads (metadata locations and signals through pyiceberg, claims, runs in
flight and the latest materializations from the instance) and turns its runs into RunRequests.
`evaluate_retention` is shared with `icemaint tick`.
"""


import datetime as dt
import hashlib
from collections.abc import Sequence
from typing import Optional

import dagster as dg

from icemaint.safety.audit import AuditRecord
from icemaint.observe.manifests import read_retention_signals
from icemaint.domain.retention_tick import RETENTION_JOBS, RetentionDecision, \
    RetentionTickPlan, decode_cursor, encode_cursor, plan_retention_tick
from icemaint.domain.tick import policy_fingerprint, table_batches
from maint_assets.partitions import TABLE_TAG, TRIGGER_TAG, slot_tags, table_partitions, table_slot, \
    tables_range_tags
from maint_assets.retention import RETENTION_ASSET_OF, RETENTION_TABLES_PER_RUN, in_flight_jobs_by_table
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource



def _latest_materialization(instance, asset: str, table: str) -> Optional[int]:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[table]), limit=1).records
    return records[0].storage_id if records else None


def evaluate_retention(instance, catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource,
                       cursor_text: Optional[str], now: dt.datetime, tables: Optional[list[str]] = None,
                       record: bool = True) -> RetentionTickPlan:
    """The tick's retention plan: shared by the sensor and `icemaint tick` (`tables` and `record` as in
    `evaluate_compaction`: a dry run's)."""
    config = catalog.settings.config
    identity = config.identity()

    def holder(table: str) -> Optional[str]:
        info = claims.holder_of(table)
        return info.holder if info else None

    plan = plan_retention_tick(
        instance.get_dynamic_partitions(table_partitions.name) if tables is None else tables,
        policy_of=config.policy, policy_fingerprint=policy_fingerprint, identity=identity,
        metadata_location=catalog.metadata_location,
        read_signals=lambda table, policy: read_retention_signals(catalog.reader.load(table), table, policy),
        claim_holder=holder, in_flight_jobs=lambda: in_flight_jobs_by_table(instance),
        latest_mark=lambda operation, table: _latest_materialization(instance, RETENTION_ASSET_OF[operation], table),
        cursor=decode_cursor(cursor_text), now=now, orphan_removal=config.automation.orphan_removal)
    for d in plan.to_record if record else ():
        audit.append(AuditRecord(table=d.table, operation=str(d.operation), decision=str(d.verdict), reason=d.reason,
                                 trigger="sensor", identity=identity, details={"reason_kind": str(d.kind)}))
    return plan


def retention_run_request(decision: RetentionDecision, trigger: str = "sensor") -> dg.RunRequest:
    return dg.RunRequest(run_key=decision.run_key, job_name=RETENTION_JOBS[decision.operation], partition_key=decision.table,
                         tags={TABLE_TAG: decision.table, TRIGGER_TAG: trigger})


def retention_batches(runs: list[RetentionDecision], order: Sequence[str],
                      spread: int = 1) -> list[list[tuple[str, str]]]:
    """The retention runs' (table, operation) pairs, each once, in runs: neighbouring tables in `order` due for the same operation
    together (`tick.table_batches`, the operation in the date's place: at most RETENTION_TABLES_PER_RUN, a stretch
    cut into at least `spread` runs, different queue slots); a table due for two operations alone. Shared by the
    sensor and `icemaint tick`."""
    keys = dict.fromkeys((d.table, str(d.operation)) for d in runs)  # each once, in the runs' order
    return table_batches([[key] for key in keys], order, RETENTION_TABLES_PER_RUN, spread=spread, slot=table_slot)


def retention_run_requests(runs: list[RetentionDecision], order: Sequence[str], spread: int = 1,
                           trigger: str = "sensor") -> list[dg.RunRequest]:
    """The tick's retention runs as requests: neighbouring tables in `order` (the `table` partitions' order) due
    for the same operation as one run over their range (`tick.table_batches`: at most RETENTION_TABLES_PER_RUN
    tables, a stretch cut into at least `spread` runs, tables of a run in different queue slots); a table due for
    two operations this tick, or alone, as `retention_run_request`'s. One run worker and Spark session where each
    table was one; each table still its own claim, audit record and materialization."""
    by_key = {(d.table, str(d.operation)): d for d in runs}
    requests = []
    for batch in retention_batches(runs, order, spread):
        decisions = [by_key[key] for key in batch]
        if len(decisions) == 1:
            requests.append(retention_run_request(decisions[0], trigger))
            continue
        tables = [d.table for d in decisions]
        operation = decisions[0].operation
        keys = hashlib.sha256(",".join(str(d.run_key) for d in decisions).encode()).hexdigest()[:16]
        requests.append(dg.RunRequest(
            run_key=f"{operation}:{tables[0]}..{tables[-1]}:{keys}", job_name=RETENTION_JOBS[operation],
            tags={TRIGGER_TAG: trigger, **tables_range_tags(tables), **slot_tags(tables)}))
    return requests


def retention_description(orphan_removal: bool) -> str:
    """The sensor's description, as the UI shows it: what it starts on its own under this config."""
    orphans = ("orphan-file removal once an expiry finished and nothing else runs on the table "
               "(automation.orphan_removal: true)" if orphan_removal else
               "never orphan-file removal (it deletes files: off until automation.orphan_removal: true; "
               "`icemaint orphans TABLE` runs it once)")
    return ("Polls each table's metadata; requests snapshot expiry when due, a manifest rewrite when the manifest "
            "thresholds pass, column statistics of the current snapshot when the policy keeps them and enough rows "
            f"changed, and {orphans}. Quarantine purge is never automatic. Refusals and busy claims go to the audit "
            "trail; a tick that requests nothing says why.")


def build_retention_sensor(expiry_job, orphans_job, manifests_job, statistics_job,
                           orphan_removal: bool = False, interval_seconds: int = 60) -> dg.SensorDefinition:
    @dg.sensor(name="retention_sensor", jobs=[expiry_job, orphans_job, manifests_job, statistics_job],
               minimum_interval_seconds=interval_seconds, default_status=dg.DefaultSensorStatus.RUNNING,
               description=retention_description(orphan_removal))
    def retention_sensor(context: dg.SensorEvaluationContext, catalog: IcebergCatalogResource,
                         claims: TableClaimResource, audit: AuditResource):
        plan = evaluate_retention(context.instance, catalog, claims, audit, context.cursor,
                                  dt.datetime.now(dt.timezone.utc))
        summary = plan.summary()
        context.log.info(summary)
        order = context.instance.get_dynamic_partitions(table_partitions.name) if len(plan.runs) > 1 else []
        requests = retention_run_requests(plan.runs, order, spread=catalog.settings.config.max_runs_total)
        return dg.SensorResult(run_requests=requests, cursor=encode_cursor(plan.cursor),
                               skip_reason=None if requests else summary)

    return retention_sensor
