"""The Dagster instance the project writes: telemetry off, one run per table, a global cap."""

import pytest
import yaml

from conftest import make_config
from icemaint.app.instance import ensure_dagster_home
from maint_assets.partitions import TABLE_SLOTS


def test_instance_limits_runs_per_table_and_in_total(tmp_path, lake_root, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"), max_runs_total=3)
    home = ensure_dagster_home(config)
    settings = yaml.safe_load((home / "dagster.yaml").read_text())
    assert settings["telemetry"] == {"enabled": False}

    from dagster import DagsterInstance

    instance = DagsterInstance.from_config(str(home))
    queue = instance.get_concurrency_config().run_queue_config
    assert queue.max_concurrent_runs == 3
    limits = {limit["key"]: limit for limit in queue.tag_concurrency_limits}
    for key in ("icemaint/table", "dagster/partition/table"):
        assert limits[key]["limit"] == 1 and limits[key]["value"] == {"applyLimitPerUniqueValue": True}
    assert type(instance.run_coordinator).__name__ == "TableTaggingRunCoordinator"  # a QueuedRunCoordinator
    # A run worker slow to start on a loaded machine is neither failed at launch nor by monitoring within minutes.
    assert type(instance.run_launcher).__name__ == "PatientRunLauncher"
    assert instance.run_monitoring_start_timeout_seconds >= 600 and instance.code_server_process_startup_timeout >= 600


@pytest.mark.postgres
def test_dagster_storage_on_postgres_keeps_the_dsn_in_the_environment(tmp_path, lake_root, monkeypatch,
                                                                      postgres_dsn):
    from dagster import DagsterInstance, DagsterRun

    from icemaint.config.parse import ConfigError
    from pg_server import fresh_database

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         dagster={"storage": "postgres", "dsn_env": "ICEMAINT_DAGSTER_DSN"})
    monkeypatch.delenv("ICEMAINT_DAGSTER_DSN", raising=False)
    with pytest.raises(ConfigError, match=r"\$ICEMAINT_DAGSTER_DSN is not set"):
        ensure_dagster_home(config)

    with fresh_database(postgres_dsn, "dagster_storage") as dsn:
        monkeypatch.setenv("ICEMAINT_DAGSTER_DSN", dsn)
        home = ensure_dagster_home(config)
        text = (home / "dagster.yaml").read_text()
        assert dsn not in text and "ICEMAINT_DAGSTER_DSN" in text
        instance = DagsterInstance.from_config(str(home))
        try:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
            queue = instance.get_concurrency_config().run_queue_config
            assert {limit["key"] for limit in queue.tag_concurrency_limits} == {
                "icemaint/table", "dagster/partition/table", *(f".dagster/icemaint/slot/{i:04d}" for i in range(TABLE_SLOTS))}
            assert {limit["limit"] for limit in queue.tag_concurrency_limits} == {1}
            instance.add_run(DagsterRun(job_name="probe", run_id="0" * 8 + "-0000-0000-0000-" + "0" * 12))
            # Another instance on the same database (another process, host) sees the run.
            assert [r.job_name for r in DagsterInstance.from_config(str(home)).get_runs()] == ["probe"]
        finally:
            instance.dispose()
