"""Catalog layer: Spark-free reads of table metadata and health (pyiceberg), for sensors and assets."""


import datetime as dt

from dagster import ConfigurableResource
from pydantic import PrivateAttr

from icemaint.domain.health import TableHealth
from icemaint.domain.screen import Screened
from icemaint.observe.catalog import CatalogReader
from resources.settings import MaintenanceSettings


class IcebergCatalogResource(ConfigurableResource):
    """Lists tables, reads metadata locations and computes health with pyiceberg."""

    settings: MaintenanceSettings
    _reader: CatalogReader | None = PrivateAttr(default=None)

    @property
    def reader(self) -> CatalogReader:
        if self._reader is None:
            self._reader = CatalogReader(self.settings.config)
        return self._reader

    def list_tables(self) -> list[str]:
        """Tables in the catalog that the config's scope admits."""
        scope = self.settings.config.scope
        return [t for t in self.reader.list_tables() if scope.admits(t)]

    def metadata_location(self, table: str) -> str:
        return self.reader.metadata_location(table)

    def health(self, table: str, now: dt.datetime | None = None, measure_metadata: bool = False) -> TableHealth:
        return self.reader.health(table, now=now, measure_metadata=measure_metadata)

    def tick_health(self, table: str) -> TableHealth | Screened:
        """Health for a sensor tick: `Screened` when the manifest list shows nothing can be due."""
        return self.reader.tick_health(table)

    def read_many(self, fn, tables: list[str]) -> list:
        """`fn` over `tables`, `catalog.read_workers` at a time (a tick's metadata reads)."""
        return self.reader.read_many(fn, tables)
