"""Claimed, audited, policy-gated expiry / orphan removal / manifest rewrites (`Housekeeper`) on real
Spark + Iceberg: the rows and files they keep, deferrals, refusals, dry runs and the audit trail."""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import make_config, streaming_table
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims, table_claim
from icemaint.operations.expiry import ExpiryRequest
from icemaint.operations.housekeeping import Housekeeper
from icemaint.operations.manifests import ManifestRequest
from icemaint.operations.orphans import OrphanRequest
from icemaint.observe.catalog import CatalogReader, TableNotFound
from icemaint.domain.names import InvalidTableName, TableName
from icemaint.domain.retention import RetentionError
from icemaint.engine.retention import read_snapshots



def simulate(spark, config, table, batches=4):
    return streaming_table(spark, config.catalog.name, table, batches=batches, days=2, rows_per_day=10,
                           delete_every=0)


def housekeeper(config, spark):
    return Housekeeper(config, spark, CatalogReader(config), open_claims(config), open_audit(config))


def rows(spark, config, table):
    sql = TableName.parse(table).sql(config.catalog.name)
    return sorted(r[0] for r in spark.sql(f"SELECT event_id FROM {sql}").collect())


def table_files(config, table) -> dict[str, int]:
    ns, name = table.split(".")
    root = Path(config.catalog.warehouse) / ns / name
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def records(config, table, operation=None):
    return open_audit(config).records(table=table, operation=operation)


def plant(path: Path, age: timedelta) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a table file" * 10)
    stamp = time.time() - age.total_seconds()
    os.utime(path, (stamp, stamp))
    return path


@pytest.fixture
def own_config(lake_root, tmp_path):
    """A config on the shared warehouse with its own state dir and per-table policy overrides."""
    def build(**tables):
        return make_config(lake_root, state_dir=str(tmp_path / "state"), tables=tables)
    return build


@pytest.fixture(scope="module")
def untouched(spark, config) -> str:
    """One table for the checks that change nothing (deferrals, refusals, bad input); each checks it stays put."""
    table = f"t.retention_untouched_{uuid.uuid4().hex[:8]}"
    simulate(spark, config, table, batches=3)
    return table


def test_expiry_after_compaction_reclaims_superseded_files_and_keeps_every_row(spark, config, table_name):
    writer = simulate(spark, config, table_name, batches=4)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    rewrite = spark.sql(f"CALL lake.system.rewrite_data_files(table => '{table_name}', "
                        "options => map('min-input-files', '2'))").collect()[0]
    assert rewrite["rewritten_data_files_count"] == 8
    snapshots, _ = read_snapshots(spark, "lake", table_name)
    in_flight = snapshots[1].snapshot_id  # as if a queued compaction had been planned on it
    before_rows = rows(spark, config, table_name)

    outcome = housekeeper(config, spark).expire(ExpiryRequest(
        table_name, older_than_seconds=0, retain_last=1, in_flight_snapshot_ids=(in_flight,), run_id="r-1"))

    assert outcome.decision == "run", outcome.reason
    left = {s.snapshot_id for s in read_snapshots(spark, "lake", table_name)[0]}
    assert in_flight in left and snapshots[-1].snapshot_id in left
    assert snapshots[0].snapshot_id not in left
    assert "in-flight" in outcome.evidence["protected"][str(in_flight)]
    m = outcome.metrics
    assert (m["snapshots_before"], m["snapshots_after"]) == (5, len(left))
    assert m["snapshots_removed"] == 5 - len(left) == len(outcome.evidence["expired_snapshot_ids"])
    assert m["bytes_reclaimed"] > 0 and m["manifest_lists_deleted"] == m["snapshots_removed"]
    assert outcome.metadata_location_after != outcome.metadata_location_before
    assert outcome.before_snapshot_id == outcome.after_snapshot_id == snapshots[-1].snapshot_id
    assert rows(spark, config, table_name) == before_rows == sorted(writer.ledger.expected_ids())
    spark.sql(f"SELECT count(*) FROM {sql} VERSION AS OF {in_flight}").collect()  # still readable

    record = records(config, table_name, "expire")[-1]
    assert (record.decision, record.run_id, record.identity) == ("run", "r-1", config.identity())
    assert record.details["metrics"] == m and record.details["dry_run"] is False
    assert record.durations["duration_seconds"] > 0


