"""Table discovery: keeps the `table` dynamic partitions equal to the catalog's tables (within scope)."""

import dagster as dg

from icemaint.observe.catalog import CatalogUnavailable, WarehouseMissing
from maint_assets.health import HEALTH_TABLES_PER_RUN
from maint_assets.partitions import TABLE_TAG, table_partitions, tables_range_tags
from resources.catalog import IcebergCatalogResource


def discover_tables(instance, catalog: IcebergCatalogResource, notes: list[str] | None = None
                    ) -> tuple[list[str], list[str]]:
    """(added, removed) tables versus the known `table` partitions. Shared by the sensor and `icemaint tick`.

    A catalog that lists no table while tables are known is not taken as "every table was dropped": an unmounted or
    emptied warehouse looks just so, and removing every `table` partition would stop all maintenance. It raises
    instead, removing nothing (a deployment whose tables really are all gone removes them in the UI). A warehouse
    that does not exist yet, with no table known, is a fresh deployment: nothing to discover, and `notes` (when
    given) gets a line saying so, in case the path is a typo."""
    known = set(instance.get_dynamic_partitions(table_partitions.name))
    try:
        found = set(catalog.list_tables())
    except WarehouseMissing as exc:
        if not known:
            if notes is not None:
                notes.append(f"{str(exc).split(' (', 1)[0]} yet: no table to maintain")
            return [], []
        raise WarehouseMissing(f"{exc}, while {len(known)} known tables are registered: none was removed") from None
    if known and not found:
        raise CatalogUnavailable(f"catalog {catalog.settings.config.catalog.name!r} lists no table while "
                                 f"{len(known)} are registered (an empty or unmounted warehouse?): none was removed; "
                                 "if every table was dropped, delete the `table` partitions in the Dagster UI")
    return sorted(found - known), sorted(known - found)


def health_requests(added: list[str]) -> list[dg.RunRequest]:
    """A health run for the new tables: up to HEALTH_TABLES_PER_RUN a run over their range (they are added to the
    `table` partitions in this order, so each run's range holds exactly its tables), a single table as its own."""
    requests = []
    for start in range(0, len(added), HEALTH_TABLES_PER_RUN):
        part = added[start:start + HEALTH_TABLES_PER_RUN]
        if len(part) == 1:
            requests.append(dg.RunRequest(partition_key=part[0], run_key=f"discovered:{part[0]}",
                                          tags={TABLE_TAG: part[0]}))
        else:
            requests.append(dg.RunRequest(run_key=f"discovered:{part[0]}..{part[-1]}:{len(part)}",
                                          tags=tables_range_tags(part)))
    return requests


def build_discovery_sensor(health_job, interval_seconds: int = 60) -> dg.SensorDefinition:
    @dg.sensor(name="table_discovery", job=health_job, minimum_interval_seconds=interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Adds catalog tables (filtered by the config's scope) to the `table` partitions, "
                           "removes dropped ones, and requests a health snapshot of each new table.")
    def table_discovery(context: dg.SensorEvaluationContext, catalog: IcebergCatalogResource):
        notes: list[str] = []
        added, removed = discover_tables(context.instance, catalog, notes)
        if not added and not removed:
            known = len(context.instance.get_dynamic_partitions(table_partitions.name))
            return dg.SkipReason("; ".join(notes) or f"no change: {known} tables known")
        requests = []
        if added:
            requests.append(table_partitions.build_add_request(added))
        if removed:
            requests.append(table_partitions.build_delete_request(removed))
        context.log.info(f"tables added: {added}; removed: {removed}")
        return dg.SensorResult(dynamic_partitions_requests=requests, run_requests=health_requests(added))

    return table_discovery
