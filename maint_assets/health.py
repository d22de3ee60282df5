"""`table_health`: per-table health numbers read from Iceberg metadata (pyiceberg, no Spark)."""


import datetime as dt
import warnings

import dagster as dg

from icemaint.domain.decisions import Gates, decide_table_compactions
from icemaint.domain.tick import table_summary

from icemaint.domain.layout import describe
from icemaint.domain.units import human_duration
from maint_assets.metadata import as_json, markdown_table, numeric, partition_error
from maint_assets.partitions import table_partitions
from resources.catalog import IcebergCatalogResource

HEALTH_NUMBERS = ("data_files", "small_files", "total_bytes", "avg_file_bytes", "median_file_bytes", "records",
                  "delete_files", "delete_records", "deleted_row_ratio", "manifests", "manifest_bytes",
                  "small_manifests", "snapshots", "oldest_snapshot_age_seconds", "metadata_files", "metadata_bytes",
                  "metadata_files_below_log", "metadata_bytes_below_log",
                  "equality_delete_files", "equality_delete_records", "deletion_vectors",
                  "seconds_since_writer_commit", "drift_files", "drift_bytes", "old_spec_files", "unsorted_files",
                  "oversized_files")


# The discovery sensor's health runs: a new estate's tables are observed up to this many a run (one run
# worker where each table was one; health is metadata only, a fraction of a second a table).
HEALTH_TABLES_PER_RUN = 100


with warnings.catch_warnings():  # backfill policies are beta in Dagster 1.13; this one is deliberate
    warnings.simplefilter("ignore", dg.BetaWarning)
    _health_asset = dg.asset(
        partitions_def=table_partitions,
        group_name="maintenance",
        kinds={"iceberg"},
        output_required=False,
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=HEALTH_TABLES_PER_RUN),
        description="Health of one Iceberg table at its current snapshot: files, small files, sizes, deletes, "
                    "manifests, snapshots, metadata files, and who committed last.",
    )


@_health_asset
def table_health(context: dg.AssetExecutionContext, catalog: IcebergCatalogResource):
    """One table's health as the run's materialization; a run over several tables (the discovery sensor's, a
    backfill) materializes each on its own and fails at the end naming every table it could not read."""
    keys = list(context.partition_keys)
    if len(keys) == 1:
        yield dg.MaterializeResult(metadata=health_metadata(context, catalog, keys[0]))
        return
    failed = []
    for key in keys:
        try:
            yield dg.AssetMaterialization(asset_key="table_health", partition=key,
                                          metadata=health_metadata(context, catalog, key))
        except Exception as exc:  # one table's read does not stop the others'; the run fails below
            context.log.error(f"{key}: health not read: {partition_error(exc)}")
            failed.append(f"{key}: {partition_error(exc)}")
    if failed:
        raise dg.Failure(description=f"{len(failed)} of {len(keys)} tables not read: " + "; ".join(failed))


def _ago(seconds: float | None) -> str:
    return "-" if seconds is None else f"{human_duration(max(seconds, 0.0))} ago"


def health_metadata(context, catalog: IcebergCatalogResource, table: str) -> dict:
    health = catalog.health(table, measure_metadata=True)
    config = catalog.settings.config
    # What compaction would decide now (claim and approvals aside): a table that cannot be maintained says why.
    decisions = decide_table_compactions(health, config.policy(health.table),
                                         Gates(now=dt.datetime.now(dt.timezone.utc), identity=config.identity()))
    values = health.to_dict()
    partitions = values.pop("partitions")
    context.log.info(f"{health.table}: {health.data_files} data files ({health.small_files} small), "
                     f"{health.delete_files} delete files, {health.snapshots} snapshots; maintained "
                     f"{health.maintained_as}; compaction now: {table_summary(decisions)}")
    return {
        **numeric({k: values[k] for k in HEALTH_NUMBERS}),
        "snapshot_id": dg.MetadataValue.text(str(health.snapshot_id)),
        "metadata_location": dg.MetadataValue.path(health.metadata_location),
        "last_commit_at": dg.MetadataValue.text(str(health.last_commit_at)),
        "last_commit_by": dg.MetadataValue.text(str(health.last_commit_by)),
        "time_column": dg.MetadataValue.text(f"{health.time_column} ({health.time_transform})"),
        "maintained_as": dg.MetadataValue.text(health.maintained_as),
        "compaction_now": dg.MetadataValue.text(table_summary(decisions)),
        "partitions": markdown_table([{**p, "partition": describe(p["key"]),
                                       "last_writer_commit": _ago(p["seconds_since_writer_commit"])}
                                      for p in partitions],
                                     ["partition", "data_files", "small_files", "total_bytes", "records",
                                      "delete_files", "delete_records", "equality_delete_files",
                                      "deletion_vectors", "drift_files", "drift_bytes", "last_writer_commit"]),
        "health": as_json({**health.to_dict(), "compaction_now": table_summary(decisions)}),
    }
