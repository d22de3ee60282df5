"""`table_health`: per-table health numbers read from Iceberg metadata (pyiceberg, no Spark)."""


import datetime as dt

import dagster as dg

from icemaint.domain.decisions import Gates, decide_table_compactions
from icemaint.domain.tick import table_summary

from icemaint.domain.layout import describe
from maint_assets.metadata import as_json, markdown_table, numeric
from maint_assets.partitions import table_partitions
from resources.catalog import IcebergCatalogResource

HEALTH_NUMBERS = ("data_files", "small_files", "total_bytes", "avg_file_bytes", "median_file_bytes", "records",
                  "delete_files", "delete_records", "deleted_row_ratio", "manifests", "manifest_bytes",
                  "small_manifests", "snapshots", "oldest_snapshot_age_seconds", "metadata_files", "metadata_bytes",
                  "equality_delete_files", "equality_delete_records", "deletion_vectors",
                  "seconds_since_writer_commit")


@dg.asset(
    partitions_def=table_partitions,
    group_name="maintenance",
    kinds={"iceberg"},
    description="Health of one Iceberg table at its current snapshot: files, small files, sizes, deletes, "
                "manifests, snapshots, metadata files, and who committed last.",
)
def table_health(context: dg.AssetExecutionContext, catalog: IcebergCatalogResource) -> dg.MaterializeResult:
    health = catalog.health(context.partition_key, measure_metadata=True)
    config = catalog.settings.config
    # What compaction would decide now (claim and approvals aside): a table that cannot be maintained says why.
    decisions = decide_table_compactions(health, config.policy(health.table),
                                         Gates(now=dt.datetime.now(dt.timezone.utc), identity=config.identity()))
    values = health.to_dict()
    partitions = values.pop("partitions")
    context.log.info(f"{health.table}: {health.data_files} data files ({health.small_files} small), "
                     f"{health.delete_files} delete files, {health.snapshots} snapshots; maintained "
                     f"{health.maintained_as}; compaction now: {table_summary(decisions)}")
    return dg.MaterializeResult(metadata={
        **numeric({k: values[k] for k in HEALTH_NUMBERS}),
        "snapshot_id": dg.MetadataValue.text(str(health.snapshot_id)),
        "metadata_location": dg.MetadataValue.path(health.metadata_location),
        "last_commit_at": dg.MetadataValue.text(str(health.last_commit_at)),
        "last_commit_by": dg.MetadataValue.text(str(health.last_commit_by)),
        "time_column": dg.MetadataValue.text(f"{health.time_column} ({health.time_transform})"),
        "maintained_as": dg.MetadataValue.text(health.maintained_as),
        "compaction_now": dg.MetadataValue.text(table_summary(decisions)),
        "partitions": markdown_table([{**p, "partition": describe(p["key"])} for p in partitions],
                                     ["partition", "data_files", "small_files", "total_bytes", "records",
                                      "delete_files", "delete_records", "equality_delete_files",
                                      "deletion_vectors"]),
        "health": as_json({**health.to_dict(), "compaction_now": table_summary(decisions)}),
    })
