"""A command about to do Spark work starts its JVM in the background (`spark_session.start_in_background`): the
session it makes is the one the first use gets, and a start that fails is reported by that first use, in its
own thread, as the one-line error a lazy start gives."""

import os
import sys

import pytest

from conftest import run_json_script, write_config

STARTS_ALONE = """
    import json, sys, threading, time
    from pyspark.sql import SparkSession
    from icemaint.config import load_config
    from icemaint.engine import spark_session

    config = load_config(sys.argv[1])
    spark_session.start_in_background(config)
    first = spark_session._STARTING
    spark_session.start_in_background(config)  # once per process: no second starter replaces the first
    other_starters = sum(1 for t in threading.enumerate() if t.name == "icemaint-start-spark" and t is not first)
    same_starter = first is not None and spark_session._STARTING is first
    deadline = time.monotonic() + 120
    while spark_session._running_session(SparkSession) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    started = spark_session._running_session(SparkSession)
    spark = spark_session.get_spark(config)
    print(json.dumps({"same_starter": same_starter, "other_starters": other_starters,
                      "started_without_a_caller": started is not None, "first_use_gets_it": spark is started,
                      "rows": spark.range(3).count(),
                      "catalog": spark.conf.get("spark.sql.catalog.lake", None)}))
"""

FAILS_QUIETLY = """
    import io, json, sys, traceback
    from icemaint.config import load_config
    from icemaint.engine import spark_session

    config = load_config(sys.argv[1])
    sys.stderr = io.StringIO()  # what the background thread would print
    sys.excepthook = lambda *exc: traceback.print_exception(*exc, file=sys.__stderr__)  # this script's own failures
    spark_session.start_in_background(config)
    starter = spark_session._STARTING  # it may have ended already: without java it fails at once
    starter.join(60)
    try:
        spark_session.get_spark(config)
        error = None
    except spark_session.JavaMissing as exc:
        error = str(exc)
    print(json.dumps({"starter_done": not starter.is_alive(), "error": error, "printed": sys.stderr.getvalue()}))
"""


@pytest.mark.slow
@pytest.mark.java
def test_a_background_start_makes_the_session_the_first_use_gets(tmp_path, lake_root):
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        spark={"conf": {"spark.ui.enabled": "false"}})
    result = run_json_script(STARTS_ALONE, str(path))
    assert result["same_starter"] is True and result["other_starters"] == 0  # one starter (it may have ended)
    assert result["started_without_a_caller"] is True  # nothing but the background thread asked for it
    assert result["first_use_gets_it"] is True and result["rows"] == 3
    assert result["catalog"] == "org.apache.iceberg.spark.SparkCatalog"


def test_a_start_that_fails_is_reported_by_the_first_use_and_prints_nothing(tmp_path, lake_root):
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    bin_dir = tmp_path / "bin"  # python and nothing else: no java
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["PATH"] = f"{bin_dir}:/usr/bin/does-not-exist"
    result = run_json_script(FAILS_QUIETLY, str(path), env=env)
    assert result["starter_done"] is True and result["printed"] == ""
    assert result["error"] and "java" in result["error"].lower() and "\n" not in result["error"]
