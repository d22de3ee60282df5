"""The jars a session would load, read from files without Spark: which Iceberg runtime (one, of a supported version,
built for this Spark), every local `spark.jars` entry, and the PostgreSQL JDBC driver a JDBC catalog needs."""

from __future__ import annotations

import glob
import os
import re
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

from icemaint.app.doctor.report import Check, fail, ok, shown_uri
from icemaint.config import MaintenanceConfig
from icemaint.engine.spark_session import (ICEBERG_JAR, POSTGRES_JDBC_JAR, SUPPORTED_ICEBERG, TESTED_ICEBERG,
                                           brings_own_iceberg, deployment_conf)

_RUNTIME_ARTIFACT = re.compile(r"iceberg-spark-runtime-(\d+\.\d+)_(\d+\.\d+)")


def iceberg_supported(version: str) -> bool:
    parts = tuple(int(p) for p in version.split("-")[0].split(".")[:2] if p.isdigit())
    low, high = SUPPORTED_ICEBERG
    return len(parts) == 2 and low <= parts < high


def _supported_range() -> str:
    (lo1, lo2), (hi1, hi2) = SUPPORTED_ICEBERG
    return f"{lo1}.{lo2} <= version < {hi1}.{hi2} (tested with {TESTED_ICEBERG})"


def jar_iceberg_version(jar: str) -> str | None:
    """The Iceberg version a runtime jar was built as (its `iceberg-build.properties`), else None."""
    try:
        with zipfile.ZipFile(jar) as z:
            props = z.read("iceberg-build.properties").decode("utf-8", "replace")
    except KeyError:
        return None
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{jar} is not a jar: {exc}") from None
    found = re.search(r"^git\.build\.version=(\S+)", props, re.M)
    return found.group(1) if found else None


def installed_spark() -> tuple[str, str] | None:
    """(Spark version, Scala version) of the Spark the driver runs ($SPARK_HOME, else pyspark's own jars)."""
    jars = Path(os.environ["SPARK_HOME"], "jars") if os.environ.get("SPARK_HOME") else None
    if jars is None:
        import importlib.util

        spec = importlib.util.find_spec("pyspark")
        if spec is None or not spec.origin:
            return None
        jars = Path(spec.origin).parent / "jars"
    for core in sorted(jars.glob("spark-core_*.jar")):
        found = re.match(r"spark-core_(\d+\.\d+)-(\d+\.\d+\.\d+)", core.name)
        if found:
            return found.group(2), found.group(1)
    return None


def _runtime_problems(artifact_name: str, version: str | None) -> list[str]:
    """What is wrong with an Iceberg runtime of this artifact and version for the engine and this Spark."""
    problems = []
    if version and not iceberg_supported(version):
        problems.append(f"Iceberg {version} is not supported: icemaint needs {_supported_range()}")
    built = _RUNTIME_ARTIFACT.search(artifact_name)
    spark = installed_spark()
    if built and spark:
        (spark_version, scala), (for_spark, for_scala) = spark, built.groups()
        if not spark_version.startswith(for_spark + ".") or scala != for_scala:
            problems.append(f"built for Spark {for_spark} / Scala {for_scala}, but this Spark is "
                            f"{spark_version} / Scala {scala}")
    return problems


def _named_runtimes(config: MaintenanceConfig) -> list[tuple[str, str, str | None]]:
    """The Iceberg runtimes the deployment names: (setting, artifact or path, version or None)."""
    conf = deployment_conf(config)
    named: list[tuple[str, str, str | None]] = []
    for coord in filter(None, (c.strip() for c in conf.get("spark.jars.packages", "").split(","))):
        parts = coord.split(":")
        if len(parts) >= 3 and parts[1].startswith("iceberg-spark-runtime"):
            named.append(("spark.jars.packages", coord, parts[2]))
    for path in filter(None, deployment_conf(config).get("spark.driver.extraClassPath", "").split(os.pathsep)):
        if "iceberg-spark-runtime" in Path(path).name:
            version = jar_iceberg_version(path) if os.path.isfile(path) else None
            named.append(("spark.driver.extraClassPath", path, version))
    for jar in jar_entries(config):
        if "iceberg-spark-runtime" in Path(jar).name:
            local = _local_path(jar)
            version = jar_iceberg_version(local) if local and os.path.isfile(local) else None
            named.append(("spark.jars", jar, version))
    return named


