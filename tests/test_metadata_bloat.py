"""Metadata bloat: the policy's `write.metadata.*` properties set by the expiry step (audited, dry run, refused
under read_only), and the metadata.json files no longer in the table's metadata log reclaimed by orphan
removal while every retained snapshot reads the same rows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import make_config, streaming_table
from icemaint.config.parse import ConfigError
from icemaint.domain.names import TableName
from icemaint.engine.retention import table_properties
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.expiry import ExpiryRequest
from icemaint.operations.housekeeping import Housekeeper
from icemaint.operations.orphans import OrphanRequest
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims

pytestmark = pytest.mark.slow

VERSIONS = "write.metadata.previous-versions-max"
DELETE_AFTER = "write.metadata.delete-after-commit.enabled"


def keeper(config, spark) -> Housekeeper:
    return Housekeeper(config, spark, CatalogReader(config), open_claims(config), open_audit(config))


def metadata_files(config, table: str) -> set[str]:
    ns, name = table.split(".")
    return {p.name for p in (Path(config.catalog.warehouse) / ns / name / "metadata").glob("*.metadata.json")}


def event_ids(spark, config, table: str, snapshot_id: int | None = None) -> list[int]:
    at = f" VERSION AS OF {int(snapshot_id)}" if snapshot_id else ""
    sql = TableName.parse(table).sql(config.catalog.name)
    return sorted(r[0] for r in spark.sql(f"SELECT event_id FROM {sql}{at}").collect())


@pytest.mark.parametrize("key, value, words", [
    ("metadata_versions_max", 0, ["metadata_versions_max", "below the minimum 1"]),
    ("metadata_versions_max", "5; DROP", ["metadata_versions_max", "not a whole number"]),
    ("metadata_delete_after_commit", "yes", ["metadata_delete_after_commit", "not a boolean"]),
])
def test_bad_metadata_policy_values_are_refused_at_load(lake_root, key, value, words):
    with pytest.raises(ConfigError) as info:
        make_config(lake_root, defaults={key: value})
    assert all(w in str(info.value) for w in words), str(info.value)


def test_expiry_sets_the_metadata_properties_once_and_says_so(spark, lake_root, tmp_path, table_name):
    streaming_table(spark, "lake", table_name, batches=3, days=1, rows_per_day=5, delete_every=0)
    policy = {"metadata_versions_max": 3, "metadata_delete_after_commit": True}
    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: policy})
    reader = CatalogReader(config)

    before = reader.metadata_location(table_name)
    dry = keeper(config, spark).expire(ExpiryRequest(table_name, dry_run=True))
    assert "would set" in dry.reason and f"{VERSIONS}=3" in dry.reason, dry.reason
    assert reader.metadata_location(table_name) == before, "a dry run changed the table"
    assert VERSIONS not in table_properties(spark, "lake", table_name)

    done = keeper(config, spark).expire(ExpiryRequest(table_name))
    props = table_properties(spark, "lake", table_name)
    assert props[VERSIONS] == "3" and props[DELETE_AFTER] == "true"
    assert f"set: {DELETE_AFTER}=true, {VERSIONS}=3" in done.reason, done.reason
    [record] = [r for r in open_audit(config).records(table=table_name, operation="expire") if r.reason == done.reason]
    assert record.details["evidence"]["metadata_properties"] == {
        "before": {VERSIONS: None, DELETE_AFTER: None}, "after": {VERSIONS: "3", DELETE_AFTER: "true"}, "applied": True}

    again = keeper(config, spark).expire(ExpiryRequest(table_name))
    assert "table properties" not in again.reason, "an aligned table is not changed again"

    sql = TableName.parse(table_name).sql("lake")
    for i in range(6):  # Iceberg now keeps 3 previous metadata files and deletes older ones itself
        spark.sql(f"INSERT INTO {sql} SELECT event_id + {10_000 + i}, device_id, ts, reading, status FROM {sql} LIMIT 1")
    assert len(metadata_files(config, table_name)) <= 4


def test_read_only_refuses_the_property_change(spark, lake_root, tmp_path, table_name):
    streaming_table(spark, "lake", table_name, batches=2, days=1, rows_per_day=5, delete_every=0)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={table_name: {"metadata_versions_max": 2, "read_only": True}})
    before = CatalogReader(config).metadata_location(table_name)
    outcome = keeper(config, spark).expire(ExpiryRequest(table_name))
    assert outcome.decision == "refuse" and "read_only" in outcome.reason, outcome.reason
    assert VERSIONS not in table_properties(spark, "lake", table_name)
    assert CatalogReader(config).metadata_location(table_name) == before


def test_metadata_files_dropped_from_the_log_are_reclaimed_by_orphan_removal(spark, lake_root, tmp_path, table_name):
    """With previous-versions-max 2 and no delete-after-commit, old metadata.json files pile up outside the log:
    orphan removal (its own cutoff, forced here) removes them and nothing the log or a snapshot needs."""
    writer = streaming_table(spark, "lake", table_name, batches=8, days=1, rows_per_day=5, delete_every=0)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={table_name: {"metadata_versions_max": 2, "metadata_delete_after_commit": False}})
    keeper(config, spark).expire(ExpiryRequest(table_name, older_than_seconds=10 * 365 * 86400))
    assert table_properties(spark, "lake", table_name)[VERSIONS] == "2"
    sql = TableName.parse(table_name).sql("lake")
    for i in range(4):
        spark.sql(f"INSERT INTO {sql} SELECT event_id + {20_000 + i}, device_id, ts, reading, status FROM {sql} LIMIT 1")
    expected = event_ids(spark, config, table_name)
    reader = CatalogReader(config)
    tbl = reader.load(table_name)
    in_log = {Path(e.metadata_file).name for e in tbl.metadata.metadata_log} | {Path(tbl.metadata_location).name}
    on_disk = metadata_files(config, table_name)
    stale = on_disk - in_log
    assert len(in_log) == 3 and len(stale) >= 8, (len(in_log), len(stale))
    for name in on_disk:  # all old enough for the forced cutoff below
        path = Path(config.catalog.warehouse, *table_name.split("."), "metadata", name)
        os.utime(path, (path.stat().st_mtime - 7200, path.stat().st_mtime - 7200))

    measured = reader.health(table_name, measure_metadata=True)
    assert measured.metadata_files == 3 and reader.health(table_name).metadata_bytes is None
    assert measured.metadata_files_below_log == len(stale) and reader.health(table_name).metadata_files_below_log is None
    assert measured.metadata_bytes_below_log == sum(
        Path(config.catalog.warehouse, *table_name.split("."), "metadata", name).stat().st_size for name in stale)
    assert measured.metadata_bytes == sum(
        Path(config.catalog.warehouse, *table_name.split("."), "metadata", name).stat().st_size for name in in_log)

    outcome = keeper(config, spark).remove_orphans(OrphanRequest(table_name, older_than_seconds=3600, force=True))
    assert outcome.decision == "run", outcome.reason
    assert metadata_files(config, table_name) == in_log
    assert reader.health(table_name, measure_metadata=True).metadata_files_below_log == 0
    assert reader.metadata_location(table_name) == tbl.metadata_location
    assert event_ids(spark, config, table_name) == expected
    for snap in reader.load(table_name).metadata.snapshots:  # a file removed that a snapshot needs would raise
        event_ids(spark, config, table_name, snap.snapshot_id)
    assert set(expected) >= writer.ledger.expected_ids()


def test_expiry_removes_metadata_files_older_than_the_log_and_nothing_else(spark, lake_root, tmp_path, table_name):
    """The default policy: metadata.json files that dropped out of the metadata log (previous-versions-max 2 here, 100
    by default; delete-after-commit off, Iceberg's default) are removed by the expiry step, as Iceberg's
    delete-after-commit would have; a refused request and a dry run change nothing, main never moves back."""
    import uuid

    from pyiceberg.expressions import AlwaysTrue

    writer = streaming_table(spark, "lake", table_name, batches=6, days=1, rows_per_day=5, delete_every=0)
    sql = TableName.parse(table_name).sql("lake")
    spark.sql(f"ALTER TABLE {sql} SET TBLPROPERTIES ('{VERSIONS}' = '2')")
    writer.run(2)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {}})
    directory = Path(config.catalog.warehouse, *table_name.split("."), "metadata")
    in_flight = directory / f"{uuid.uuid4()}.metadata.json"  # a Hadoop commit's temporary file, before its rename
    in_flight.write_text("{}")
    for path in directory.iterdir():  # old enough for the margin
        os.utime(path, (path.stat().st_mtime - 7200, path.stat().st_mtime - 7200))
    writer.run(1)
    reader = CatalogReader(config)

    def version(name: str) -> int:
        return int(name[1:].split(".")[0])

    before, on_disk = reader.load(table_name), metadata_files(config, table_name)
    in_log = {Path(e.metadata_file).name for e in before.metadata.metadata_log} | {Path(before.metadata_location).name}
    stale = on_disk - in_log - {in_flight.name}
    assert len(in_log) == 3 and len(stale) >= 8, (in_log, on_disk)
    young = max(stale, key=version)  # as if it had dropped out of the log a moment ago: inside the margin
    os.utime(directory / young, None)
    assert reader.health(table_name, measure_metadata=True).metadata_files_below_log == len(stale)  # the report sees them

    def unchanged(outcome, words):
        assert words in outcome.reason, outcome.reason
        assert reader.metadata_location(table_name) == before.metadata_location, outcome.reason
        assert metadata_files(config, table_name) == on_disk

    dry = keeper(config, spark).expire(ExpiryRequest(table_name, dry_run=True, older_than_seconds=0))
    unchanged(dry, f"would remove {len(stale) - 1} metadata.json files")
    for refused_policy, words in (({"read_only": True}, "read_only"),
                                  ({"allowed_operations": ["compact"]}, "not allowed")):
        refusing = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: refused_policy})
        outcome = keeper(refusing, spark).expire(ExpiryRequest(table_name, older_than_seconds=0))
        assert outcome.decision == "refuse", outcome.reason
        unchanged(outcome, words)

    head = before.current_snapshot()
    done = keeper(config, spark).expire(ExpiryRequest(table_name, older_than_seconds=0))
    after = reader.load(table_name)
    kept = {Path(e.metadata_file).name for e in after.metadata.metadata_log} | {Path(after.metadata_location).name}
    assert metadata_files(config, table_name) == kept | {in_flight.name, young}
    removed = on_disk - metadata_files(config, table_name)
    assert removed == (stale - {young}) | (in_log - kept)  # also the one the expiry's own commit moved out of the log
    assert reader.health(table_name, measure_metadata=True).metadata_files_below_log == 1  # the young one
    assert all(version(n) < min(version(k) for k in kept) for n in removed)
    assert done.decision == "run" and f"removed {len(removed)} metadata.json files" in done.reason, done.reason
    assert done.metrics["metadata_files_removed"] == len(removed)
    [record] = [r for r in open_audit(config).records(table=table_name, operation="expire") if r.reason == done.reason]
    assert record.details["evidence"]["metadata_files"]["metadata_files_removed"] == len(removed)
    # main stays where it was (an expiry commits no snapshot) and moved forward in sequence, never back
    assert after.current_snapshot().snapshot_id == head.snapshot_id
    assert after.metadata.last_sequence_number >= before.metadata.last_sequence_number
    assert (directory / "version-hint.text").exists()
    # an independent reader (pyiceberg) still reads every row, and Spark every retained snapshot
    ids = sorted(after.scan(row_filter=AlwaysTrue()).to_arrow().column("event_id").to_pylist())
    assert ids == sorted(writer.ledger.expected_ids()) == event_ids(spark, config, table_name)
    for snap in after.metadata.snapshots:
        event_ids(spark, config, table_name, snap.snapshot_id)
