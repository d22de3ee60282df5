"""Checkpoint-safe expiry (issue 16): the newest snapshot carrying each streaming writer job's checkpoint
marker is never expired, per job, with the reason in the plan; other writers' markers are configurable."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from conftest import write_config
from icemaint.config import load_config
from icemaint.domain.names import TableName
from icemaint.domain.policy import DEFAULT_CHECKPOINT_MARKERS, PolicyError, TablePolicy, apply_overrides
from icemaint.domain.retention import SnapshotInfo, SnapshotRef, checkpoint_snapshots, plan_expiry
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.expiry import ExpiryRequest
from icemaint.operations.housekeeping import Housekeeper
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims

NOW = datetime(2026, 1, 10, tzinfo=timezone.utc)
DAY_MS = 86_400_000
POLICY = TablePolicy(snapshot_older_than_seconds=86400, snapshot_retain_last=1, snapshot_min_age_seconds=0)
FLINK = "flink.max-committed-checkpoint-id"


def snap(i: int, days_ago: float, **markers: str) -> SnapshotInfo:
    return SnapshotInfo(i, i - 1 if i > 1 else None, int(NOW.timestamp() * 1000 - days_ago * DAY_MS),
                        markers={k.replace("_", "."): v for k, v in markers.items()})


def flink(i: int, days_ago: float, job: str, checkpoint: int) -> SnapshotInfo:
    return SnapshotInfo(i, i - 1 if i > 1 else None, int(NOW.timestamp() * 1000 - days_ago * DAY_MS),
                        markers={FLINK: str(checkpoint), "flink.job-id": job})


def test_each_jobs_newest_checkpoint_stays_and_older_ones_expire():
    snaps = [flink(1, 30, "job-a", 7), flink(2, 29, "job-b", 3), flink(3, 20, "job-a", 8),
             snap(4, 10), snap(5, 5), snap(6, 0.1)]
    plan = plan_expiry(snaps, {"main": SnapshotRef.branch(6)}, NOW, POLICY)
    assert 3 in plan.protected and "writer job job-a (flink.max-committed-checkpoint-id=8)" in plan.protected[3]
    assert 2 in plan.protected and "job-b" in plan.protected[2]
    assert set(plan.expiring_snapshot_ids) == {1}, "job-a's older checkpoint goes; the cutoff keeps what is newer"


def test_markers_are_configurable_and_validated():
    snaps = [snap(1, 9, **{"my_writer_offset": "12"}), snap(2, 8, **{"my_writer_offset": "13"}), snap(3, 0.1)]
    assert checkpoint_snapshots(snaps, DEFAULT_CHECKPOINT_MARKERS) == {}
    custom = apply_overrides(POLICY, {"checkpoint_markers": ["my.writer.offset"]}, "defaults")
    assert list(checkpoint_snapshots(snaps, custom.checkpoint_markers)) == [2]
    for bad in ("flink.max-committed-checkpoint-id", [""], ["a b"], ["x@y@z"], [1]):
        with pytest.raises(PolicyError, match="checkpoint_markers"):
            apply_overrides(POLICY, {"checkpoint_markers": bad}, "defaults")


def test_a_real_expiry_keeps_the_flink_checkpoint_snapshot(spark, lake_root, tmp_path, table_name):
    sql = TableName.parse(table_name).sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, v STRING) USING iceberg")
    for i, checkpoint in enumerate((41, 42)):  # a Flink-like writer: its checkpoint id in the summary
        spark.createDataFrame([(i, "flink")], "id BIGINT, v STRING").writeTo(sql) \
            .option(f"snapshot-property.{FLINK}", str(checkpoint)) \
            .option("snapshot-property.flink.job-id", "job-a").append()
    for i in range(3):  # then a batch writer without markers
        spark.sql(f"INSERT INTO {sql} VALUES ({10 + i}, 'batch')")
    snapshots = {r[0]: r[1] for r in spark.sql(f"SELECT snapshot_id, summary FROM {sql}.snapshots").collect()}
    [checkpoint_42] = [s for s, summary in snapshots.items() if summary.get(FLINK) == "42"]
    [checkpoint_41] = [s for s, summary in snapshots.items() if summary.get(FLINK) == "41"]
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"))
    config = load_config(path)
    outcome = Housekeeper(config, spark, CatalogReader(config), open_claims(config), open_audit(config)).expire(
        ExpiryRequest(table_name, older_than_seconds=0, retain_last=1))
    assert outcome.decision == "run", outcome.reason
    left = {r[0] for r in spark.sql(f"SELECT snapshot_id FROM {sql}.snapshots").collect()}
    assert checkpoint_42 in left and checkpoint_41 not in left
    why = outcome.evidence["protected"][str(checkpoint_42)]
    assert "newest checkpoint of writer job job-a (flink.max-committed-checkpoint-id=42)" in why
    assert spark.sql(f"SELECT count(*) FROM {sql} VERSION AS OF {checkpoint_42}").first()[0] == 2
