"""`expired_snapshots`, `orphan_files`, `rewritten_manifests` and `column_statistics` (per table), run by
`icemaint.operations.housekeeping`.

Each materializes only when it changed the table or its files; dry runs, defers and noops are
observations, and a refusal is an observation followed by a Failure naming the policy.
"""


import warnings
from typing import Callable, Optional

import dagster as dg

from icemaint.operations.expiry import ExpiryRequest
from icemaint.operations.housekeeping import Housekeeper
from icemaint.operations.manifests import ManifestRequest
from icemaint.operations.orphans import OrphanRequest
from icemaint.operations.retention_outcome import RetentionOutcome
from icemaint.operations.statistics import StatisticsRequest
from icemaint.domain.retention_tick import EXPIRE, MANIFESTS, ORPHANS, STATISTICS
from icemaint.domain.units import parse_duration
from maint_assets.compaction import table_dimension_mapping
from maint_assets.partitions import PLANNED_SNAPSHOT_TAG, TRIGGER_TAG, run_agent_reason, run_identity
from maint_assets.health import table_health
from maint_assets.metadata import as_json, materializes, numeric, partition_error, report_outcome, run_failure
from maint_assets.partitions import table_of, table_partitions, tables_of
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource
from resources.spark import SparkResource

COMPACTION_JOB = "compaction_job"
# The retention sensor's runs (and backfills) cover up to this many neighbouring tables due for one operation.
RETENTION_TABLES_PER_RUN = 31
# Each retention operation's asset (its job: `icemaint.domain.retention_tick.RETENTION_JOBS`).
RETENTION_ASSET_OF = {EXPIRE: "expired_snapshots", ORPHANS: "orphan_files", MANIFESTS: "rewritten_manifests",
                      STATISTICS: "column_statistics"}
IN_FLIGHT_STATUSES = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                      dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)


class ExpiryConfig(dg.Config):
    dry_run: bool = False
    older_than: Optional[str] = None
    retain_last: Optional[int] = None
    keep_files: Optional[bool] = None


class OrphanConfig(dg.Config):
    dry_run: bool = False
    older_than: Optional[str] = None
    force: bool = False
    quarantine: bool = False


class ManifestConfig(dg.Config):
    dry_run: bool = False
    force: bool = False


class StatisticsConfig(dg.Config):
    dry_run: bool = False
    force: bool = False
    columns: Optional[list[str]] = None  # None: the policy's statistics_columns, else every primitive column


def run_table(run) -> Optional[str]:
    """The table a run maintains: its `icemaint/table` tag, else its partition's (or range's) table."""
    return table_of(run.tags)


def runs_in_flight(instance, job_name: Optional[str] = None) -> list:
    """Queued, starting and running runs (optionally of one job)."""
    return list(instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=list(IN_FLIGHT_STATUSES))))


def in_flight_jobs_by_table(instance) -> dict:
    """Table -> names of jobs with a queued or running run on it (every table a run over several names)."""
    out: dict = {}
    for run in runs_in_flight(instance):
        for table in tables_of(run.tags):
            out.setdefault(table, set()).add(run.job_name)
    return out


def in_flight_planned_snapshots(instance, table: str, exclude_run_id: Optional[str] = None) -> tuple[int, ...]:
    """Snapshots that queued or running compactions of `table` were planned on (their sensor tag)."""
    found = set()
    for run in runs_in_flight(instance, COMPACTION_JOB):
        planned = run.tags.get(PLANNED_SNAPSHOT_TAG)
        if run.run_id != exclude_run_id and planned and run_table(run) == table:
            found.add(int(planned))
    return tuple(sorted(found))


def outcome_metadata(outcome: RetentionOutcome) -> dict:
    return {**numeric({**outcome.metrics, **outcome.durations}),
            "decision": dg.MetadataValue.text(str(outcome.decision)),
            "reason": dg.MetadataValue.text(outcome.reason),
            "dry_run": dg.MetadataValue.bool(outcome.dry_run),
            "before_snapshot_id": dg.MetadataValue.text(str(outcome.before_snapshot_id)),
            "after_snapshot_id": dg.MetadataValue.text(str(outcome.after_snapshot_id)),
            "metadata_location": dg.MetadataValue.path(str(outcome.metadata_location_after)),
            "outcome": as_json(outcome.to_dict())}


def _duration(value: Optional[str], setting: str) -> Optional[float]:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise dg.Failure(description=f"invalid config {setting}: {exc}") from None


