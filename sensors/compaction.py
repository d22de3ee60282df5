"""The compaction sensor: observes metadata (pyiceberg), decides per table/date, requests runs or records why not."""


import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Sequence

import dagster as dg

from icemaint.safety.approvals import UNPUBLISHED_RUN_ENDS, held_runs, is_approved, reverted_scopes
from icemaint.safety.audit import AuditRecord
from icemaint.safety.health_store import HealthStore
from icemaint.domain.health_summary import summarize_health, summarize_screened
from icemaint.domain.screen import Screened
from icemaint.domain.verdicts import DEFER, REFUSE
from icemaint.domain.tick import KeptHealths, date_batches, decode_cursor, encode_cursor, plan_compaction_tick, \
    table_batches
from maint_assets.compaction import BACKFILL_DATES_PER_RUN, PARTITIONS_PER_RUN
from maint_assets.metadata import numeric
from maint_assets.retention import in_flight_jobs_by_table
from maint_assets.partitions import PLANNED_SCHEMA_TAG, PLANNED_SNAPSHOT_TAG, TABLE_TAG, TRIGGER_TAG, \
    date_range_tags, slot_tags, table_date_key, table_partitions, table_range_tags, table_slot
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource

MAX_RUNS_PER_TICK = 20


COMPACTION_JOB, TABLE_COMPACTION_JOB = "compaction_job", "table_compaction_job"


Attempts = Callable[[str, "str | None"], int]


def no_attempts(table: str, date: str | None) -> int:
    return 0


def _retry(n: int) -> str:
    """The run key's suffix for the n-th retry of a request (none for the first)."""
    return f":retry{n}" if n else ""


def compaction_run_request(decision, health, trigger: str = "sensor", attempts: Attempts = no_attempts
                           ) -> dg.RunRequest:
    """A dated decision runs `compaction_job` on its (date, table); a table without a time column runs
    `table_compaction_job` on the table. The run key names the table, scope and planned snapshot, and how many
    runs of the scope ended without publishing (`attempts`): the same request again is skipped by Dagster, the
    one after such a run (a retry, or a run an operator's approval lets go) is not."""
    dated = decision.date is not None
    return dg.RunRequest(
        run_key=(f"compact:{decision.table}:{decision.date or 'partitions'}:{health.snapshot_id}"
                 f"{_retry(attempts(decision.table, decision.date))}"),
        partition_key=table_date_key(decision.table, decision.date) if dated else decision.table,
        job_name=COMPACTION_JOB if dated else TABLE_COMPACTION_JOB,
        tags={TABLE_TAG: decision.table, TRIGGER_TAG: trigger, **slot_tags([decision.table]),
              PLANNED_SNAPSHOT_TAG: str(health.snapshot_id), PLANNED_SCHEMA_TAG: str(health.schema_id)},
    )


def compaction_run_requests(runs, trigger: str = "sensor", order: Sequence[str] = (),
                            spread: int = 1, attempts: Attempts = no_attempts) -> list[dg.RunRequest]:
    """The tick's runs as requests: a table's consecutive due dates as one run over their partition range (at
    most BACKFILL_DATES_PER_RUN dates), and the same dates of tables next to each other in `order` (the `table`
    partitions' order) as one run over theirs (`tick.table_batches`: at most PARTITIONS_PER_RUN table-dates, a
    stretch cut into at least `spread` runs, tables of a run in different queue slots). One run worker, Spark
    session and claim wait where each table-date was its own; each table-date still its own decision at run
    time, proof, audit record and materialization. Any other run is `compaction_run_request`'s. Requests are in
    the tick's rank order."""
    by_key = {(d.table, d.date): (d, h) for d, h in runs}
    requests = []
    batches = table_batches(date_batches(list(by_key), BACKFILL_DATES_PER_RUN), order, PARTITIONS_PER_RUN,
                            spread=spread, slot=table_slot)
    for batch in batches:
        decision, health = by_key[batch[0]]
        if len(batch) == 1:
            requests.append(compaction_run_request(decision, health, trigger, attempts))
            continue
        tables = list(dict.fromkeys(table for table, _ in batch))
        dates = [date for table, date in batch if table == tables[0]]
        first, last = dates[0], dates[-1]
        retry = _retry(sum(attempts(table, date) for table, date in batch))
        if len(tables) == 1:
            key = f"compact:{decision.table}:{first}..{last}:{health.snapshot_id}{retry}"
            tags = {TABLE_TAG: decision.table, **date_range_tags(decision.table, first, last)}
        else:
            # The key holds every table's planned snapshot: the same batch after a commit to one is a new run.
            snapshots = ",".join(f"{t}@{by_key[(t, first)][1].snapshot_id}" for t in tables)
            digest = hashlib.sha256(snapshots.encode()).hexdigest()[:16]
            key = f"compact:{tables[0]}..{tables[-1]}:{first}..{last}:{digest}{retry}"
            tags = table_range_tags(tables, first, last)
        requests.append(dg.RunRequest(run_key=key, job_name=COMPACTION_JOB,
                                      tags={TRIGGER_TAG: trigger, **tags, **slot_tags(tables)}))
    return requests


