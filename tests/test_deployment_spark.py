"""The deployment's own Spark around icemaint's session: its spark-defaults.conf is kept where icemaint adds to
the same settings, and a driver JVM that starts with a Java agent or a flight recording never maps the class
archive (JDK 17 crashed mapping one with either)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import make_config, write_config
from icemaint.engine import class_archive as ca
from icemaint.engine.spark_defaults import defaults_path, deployment_defaults, parse_properties
from icemaint.engine.spark_session import ICEBERG_EXTENSIONS, brings_own_iceberg, session_conf

REPO = Path(__file__).resolve().parent.parent
JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def test_the_defaults_file_is_read_as_java_reads_a_properties_file():
    text = textwrap.dedent("""\
        # a comment
        ! another
          spark.driver.extraJavaOptions   -Dfoo=1 \\
              -Dbar=2
        spark.jars=/opt/a.jar,/opt/b.jar
        spark.sql.extensions:io.delta.sql.DeltaSparkSessionExtension   
        key\\ with\\ space  value
        spark.unicode \\u00e9t\\u00e9
        spark.empty
        spark.ff a\fb
        spark.trim \u00a0x\u00a0
        """)  # noqa: W291 (the trailing blanks after DeltaSparkSessionExtension are the case under test)
    assert parse_properties(text) == {
        JAVA_OPTIONS: "-Dfoo=1 -Dbar=2", "spark.jars": "/opt/a.jar,/opt/b.jar",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension", "key with space": "value",
        "spark.unicode": "\u00e9t\u00e9", "spark.empty": "",
        "spark.ff": "a\fb",  # Java ends a line at \n and \r only
        "spark.trim": "\u00a0x\u00a0"}  # and trims characters up to the space only


def test_the_file_is_found_where_spark_submit_looks(tmp_path):
    conf_dir, home = tmp_path / "conf_dir", tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    conf_dir.mkdir()
    (home / "conf" / "spark-defaults.conf").write_text("spark.from home\n")
    assert defaults_path({"SPARK_HOME": str(home)}) == home / "conf" / "spark-defaults.conf"
    assert defaults_path({"SPARK_HOME": str(home), "SPARK_CONF_DIR": str(conf_dir)}) is None, "the conf dir wins"
    (conf_dir / "spark-defaults.conf").write_text("spark.from conf_dir\n")
    assert deployment_defaults({"SPARK_HOME": str(home), "SPARK_CONF_DIR": str(conf_dir)}) == {"spark.from": "conf_dir"}
    assert deployment_defaults({"SPARK_CONF_DIR": str(tmp_path / "missing")}) == {}
    # pyspark's own --properties-file replaces spark-defaults.conf, as for spark-submit
    named = tmp_path / "my.properties"
    named.write_text("spark.from named\n")
    args = f"--master local[1] --properties-file '{named}' pyspark-shell"
    assert deployment_defaults({"SPARK_CONF_DIR": str(conf_dir), "PYSPARK_SUBMIT_ARGS": args}) == {"spark.from": "named"}


def test_an_unreadable_conf_dir_is_no_file(tmp_path):
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    locked.chmod(0)
    try:
        if os.access(locked / "inner", os.F_OK):
            pytest.skip("running as root: permissions do not hide a directory")
        assert deployment_defaults({"SPARK_CONF_DIR": str(locked / "inner")}) == {}
    finally:
        locked.chmod(0o755)


@pytest.fixture
def spark_defaults(tmp_path, monkeypatch):
    """Writes the deployment's spark-defaults.conf ($SPARK_CONF_DIR) and keeps the class archive's cache here."""
    folder = tmp_path / "spark-conf"
    folder.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(folder))
    monkeypatch.setenv("ICEMAINT_CACHE_DIR", str(tmp_path / "cache"))
    for name in ca.ENV_OPTIONS:
        monkeypatch.delenv(name, raising=False)

    def write(**settings) -> None:
        (folder / "spark-defaults.conf").write_text("".join(f"{k.replace('_', '.')} {v}\n" for k, v in settings.items()))
    return write


def test_the_deployments_java_options_jars_and_extensions_are_added_to_not_replaced(tmp_path, spark_defaults):
    spark_defaults(spark_driver_extraJavaOptions="-Dkrb.conf=/etc/krb5.conf", spark_jars="/opt/gcs-connector.jar",
                   spark_sql_extensions="io.delta.sql.DeltaSparkSessionExtension")
    # the estate's config as a deployment writes it: no Java options of its own (the tests' JIT option is one)
    conf = session_conf(make_config(tmp_path, test_java_options=False))
    assert conf[JAVA_OPTIONS].startswith("-Dkrb.conf=/etc/krb5.conf "), conf[JAVA_OPTIONS]
    assert "-Diceberg.worker.num-threads=" in conf[JAVA_OPTIONS]
    jars = conf["spark.jars"].split(",")
    assert "/opt/gcs-connector.jar" in jars and any("iceberg-spark-runtime" in j for j in jars), jars
    assert conf["spark.sql.extensions"] == f"{ICEBERG_EXTENSIONS},io.delta.sql.DeltaSparkSessionExtension"


def test_the_configs_own_settings_win_over_the_file_as_on_spark_submits_command_line(tmp_path, spark_defaults):
    spark_defaults(spark_driver_extraJavaOptions="-Dfrom.file=1")
    conf = session_conf(make_config(tmp_path, spark={"master": "local[1]", "conf": {
        JAVA_OPTIONS: "-Dfrom.config=1", "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension"}}))
    assert conf[JAVA_OPTIONS].startswith("-Dfrom.config=1") and "from.file" not in conf[JAVA_OPTIONS]
    assert conf["spark.sql.extensions"].split(",")[0] == ICEBERG_EXTENSIONS, "the engine needs Iceberg's"


@pytest.mark.parametrize("setting", ["spark_jars_packages", "spark_driver_extraClassPath"])
def test_an_iceberg_runtime_the_file_names_is_the_deployments(tmp_path, spark_defaults, setting):
    value = ("org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.0" if setting == "spark_jars_packages"
             else "/opt/spark/extra/iceberg-spark-runtime-3.5_2.12-1.10.0.jar")
    spark_defaults(**{setting: value})
    config = make_config(tmp_path)
    assert brings_own_iceberg(config)
    assert not any("iceberg-spark-runtime" in j for j in session_conf(config).get("spark.jars", "").split(","))


def test_a_jar_url_with_credentials_is_refused_not_put_on_a_command_line(tmp_path, spark_defaults):
    spark_defaults(spark_jars="/opt/a.jar,https://deploy:s3cr3t@repo.example.com/x.jar")
    with pytest.raises(ValueError) as caught:
        session_conf(make_config(tmp_path))
    assert "repo.example.com with credentials" in str(caught.value) and "s3cr3t" not in str(caught.value)


@pytest.mark.parametrize("where, value", [
    ("JAVA_TOOL_OPTIONS", "-javaagent:/opt/dd-java-agent.jar"),
    ("JDK_JAVA_OPTIONS", "-agentpath:/opt/libasyncProfiler.so=start"),
    ("_JAVA_OPTIONS", "-Xmx2g -XX:StartFlightRecording=filename=/tmp/r.jfr"),
    (JAVA_OPTIONS, "-Dx=1 -agentlib:jdwp=transport=dt_socket,server=y,suspend=n"),
    ("spark.driver.defaultJavaOptions", "-javaagent:/opt/otel.jar"),
    ("SPARK_SUBMIT_OPTS", "-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=5005"),
    ("PYSPARK_SUBMIT_ARGS", "--driver-java-options '-javaagent:/opt/jmx exporter.jar=9404:c.yaml' pyspark-shell"),
    (JAVA_OPTIONS, '"-javaagent:/opt/my agent/a.jar"'),
    (JAVA_OPTIONS, "-Xmx1g @/etc/spark/driver.args"),
    ("JDK_JAVA_OPTIONS", "-XX:VMOptionsFile=/etc/jvm.options"),
])
def test_a_java_agent_anywhere_the_driver_jvm_reads_options_keeps_the_archive_off(tmp_path, monkeypatch, where, value):
    for name in ca.ENV_OPTIONS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    (tmp_path / "release").write_text('JAVA_VERSION="17.0.15"\n')
    folder = tmp_path / "cache"
    conf = {}
    if where.startswith("spark."):
        conf[where] = value
    else:
        monkeypatch.setenv(where, value)
    assert ca.java_agent(conf) == where
    for now in (1.0, 2.0, 3.0):  # met, would record, would map: never with the agent
        assert ca.archive_options(conf, folder=folder, now=now) == ""
    assert ca.java_agent({JAVA_OPTIONS: "-Dmy.javaagent.path=/x -XX:FlightRecorderOptions=stackdepth=96"}, {}) is None


def test_doctor_says_why_the_archive_is_off_with_an_agent(tmp_path, monkeypatch):
    from icemaint.app.doctor.spark import check_class_archive

    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-javaagent:/opt/dd-java-agent.jar")
    check = check_class_archive(make_config(tmp_path))
    assert check.status.value.strip() == "ok" and "JAVA_TOOL_OPTIONS" in check.detail and check.detail.startswith("off"), check


PROPERTIES = textwrap.dedent("""
    import json, sys
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark
    spark = get_spark(load_config(sys.argv[1]))
    system = spark._jvm.java.lang.System
    print(json.dumps({"krb": system.getProperty("java.security.krb5.conf"),
                      "threads": system.getProperty("iceberg.worker.num-threads"),
                      "rows": spark.sql("SELECT count(*) FROM range(3)").first()[0]}))
""")


@pytest.mark.slow
@pytest.mark.java
def test_a_real_driver_keeps_the_deployments_java_options_and_prints_nothing_on_the_commands_output(tmp_path, lake_root):
    """The file's options reach the driver; what its JVM prints to standard output (here the GC log the
    deployment asked for) goes to the command's standard error, not into its output, which `--json` callers
    parse."""
    folder = tmp_path / "spark-conf"
    folder.mkdir()
    (folder / "spark-defaults.conf").write_text(
        "spark.driver.extraJavaOptions -Djava.security.krb5.conf=/etc/k.conf -Xlog:gc\n")
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        spark={"master": "local[1]", "conf": {"spark.ui.enabled": "false"}}, test_java_options=False)
    proc = subprocess.run([sys.executable, "-c", PROPERTIES, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "SPARK_CONF_DIR": str(folder)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, lines[:5]
    seen = json.loads(lines[0])
    assert seen["krb"] == "/etc/k.conf", "the file's Java option reached the driver (it was dropped before)"
    assert seen["threads"] and seen["rows"] == 3
    assert "[info][gc]" in proc.stderr
