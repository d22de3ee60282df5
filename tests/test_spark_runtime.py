"""The deployment's own Iceberg runtime, and secrets kept off every command line.

Each case starts its own Spark JVM in a subprocess (one session per process), from the project's
own `get_spark`, with a config written here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from conftest import write_config
from icemaint.engine.spark_session import ICEBERG_JAR, TESTED_ICEBERG, iceberg_jar_path

pytestmark = [pytest.mark.slow, pytest.mark.java]  # each case starts its own JVM
REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import json, os, sys
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark
    config = load_config(sys.argv[1])
    try:
        spark = get_spark(config)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(0)
    table = f"`{config.catalog.name}`.`rt`.`t_{os.getpid()}`"
    spark.sql(f"CREATE TABLE {table} (id BIGINT) USING iceberg")
    spark.sql(f"INSERT INTO {table} VALUES (1), (2)")
    rows = spark.sql(f"SELECT count(*) FROM {table}").first()[0]
    secret = os.environ.get("PROBE_SECRET", "")
    seen = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if secret and secret in cmdline:
                seen.append(pid)
    key = f"spark.sql.catalog.{config.catalog.name}.s3.secret-access-key"
    print(json.dumps({"rows": rows, "iceberg": spark._jvm.org.apache.iceberg.IcebergBuild.version(),
                      "jars": spark.conf.get("spark.jars", ""), "secret_in_cmdlines": seen,
                      "secret_in_session": spark.conf.get(key, None) == secret if secret else None}))
""")


def run_session(tmp_path: Path, lake_root: Path, env: dict | None = None, **config) -> dict:
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"), **config)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_catalog_secrets_are_set_on_the_running_session_and_on_no_command_line(tmp_path, lake_root):
    secret = f"probe-{uuid.uuid4().hex}"
    report = run_session(tmp_path, lake_root, env={"PROBE_SECRET": secret,
                                                   "ICEMAINT_CATALOG_S3_SECRET__ACCESS__KEY": secret})
    assert report["rows"] == 2
    assert report["secret_in_session"] is True, "the secret did not reach the catalog's settings"
    assert report["secret_in_cmdlines"] == [], "a secret is readable with ps"


def test_spark_jars_packages_resolves_offline_from_a_local_maven_repository(tmp_path, lake_root):
    # The bundled jar under its real coordinates, in a Maven layout: what a mirror or a proxy serves.
    coords = ("org.apache.iceberg", "iceberg-spark-runtime-3.5_2.12", TESTED_ICEBERG)
    home = tmp_path / "m2" / Path(*coords[0].split(".")) / coords[1] / coords[2]
    home.mkdir(parents=True)
    (home / ICEBERG_JAR).write_bytes(Path(iceberg_jar_path()).read_bytes())
    (home / f"{coords[1]}-{coords[2]}.pom").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>{coords[0]}</groupId><artifactId>{coords[1]}</artifactId><version>{coords[2]}</version>"
        "</project>")
    report = run_session(tmp_path, lake_root, spark={"master": "local[1]", "conf": {
        "spark.ui.enabled": "false", "spark.jars.packages": ":".join(coords),
        "spark.jars.repositories": f"file://{tmp_path / 'm2'}", "spark.jars.ivy": str(tmp_path / "ivy")}})
    assert report["rows"] == 2 and report["iceberg"] == TESTED_ICEBERG
    assert iceberg_jar_path() not in report["jars"], "the bundled jar was added beside the user's runtime"


def test_a_session_without_an_iceberg_runtime_fails_with_one_line(tmp_path, lake_root):
    report = run_session(tmp_path, lake_root, spark={"master": "local[1]", "iceberg_runtime": "provided",
                                                     "conf": {"spark.ui.enabled": "false"}})
    assert report["error"].startswith("UnsupportedIceberg: no Iceberg runtime on Spark's classpath")
    assert "\n" not in report["error"]


def test_an_unresolvable_package_is_one_line_naming_it_and_ivys_output_goes_to_the_log(tmp_path, lake_root):
    """`spark.jars.packages` naming a coordinate no repository has ended in JAVA_GATEWAY_EXITED after ~115 lines
    of Ivy output, read as a bug. Offline, Ivy fails fast on the remote repositories."""
    (tmp_path / "empty-repo").mkdir()
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"), spark={
        "master": "local[1]", "conf": {"spark.jars.packages": "org.x:y:1",
                                       "spark.jars.repositories": f"file://{tmp_path / 'empty-repo'}",
                                       "spark.jars.ivy": str(tmp_path / "ivy")}})
    proc = subprocess.run([str(Path(sys.executable).parent / "icemaint"), "--config", str(path), "purge-quarantine",
                           "--older-than", "1d"], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "DAGSTER_HOME": str(tmp_path / "dh")})
    log = tmp_path / "state" / "logs" / "jvm.log"
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "error: spark.jars.packages: org.x:y:1 could not be resolved: check the coordinate, the Maven mirror "
        f"(spark.jars.repositories: file://{tmp_path / 'empty-repo'}) and this machine's network or proxy; "
        f"spark-submit's output is in {log}"], proc.stderr[-3000:]
    assert "unresolved dependency: org.x#y;1: not found" in log.read_text()
