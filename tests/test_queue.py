"""One maintenance run per table in the queue, however the run was launched: the coordinator adds
`icemaint/table` to runs Dagster creates (backfills of table x date and of table-partitioned assets)."""

from __future__ import annotations

import pytest

from conftest import make_config
from icemaint.app.instance import ensure_dagster_home
from icemaint.app.queue import TableTaggingRunCoordinator
from maint_assets.partitions import table_of


@pytest.mark.parametrize("tags, table", [
    ({"icemaint/table": "db.events"}, "db.events"),
    ({"dagster/partition/table": "db.events", "dagster/partition": "2026-01-02|db.events"}, "db.events"),
    ({"dagster/partition": "db.events"}, "db.events"),              # a table-partitioned asset's backfill run
    ({"dagster/partition": "2026-01-02|db.events"}, "db.events"),
    ({"dagster/asset_partition_range_start": "2026-01-01|db.events",   # a batched backfill run
      "dagster/asset_partition_range_end": "2026-01-09|db.events"}, "db.events"),
    ({"dagster/partition": "2026-01-02"}, None),                    # not a table
    ({"dagster/partition": "x; DROP TABLE y"}, None),
    ({}, None),
])
def test_the_table_a_run_maintains_comes_from_its_tags(tags, table):
    assert table_of(tags) == table


def test_a_retention_run_and_a_date_backfill_of_one_table_never_run_together(tmp_path, lake_root, monkeypatch):
    """Runs as the backfill daemon and a launchpad create them (partition tags only), submitted through
    the instance's real coordinator, then judged by Dagster's own queue limits."""
    import dagster as dg
    from dagster._core.run_coordinator import SubmitRunContext
    from dagster._core.utils import make_new_run_id
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"))
    home = ensure_dagster_home(config)
    instance = dg.DagsterInstance.from_config(str(home))
    assert isinstance(instance.run_coordinator, TableTaggingRunCoordinator)

    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="maint_assets.definitions"))

    def submitted(job_name: str, tags: dict) -> dg.DagsterRun:
        origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)
        run = instance.add_run(dg.DagsterRun(job_name=job_name, run_id=make_new_run_id(), tags=tags,
                                             status=dg.DagsterRunStatus.NOT_STARTED, remote_job_origin=origin))
        return instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))

    retention = submitted("__ASSET_JOB", {"dagster/partition": "db.events"})
    backfill = [submitted("__ASSET_JOB", {"dagster/partition": f"2026-01-0{d}|db.events",
                                          "dagster/partition/table": "db.events", "dagster/backfill": "b1"})
                for d in (1, 2, 3)]
    other_table = submitted("__ASSET_JOB", {"dagster/partition": "db.other"})
    for run in [retention, *backfill, other_table]:
        assert run.status == dg.DagsterRunStatus.QUEUED
    assert retention.tags["icemaint/table"] == "db.events" and other_table.tags["icemaint/table"] == "db.other"

    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    counter = TagConcurrencyLimitsCounter(limits, [retention])  # the retention run is in progress
    assert all(counter.is_blocked(run) for run in backfill), "a backfill date ran beside the retention run"
    assert not counter.is_blocked(other_table)
    counter = TagConcurrencyLimitsCounter(limits, [backfill[0]])
    assert counter.is_blocked(retention) and counter.is_blocked(backfill[1])


def test_an_agents_run_is_queued_only_while_the_run_queue_daemon_beats(tmp_path, lake_root, monkeypatch):
    """`icemaint mcp` submits to the queue only while a daemon serves it, for the project's code location: read from
    the instance's real heartbeat storage and the project's workspace.yaml. A submitted run is QUEUED with the
    queue's per-table tags, and `run_status` tells the agent when no daemon is left to start it."""
    import time
    import uuid

    import dagster as dg
    from dagster._daemon.types import DaemonHeartbeat

    from icemaint.app.agent_desk import AgentDesk
    from icemaint.app.queued_runs import code_location_origin, current_mode
    from icemaint.app.runner import JobCall
    from maint_assets.partitions import slot_tags
    from icemaint.domain.agents import IN_PROCESS, QUEUED

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"))
    home = ensure_dagster_home(config)
    instance = dg.DagsterInstance.from_config(str(home))
    origin = code_location_origin()
    assert origin.location_name == "maint_assets.definitions"
    assert origin.loadable_target_origin.module_name == "maint_assets.definitions"
    assert current_mode(instance, origin).mode == IN_PROCESS  # no daemon ever ran on this instance

    def beat(age_s: float) -> str:
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - age_s, "QUEUED_RUN_COORDINATOR", "d1", None))
        return current_mode(instance, origin).mode

    # a run an agent queued earlier (another server's): run_status says whether a daemon is there to start it
    desk = AgentDesk(config)
    runner = desk.runner()
    runner.instance.add_dynamic_partitions("table", ["db.events"])
    queued = runner.submit(JobCall("health_job", "db.events", {}, {"icemaint/table": "db.events", "icemaint/trigger":
                                                                   "agent", "icemaint/agent": "ops-bot"}),
                           origin, str(uuid.uuid4()))
    assert queued.status == dg.DagsterRunStatus.QUEUED and queued.remote_job_origin.location_name == origin.location_name
    assert queued.tags["dagster/partition"] == "db.events" and queued.tags["icemaint/agent"] == "ops-bot"
    assert slot_tags(["db.events"]).items() <= queued.tags.items()  # the queue's per-table limits apply
    try:
        assert beat(10) == QUEUED
        status = desk.run_status(queued.run_id)
        assert status["status"] == "QUEUED" and not status["finished"] and "waiting" not in status, status
        assert beat(600) == IN_PROCESS  # the daemon stopped ten minutes ago: a queued run would wait for nobody
        status = desk.run_status(queued.run_id)
        assert "waiting" in status and "last heartbeat was 600 s ago" in status["waiting"], status
    finally:
        desk.close()
    assert current_mode(instance, None).mode == IN_PROCESS  # no workspace.yaml: the daemon's location is unknown