def test_expiry_dry_run_and_noop_change_nothing(spark, config, table_name):
    simulate(spark, config, table_name, batches=3)
    reader = CatalogReader(config)
    location, files = reader.metadata_location(table_name), table_files(config, table_name)

    preview = housekeeper(config, spark).expire(ExpiryRequest(table_name, dry_run=True, older_than_seconds=0))
    assert preview.decision == "run" and preview.dry_run and "nothing changed" in preview.reason
    assert preview.metrics["snapshots_removed"] == 2 and preview.metrics["snapshots_after"] == 1
    # by policy (snapshot_older_than 7 d) these fresh snapshots are all kept
    noop = housekeeper(config, spark).expire(ExpiryRequest(table_name))
    assert noop.decision == "noop" and "nothing to expire" in noop.reason

    assert reader.metadata_location(table_name) == location and table_files(config, table_name) == files
    assert len(read_snapshots(spark, "lake", table_name)[0]) == 3
    assert [(r.decision, r.details["dry_run"]) for r in records(config, table_name)] == [("run", True), ("noop", False)]


@pytest.mark.parametrize("operation", ["expire", "orphans", "manifests"])
def test_busy_claim_defers_naming_the_holder(spark, config, untouched, operation):
    table_name = untouched
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    request = {"expire": ExpiryRequest(table_name, older_than_seconds=0),
               "orphans": OrphanRequest(table_name, older_than_seconds=0, force=True),
               "manifests": ManifestRequest(table_name, force=True)}[operation]
    run = {"expire": "expire", "orphans": "remove_orphans", "manifests": "rewrite_manifests"}[operation]
    with table_claim(config, table_name, holder="nightly-ingest"):
        outcome = getattr(housekeeper(config, spark), run)(request)
    assert outcome.decision == "defer" and "nightly-ingest" in outcome.reason
    assert outcome.claim_holder == "nightly-ingest"
    assert reader.metadata_location(table_name) == location
    record = records(config, table_name, operation)[-1]
    assert record.decision == "defer" and record.writer_check == {"claim_holder": "nightly-ingest"}


@pytest.mark.parametrize("policy, message", [
    ({"read_only": True}, "read-only by policy"),
    ({"allowed_operations": ["compact"]}, "is not allowed by policy"),
    ({"allowed_identities": ["someone-else"]}, "identity 'maint-test' is not allowed"),
])
def test_policy_refusals_change_nothing(spark, own_config, untouched, policy, message):
    table_name = untouched
    config = own_config(**{table_name: policy})
    reader = CatalogReader(config)
    location, files = reader.metadata_location(table_name), table_files(config, table_name)
    keeper = housekeeper(config, spark)
    outcomes = [keeper.expire(ExpiryRequest(table_name, older_than_seconds=0)),
                keeper.remove_orphans(OrphanRequest(table_name, older_than_seconds=0, force=True)),
                keeper.rewrite_manifests(ManifestRequest(table_name, force=True))]
    for outcome in outcomes:
        assert outcome.decision == "refuse" and message in outcome.reason
    assert reader.metadata_location(table_name) == location and table_files(config, table_name) == files
    assert [(r.operation, r.decision) for r in records(config, table_name)] == [
        ("expire", "refuse"), ("orphans", "refuse"), ("manifests", "refuse")]


