"""icemaint: event-driven maintenance for Apache Iceberg tables on Dagster and Spark."""

__version__ = "0.1.0"
