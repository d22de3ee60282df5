"""Execution layer: the Spark session (with the Iceberg catalog) as a lazily built Dagster resource."""


from dagster import ConfigurableResource

from icemaint.engine.spark_session import LazySession, get_spark, start_in_background
from resources.settings import MaintenanceSettings


class SparkResource(ConfigurableResource):
    """One SparkSession per process, created on first use (never at import or definition load)."""

    settings: MaintenanceSettings

    @property
    def session(self):
        return get_spark(self.settings.config)

    @property
    def lazy_session(self) -> LazySession:
        """The session, started only when something first uses it."""
        return LazySession(self.settings.config)

    def start_in_background(self) -> None:
        """Starts the session in a daemon thread for a run about to do Spark work; the first use waits for it."""
        start_in_background(self.settings.config)

    @property
    def catalog(self) -> str:
        return self.settings.config.catalog.name
