"""A compaction partition's own history tells its story (issue 13): the tick's deferral ("writer active",
with the numbers) is an observation on the (date, table) partition, before the compaction's
materialization; asserted through Dagster's GraphQL schema, which is what the Events tab reads (executed on
the code location in this process: the webserver serving the same schema is `tests/test_dagster_dev.py`'s and
`tests/test_ui.py`'s subject, and starting one here cost half this test's time)."""

from __future__ import annotations

import uuid

import pytest

from conftest import streaming_table, write_config
from icemaint.app.cli import main
from icemaint.app.instance import ensure_dagster_home
from icemaint.config import load_config
from test_backfill import code_location_target

pytestmark = pytest.mark.slow

DATE = "2026-01-01"
EVENTS = """query($key: [String!]!, $partition: String!) { assetOrError(assetKey: {path: $key}) {
  __typename ... on Asset {
    assetObservations(partitions: [$partition]) { timestamp partition
      metadataEntries { label ... on TextMetadataEntry { text } ... on FloatMetadataEntry { floatValue } } }
    assetMaterializations(partitions: [$partition]) { timestamp partition runId
      metadataEntries { label ... on TextMetadataEntry { text } } } } } }"""


def graphql(instance, query: str, variables: dict) -> dict:
    """`query` against Dagster's GraphQL schema over `maint_assets.definitions` loaded in this process."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster_graphql.test.utils import execute_dagster_graphql

    with WorkspaceProcessContext(instance, code_location_target()) as workspace:
        result = execute_dagster_graphql(workspace.create_request_context(), query, variables)
    assert not result.errors, result.errors
    return dict(result.data)


def test_the_partition_history_shows_the_deferral_before_the_compaction(capsys, spark, tmp_path, lake_root,
                                                                        isolated_dagster_home, monkeypatch):
    namespace = f"events_{uuid.uuid4().hex[:8]}"
    table = f"{namespace}.events"
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [f"{namespace}.*"]}, defaults={"writer_idle": "10m"})
    # the same estate and instance once the writer's window has passed (no wait: a loaded machine's tick start
    # must not decide which of the two a tick sees)
    idle = write_config(tmp_path / "idle.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [f"{namespace}.*"]}, defaults={"writer_idle": "0s"})
    streaming_table(spark, "lake", table, batches=4, days=1, rows_per_day=6)
    capsys.readouterr()
    assert main(["--config", str(path), "tick"]) == 0  # the writer committed just now: deferred
    first = capsys.readouterr().out
    assert f"{table} {DATE}: defer: writer active" in first, first
    assert main(["--config", str(idle), "tick"]) == 0  # idle now: compacted
    second = capsys.readouterr().out
    assert f"{table} {DATE}: run:" in second, second

    from dagster import DagsterInstance

    home = ensure_dagster_home(load_config(path))
    monkeypatch.setenv("ICEMAINT_CONFIG", str(path))  # what the code location reads when it loads
    with DagsterInstance.from_config(str(home)) as instance:
        data = graphql(instance, EVENTS, {"key": ["compaction"], "partition": f"{DATE}|{table}"})["assetOrError"]
    assert data["__typename"] == "Asset", data
    [observation] = data["assetObservations"]
    [materialization] = data["assetMaterializations"]
    seen = {e["label"]: e.get("text", e.get("floatValue")) for e in observation["metadataEntries"]}
    assert seen["decision"] == "defer" and seen["reason_kind"] == "writer_active", seen
    assert "writer active" in seen["reason"] and seen["seconds_since_writer_commit"] < 600, seen
    done = {e["label"]: e.get("text") for e in materialization["metadataEntries"]}
    assert done["decision"] == "run", done
    assert float(observation["timestamp"]) < float(materialization["timestamp"]), (observation, materialization)
