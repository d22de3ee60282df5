"""Builds the one SparkSession a process uses, with Iceberg from the PyPI-shipped runtime jar.

Maven is unreachable, so `spark.jars.packages` is never set: the runtime jar comes from the
`snowpark-connect-deps-iceberg==1.0.2` wheel (1.0.3's jar is broken, see STACK.md).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading

from icemaint.config import MaintenanceConfig, catalog_secret_properties

ICEBERG_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
POSTGRES_JDBC_JAR = "/usr/share/java/postgresql.jar"
_lock = threading.Lock()


class JavaMissing(RuntimeError):
    pass


def iceberg_jar_path() -> str:
    import snowpark_connect_deps_iceberg

    return str(snowpark_connect_deps_iceberg.get_jar_path(ICEBERG_JAR))


def require_java() -> None:
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        raise JavaMissing("Java 17 is required for Spark and was not found: install it "
                          "(Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME")


def catalog_spark_conf(config: MaintenanceConfig) -> dict[str, str]:
    """The `spark.sql.catalog.<name>.*` settings for the configured catalog."""
    cat = config.catalog
    prefix = f"spark.sql.catalog.{cat.name}"
    # Maintenance decides on, validates against and rolls back to snapshots that other processes
    # may have just committed: a cached table would plan and time-travel on stale metadata.
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.cache-enabled": "false"}
    if cat.type == "glue":
        conf[f"{prefix}.catalog-impl"] = "org.apache.iceberg.aws.glue.GlueCatalog"
    else:
        conf[f"{prefix}.type"] = cat.type
    if cat.warehouse:
        conf[f"{prefix}.warehouse"] = cat.warehouse
    if cat.uri:
        conf[f"{prefix}.uri"] = cat.uri
    for key, value in {**cat.properties, **catalog_secret_properties(cat)}.items():
        conf[f"{prefix}.{key}"] = value
    return conf


def session_conf(config: MaintenanceConfig) -> dict[str, str]:
    jars = [iceberg_jar_path()]
    # Debian's JDBC driver (libpostgresql-jdbc-java), whenever installed: a JdbcCatalog on PostgreSQL
    # can then be used, also as a second catalog added to a running session.
    if os.path.exists(POSTGRES_JDBC_JAR):
        jars.append(POSTGRES_JDBC_JAR)
    conf = {
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.showConsoleProgress": "false",
        # Rewrite proofs bring each snapshot's sampled row fingerprints to the driver (toPandas).
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **catalog_spark_conf(config),
    }
    extra_jars = config.spark.conf.get("spark.jars")
    conf.update(config.spark.conf)
    if extra_jars:
        conf["spark.jars"] = ",".join(jars + [extra_jars])
    return conf


def get_spark(config: MaintenanceConfig):
    """The process's SparkSession, created on first use with the config's catalog and settings.

    Spark allows one active session per process; a second config naming a different catalog is
    added to the running session (catalog settings are read when the catalog is first used).
    """
    require_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    with _lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            for key, value in catalog_spark_conf(config).items():
                if active.conf.get(key, None) != value:
                    active.conf.set(key, value)
            return active
        builder = SparkSession.builder.master(config.spark.master).appName("icemaint")
        for key, value in session_conf(config).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark
