"""A compaction partition's own history tells its story (issue 13): the tick's deferral ("writer active",
with the numbers) is an observation on the (date, table) partition, before the compaction's
materialization; asserted through the webserver's GraphQL, which is what the Events tab reads."""

from __future__ import annotations

import contextlib
import json
import urllib.request
import uuid

import pytest

from conftest import streaming_table, write_config
from icemaint.app.cli import main
from icemaint.app.instance import ensure_dagster_home
from icemaint.config import load_config
from test_daemon_e2e import dagster_dev

pytestmark = pytest.mark.slow

DATE = "2026-01-01"
EVENTS = """query($key: [String!]!, $partition: String!) { assetOrError(assetKey: {path: $key}) {
  __typename ... on Asset {
    assetObservations(partitions: [$partition]) { timestamp partition
      metadataEntries { label ... on TextMetadataEntry { text } ... on FloatMetadataEntry { floatValue } } }
    assetMaterializations(partitions: [$partition]) { timestamp partition runId
      metadataEntries { label ... on TextMetadataEntry { text } } } } } }"""


def graphql(port: int, query: str, variables: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql",
                                     data=json.dumps({"query": query, "variables": variables}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body["errors"]
    return body["data"]


def test_the_partition_history_shows_the_deferral_before_the_compaction(capsys, spark, tmp_path, lake_root,
                                                                        isolated_dagster_home):
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

    home = ensure_dagster_home(load_config(path))
    with contextlib.ExitStack() as stack:
        _, port, _ = stack.enter_context(dagster_dev(tmp_path / "dev", path, home))
        data = graphql(port, EVENTS, {"key": ["compaction"], "partition": f"{DATE}|{table}"})["assetOrError"]
    assert data["__typename"] == "Asset", data
    [observation] = data["assetObservations"]
    [materialization] = data["assetMaterializations"]
    seen = {e["label"]: e.get("text", e.get("floatValue")) for e in observation["metadataEntries"]}
    assert seen["decision"] == "defer" and seen["reason_kind"] == "writer_active", seen
    assert "writer active" in seen["reason"] and seen["seconds_since_writer_commit"] < 600, seen
    done = {e["label"]: e.get("text") for e in materialization["metadataEntries"]}
    assert done["decision"] == "run", done
    assert float(observation["timestamp"]) < float(materialization["timestamp"]), (observation, materialization)
