"""Jobs over the maintenance assets. Spark work runs in process: one session per run, not per step."""


import dagster as dg


def build_jobs(table_partitions_def, table_date_partitions_def) -> dict:
    return {
        "health": dg.define_asset_job("health_job", selection=["table_health"], partitions_def=table_partitions_def,
                                      executor_def=dg.in_process_executor),
        "compaction": dg.define_asset_job(
            "compaction_job", selection=dg.AssetSelection.assets("compaction", "validation_report").without_checks()
            | dg.AssetSelection.checks_for_assets("compaction"),
            partitions_def=table_date_partitions_def, executor_def=dg.in_process_executor),
    }