def batched_run_requests(instance, catalog: IcebergCatalogResource, runs, trigger: str = "sensor",
                         attempts: Attempts = no_attempts) -> list[dg.RunRequest]:
    """`compaction_run_requests` in the `table` partitions' order, a stretch of tables spread over as many runs
    as the run queue runs at once (its global cap)."""
    order = instance.get_dynamic_partitions(table_partitions.name) if len(runs) > 1 else []
    return compaction_run_requests(runs, trigger, order=order, spread=catalog.settings.config.max_runs_total,
                                   attempts=attempts)


class TickHistory:
    """The audit log read at most once per tick (and only if some table is evaluated), indexed by table.

    Reading it per evaluated table made a tick cost tables x log size.
    """

    def __init__(self, log):
        self.log = log
        self._by_table = None

    def _records(self, table: str) -> list:
        if self._by_table is None:
            self._by_table = {}
            for r in self.log.records():
                if r.operation in ("compact", "approve", "revert"):
                    self._by_table.setdefault(r.table, []).append(r)
        return self._by_table.get(table, [])

    def past_runs(self, table: str) -> list[dict]:
        return [r.details for r in self._records(table) if r.operation == "compact" and r.decision == "run"]

    def approved(self, table: str, date: str | None) -> bool:
        return is_approved(self._records(table), date)

    def reverted(self, table: str) -> dict:
        return reverted_scopes(self._records(table))

    def held(self, table: str) -> dict:
        return held_runs(self._records(table))

    def attempts(self, table: str, date: str | None) -> int:
        """How many runs of the scope ended without publishing (deferred at run time, proof failed, failed,
        interrupted): part of its run key, so the next request after one (a retry, or a run an approval let go)
        is a new request; Dagster skips a run key it has launched before."""
        return sum(1 for r in self._records(table) if r.operation == "compact" and r.date == date and r.run_id
                   and r.decision in UNPUBLISHED_RUN_ENDS and not r.details.get("dry_run"))


def evaluate_compaction(instance, catalog: IcebergCatalogResource, claims: TableClaimResource,
                        audit: AuditResource, cursor_text: str | None, now: dt.datetime, date_keys: set[str],
                        batch_dates: bool = False, kept: KeptHealths | None = None,
                        history: TickHistory | None = None, tables: list[str] | None = None, record: bool = True):
    """The tick's plan: shared by the sensor and `icemaint tick`. With `batch_dates` (`icemaint tick`, which
    runs a table's due dates as one Dagster run) the run budget counts tables, not table-dates. `kept`: the
    caller's `KeptHealths`, carried from its previous tick (with its cursor). `history`: the tick's read of the
    audit log, when the caller uses it too. `tables`: instead of the `table` partitions (a dry run's, with what
    discovery would add); `record` false: a dry run's deferrals and refusals are not written to the audit."""
    config = catalog.settings.config
    tables = instance.get_dynamic_partitions(table_partitions.name) if tables is None else tables

    def holder(table):
        info = claims.holder_of(table)
        return getattr(info, "holder", None) if info else None

    history = history or TickHistory(audit.log)
    plan = plan_compaction_tick(
        config, tables, metadata_location=catalog.metadata_location, health=catalog.tick_health,
        read=catalog.read_many,
        claim_holder=holder, approved=history.approved, past_runs=history.past_runs,
        cursor=decode_cursor(cursor_text), now=now, max_runs=MAX_RUNS_PER_TICK,
        valid_dates=lambda d: d in date_keys, run_of=(lambda d: d.table) if batch_dates else None, kept=kept,
        in_flight=lambda: in_flight_jobs_by_table(instance), reverted=history.reverted, held=history.held)
    for d in plan.to_record if record else ():
        if d.verdict in (DEFER, REFUSE):
            audit.append(AuditRecord(table=d.table, operation="compact", decision=d.verdict, reason=d.reason,
                                     date=d.date, trigger="sensor", identity=config.identity(),
                                     writer_check=d.writer_check, partition_rationale=d.rationale,
                                     cost_estimate=d.cost_estimate, details={"reason_kind": str(d.kind)}))
    if record:
        record_health(config, plan, tables, now)
    return plan


