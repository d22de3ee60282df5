"""An optional nightly maintenance window: the compaction sensor's decisions, applied on a schedule.

For estates that prefer maintenance at night: stop the sensor, start this schedule. It evaluates
every table (no cursor), so it also catches dates whose deferral has expired since the last commit.
"""

import datetime as dt

import dagster as dg

from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource
from sensors.compaction import batched_run_requests, evaluate_compaction

WINDOW_CRON = "0 2 * * *"


def build_window_schedule(job, date_partitions_def, per_table: bool = False) -> dg.ScheduleDefinition:
    """The window for dated compactions, or (per_table) for tables without a time column: a schedule
    targets one job, so each compaction job has its own window on the same cron."""
    @dg.schedule(name="nightly_table_window" if per_table else "nightly_maintenance_window", job=job,
                 cron_schedule=WINDOW_CRON, execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.STOPPED,
                 description="Nightly at 02:00 UTC: the compaction sensor's decisions over the whole estate"
                             + (" (tables without a time column)." if per_table else " (dates of tables)."))
    def window(context: dg.ScheduleEvaluationContext, catalog: IcebergCatalogResource,
               claims: TableClaimResource, audit: AuditResource):
        now = dt.datetime.now(dt.timezone.utc)
        date_keys = set(date_partitions_def.get_partition_keys(current_time=now))
        plan = evaluate_compaction(context.instance, catalog, claims, audit, None, now, date_keys, batch_dates=True)
        runs = [(d, h) for d, h in plan.runs if (d.date is None) == per_table]
        context.log.info(plan.summary())
        if not runs:
            return dg.SkipReason(plan.summary())
        return batched_run_requests(context.instance, catalog, runs, trigger="window")

    return window
