"""The Dagster instance the project writes: telemetry off, one run per table, a global cap."""

import yaml

from conftest import make_config
from icemaint.app.instance import ensure_dagster_home


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