def check_iceberg_runtime(config: MaintenanceConfig) -> Check:
    """Which Iceberg runtime the session will load, and whether the engine can drive it (without Spark)."""
    name, mode = "iceberg runtime", config.spark.iceberg_runtime
    named = _named_runtimes(config)
    if mode == "bundled" and named:
        return fail(name, f"spark.iceberg_runtime: bundled adds the bundled runtime beside {named[0][1]} "
                          f"({named[0][0]}): two Iceberg runtimes on one classpath")
    if brings_own_iceberg(config) and not named:
        if mode == "provided":
            return ok(name, "provided by the cluster's classpath (spark.iceberg_runtime: provided); "
                            "only --spark checks its version")
        return ok(name, "named in spark.jars / spark.jars.packages; only --spark checks its version")
    if len(named) > 1:
        return fail(name, "two Iceberg runtimes on one classpath: "
                          + ", ".join(f"{what} ({setting})" for setting, what, _ in named) + "; name one")
    if named:
        lines, failed = [], False
        for setting, what, version in named:
            a_file = setting != "spark.jars.packages"
            local = _local_path(what) if a_file else None
            if a_file and local and not os.path.isfile(local):
                lines.append(f"{what} ({setting}) does not exist")
                failed = True
                continue
            problems = _runtime_problems(what, version)
            failed = failed or bool(problems)
            shown = f"{what} ({setting}{f', Iceberg {version}' if version and a_file else ''})"
            lines.append(shown + (": " + "; ".join(problems) if problems else ""))
        return (fail if failed else ok)(name, "; ".join(lines))
    from icemaint.engine.spark_session import iceberg_jar_path

    jar = iceberg_jar_path()
    if not os.path.isfile(jar):
        return fail(name, f"the bundled runtime {jar} does not exist: reinstall snowpark-connect-deps-iceberg")
    version = jar_iceberg_version(jar)
    problems = _runtime_problems(ICEBERG_JAR, version)
    detail = f"bundled Iceberg {version or 'of unknown version'} ({jar})"
    return fail(name, detail + ": " + "; ".join(problems)) if problems else ok(name, detail)


def jar_entries(config: MaintenanceConfig) -> list[str]:
    return [j.strip() for j in deployment_conf(config).get("spark.jars", "").split(",") if j.strip()]


def _local_path(jar: str) -> str | None:
    """The local file a spark.jars entry names, or None for a remote one (hdfs://, s3a://, https://)."""
    if "://" not in jar and not jar.startswith(("file:", "local:")):
        return jar
    scheme, _, rest = jar.partition(":")
    if scheme not in ("file", "local"):
        return None
    return urlsplit(jar).path if rest.startswith("//") else rest


def check_spark_jars(config: MaintenanceConfig) -> Check:
    """Every local path in `spark.jars` exists (remote ones are left to Spark)."""
    present: list[str] = []
    missing: list[str] = []
    remote: list[str] = []
    for jar in jar_entries(config):
        local = _local_path(jar)
        if local is None:
            remote.append(jar)
        elif glob.has_magic(local):
            (present if glob.glob(local) else missing).append(jar)
        else:
            (present if os.path.isfile(local) else missing).append(jar)
    if missing:
        return fail("spark.jars", "; ".join(f"{jar} does not exist" for jar in missing))
    # A deployment's jars can be dozens (the AWS SDK alone is 30): name a few, count them all.
    shown = ", ".join(present[:3]) + (f" and {len(present) - 3} more" if len(present) > 3 else "")
    detail = f"{shown} exist" if present else ""
    if remote:
        detail += ("; " if present else "") + ", ".join(remote) + " (remote, not checked)"
    return ok("spark.jars", detail)


def check_jdbc_driver(config: MaintenanceConfig) -> Check:
    """A JDBC catalog on PostgreSQL needs the driver on Spark's classpath."""
    conf = deployment_conf(config)
    named = ",".join((conf.get("spark.jars", ""), conf.get("spark.jars.packages", ""))).lower()
    if "postgresql" in named:
        return ok("jdbc driver", "PostgreSQL driver named in spark.jars / spark.jars.packages")
    if os.path.isfile(POSTGRES_JDBC_JAR):
        return ok("jdbc driver", f"{POSTGRES_JDBC_JAR} (added to Spark's jars)")
    return fail("jdbc driver", f"Spark needs the PostgreSQL JDBC driver for {shown_uri(config.catalog.uri or '')}: "
                               f"install libpostgresql-jdbc-java ({POSTGRES_JDBC_JAR}) or name it in spark.jars")