def test_expiry_inside_the_owners_window_is_refused(spark, own_config, untouched):
    table_name = untouched
    config = own_config(**{table_name: {"snapshot_min_age": "10d"}})
    location = CatalogReader(config).metadata_location(table_name)
    outcome = housekeeper(config, spark).expire(ExpiryRequest(table_name, older_than_seconds=86400))
    assert outcome.decision == "refuse" and "inside the owner's retention window" in outcome.reason
    assert CatalogReader(config).metadata_location(table_name) == location
    assert records(config, table_name, "expire")[-1].decision == "refuse"


def test_bad_input_is_refused_before_anything_is_touched(spark, own_config, untouched):
    table_name = untouched
    config = own_config()
    keeper = housekeeper(config, spark)
    with pytest.raises(RetentionError, match="retain_last=0"):
        ExpiryRequest(table_name, retain_last=0)
    with pytest.raises(RetentionError, match="older_than=-1.0 is negative; an age must be zero or more seconds"):
        OrphanRequest(table_name, older_than_seconds=-1.0)
    with pytest.raises(TableNotFound):
        keeper.expire(ExpiryRequest("t.does_not_exist"))
    with pytest.raises(InvalidTableName):
        keeper.rewrite_manifests(ManifestRequest("t.x; DROP TABLE t.y"))
    assert records(config, table_name) == []


def test_a_table_with_gc_disabled_is_refused_expiry_and_orphan_removal(spark, own_config, table_name):
    config = own_config()
    sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} (id BIGINT) USING iceberg TBLPROPERTIES ('gc.enabled'='FALSE')")
    spark.sql(f"INSERT INTO {sql} VALUES (1)")
    spark.sql(f"INSERT INTO {sql} VALUES (2)")
    location = CatalogReader(config).metadata_location(table_name)
    keeper = housekeeper(config, spark)
    expiry = keeper.expire(ExpiryRequest(table_name, older_than_seconds=0, retain_last=1))
    orphans = keeper.remove_orphans(OrphanRequest(table_name))
    for outcome in (expiry, orphans):
        assert outcome.decision == "refuse" and "has gc.enabled=false" in outcome.reason, outcome.reason
    assert CatalogReader(config).metadata_location(table_name) == location
    assert len(read_snapshots(spark, "lake", table_name)[0]) == 2


def test_orphans_removed_quarantined_forced_and_dry_run(spark, own_config, table_name):
    config = own_config()
    writer = simulate(spark, config, table_name, batches=2)
    ns, name = table_name.split(".")
    data = Path(config.catalog.warehouse) / ns / name / "data" / "ts_day=2026-01-01"
    old = plant(data / "orphan-old.parquet", timedelta(days=4))
    young = plant(data / "orphan-young.parquet", timedelta(hours=2))
    keeper = housekeeper(config, spark)
    files = table_files(config, table_name)

    preview = keeper.remove_orphans(OrphanRequest(table_name, dry_run=True))  # the policy's 72 h
    assert preview.decision == "run" and preview.metrics == {"candidates": 1, "removed": 0, "bytes": 160}
    assert table_files(config, table_name) == files

    too_young = keeper.remove_orphans(OrphanRequest(table_name, older_than_seconds=3600))
    assert too_young.decision == "refuse" and "less than 24 h" in too_young.reason
    assert young.exists() and old.exists()

    outcome = keeper.remove_orphans(OrphanRequest(table_name))
    assert outcome.decision == "run" and outcome.metrics == {"candidates": 1, "removed": 1, "bytes": 160}
    assert not old.exists() and young.exists()

    forced = keeper.remove_orphans(OrphanRequest(table_name, older_than_seconds=3600, force=True, quarantine=True))
    assert forced.decision == "run" and "FORCED" in forced.reason
    quarantined = Path(config.state_dir, "quarantine", table_name)
    moved = list(quarantined.rglob("orphan-young.parquet"))
    assert not young.exists() and len(moved) == 1
    assert rows(spark, config, table_name) == sorted(writer.ledger.expected_ids())

    nothing = keeper.remove_orphans(OrphanRequest(table_name))
    assert nothing.decision == "noop" and nothing.metrics["candidates"] == 0
    trail = records(config, table_name, "orphans")
    assert [r.decision for r in trail] == ["run", "refuse", "run", "run", "noop"]
    assert trail[3].details["evidence"]["forced_cutoff_under_24h"] is True
    assert trail[3].details["settings"]["force"] is True


