"""`dagster dev` serves the code location: assets, partitions, checks and sensors over GraphQL, telemetry off,
no warnings from our modules, and it stops when its process group is told to.

One server for the module (a `dagster dev` start is ~10 CPU-seconds of webserver, daemon and code server): the
one `icemaint ui` starts, which is `dagster dev` on the project's workspace.yaml."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import write_config
from icemaint.config import load_config

REPO = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 120
STOP_TIMEOUT_S = 45
# A Python warning raised in one of our packages, as the warnings module prints it.
OUR_WARNING = re.compile(r"/(icemaint|maint_assets|resources|sensors)/[\w/]+\.py:\d+: \w*Warning")

pytestmark = pytest.mark.slow

LOCATION_QUERY = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
ASSETS_QUERY = """{ assetNodes { assetKey { path } groupName
  partitionDefinition { type name dimensionTypes { name type dynamicPartitionsDefinitionName } }
  assetChecksOrError { __typename ... on AssetChecks { checks { name blocking } } } } }"""
SENSORS_QUERY = """{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name
  location { name } jobs { name } sensors { name sensorState { status }
  targets { pipelineName } } } } } }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str, timeout: float = 10.0) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body["errors"]
    return body["data"]


def dagster_executable() -> str:
    beside = Path(sys.executable).parent / "dagster"
    return str(beside if beside.exists() else REPO / ".venv" / "bin" / "dagster")


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. Zombies do not count: a killed member
    reparented to a PID 1 that does not reap would otherwise keep the group 'alive' forever."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            return True
    return False


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the whole process group (webserver, daemon, code servers), SIGKILL if it lingers."""
    if proc.poll() is None or group_alive(proc.pid):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and group_alive(proc.pid):
        time.sleep(0.5)
        proc.poll()
    if group_alive(proc.pid):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    # Killed group members disappear once the kernel has delivered the signal and they are reaped.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and group_alive(proc.pid):
        time.sleep(0.2)


def wait_until_loaded(proc: subprocess.Popen, port: int, log_path: Path) -> dict:
    """Until `dagster dev` answers with its location loaded: fails when its log and answers stop changing for
    300 s, or after 3x STARTUP_TIMEOUT_S in all (tests/waiting.py: a slow machine is not a broken one)."""
    from waiting import Patience

    patience = Patience("dagster dev answering with a loaded location", cap_s=3 * STARTUP_TIMEOUT_S)
    while True:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            data = graphql(port, LOCATION_QUERY, timeout=5)
            entries = data["workspaceOrError"].get("locationEntries") or []
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                return data
            last: object = data
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            last = exc
        patience.check((log_path.stat().st_size, repr(last)), f"last: {last}:\n{log_path.read_text()[-4000:]}")
        time.sleep(1.0)


@pytest.fixture(scope="module")
def ui(tmp_path_factory, lake_root):
    """`icemaint ui` (what `make ui` runs: `dagster dev` on the project's workspace.yaml), started once for the
    module from a directory that is not the project's, with deprecation warnings shown outside __main__ too so
    the log can prove there are none from our modules. The last test stops it."""
    root = tmp_path_factory.mktemp("dev")
    # An empty namespace: the always-on sensors find nothing to run in the shared test warehouse.
    path = write_config(root / "maintenance.yaml", lake_root, state_dir=str(root / "state"),
                        scope={"include": [f"dev_{uuid.uuid4().hex[:8]}.*"]})
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    port = free_port()
    log_path = root / "ui.log"
    env = {**os.environ, "DAGSTER_HOME": str(root / "unused-dagster-home"), "PYTHONWARNINGS": "default"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "icemaint"), "--config", str(path), "ui",
                                 "--port", str(port)], cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        location = wait_until_loaded(proc, port, log_path)
        yield SimpleNamespace(proc=proc, port=port, log_path=log_path, location=location,
                              home=load_config(path).dagster_home.resolve())
    finally:
        stop(proc)


def test_dagster_dev_serves_the_location(ui):
    settings = yaml.safe_load((ui.home / "dagster.yaml").read_text())
    assert settings["telemetry"] == {"enabled": False}
    entries = ui.location["workspaceOrError"]["locationEntries"]
    assert [e["locationOrLoadError"]["__typename"] for e in entries] == ["RepositoryLocation"], entries

    nodes = {"/".join(n["assetKey"]["path"]): n for n in graphql(ui.port, ASSETS_QUERY)["assetNodes"]}
    assert {"table_health", "compaction", "validation_report"} <= set(nodes), sorted(nodes)
    health = nodes["table_health"]["partitionDefinition"]
    assert health["type"] == "DYNAMIC" and health["name"] == "table"
    for asset in ("compaction", "validation_report"):
        partitions = nodes[asset]["partitionDefinition"]
        assert partitions["type"] == "MULTIPARTITIONED", asset
        dims = {d["name"]: d for d in partitions["dimensionTypes"]}
        assert dims["date"]["type"] == "TIME_WINDOW"
        assert dims["table"]["type"] == "DYNAMIC" and dims["table"]["dynamicPartitionsDefinitionName"] == "table"
    checks = {c["name"]: c["blocking"] for c in nodes["compaction"]["assetChecksOrError"]["checks"]}
    assert checks == {"row_count_parity": True, "sample_comparison": True, "column_aggregates": True}

    [repo] = graphql(ui.port, SENSORS_QUERY)["repositoriesOrError"]["nodes"]
    sensors = {s["name"]: s for s in repo["sensors"]}
    assert {"table_discovery", "compaction_sensor"} <= set(sensors)
    assert sensors["table_discovery"]["targets"][0]["pipelineName"] == "health_job"
    assert sensors["compaction_sensor"]["targets"][0]["pipelineName"] == "compaction_job"
    assert all(s["sensorState"]["status"] == "RUNNING" for s in sensors.values())
    assert {"health_job", "compaction_job"} <= {j["name"] for j in repo["jobs"]}


def test_icemaint_ui_serves_the_code_location_from_any_directory(ui):
    """`make ui` is `icemaint ui`: it finds the project's workspace.yaml (it once looked inside icemaint/) and
    serves the location, also when started from another directory (the fixture's)."""
    keys = {"/".join(n["assetKey"]["path"]) for n in graphql(ui.port, ASSETS_QUERY)["assetNodes"]}
    assert {"compaction", "table_health", "column_statistics"} <= keys, keys
    assert f"Dagster UI on http://127.0.0.1:{ui.port}" in ui.log_path.read_text()


def test_it_stops_when_its_process_group_is_told_to_and_warned_nothing_of_ours(ui):
    stop(ui.proc)
    assert ui.proc.returncode is not None and not group_alive(ui.proc.pid)
    text = ui.log_path.read_text()
    assert "Serving dagster-webserver" in text
    assert not OUR_WARNING.findall(text), [line for line in text.splitlines() if OUR_WARNING.search(line)]
