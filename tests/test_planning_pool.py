"""Iceberg's worker pool on a small driver: big enough that planning many small manifests does not sleep.

Iceberg's `ParallelIterable` keeps 2 x the pool's size manifests in flight and sleeps 10 ms whenever none
has an entry ready; the pool defaults to the driver's cores. The session's driver gets at least
WORKER_THREADS_FLOOR threads (its cores when more) unless the deployment sizes the pool itself
(`spark_session.worker_threads_conf`).
The speed it buys is a benchmark's figure (benchmarks/RESULTS.md), not a test's.
"""

from __future__ import annotations

import os

import pytest

from conftest import run_json_script, write_config
from icemaint.engine.class_archive import JAVA_OPTIONS_KEY
from icemaint.engine.spark_session import WORKER_THREADS_ENV, WORKER_THREADS_FLOOR, worker_threads_conf
PROPERTY = f"-Diceberg.worker.num-threads={WORKER_THREADS_FLOOR}"


def test_a_small_driver_gets_the_floor_after_its_own_java_options(monkeypatch):
    monkeypatch.delenv(WORKER_THREADS_ENV, raising=False)
    assert worker_threads_conf({}, cores=2) == {JAVA_OPTIONS_KEY: PROPERTY}
    assert worker_threads_conf({JAVA_OPTIONS_KEY: "-Xss4m"}, cores=2) == {JAVA_OPTIONS_KEY: f"-Xss4m {PROPERTY}"}


def test_a_driver_of_more_cores_gets_its_cores(monkeypatch):
    monkeypatch.delenv(WORKER_THREADS_ENV, raising=False)
    assert worker_threads_conf({}, cores=4 * WORKER_THREADS_FLOOR) == {
        JAVA_OPTIONS_KEY: f"-Diceberg.worker.num-threads={4 * WORKER_THREADS_FLOOR}"}


def test_the_deployments_own_pool_size_is_left_alone(monkeypatch):
    monkeypatch.delenv(WORKER_THREADS_ENV, raising=False)
    assert worker_threads_conf({JAVA_OPTIONS_KEY: "-Diceberg.worker.num-threads=3"}, cores=2) == {}
    monkeypatch.setenv(WORKER_THREADS_ENV, "3")
    assert worker_threads_conf({}, cores=2) == {}


@pytest.mark.java
def test_the_sessions_driver_plans_on_a_pool_of_at_least_the_floor(spark):
    if os.environ.get(WORKER_THREADS_ENV):
        pytest.skip(f"{WORKER_THREADS_ENV} sizes the pool in this environment")
    size = spark._jvm.org.apache.iceberg.util.ThreadPools.WORKER_THREAD_POOL_SIZE
    assert size == max(WORKER_THREADS_FLOOR, os.cpu_count() or 1)


SCRIPT = """
    import json, sys
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark
    spark = get_spark(load_config(sys.argv[1]))
    print(json.dumps({"pool": spark._jvm.org.apache.iceberg.util.ThreadPools.WORKER_THREAD_POOL_SIZE}))
"""


@pytest.mark.slow
@pytest.mark.java
def test_a_pool_size_in_the_deployments_java_options_wins(tmp_path, lake_root):
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        spark={"conf": {"spark.ui.enabled": "false",
                                        JAVA_OPTIONS_KEY: "-Diceberg.worker.num-threads=3"}})
    env = {k: v for k, v in os.environ.items() if k != WORKER_THREADS_ENV}
    assert run_json_script(SCRIPT, str(path), env=env) == {"pool": 3}
