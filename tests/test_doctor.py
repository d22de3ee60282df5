"""`icemaint doctor`: each check against the real thing it checks (Java, jars, a catalog at a closed
port, PostgreSQL, the state dir, the Dagster instance), through the CLI, with no secret in its output."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import run_cli, write_config
from icemaint.app.doctor import run_doctor
from icemaint.app.doctor.report import Status, shown_uri
from icemaint.config import load_config
from icemaint.engine.spark_session import TESTED_ICEBERG

ICEMAINT = Path(sys.executable).parent / "icemaint"
ALWAYS = ["config", "java", "local files", "iceberg runtime", "class archive", "catalog credentials", "catalog", "state dir",
          "dagster instance", "automation"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, isolated_dagster_home):
    # no secret of another test leaks in
    for name in list(os.environ):
        if name.startswith("ICEMAINT_CATALOG_") or name in ("ICEMAINT_PG_DSN", "PGPASSWORD"):
            monkeypatch.delenv(name)


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def estate(tmp_path: Path, **overrides) -> Path:
    """A config with its own (existing, empty) hadoop warehouse and state dir under tmp_path."""
    (tmp_path / "warehouse").mkdir(exist_ok=True)
    overrides.setdefault("state_dir", str(tmp_path / "state"))
    return write_config(tmp_path / "maintenance.yaml", tmp_path, **overrides)


def doctor(capsys, path: Path, *flags: str) -> tuple[int, dict[str, list[str]], str, str]:
    """Runs `icemaint --config PATH doctor`; returns (exit code, lines by check name, stdout, stderr)."""
    code, out, err = run_cli(capsys, "--config", str(path), "doctor", *flags)
    assert "Traceback" not in out + err
    lines: dict[str, list[str]] = {}
    for line in out.splitlines():
        lines.setdefault(line[6:].split(":", 1)[0], []).append(line)
    return code, lines, out, err


def fake_runtime(directory: Path, version: str, spark: str = "3.5") -> Path:
    """A jar shaped like an Iceberg Spark runtime of `version` (its build properties say so)."""
    jar = directory / f"iceberg-spark-runtime-{spark}_2.12-{version}.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("iceberg-build.properties", f"git.build.version={version}\n")
    return jar


@pytest.mark.java  # needs Java on PATH (it runs `java -version`, not Spark)
def test_a_good_default_config_is_all_ok_and_exits_0(capsys, tmp_path):
    path = estate(tmp_path)
    code, lines, out, err = doctor(capsys, path)
    assert code == 0, out
    assert list(lines) == ALWAYS, out
    assert all(line.startswith("ok    ") for line in out.splitlines()), out
    assert lines["config"] == [f"ok    config: {path.resolve()} (catalog lake: hadoop, state dir {tmp_path / 'state'})"]
    [java] = lines["java"]
    found = re.fullmatch(r"ok    java: \S+ (\d+)\S* \(/\S+/java\)", java)
    assert found and int(found.group(1)) >= 17, java
    assert f"bundled Iceberg {TESTED_ICEBERG}" in lines["iceberg runtime"][0]
    assert lines["catalog"] == [f"ok    catalog: hadoop warehouse {tmp_path / 'warehouse'}: 0 tables (writable)"]
    assert (tmp_path / "state" / "dagster" / "dagster.yaml").exists()  # the instance really opened
    # what opening the UI starts, and that by default nothing of it removes orphans
    [automation] = lines["automation"]
    assert "running at start: table_discovery, compaction_sensor, retention_sensor" in automation, automation
    assert "orphan removal off (automation.orphan_removal: false); quarantine purge never" in automation, automation

    code, _, out, _ = doctor(capsys, path, "--json")
    checks = json.loads(out)
    assert code == 0 and [c["name"] for c in checks] == ALWAYS
    assert {c["status"] for c in checks} == {"ok"}


def test_a_java_home_without_java_fails_naming_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    code, lines, _, _ = doctor(capsys, estate(tmp_path))
    assert code == 1
    assert lines["java"] == [f"FAIL  java: JAVA_HOME={tmp_path / 'jdk'} has no executable bin/java"]


def test_a_spark_jars_path_that_does_not_exist_fails_naming_it(capsys, tmp_path):
    jar = tmp_path / "nope" / "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
    path = estate(tmp_path, spark={"master": "local[1]", "conf": {"spark.jars": str(jar)}})
    code, lines, out, err = doctor(capsys, path)
    assert code == 1
    assert lines["spark.jars"] == [f"FAIL  spark.jars: {jar} does not exist"]
    assert lines["iceberg runtime"] == [f"FAIL  iceberg runtime: {jar} (spark.jars) does not exist"]

    code, lines, out, err = doctor(capsys, path, "--spark")  # Spark is not started on a missing runtime
    [line] = lines["spark"]
    assert code == 1 and line.startswith("warn  spark: not started: fix ")  # (and java, without Java)
    assert line.endswith("iceberg runtime, spark.jars first")


def test_an_existing_extra_jar_is_ok_and_a_remote_one_is_left_to_spark(capsys, tmp_path):
    extra = tmp_path / "udfs.jar"
    extra.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    path = estate(tmp_path, spark={"master": "local[1]", "conf": {"spark.jars": f"{extra},hdfs://nn/jars/x.jar"}})
    _, lines, _, _ = doctor(capsys, path)
    assert lines["spark.jars"] == [f"ok    spark.jars: {extra} exist; hdfs://nn/jars/x.jar (remote, not checked)"]
    assert lines["iceberg runtime"][0].startswith("ok    iceberg runtime: bundled Iceberg")


@pytest.mark.parametrize("setup, expected", [
    ("jar", "Iceberg 1.5.2 is not supported: icemaint needs 1.7 <= version < 2.0"),
    ("packages", "Iceberg 1.6.1 is not supported: icemaint needs 1.7 <= version < 2.0"),
    ("spark34", "built for Spark 3.4 / Scala 2.12, but this Spark is 3.5"),
    ("bundled+packages", "spark.iceberg_runtime: bundled adds the bundled runtime beside"),
    ("jar+packages", "two Iceberg runtimes on one classpath"),
])
def test_an_iceberg_runtime_the_engine_cannot_drive_fails(capsys, tmp_path, setup, expected):
    coordinate = "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.6.1"
    spark = {"master": "local[1]", "conf": {}}
    if setup in ("jar", "jar+packages"):
        spark["conf"]["spark.jars"] = str(fake_runtime(tmp_path, "1.5.2"))
    if setup in ("packages", "bundled+packages", "jar+packages"):
        spark["conf"]["spark.jars.packages"] = coordinate
    if setup == "spark34":
        spark["conf"]["spark.jars"] = str(fake_runtime(tmp_path, TESTED_ICEBERG, spark="3.4"))
    if setup == "bundled+packages":
        spark["iceberg_runtime"] = "bundled"
    code, lines, out, _ = doctor(capsys, estate(tmp_path, spark=spark))
    assert code == 1
    [line] = lines["iceberg runtime"]
    assert line.startswith("FAIL  iceberg runtime: ") and expected in line, line


def test_a_rest_catalog_at_a_wrong_uri_fails_naming_it_within_seconds(capsys, tmp_path):
    uri = f"http://127.0.0.1:{closed_port()}"
    path = estate(tmp_path, catalog={"name": "lake", "type": "rest", "uri": uri, "warehouse": "s3://bucket/wh"})
    started = time.monotonic()
    code, lines, out, err = doctor(capsys, path)
    assert time.monotonic() - started < 60  # a refused connection is not retried for minutes (a bound, not a speed target)
    assert code == 1
    [line] = lines["catalog"]
    assert line.startswith(f"FAIL  catalog: rest {uri}: ") and "Connection refused" in line, line
    assert lines["catalog credentials"] == [
        "ok    catalog credentials: none set (a REST catalog that needs auth takes ICEMAINT_CATALOG_TOKEN "
        "or ICEMAINT_CATALOG_CREDENTIAL)"]


def test_a_catalog_that_never_answers_fails_after_the_timeout(tmp_path):
    with socket.socket() as server:  # accepts connections (the kernel's backlog) and never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        uri = f"http://127.0.0.1:{server.getsockname()[1]}"
        config = load_config(estate(tmp_path, catalog={"name": "lake", "type": "rest", "uri": uri}))
        started = time.monotonic()
        [catalog] = [c for c in run_doctor(config, config.source, timeout_s=1) if c.name == "catalog"]
        # Without the timeout the probe would wait on this socket for ever; the bound only tells that apart from a
        # loaded machine (the timeout itself is proven by the detail below), so it is generous.
        assert time.monotonic() - started < 60
    assert catalog.status is Status.FAIL
    assert catalog.detail == f"rest {uri}: TimeoutError: no answer within 1s"


def test_a_jdbc_catalog_on_a_closed_postgres_port_fails_naming_the_uri(capsys, tmp_path, monkeypatch):
    secret = "jdbc-pw-4f1c9e"
    monkeypatch.setenv("ICEMAINT_CATALOG_JDBC_PASSWORD", secret)
    uri = f"jdbc:postgresql://127.0.0.1:{closed_port()}/catalog"
    path = estate(tmp_path, catalog={"name": "lake", "type": "jdbc", "uri": uri, "warehouse": str(tmp_path / "wh"),
                                     "properties": {"jdbc.user": "iceberg"}})
    code, lines, out, err = doctor(capsys, path)
    assert code == 1
    [line] = lines["catalog"]
    assert line.startswith(f"FAIL  catalog: jdbc {uri}: ") and "Connection refused" in line, line
    assert lines["catalog credentials"] == ["ok    catalog credentials: set: ICEMAINT_CATALOG_JDBC_PASSWORD"]
    assert secret not in out + err


def test_postgres_claims_without_their_dsn_variable_fail_naming_it(capsys, tmp_path):
    code, lines, out, _ = doctor(capsys, estate(tmp_path, claims={"backend": "postgres"}))
    assert code == 1
    [line] = lines["postgres"]
    assert line.startswith("FAIL  postgres: ") and "ICEMAINT_PG_DSN is not set" in line and "claims.dsn_env" in line


def test_postgres_at_a_closed_port_fails_naming_where_and_not_the_password(capsys, tmp_path, monkeypatch):
    port, secret = closed_port(), "pg-pw-7d2a01"
    monkeypatch.setenv("ICEMAINT_PG_DSN", f"postgresql://icemaint:{secret}@127.0.0.1:{port}/icemaint")
    code, lines, out, err = doctor(capsys, estate(tmp_path, claims={"backend": "postgres"}, audit={"sink": "postgres"}))
    assert code == 1
    [line] = lines["postgres"]
    assert line.startswith(f"FAIL  postgres: 127.0.0.1:{port}/icemaint (claims and audit via $ICEMAINT_PG_DSN): ")
    assert "Connection refused" in line and secret not in out + err


def test_postgres_that_answers_is_ok(capsys, tmp_path, monkeypatch, postgres_server):
    monkeypatch.setenv("ICEMAINT_PG_DSN", postgres_server.dsn)
    _, lines, out, err = doctor(capsys, estate(tmp_path, audit={"sink": "postgres"}))
    [line] = lines["postgres"]
    assert line.startswith(f"ok    postgres: 127.0.0.1:{postgres_server.port}/icemaint: PostgreSQL "), line
    assert line.endswith("(audit via $ICEMAINT_PG_DSN)")
    assert postgres_server.password not in out + err


def _unwritable(tmp_path: Path, how: str) -> Path:
    if how == "chmod":
        state = tmp_path / "state"
        state.mkdir()
        state.chmod(0o500)
        try:  # root writes through the mode bits
            (state / "probe").touch()
        except PermissionError:
            return state
        (state / "probe").unlink()
        state.chmod(0o700)
        pytest.skip("running as root: chmod does not make a directory unwritable")
    if how == "file":
        (tmp_path / "a-file").write_text("")
        return tmp_path / "a-file" / "state"
    if not Path("/proc/self").exists():
        pytest.skip("no /proc")
    return Path("/proc/icemaint-doctor-test/state")  # unwritable even for root


def test_a_state_dir_below_a_file_is_named_when_the_config_loads(capsys, tmp_path):
    """Every command, doctor too, refuses it in one line before it does anything (others failed later, in a
    NotADirectoryError traceback)."""
    state = _unwritable(tmp_path, "file")
    code, lines, out, err = doctor(capsys, estate(tmp_path, state_dir=str(state)))
    assert code == 2 and out == ""
    assert err.strip().endswith(f"state_dir: {state} cannot be created: {state.parent} is a file, not a directory")
    assert err.count("\n") == 1


@pytest.mark.parametrize("how, expected", [
    ("chmod", "is not writable by this user"),
    ("proc", "does not exist and cannot be created: /proc is not writable"),
])
def test_a_state_dir_that_cannot_be_written_fails(capsys, tmp_path, how, expected):
    state = _unwritable(tmp_path, how)
    try:
        code, lines, out, _ = doctor(capsys, estate(tmp_path, state_dir=str(state)))
    finally:
        if how == "chmod":
            state.chmod(0o700)
    assert code == 1
    [line] = lines["state dir"]
    assert line.startswith(f"FAIL  state dir: {state}") and expected in line, line
    [instance] = lines["dagster instance"]
    assert instance.startswith("FAIL  dagster instance: ") and "\n" not in instance


def test_no_secret_reaches_the_console_scripts_output(tmp_path):
    """The real `icemaint` script, with secrets in every variable doctor reads and every check failing
    on them: the variables are named, their values appear nowhere (stdout or stderr)."""
    secrets = {"ICEMAINT_CATALOG_TOKEN": "tok-91be0c5a", "ICEMAINT_CATALOG_CREDENTIAL": "client:cred-33f0aa",
               "ICEMAINT_PG_DSN": f"postgresql://icemaint:dsn-pw-5e77@127.0.0.1:{closed_port()}/icemaint",
               "AUDIT_DSN": "host=127.0.0.1 password=audit-pw-c0ffee not-a-dsn"}
    path = estate(tmp_path, catalog={"name": "lake", "type": "rest", "uri": f"http://127.0.0.1:{closed_port()}"},
                  claims={"backend": "postgres"}, audit={"sink": "postgres", "dsn_env": "AUDIT_DSN"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEMAINT_CATALOG_")}
    for flags in ([], ["--json"]):
        proc = subprocess.run([str(ICEMAINT), "--config", str(path), "doctor", *flags], capture_output=True,
                              text=True, timeout=120, env={**env, **secrets, "DAGSTER_HOME": str(tmp_path / "dh")})
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        output = proc.stdout + proc.stderr
        for value in [*secrets.values(), "dsn-pw-5e77", "audit-pw-c0ffee", "cred-33f0aa"]:
            assert value not in output, value
        assert "ICEMAINT_CATALOG_CREDENTIAL, ICEMAINT_CATALOG_TOKEN" in proc.stdout
    checks = json.loads(proc.stdout)
    assert {"name": "postgres", "status": "FAIL",
            "detail": "$AUDIT_DSN is not a PostgreSQL DSN (its value is not shown)"} in checks
    assert [c["status"] for c in checks if c["name"] == "catalog"] == ["FAIL"]


@pytest.mark.parametrize("uri, shown", [
    ("jdbc:postgresql://db:5432/cat", "jdbc:postgresql://db:5432/cat"),
    ("http://alice:s3cr3t@rest:8181/api", "http://alice:***@rest:8181/api"),
    ("jdbc:postgresql://db/cat?user=a&password=s3cr3t&ssl=true",
     "jdbc:postgresql://db/cat?user=a&password=***&ssl=true"),
])
def test_a_uri_is_shown_without_its_password(uri, shown):
    assert shown_uri(uri) == shown


def test_doctor_spark_reports_the_iceberg_version_the_session_loaded(capsys, spark, config_file):
    code, lines, out, err = doctor(capsys, config_file, "--spark")
    [line] = lines["spark"]
    assert line.startswith(f"ok    spark: Spark {spark.version} (local[2]) with Iceberg {TESTED_ICEBERG}; "
                           "catalog lake: "), line
    assert code == 0, out
    assert spark.sql("SELECT 1").first()[0] == 1  # the session doctor found running is left running


def test_the_class_archive_line_says_whether_sessions_map_one(capsys, tmp_path, monkeypatch):
    """Not recorded yet, then in place with its size (a file where the archive for these jars goes), or off."""
    from icemaint.engine.class_archive import archive_file
    from icemaint.engine.spark_session import archive_settings

    monkeypatch.setenv("ICEMAINT_CACHE_DIR", str(tmp_path / "cache"))
    path = estate(tmp_path, spark={"master": "local[1]"})
    config = load_config(path)
    archive = archive_file(archive_settings(config))
    if archive is None:
        pytest.skip("this JDK cannot record a class archive")
    _, lines, _, _ = doctor(capsys, path)
    assert lines["class archive"] == [f"ok    class archive: not recorded yet: the second session with these jars "
                                      f"records it ({archive})"]
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"x" * 3 * 1024 * 1024)
    _, lines, _, _ = doctor(capsys, path)
    assert lines["class archive"] == [f"ok    class archive: {archive} (3 MiB): sessions map Spark's classes from it"]
    _, lines, _, _ = doctor(capsys, estate(tmp_path, spark={"master": "local[1]", "class_archive": False}))
    assert lines["class archive"][0].startswith("ok    class archive: off (spark.class_archive: false)")
    assert not list((tmp_path / "cache").glob("jvm-classes/*.seen")), "the doctor marks nothing"


def test_a_tables_entry_naming_a_table_the_catalog_lacks_fails_naming_it(capsys, tmp_path):
    """A misspelt `tables:` entry passed: its policy never applied and the table ran on the defaults."""
    (tmp_path / "warehouse" / "db" / "events" / "metadata").mkdir(parents=True)
    (tmp_path / "warehouse" / "db" / "events" / "metadata" / "version-hint.text").write_text("1")
    path = estate(tmp_path, tables={"db.evnts": {"owner": "ops"}, "db.events": {"owner": "ops"}})
    code, lines, out, err = doctor(capsys, path)
    assert code == 1, out
    assert lines["configured tables"] == [
        "FAIL  configured tables: tables.db.evnts names a table the catalog does not have (did you mean db.events?): "
        f"its policy never applies; fix or remove the entry in {path.resolve()}"], out

    from icemaint.app.doctor.catalog import check_catalog, check_configured_tables  # the passing case, without the rest

    config, listed = load_config(estate(tmp_path, tables={"db.events": {"owner": "ops"}})), []
    assert check_catalog(config, listed=listed).status is Status.OK and listed == [["db.events"]]
    assert check_configured_tables(config, listed).line() == "ok    configured tables: all 1 in tables: are in the catalog"
