"""Jobs over the maintenance assets. Spark work runs in process: one session per run, not per step."""


import dagster as dg


def build_jobs(table_partitions_def=None, table_date_partitions_def=None) -> dict:
    # Each job's partitions are inferred from its assets: `partitions_def=` on asset jobs is deprecated
    # in Dagster 1.13 and warned at every load. The arguments stay for existing callers.
    return {
        "health": dg.define_asset_job("health_job", selection=["table_health"], executor_def=dg.in_process_executor),
        "compaction": dg.define_asset_job(
            "compaction_job", selection=dg.AssetSelection.assets("compaction", "validation_report").without_checks()
            | dg.AssetSelection.checks_for_assets("compaction"),
            executor_def=dg.in_process_executor),
        "table_compaction": dg.define_asset_job(
            "table_compaction_job", selection=dg.AssetSelection.assets("table_compaction").without_checks()
            | dg.AssetSelection.checks_for_assets("table_compaction"),
            executor_def=dg.in_process_executor),
        "expiry": dg.define_asset_job("expiry_job", selection=["expired_snapshots"], executor_def=dg.in_process_executor),
        "orphans": dg.define_asset_job("orphans_job", selection=["orphan_files"], executor_def=dg.in_process_executor),
        "manifests": dg.define_asset_job("manifests_job", selection=["rewritten_manifests"],
                                         executor_def=dg.in_process_executor),
        "statistics": dg.define_asset_job("statistics_job", selection=["column_statistics"],
                                          executor_def=dg.in_process_executor),
    }
