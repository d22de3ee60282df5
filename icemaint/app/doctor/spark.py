"""The Spark driver: its local file system, its class archive, and (with `--spark`) a session started as
maintenance starts one, with the Iceberg version it loaded and the catalog's answer."""

from __future__ import annotations

import os

from icemaint.app.doctor.report import Check, fail, first_line, ok, warn
from icemaint.config import MaintenanceConfig
from icemaint.engine.spark_session import deployment_conf


def check_local_files(config: MaintenanceConfig) -> Check:
    """A local session's file system (icemaint/engine/local_fs.py): permissions set in the JVM, or a chmod
    process for every file created."""
    from icemaint.engine.local_fs import FS_IMPL_KEY, concerns, local_fs

    own = deployment_conf(config)
    if not concerns(config.spark.master, own):
        return ok("local files", f"{FS_IMPL_KEY} is the deployment's: {own[FS_IMPL_KEY]}")
    built = local_fs()
    if built.jar is None:
        return warn("local files", f"{built.reason}: Hadoop runs chmod in a child process for every file a local "
                    "session creates (about 9 ms a file against 2; a JDK, e.g. openjdk-17-jdk-headless, avoids it)")
    return ok("local files", f"permissions set in the JVM, no chmod process per file ({built.jar})")


def check_class_archive(config: MaintenanceConfig) -> Check:
    """The driver JVM's class archive (icemaint/engine/class_archive.py): mapped at start-up, still to be
    recorded, or off and why. Reads files only."""
    from icemaint.domain.units import human_size
    from icemaint.engine.class_archive import (DEFAULT_OPTIONS_KEY, JAVA_OPTIONS_KEY, archive_file, java_agent,
                                               own_sharing)
    from icemaint.engine.spark_session import archive_settings

    if not config.spark.class_archive:
        return ok("class archive", "off (spark.class_archive: false): each session loads Spark's classes from its jars")
    conf = archive_settings(config)
    if own_sharing(conf):
        return ok("class archive", f"the deployment's own class-data sharing ({JAVA_OPTIONS_KEY})")
    agent = java_agent({**conf, DEFAULT_OPTIONS_KEY: deployment_conf(config).get(DEFAULT_OPTIONS_KEY, "")})
    if agent:
        return ok("class archive", f"off: the driver JVM starts with a Java agent or a flight recording ({agent}), "
                  "and Java crashes mapping an archive with one")
    archive = archive_file(conf)
    if archive is None:
        return ok("class archive", "none: recording one needs Java 13 or later")
    if archive.exists():
        return ok("class archive", f"{archive} ({human_size(archive.stat().st_size)}): sessions map Spark's "
                  "classes from it")
    return ok("class archive", f"not recorded yet: the second session with these jars records it ({archive})")


def check_spark(config: MaintenanceConfig) -> Check:
    """Start Spark as maintenance does and report the Iceberg version it loaded and the catalog's answer."""
    from pyspark.sql import SparkSession

    from icemaint.engine.spark_session import _running_session, check_iceberg, get_spark

    # A session another thread started is active in that thread only: it is not ours to stop either.
    ours = SparkSession.getActiveSession() is None and _running_session(SparkSession) is None
    spark = get_spark(config)
    try:
        version = check_iceberg(spark)
        started = f"Spark {spark.version} ({config.spark.master}) with Iceberg {version}"
        cat = config.catalog
        if cat.type == "hadoop" and not os.path.isdir((cat.warehouse or "").removeprefix("file://")):
            # Iceberg's HadoopCatalog cannot list a warehouse that does not exist yet
            return ok("spark", f"{started}; catalog {cat.name}: empty warehouse")
        try:
            namespaces = spark.sql(f"SHOW NAMESPACES IN `{cat.name}`").count()
        except Exception as exc:
            return fail("spark", f"{started}, but catalog {cat.name} failed: {first_line(exc)}")
        return ok("spark", f"{started}; catalog {cat.name}: {namespaces} namespace{'' if namespaces == 1 else 's'}")
    finally:
        if ours:  # leave a session someone else started (a test run's) running
            spark.stop()