def _each_table(context: dg.AssetExecutionContext, asset_key: str,
                run_one: Callable[[str], tuple[RetentionOutcome, bool]]):
    """Runs `run_one(table) -> (outcome, done)` for each table of the run and reports each outcome.

    A run of one table materializes (or observes and, on a refusal, fails) as before. A run over several (the
    retention sensor's neighbouring tables due for the same operation, a backfill) reports each table on its own
    partition, goes on past one table's refusal or error, and fails at the end naming every table not done.
    """
    keys = list(context.partition_keys)
    if len(keys) == 1:
        outcome, done = run_one(keys[0])
        yield from _report(context, asset_key, outcome, done)
        return
    failures = []
    for key in keys:
        try:
            outcome, done = run_one(key)
        except Exception as exc:  # already in the table's audit record where it got that far
            context.log.error(f"{key}: {asset_key} failed: {partition_error(exc)}")
            failures.append(f"{key}: {partition_error(exc)}")
            continue
        materialize, failure = _verdict(context, outcome, done)
        event = dg.AssetMaterialization if materialize else dg.AssetObservation
        yield event(asset_key=asset_key, partition=key, metadata=outcome_metadata(outcome))
        if failure:
            failures.append(failure)
    if failures:
        raise dg.Failure(description=f"{len(failures)} of {len(keys)} tables not done: " + "; ".join(failures))


def _verdict(context: dg.AssetExecutionContext, outcome: RetentionOutcome, done: bool) -> tuple[bool, str | None]:
    """(whether the outcome materializes, the run's failure it makes or None)."""
    context.log.info(f"{outcome.table} {outcome.operation}: {outcome.decision}: {outcome.reason}")
    trigger = context.run.tags.get(TRIGGER_TAG, "manual")
    failure = run_failure(trigger, outcome.decision,
                          refused=f"refused {outcome.operation} on {outcome.table}: {outcome.reason}",
                          not_done=f"{outcome.operation} on {outcome.table} not done: {outcome.reason}")
    return materializes(trigger, outcome.decision, outcome.dry_run, done=done), failure


def _report(context: dg.AssetExecutionContext, asset_key: str, outcome: RetentionOutcome, done: bool):
    """Yield the outcome as the asset's materialization, or observe it (and fail on a refusal)."""
    materialize, failure = _verdict(context, outcome, done)
    yield from report_outcome(context, asset_key, outcome_metadata(outcome), materialize=materialize,
                              refusal=failure)


def _housekeeper(context, spark: SparkResource, catalog: IcebergCatalogResource, claims: TableClaimResource,
                 audit: AuditResource) -> Housekeeper:
    return Housekeeper(spark.settings.config, spark.session, catalog.reader, claims.claims, audit.log,
                       progress=context.log.info)


def _request_fields(context: dg.AssetExecutionContext, table: str) -> dict:
    trigger = context.run.tags.get(TRIGGER_TAG, "manual")
    return {"table": table, "trigger": trigger, "run_id": context.run.run_id,
            "identity": run_identity(context.run.tags), "agent_reason": run_agent_reason(context.run.tags)}


