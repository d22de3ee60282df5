"""An asset backfill over three dates of one table, launched through Dagster's own backfill machinery
(the BackfillDaemon's iteration over an in-process code location), compacts each date with its own proof.

The runs execute synchronously in this process (Dagster's SyncInMemoryRunLauncher), on the session's Spark.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.daemon import get_default_daemon_logger

from conftest import write_config
from icemaint.safety.audit import open_audit
from icemaint.config import load_config
from icemaint.app.simulator import StreamingWriter, WorkloadSpec

REPO = Path(__file__).resolve().parent.parent
DATES = ["2026-01-01", "2026-01-02", "2026-01-03"]
PROOFS = {"row_count_parity", "sample_comparison", "column_aggregates"}

pytestmark = pytest.mark.slow


def code_location_target() -> InProcessWorkspaceLoadTarget:
    """`maint_assets.definitions` as the webserver and daemon load it, but in this process."""
    origin = LoadableTargetOrigin(executable_path=sys.executable, module_name="maint_assets.definitions",
                                  working_directory=str(REPO))
    return InProcessWorkspaceLoadTarget(InProcessCodeLocationOrigin(origin, location_name="icemaint"))


def test_asset_backfill_compacts_each_date_with_its_own_proof(spark, lake_root, tmp_path, monkeypatch,
                                                              isolated_dagster_home):
    namespace = f"bf_{uuid.uuid4().hex[:8]}"
    writer = StreamingWriter(spark, "lake", WorkloadSpec(table=f"{namespace}.events", days=3, rows_per_day=8,
                                                          delete_every=0, seed=21))
    writer.create_table()
    writer.run(3)  # 3 small files on each date: just over min_input_files
    table = writer.name.key
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [f"{namespace}.*"]})
    config = load_config(path)
    monkeypatch.setenv("ICEMAINT_CONFIG", str(path))  # what the code location reads when it loads
    keys = [f"{d}|{table}" for d in DATES]

    with dg.instance_for_test(synchronous_run_launcher=True, synchronous_run_coordinator=True) as instance:
        instance.add_dynamic_partitions("table", [table])
        with create_test_daemon_workspace_context(code_location_target(), instance) as workspace:
            backfill_id = f"bf{uuid.uuid4().hex[:6]}"
            instance.add_backfill(PartitionBackfill.from_asset_partitions(
                backfill_id=backfill_id, asset_graph=workspace.create_request_context().asset_graph,
                partition_names=keys, asset_selection=[dg.AssetKey("compaction"), dg.AssetKey("validation_report")],
                backfill_timestamp=time.time(), tags={}, dynamic_partitions_store=instance, all_partitions=False,
                title="compact three dates", description=None, run_config=None))
            logger = get_default_daemon_logger("BackfillDaemon")
            for _ in range(5):  # the daemon's loop: request runs, then see them finished
                errors = [e for e in execute_backfill_iteration(workspace, logger) if e is not None]
                assert not errors, errors[0].to_string()
                if instance.get_backfill(backfill_id).status != BulkActionStatus.REQUESTED:
                    break
        assert instance.get_backfill(backfill_id).status == BulkActionStatus.COMPLETED_SUCCESS

        # a batched backfill: the three dates of the table in one run (one Spark session, one claim wait)
        [run] = instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert (run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]) == \
            (keys[0], keys[-1])
        materialized = {(e.dagster_event.event_specific_data.materialization.asset_key.to_user_string(),
                         e.dagster_event.event_specific_data.materialization.partition)
                        for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)}
        assert materialized == {(asset, key) for asset in ("compaction", "validation_report") for key in keys}
        checks = [e.dagster_event.event_specific_data
                  for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)]
        # each date's proofs attached to that date's partition (the partition shows passed, not skipped), and the
        # run's own result per check, which Dagster attaches to no partition
        assert sorted((c.partition, c.check_name) for c in checks if c.partition) == sorted(
            (key, name) for key in keys for name in PROOFS)
        assert sorted(c.check_name for c in checks if not c.partition) == sorted(PROOFS)
        assert all(c.passed for c in checks)
        for key in keys:  # each date has its own materialization, proof and evidence
            [record] = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("compaction"), asset_partitions=[key]), limit=5).records
            assert record.run_id == run.run_id
            outcome = record.asset_materialization.metadata["outcome"].value
            assert outcome["decision"] == "run" and outcome["validation"]["passed"] is True
            assert outcome["date"] == key.split("|")[0] and outcome["files_after"] < outcome["files_before"]
            report = tmp_path / "state" / "reports" / table / f"{key.split('|')[0]}.json"
            assert report.exists() and '"passed": true' in report.read_text(), "each date's report is written"
        runs = {"all": run}

    audit = [r for r in open_audit(config).records(table=table, operation="compact") if r.decision == "run"]
    assert sorted(r.date for r in audit) == DATES
    assert {r.run_id for r in audit} == {run.run_id for run in runs.values()}, "each date audited by the run"
    assert all(r.validation["passed"] is True and r.after_snapshot_id for r in audit)
    # three separate rewrites, each on top of the one before
    assert len({r.after_snapshot_id for r in audit}) == 3
    ids = sorted(r[0] for r in spark.sql(f"SELECT event_id FROM {writer.table_sql}").collect())
    assert ids == sorted(writer.ledger.expected_ids())


def test_a_date_with_nothing_to_rewrite_reports_its_proof_as_not_needed_not_failed(tmp_path):
    """Its checks pass ("nothing was rewritten: no proof needed"); its report said passed: false beside them."""
    from maint_assets.compaction import write_report

    noop = {"decision": "noop", "before_snapshot_id": 1, "after_snapshot_id": 1, "validation": {"passed": None}}
    meta = write_report(str(tmp_path), "2026-01-05|db.t", noop)
    assert meta["passed"].value is True and meta["proofs"].value == 0
    ran = {**noop, "decision": "run", "validation": {"passed": False, "commits": [{"passed": False}]}}
    meta = write_report(str(tmp_path), "2026-01-05|db.t", ran)
    assert meta["passed"].value is False and meta["proofs"].value == 1
