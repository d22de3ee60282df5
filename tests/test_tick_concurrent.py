"""`icemaint tick` runs different tables' runs at once, up to `max_runs_total`, on the process's one Spark session.

Two of Dagster's per-run set-ups act on the whole process (logging re-configuration, stdout/stderr capture
through file descriptors 1 and 2): a threaded tick deadlocked on the first and printed its report into a run's
compute log file with the second (`icemaint.app.instance.allow_runs_in_threads`). These tests run the tick with
file descriptors captured, check the runs really overlapped (never two of one table), every date was published
with a passing proof, and every row is there, read back by pyiceberg.
"""

from __future__ import annotations

import json
import uuid

import pytest

from conftest import streaming_table, write_config
from icemaint.config import load_config
from icemaint.config.catalog import CatalogConfig
from icemaint.observe.catalog import CatalogReader

pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


def _intervals(config) -> list[tuple[str, float, float]]:
    """(table, start, end) of every compaction run of the config's Dagster instance."""
    from icemaint.app.instance import get_instance
    from maint_assets.partitions import TABLE_TAG

    records = get_instance(config).get_run_records()
    return [(r.dagster_run.tags.get(TABLE_TAG), r.start_time, r.end_time) for r in records
            if r.dagster_run.job_name == "compaction_job"]


def _most_at_once(intervals) -> int:
    edges = sorted([(start, 1) for _, start, _ in intervals] + [(end, -1) for _, _, end in intervals])
    most = now = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        now += step
        most = max(most, now)
    return most


def _tick(capfd, spark, lake_root, tmp_path, *, prefix: str, tables: int, days: int, rows_per_day: int,
          max_runs_total: int):
    """Streaming tables with due dates and `icemaint tick --json` over them, file descriptors captured:
    (writers, config path, the tick's runs as its report lists them). The i-th table has `days` + i dates, so no
    two tables are due on the same dates and each is a run of its own (`tick.table_batches` would join them)."""
    from icemaint.app.cli import main

    writers = [streaming_table(spark, "lake", f"{prefix}_{uuid.uuid4().hex[:8]}.events", batches=3, days=days + i,
                               rows_per_day=rows_per_day, delete_every=0) for i in range(tables)]
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        max_runs_total=max_runs_total, scope={"include": [w.name.key for w in writers]})
    capfd.readouterr()
    code = main(["--config", str(path), "tick", "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    report = json.loads(out)  # the report reached file descriptor 1, not a run's compute log
    return writers, path, [d for d in report["decisions"] if d.get("run_id")]


def test_a_tick_runs_tables_at_once_up_to_max_runs_total_and_prints_its_report(capfd, spark, lake_root, tmp_path):
    writers, path, runs = _tick(capfd, spark, lake_root, tmp_path, prefix="conc", tables=3, days=2, rows_per_day=8,
                                max_runs_total=2)

    assert sorted(d["table"] for d in runs) == sorted(w.name.key for i, w in enumerate(writers) for _ in range(2 + i))
    assert all(d["published"] and d["validation"] and d["success"] for d in runs), runs
    config = load_config(path)
    intervals = _intervals(config)
    assert len(intervals) == 3 and all(start and end for _, start, end in intervals)
    assert _most_at_once(intervals) == 2, intervals  # two at once, never the three
    for table in {t for t, _, _ in intervals}:
        assert _most_at_once([i for i in intervals if i[0] == table]) == 1
    reader = CatalogReader(config)
    for i, writer in enumerate(writers):
        assert [p.data_files for p in reader.health(writer.name.key).partitions] == [1] * (2 + i)
        ids = reader.load(writer.name.key).scan().to_arrow().column("event_id").to_pylist()
        assert sorted(ids) == sorted(writer.ledger.expected_ids())


def test_one_run_at_a_time_when_max_runs_total_is_one(capfd, spark, lake_root, tmp_path):
    _, path, runs = _tick(capfd, spark, lake_root, tmp_path, prefix="seq", tables=2, days=1, rows_per_day=6,
                          max_runs_total=1)
    assert len(runs) == 3 and all(d["published"] for d in runs)
    intervals = _intervals(load_config(path))
    assert len(intervals) == 2 and _most_at_once(intervals) == 1


@pytest.mark.parametrize("catalog, concurrent", [
    (CatalogConfig(type="hadoop"), True),
    (CatalogConfig(type="rest", uri="http://catalog:8181"), True),
    (CatalogConfig(type="jdbc", uri="jdbc:postgresql://db:5432/iceberg"), True),
    # SQLite takes one writer: a second commit fails with SQLITE_BUSY (with a busy timeout, after it)
    (CatalogConfig(type="jdbc", uri="jdbc:sqlite:/lake/catalog.db"), False),
    (CatalogConfig(type="jdbc", uri="jdbc:sqlite:/lake/catalog.db?busy_timeout=30000"), False),
])
def test_only_catalogs_that_take_concurrent_commits_run_tables_at_once(catalog, concurrent):
    assert catalog.concurrent_commits is concurrent


def test_dagster_yaml_log_handlers_keep_runs_one_at_a_time(tmp_path):
    """With python_logs handlers configured, Dagster's logging re-configuration is kept and runs stay serial."""
    from dagster import DagsterInstance

    from icemaint.app.instance import allow_runs_in_threads

    plain = DagsterInstance.ephemeral(tempdir=str(tmp_path / "plain"))
    assert allow_runs_in_threads(plain) is True and plain.get_yaml_python_handlers() == []
    handlers = {"python_logs": {"dagster_handler_config": {"handlers": {"console": {
        "class": "logging.StreamHandler", "level": "INFO"}}}}}
    configured = DagsterInstance.ephemeral(tempdir=str(tmp_path / "configured"), settings=handlers)
    assert allow_runs_in_threads(configured) is False
    assert len(configured.get_yaml_python_handlers()) == 1