def _retention_asset(**kwargs):
    """A table-partitioned retention asset; a backfill or the sensor runs up to RETENTION_TABLES_PER_RUN
    tables a run (backfill policies are beta in Dagster 1.13; this one is deliberate)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.asset(partitions_def=table_partitions, group_name="maintenance", kinds={"spark", "iceberg"},
                        output_required=False, backfill_policy=dg.BackfillPolicy.multi_run(
                            max_partitions_per_run=RETENTION_TABLES_PER_RUN), **kwargs)


def _bad_config(exc: ValueError) -> dg.Failure:
    return dg.Failure(description=f"invalid config: {exc}")


@_retention_asset(
    # after the compaction of either kind of table: per date (table x date), or per partition (table)
    deps=[dg.AssetDep("compaction", partition_mapping=table_dimension_mapping()), dg.AssetDep("table_compaction")],
    description="Expires a table's old snapshots (expire_snapshots) by policy under the table's claim: never "
                "inside the owner's retention window, never a branch head, tag or the snapshot a queued or "
                "running compaction was planned on. Materializes only when snapshots were expired.",
)
def expired_snapshots(context: dg.AssetExecutionContext, config: ExpiryConfig, spark: SparkResource,
                      catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
    try:  # the settings, checked once before any table
        older_than = _duration(config.older_than, "older_than")
        ExpiryRequest(**_request_fields(context, context.partition_keys[0]), dry_run=config.dry_run,
                      older_than_seconds=older_than, retain_last=config.retain_last, keep_files=config.keep_files)
    except ValueError as exc:
        raise _bad_config(exc) from None
    housekeeper = _housekeeper(context, spark, catalog, claims, audit)

    def expire(table: str) -> tuple[RetentionOutcome, bool]:
        outcome = housekeeper.expire(ExpiryRequest(
            **_request_fields(context, table), dry_run=config.dry_run, older_than_seconds=older_than,
            retain_last=config.retain_last, keep_files=config.keep_files,
            in_flight_snapshot_ids=in_flight_planned_snapshots(context.instance, table, context.run.run_id)))
        return outcome, outcome.changed_table

    yield from _each_table(context, "expired_snapshots", expire)


@_retention_asset(
    deps=[expired_snapshots],
    description="Removes files under the table location that no snapshot references and that are older than "
                "the cutoff (default: the policy's orphan age, at least 24 h unless forced, which is audited); "
                "optionally moves them to <state_dir>/quarantine instead. Materializes whenever a real scan "
                "completed, also when it found nothing.",
)
def orphan_files(context: dg.AssetExecutionContext, config: OrphanConfig, spark: SparkResource,
                 catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
    try:  # the settings, checked once before any table
        older_than = _duration(config.older_than, "older_than")
        OrphanRequest(**_request_fields(context, context.partition_keys[0]), dry_run=config.dry_run,
                      older_than_seconds=older_than, force=config.force, quarantine=config.quarantine)
    except ValueError as exc:
        raise _bad_config(exc) from None
    housekeeper = _housekeeper(context, spark, catalog, claims, audit)

    def remove(table: str) -> tuple[RetentionOutcome, bool]:
        outcome = housekeeper.remove_orphans(OrphanRequest(
            **_request_fields(context, table), dry_run=config.dry_run, older_than_seconds=older_than,
            force=config.force, quarantine=config.quarantine))
        # A completed scan that found nothing still closes the expiry -> orphans step for the sensor.
        return outcome, not outcome.dry_run and outcome.decision in ("run", "noop")

    yield from _each_table(context, "orphan_files", remove)


@_retention_asset(
    deps=[table_health],
    description="Merges the current snapshot's small manifests (rewrite_manifests) when the policy's manifest "
                "thresholds say so, or when forced. Materializes only when manifests were rewritten.",
)
def rewritten_manifests(context: dg.AssetExecutionContext, config: ManifestConfig, spark: SparkResource,
                        catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
    housekeeper = _housekeeper(context, spark, catalog, claims, audit)

    def rewrite(table: str) -> tuple[RetentionOutcome, bool]:
        outcome = housekeeper.rewrite_manifests(ManifestRequest(**_request_fields(context, table),
                                                                dry_run=config.dry_run, force=config.force))
        return outcome, outcome.changed_table

    yield from _each_table(context, "rewritten_manifests", rewrite)


@_retention_asset(
    deps=[table_health],
    description="Computes the column statistics of the snapshot main points at (a Puffin file of theta sketches "
                "with each column's distinct-value estimate, what cost-based optimisers read) when the rows changed "
                "since the newest statistics exceed the policy's statistics_stale_fraction, or when forced. Adds a "
                "statistics file to the table's metadata; no snapshot, no ref moves. Materializes only when "
                "statistics were committed.",
)
def column_statistics(context: dg.AssetExecutionContext, config: StatisticsConfig, spark: SparkResource,
                      catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
    columns = tuple(config.columns) if config.columns is not None else None
    try:  # the settings, checked once before any table
        StatisticsRequest(**_request_fields(context, context.partition_keys[0]), columns=columns)
    except ValueError as exc:
        raise _bad_config(exc) from None
    housekeeper = _housekeeper(context, spark, catalog, claims, audit)

    def compute(table: str) -> tuple[RetentionOutcome, bool]:
        outcome = housekeeper.compute_statistics(StatisticsRequest(
            **_request_fields(context, table), dry_run=config.dry_run, force=config.force, columns=columns))
        return outcome, outcome.changed_table

    yield from _each_table(context, "column_statistics", compute)


RETENTION_ASSETS = (expired_snapshots, orphan_files, rewritten_manifests, column_statistics)
