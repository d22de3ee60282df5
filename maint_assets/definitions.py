"""The code location: assembles assets, checks, jobs, sensors and resources. Nothing else lives here.

Built inside `@dg.definitions`, so the config file is read when the location loads, never at import;
no Spark session or catalog call happens until a run or a sensor tick needs one. Loading writes no
file and sets no environment variable: the instance home is prepared by the CLI, the runner and
`make ui` (`icemaint.app.instance.ensure_dagster_home`).
"""


import dagster as dg

from icemaint.config import load_config
from maint_assets.compaction import build_compaction_assets, table_compaction
from maint_assets.health import table_health
from maint_assets.jobs import build_jobs
from maint_assets.landing import ingest_job, landed_batches
from maint_assets.partitions import date_partitions, table_date_partitions, table_partitions
from maint_assets.retention import RETENTION_ASSETS
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource
from resources.settings import MaintenanceSettings
from resources.spark import SparkResource
from sensors.alerts import build_alert_sensors
from sensors.compaction import build_compaction_sensor
from sensors.discovery import build_discovery_sensor
from sensors.landing import build_landing_sensor
from sensors.reaper import build_reaper_sensor
from sensors.retention import build_retention_sensor
from sensors.schedules import build_window_schedule


def build_definitions(config_path: str | None = None) -> dg.Definitions:
    config = load_config(config_path)
    multi = table_date_partitions(config.dates_start)
    compaction = build_compaction_assets(multi)  # with `validation_report`, written in the same step
    jobs = build_jobs(table_partitions, multi)
    settings = MaintenanceSettings(config_path=str(config_path or config.source or ""))
    auto = config.automation
    return dg.Definitions(
        assets=[table_health, compaction, table_compaction, *RETENTION_ASSETS, landed_batches],
        # Also for the implicit asset job that UI materializations and backfills run: the default
        # multiprocess executor would start a Spark session per step.
        executor=dg.in_process_executor,
        jobs=[*jobs.values(), ingest_job],
        sensors=[build_discovery_sensor(jobs["health"], auto.discovery_interval),
                 build_compaction_sensor(jobs["compaction"], jobs["table_compaction"],
                                         date_partitions(config.dates_start), auto.compaction_interval),
                 build_retention_sensor(jobs["expiry"], jobs["orphans"], jobs["manifests"], jobs["statistics"],
                                        auto.orphan_removal, auto.retention_interval),
                 build_landing_sensor(ingest_job, auto.compaction_interval),
                 *build_alert_sensors([*jobs.values(), ingest_job]), build_reaper_sensor()],
        schedules=[build_window_schedule(jobs["compaction"], date_partitions(config.dates_start)),
                   build_window_schedule(jobs["table_compaction"], date_partitions(config.dates_start),
                                         per_table=True)],
        resources={
            "settings": settings,
            "spark": SparkResource(settings=settings),
            "catalog": IcebergCatalogResource(settings=settings),
            "claims": TableClaimResource(settings=settings),
            "audit": AuditResource(settings=settings),
        },
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions()
