"""Table discovery: keeps the `table` dynamic partitions equal to the catalog's tables (within scope)."""


import dagster as dg

from maint_assets.partitions import table_partitions
from resources.catalog import IcebergCatalogResource


def build_discovery_sensor(health_job) -> dg.SensorDefinition:
    @dg.sensor(name="table_discovery", job=health_job, minimum_interval_seconds=60,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Adds catalog tables (filtered by the config's scope) to the `table` partitions, "
                           "removes dropped ones, and requests a health snapshot of each new table.")
    def table_discovery(context: dg.SensorEvaluationContext, catalog: IcebergCatalogResource):
        found = set(catalog.list_tables())
        known = set(context.instance.get_dynamic_partitions(table_partitions.name))
        added, removed = sorted(found - known), sorted(known - found)
        if not added and not removed:
            return dg.SkipReason(f"no change: {len(known)} tables known")
        requests = []
        if added:
            requests.append(table_partitions.build_add_request(added))
        if removed:
            requests.append(table_partitions.build_delete_request(removed))
        context.log.info(f"tables added: {added}; removed: {removed}")
        return dg.SensorResult(
            dynamic_partitions_requests=requests,
            run_requests=[dg.RunRequest(partition_key=t, run_key=f"discovered:{t}", tags={"icemaint/table": t})
                          for t in added],
        )

    return table_discovery
