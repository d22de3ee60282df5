"""Execution layer: the Spark session (with the Iceberg catalog) as a lazily built Dagster resource.

Built on dagster-pyspark's `LazyPySparkResource`, so Dagster users meet the resource they know
(`spark.spark_session`, `spark.spark_context`, nothing started until first use); the session itself comes from
the project's own start (`icemaint.engine.spark_session`): catalog secrets set on the running session instead of
its command line, the Iceberg runtime and JVM class archive, the background start, one session per process.
"""

from typing import Any

from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from icemaint.engine.spark_session import LazySession, get_spark, start_in_background
from resources.settings import MaintenanceSettings


class SparkResource(LazyPySparkResource):
    """One SparkSession per process, created on first use (never at import or definition load)."""

    settings: MaintenanceSettings
    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Unused: the session's properties come from the maintenance config's `spark` section "
                    "(master, conf), with its secrets from the environment.")

    def _init_session(self) -> None:
        if self._spark_session is None:
            self._spark_session = get_spark(self.settings.config)

    @property
    def session(self):
        return self.spark_session

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
