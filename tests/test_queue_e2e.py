"""One maintenance run per table in the real queue (issue 13): under `dagster dev`'s daemon, a retention
backfill of a table (its runs carry only Dagster's `dagster/partition` tag) and a compaction backfill of
three of its dates are launched the way the UI launches them, with room for several runs at once; their
runs never overlap in time, whatever launched them (the daemon's own sensors may add runs of the table).
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest

from conftest import write_config
from icemaint.app.instance import ensure_dagster_home
from icemaint.config import load_config
from test_daemon_e2e import dagster_dev
from test_dagster_dev import graphql

pytestmark = pytest.mark.slow

DATES = ("2026-01-01", "2026-01-02", "2026-01-03")
BOUND_S = 600

LAUNCH_BACKFILL = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""


def launch_backfill(port: int, asset: str, partitions: list[str]) -> str:
    import json
    import urllib.request

    body = {"query": LAUNCH_BACKFILL, "variables": {"params": {
        "assetSelection": [{"path": [asset]}], "partitionNames": partitions, "fromFailure": False}}}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        result = json.loads(response.read())["data"]["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    return result["backfillId"]


def test_a_retention_backfill_and_a_date_backfill_of_one_table_never_overlap(spark, tmp_path, lake_root,
                                                                             isolated_dagster_home):
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    from icemaint.app.simulator import StreamingWriter, WorkloadSpec
    from maint_assets.partitions import TABLE_TAG

    namespace = f"queue_{uuid.uuid4().hex[:8]}"
    table = f"{namespace}.events"
    writer = StreamingWriter(spark, "lake", WorkloadSpec(table=table, days=len(DATES), rows_per_day=6,
                                                         delete_every=0))
    writer.create_table()
    writer.run(3)  # three small files on each date
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [f"{namespace}.*"]}, max_runs_total=4,
                        defaults={"snapshot_older_than": "0s"})
    config = load_config(path)
    home = ensure_dagster_home(config)
    finished = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)

    with contextlib.ExitStack() as stack:
        proc, port, log_path = stack.enter_context(dagster_dev(tmp_path / "dev", path, home))
        instance = stack.enter_context(DagsterInstance.from_config(str(home)))
        if not instance.has_dynamic_partition("table", table):
            instance.add_dynamic_partitions("table", [table])
        graphql(port, "{ version }")
        retention = launch_backfill(port, "expired_snapshots", [table])
        dates = launch_backfill(port, "compaction", [f"{d}|{table}" for d in DATES])
        deadline = time.monotonic() + BOUND_S
        records = []
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"dagster dev exited:\n{log_path.read_text()[-3000:]}")
            backfills = [instance.get_backfill(b) for b in (retention, dates)]
            records = instance.get_run_records(RunsFilter(tags={TABLE_TAG: table}))
            ours = [r for r in records if r.dagster_run.tags.get("dagster/backfill") in (retention, dates)]
            if all(b.status.value.startswith("COMPLETED") for b in backfills) and ours and \
                    all(r.dagster_run.status in finished for r in records):
                break
            time.sleep(2.0)
        else:
            pytest.fail(f"the backfills did not finish within {BOUND_S}s: "
                        f"{[(r.dagster_run.job_name, r.dagster_run.status.value) for r in records]}")

        states = {b: (instance.get_backfill(b).status.value, instance.get_backfill(b).failure_count)
                  for b in (retention, dates)}
    by_backfill = {}
    for r in records:
        by_backfill.setdefault(r.dagster_run.tags.get("dagster/backfill"), []).append(r)
    assert by_backfill.get(retention) and by_backfill.get(dates), (states, {
        k: [(r.dagster_run.job_name, r.dagster_run.status.value) for r in v] for k, v in by_backfill.items()})
    for r in by_backfill[retention] + by_backfill[dates]:
        assert r.dagster_run.status == DagsterRunStatus.SUCCESS, (r.dagster_run.job_name, r.dagster_run.status)
    # every run of the table, however launched, ran alone
    spans = sorted((r.start_time, r.end_time, r.dagster_run.run_id) for r in records if r.start_time)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        assert start >= end, f"runs {first} and {second} of {table} overlapped ({start} < {end})"
    ids = sorted(r[0] for r in spark.sql(f"SELECT event_id FROM {writer.table_sql}").collect())
    assert ids == sorted(writer.ledger.expected_ids())