def test_manifests_rewrite_only_when_due_or_forced(spark, own_config, table_name):
    config = own_config(**{table_name: {"manifest_min_count": 4}})
    writer = simulate(spark, config, table_name, batches=3)
    keeper = housekeeper(config, spark)
    location = CatalogReader(config).metadata_location(table_name)

    not_due = keeper.rewrite_manifests(ManifestRequest(table_name))
    assert not_due.decision == "noop" and "below manifest_min_count=4" in not_due.reason
    preview = keeper.rewrite_manifests(ManifestRequest(table_name, force=True, dry_run=True))
    assert preview.decision == "run" and preview.metrics["manifests_after"] == 1
    assert CatalogReader(config).metadata_location(table_name) == location

    writer.run(1)
    due = keeper.rewrite_manifests(ManifestRequest(table_name))
    assert due.decision == "run", due.reason
    assert (due.metrics["manifests_before"], due.metrics["manifests_after"]) == (4, 1)
    assert due.after_snapshot_id != due.before_snapshot_id
    assert rows(spark, config, table_name) == sorted(writer.ledger.expected_ids())
    assert [r.decision for r in records(config, table_name, "manifests")] == ["noop", "run", "run"]


def test_a_staging_branch_a_dead_run_left_makes_expiry_due_and_expiry_removes_it_first(spark, own_config,
                                                                                         table_name):
    """A run killed with its staging branch on the table (before its publish here) leaves the branch pinning the
    files it replaced; on a table where nothing becomes due nothing removed it. The retention tick makes expiry due
    for it (waiting for any run in flight on the table) and expiry removes it first, audited as cleanup."""
    from icemaint.domain.retention_tick import decide_retention
    from icemaint.observe.manifests import read_retention_signals

    config = own_config()
    writer = simulate(spark, config, table_name)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    head = CatalogReader(config).load(table_name).current_snapshot().snapshot_id
    spark.sql(f"ALTER TABLE {sql} CREATE BRANCH `icemaint_stage_deadrun_1` AS OF VERSION {head}")
    policy = config.policy(table_name)
    signals = read_retention_signals(CatalogReader(config).load(table_name), table_name, policy)
    assert signals.staging_branches == 1

    def expire_decision(in_flight):
        [decision] = [d for d in decide_retention(signals, policy, "maint", dt.datetime.now(dt.timezone.utc),
                                                  claim_holder=None, in_flight_jobs=in_flight, expiry_mark=None,
                                                  orphans_mark=None) if d.operation == "expire"]
        return decision

    assert expire_decision({"compaction_job"}).verdict == "defer"  # maybe that run's own, live branch
    due = expire_decision(set())
    assert due.verdict == "run" and "1 staging branch left by dead runs pin the files they replaced" in due.reason

    dry = housekeeper(config, spark).expire(ExpiryRequest(table_name, dry_run=True))
    assert "would first remove 1 staging branch(es)" in dry.reason
    assert "icemaint_stage_deadrun_1" in CatalogReader(config).load(table_name).metadata.refs
    outcome = housekeeper(config, spark).expire(ExpiryRequest(table_name))
    assert "removed 1 staging branch(es) dead runs left first" in outcome.reason, outcome.reason
    assert set(CatalogReader(config).load(table_name).metadata.refs) == {"main"}
    [cleanup] = records(config, table_name, "cleanup")
    assert "ended before publishing" in cleanup.reason and cleanup.details["branch"] == "icemaint_stage_deadrun_1"
    assert rows(spark, config, table_name) == sorted(writer.ledger.expected_ids())