def record_health(config, plan, tables: list[str], now: dt.datetime) -> None:
    """The tick's health reads, summarised per table for `icemaint metrics` (`icemaint.safety.health_store`), with
    the tick's heartbeat. Metrics are not worth a tick: a store that cannot be written is logged, not raised."""
    decisions: dict[str, list] = {}
    for d in plan.decisions:
        decisions.setdefault(d.table, []).append(d)
    summaries = []
    for table, h in plan.observed.items():
        threshold = config.policy(table).min_input_files
        summaries.append(summarize_screened(h.table, h.metadata_location, h.data_files, h.snapshots, h.manifests,
                                            threshold, now) if isinstance(h, Screened)
                         else summarize_health(h, decisions.get(table, []), threshold, now))
    heartbeat = {"at": now.isoformat(), "tables": len(tables), "evaluated": len(plan.evaluated),
                 "unchanged": len(plan.unchanged), "errors": len(plan.errors)}
    try:
        HealthStore(config.state_dir).record(summaries, heartbeat, estate=tables)
    except OSError as exc:
        logging.getLogger(__name__).warning("health summaries for icemaint metrics not written: %s", exc)


def decision_observation(decision) -> dg.AssetObservation:
    """A defer or refusal as an observation on the `compaction` partition it concerns (the table's
    `table_compaction` partition when it has no date), so the partition's own history tells why it was
    not compacted (with the numbers behind it)."""
    rationale = {k: v for k, v in decision.rationale.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    writer = decision.writer_check or {}
    numbers = {**rationale, **({"seconds_since_writer_commit": writer["seconds_since_writer_commit"]}
                               if isinstance(writer.get("seconds_since_writer_commit"), (int, float)) else {})}
    return dg.AssetObservation(
        asset_key="compaction" if decision.date else "table_compaction",
        partition=table_date_key(decision.table, decision.date) if decision.date else decision.table,
        metadata={"decision": dg.MetadataValue.text(str(decision.verdict)),
                  "reason_kind": dg.MetadataValue.text(str(decision.kind)),
                  "reason": dg.MetadataValue.text(decision.reason),
                  "trigger": dg.MetadataValue.text("sensor"),
                  **numeric(numbers)})


def build_compaction_sensor(compaction_job, table_compaction_job, date_partitions_def,
                            interval_seconds: int = 30) -> dg.SensorDefinition:
    kept = KeptHealths()  # lives with the code location's process, as the sensor's ticks do
    # A sensor with several jobs names each request's job; `compaction_job` is the default.
    @dg.sensor(name="compaction_sensor", jobs=[compaction_job, table_compaction_job],
               minimum_interval_seconds=interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Polls each table's metadata; requests a compaction run for each (table, date) whose "
                           "thresholds pass, writers are idle, the claim is free and cost/policy allow (a table's "
                           "consecutive due dates as one run over their range); otherwise records a defer or "
                           "refusal in the audit trail.")
    def compaction_sensor(context: dg.SensorEvaluationContext, catalog: IcebergCatalogResource,
                          claims: TableClaimResource, audit: AuditResource):
        now = dt.datetime.now(dt.timezone.utc)
        date_keys = set(date_partitions_def.get_partition_keys(current_time=now))
        history = TickHistory(audit.log)
        plan = evaluate_compaction(context.instance, catalog, claims, audit, context.cursor, now, date_keys,
                                   batch_dates=True, kept=kept, history=history)
        summary = plan.summary()
        context.log.info(summary)
        requests = batched_run_requests(context.instance, catalog, plan.runs, attempts=history.attempts)
        # The decisions the audit just recorded (each once per change) also land on their partitions.
        observations = [decision_observation(d) for d in plan.to_record
                        if d.verdict in (DEFER, REFUSE) and (d.date is None or d.date in date_keys)]
        return dg.SensorResult(run_requests=requests, cursor=encode_cursor(plan.cursor),
                               asset_events=observations, skip_reason=None if requests else summary)

    return compaction_sensor
