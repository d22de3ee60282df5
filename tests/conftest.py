"""Shared fixtures: one real Spark session and one temp Iceberg warehouse per test process (`make test` runs two
pytest-xdist workers, each with its own; see ONE_WORKER_FILES for the tests that must share one).

Tests create their own uniquely named tables in that warehouse (see `table_name`).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from icemaint.app.demo import local_estate_doc  # the test estate: `lake` on <root>/warehouse
from icemaint.config import MaintenanceConfig, parse_config

pytest_plugins = ("cpu_time",)  # each test's CPU seconds in the JUnit report, beside its wall time

_counter = itertools.count()


# The test JVMs' Java options. `-XX:TieredStopAtLevel=1` keeps the JIT at its first tier (C1): a test process runs
# hundreds of tiny Spark jobs, none long enough for C2's optimisations to pay back their compiling. Measured on one
# test file (tests/test_validation.py, 2 cores, both variants side by side): the driver JVM's CPU 74.6 s -> 41.7 s.
# Tests only: a deployment's long-lived runs over real data want C2.
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def config_doc(root: Path, *, test_java_options: bool = True, **overrides) -> dict:
    """The test estate's config document (`local_estate_doc`) with the test JVMs' options (unless a test of a
    deployment's own Java options says `test_java_options=False`: a config's options replace the file's)."""
    doc = local_estate_doc(root, **overrides)
    if test_java_options:
        doc["spark"].setdefault("conf", {}).setdefault("spark.driver.extraJavaOptions", TEST_JAVA_OPTIONS)
    return doc


def make_config(root: Path, **overrides) -> MaintenanceConfig:
    return parse_config(config_doc(root, **overrides), root)


def write_config(path: Path, root: Path, **overrides) -> Path:
    """Writes the config document as YAML (for Dagster resources and the CLI) and returns its path.

    Use the session's `lake_root` as `root`: one Spark session holds one `lake` catalog, so every
    config in a test run must point at the same warehouse.
    """
    import yaml

    path.write_text(yaml.safe_dump(config_doc(root, **overrides), sort_keys=False))
    return path


def run_json_script(script: str, *args: str, env: dict | None = None, timeout: float = 300) -> dict:
    """Runs `script` (dedented) in a fresh Python process from the repository's root; its last stdout line, as JSON."""
    import json
    import subprocess
    import sys
    import textwrap

    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def files_under(root) -> dict[str, tuple[int, int]]:
    """Every file under `root`: (size, mtime in ns), one stat a file (os.walk tells files from directories without
    one). What a refused command must leave as it was: a warehouse or a state dir."""
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            stat = os.stat(path)
            found[path] = (stat.st_size, stat.st_mtime_ns)
    return found


def current_snapshot(spark, table_sql: str) -> int:
    """The snapshot the table's `main` branch points at."""
    return spark.sql(f"SELECT snapshot_id FROM {table_sql}.`refs` WHERE name = 'main'").first()[0]


def two_versions(spark, table_sql: str, columns: str, first: str, second: str) -> tuple[int, int]:
    """Creates the table with `columns`, inserts the VALUES `first`, then INSERT OVERWRITEs `second`.

    Returns:
        (snapshot holding `first`, snapshot holding `second`).
    """
    spark.sql(f"CREATE TABLE {table_sql} ({columns}) USING iceberg")
    spark.sql(f"INSERT INTO {table_sql} VALUES {first}")
    before = current_snapshot(spark, table_sql)
    spark.sql(f"INSERT OVERWRITE {table_sql} VALUES {second}")
    return before, current_snapshot(spark, table_sql)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Runs `icemaint <argv>` in this process: (exit code, stdout, stderr); argparse's own exits give their code."""
    from icemaint.app.cli import main

    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def interrupts_forgotten():
    """An interrupt a test sent or simulated stops the rest of its process's command (`safety.interrupts`): here
    the process is the test suite, which goes on to the next test."""
    yield
    from icemaint.safety import interrupts

    interrupts.reset()


@pytest.fixture
def isolated_dagster_home(monkeypatch, tmp_path) -> None:
    """The CLI and the Dagster runner point $DAGSTER_HOME at the config's state dir; keep that out of other tests."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "unused-dagster-home"))


# Fixtures that start Spark (a JVM); a test using any of them, directly or through another fixture,
# is marked `java`, so `make test-fast` (-m "not java") runs the rest with no Java on PATH.
JAVA_FIXTURES = {"spark"}


# Test files whose tests share one pytest-xdist worker (`make test` runs two), by the group's name: the production
# stack listens on fixed ports (scripts/stack.py), and one worker starts it once for all of them.
ONE_WORKER_FILES = {"tests/test_cluster.py": "production stack", "tests/test_cluster_landing.py": "production stack"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if JAVA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.java)
        if item.get_closest_marker("cluster") and item.nodeid.split("::", 1)[0] not in ONE_WORKER_FILES:
            raise pytest.UsageError(f"{item.nodeid}: a `cluster` test in a file not in conftest.ONE_WORKER_FILES "
                                    "would start a second stack on the same ports in another worker")
    # The longest files first (whole files are the workers' units, `pytest_xdist_make_scheduler`): a worker that
    # meets a long one last leaves the other idle meanwhile. The production stack's file leads; then each file by
    # its time in the last recorded run (tests/durations.json, `scripts/slowest_tests.py --write-durations`), a
    # file not recorded yet as a middling one. A stable sort keeps each file's own order.
    durations = _file_durations()
    items.sort(key=lambda item: (0 if item.get_closest_marker("cluster") else 1,
                                 -durations.get(item.nodeid.split("::", 1)[0], NEW_FILE_SECONDS)))


NEW_FILE_SECONDS = 20.0


def _file_durations() -> dict[str, float]:
    import json

    path = Path(__file__).with_name("durations.json")
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` with whole files as work units, and ONE_WORKER_FILES as groups.

    A file's tests run on one worker, so a module-scoped fixture (an estate of tables, a server) is built once,
    not once per worker that happens to get one of its tests. Files are handed out in the order of the sorted
    collection (`pytest_collection_modifyitems`: the production stack's file, then files with `slow` tests),
    not by their number of tests, so the long files start first and the short ones fill the end.
    pytest-xdist's own `xdist_group` marks do not group under pytest 9 (xdist 3.8 tags a test's node id, which
    pytest 9 no longer lets a plugin change).
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    config.option.loadscopereorder = False

    class WholeFiles(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return ONE_WORKER_FILES.get(path, path)

    return WholeFiles(config, log)


def streaming_table(spark, catalog: str, table: str, *, batches: int, days: int = 3, rows_per_day: int = 15,
                    delete_every: int = 3, **spec):
    """A table written the way a streaming writer does (icemaint.app.simulator): `batches` micro-batches,
    one small file per day partition each, merge-on-read deletes every `delete_every` batches.

    The one factory for the Spark tests' streaming tables; the writer's ledger says which rows must be there.
    """
    from icemaint.app.simulator import StreamingWriter, WorkloadSpec

    writer = StreamingWriter(spark, catalog, WorkloadSpec(table=table, days=days, rows_per_day=rows_per_day,
                                                          delete_every=delete_every, **spec))
    writer.create_table()
    writer.run(batches)
    return writer


@pytest.fixture(scope="session")
def lake_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="session")
def config(lake_root) -> MaintenanceConfig:
    os.environ.setdefault("ICEMAINT_IDENTITY", "maint-test")
    return make_config(lake_root)


@pytest.fixture
def config_file(tmp_path, lake_root) -> Path:
    """A YAML config on the session's warehouse, with its own state dir (Dagster instance, claims, audit)."""
    return write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))


@pytest.fixture(scope="session")
def spark(config):
    from icemaint.engine.spark_session import get_spark

    session = get_spark(config)
    yield session
    session.stop()


@pytest.fixture
def table_name(request) -> str:
    """A fresh `namespace.table` name, unique in the session's warehouse."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:40]
    return f"t.{base}_{next(_counter)}"
from pg_server import postgres_dsn, postgres_server  # noqa: E402,F401
from cluster_stack import production_stack  # noqa: E402,F401
