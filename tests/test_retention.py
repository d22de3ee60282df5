"""Retention: pure expiry planning and due-checks, and expiry, orphan removal and manifest rewrites
on a real Spark + Iceberg warehouse, checked against the files on disk and time travel."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from icemaint.domain.policy import DEFAULT_CHECKPOINT_MARKERS, TablePolicy
from icemaint.domain.retention import (
    DRIVER_CLEANUP_MAX_FILES,
    DRIVER_CLEANUP_MAX_MANIFESTS,
    RetentionError,
    SnapshotInfo,
    SnapshotRef,
    expiry_cleanup,
    expiry_due,
    manifests_due,
    marker_keys,
    orphan_cutoff,
    plan_expiry,
    procedure_retains,
)
from icemaint.engine.manifests import rewrite_manifests
from icemaint.engine.orphans import delete_batches, quarantine_batches, remove_orphan_files
from icemaint.engine.retention import expire_snapshots, read_snapshots
from icemaint.observe.catalog import CatalogReader

NOW = datetime(2026, 1, 10, tzinfo=timezone.utc)
DAY_MS = 86_400_000
POLICY = TablePolicy(snapshot_older_than_seconds=7 * 86400, snapshot_retain_last=1, snapshot_min_age_seconds=0)


def expire(spark, config, table_name: str, plan, **kwargs):
    """The engine's expiry, with the table's pyiceberg FileIO as the housekeeper passes it."""
    return expire_snapshots(spark, "lake", table_name, plan, io=CatalogReader(config).load(table_name).io, **kwargs)


def history(days_ago: list[float]) -> list[SnapshotInfo]:
    """A linear main history, oldest first, each snapshot the given number of days before NOW."""
    now_ms = int(NOW.timestamp() * 1000)
    snaps, parent = [], None
    for i, age in enumerate(days_ago, start=1):
        snaps.append(SnapshotInfo(i, parent, now_ms - int(age * DAY_MS)))
        parent = i
    return snaps


def main_at(snaps: list[SnapshotInfo], **extra: SnapshotRef) -> dict[str, SnapshotRef]:
    return {"main": SnapshotRef.branch(snaps[-1].snapshot_id), **extra}


# ---------------------------------------------------------------------------------------------
# Pure planning
# ---------------------------------------------------------------------------------------------

def test_plan_expires_only_old_snapshots_beyond_retain_last():
    snaps = history([30, 20, 10, 8, 3, 1])
    plan = plan_expiry(snaps, main_at(snaps), NOW, POLICY)
    assert plan.expiring_snapshot_ids == (1, 2, 3, 4)
    assert plan.older_than == NOW - timedelta(days=7)
    assert plan.protected[6] == "current snapshot"
    assert set(plan.protected) == {5, 6}

    plan = plan_expiry(snaps, main_at(snaps), NOW, POLICY, retain_last=4)
    assert plan.expiring_snapshot_ids == (1, 2)
    assert "newest 4" in plan.protected[3]


def test_plan_keeps_tags_branch_heads_and_in_flight_by_lowering_the_cutoff():
    snaps = history([30, 25, 20, 15, 10, 1])
    refs = main_at(snaps, audit=SnapshotRef.tag(1), dev=SnapshotRef.branch(2))
    plan = plan_expiry(snaps, refs, NOW, POLICY, in_flight_snapshot_ids={4})
    # 4 is on main's ancestry: the walk from main's head must reach it, so the cutoff drops to 4's time
    assert plan.older_than == NOW - timedelta(days=15)
    assert plan.expiring_snapshot_ids == (3,)
    assert plan.protected[1] == "tagged 'audit'"
    assert plan.protected[2] == "head of branch 'dev'"
    assert "in-flight" in plan.protected[4]
    assert "lowered" in plan.protected[5]
    assert any("lowered" in note for note in plan.notes)
    assert plan.requested_older_than == NOW - timedelta(days=7)


def test_plan_matches_procedure_semantics_on_out_of_order_timestamps():
    # Snapshot 4 has a clock-skewed timestamp older than its parent: Iceberg's ancestry walk stops
    # at 4, so 3 would go although it is young; protecting 3 must lower the cutoff to 4's time.
    snaps = history([50, 30, 2, 40, 1])
    plan = plan_expiry(snaps, main_at(snaps), NOW, POLICY, in_flight_snapshot_ids={3})
    assert plan.older_than == NOW - timedelta(days=40)
    cutoff_ms = int(plan.older_than.timestamp() * 1000)
    kept = procedure_retains(snaps, main_at(snaps), cutoff_ms, plan.retain_last, int(NOW.timestamp() * 1000))
    assert set(plan.expiring_snapshot_ids) == {s.snapshot_id for s in snaps} - kept == {1}


def test_plan_unreferenced_snapshot_kept_by_cutoff_and_dropped_refs_reported():
    snaps = history([30, 20, 1])
    orphan_branch_tip = SnapshotInfo(9, 1, int(NOW.timestamp() * 1000) - 12 * DAY_MS)  # off main, no ref
    refs = main_at(snaps, old=SnapshotRef.tag(2, max_ref_age_ms=DAY_MS))
    plan = plan_expiry(snaps + [orphan_branch_tip], refs, NOW, POLICY, in_flight_snapshot_ids={9})
    assert plan.dropped_refs == ("old",)
    assert plan.older_than == NOW - timedelta(days=12)
    assert plan.expiring_snapshot_ids == (1, 2)


def test_owner_window_refuses_overrides_and_clamps_policy():
    snaps = history([30, 20, 9, 6, 1])
    owner = replace(POLICY, snapshot_min_age_seconds=10 * 86400)
    with pytest.raises(RetentionError, match="inside the owner's retention window snapshot_min_age"):
        plan_expiry(snaps, main_at(snaps), NOW, owner, older_than_seconds=3 * 86400)
    plan = plan_expiry(snaps, main_at(snaps), NOW, owner)  # policy's 7 d is inside the 10 d window
    assert plan.older_than == NOW - timedelta(days=10)
    assert plan.expiring_snapshot_ids == (1, 2)
    assert any("clamped" in n for n in plan.notes)
    assert all("younger than the owner's retention window" in plan.protected[i] for i in (3, 4))


def test_max_count_raises_the_cutoff_but_not_into_the_window():
    snaps = history([6, 5, 4, 3, 2, 1])
    plan = plan_expiry(snaps, main_at(snaps), NOW, replace(POLICY, snapshot_max_count=3))
    assert plan.expiring_snapshot_ids == (1, 2, 3)
    plan = plan_expiry(snaps, main_at(snaps), NOW,
                       replace(POLICY, snapshot_max_count=3, snapshot_min_age_seconds=4.5 * 86400))
    assert plan.expiring_snapshot_ids == (1, 2)


@pytest.mark.parametrize("kwargs, policy, message", [
    (dict(retain_last=0), POLICY, "retain_last=0"),
    (dict(retain_last=True), POLICY, "retain_last=True"),
    (dict(older_than_seconds=-1), POLICY, "older_than=-1 is negative"),
    (dict(), replace(POLICY, snapshot_min_age_seconds=-5), "snapshot_min_age=-5 is negative"),
    (dict(), replace(POLICY, snapshot_older_than_seconds=-1.0), "snapshot_older_than=-1.0 is negative"),
    (dict(), replace(POLICY, snapshot_retain_last=0), "retain_last=0"),
    (dict(), replace(POLICY, read_only=True), "read_only"),
])
def test_invalid_settings_are_refused_by_name(kwargs, policy, message):
    snaps = history([10, 1])
    with pytest.raises(RetentionError, match=message):
        plan_expiry(snaps, main_at(snaps), NOW, policy, **kwargs)


def test_plan_on_a_table_without_snapshots_is_a_noop():
    plan = plan_expiry([], {}, NOW, POLICY)
    assert plan.is_noop and plan.expiring_snapshot_ids == () and plan.snapshot_count == 0


def test_naive_now_is_refused():
    snaps = history([10, 1])
    with pytest.raises(RetentionError, match="timezone-aware"):
        plan_expiry(snaps, main_at(snaps), datetime(2026, 1, 1), POLICY)


@pytest.mark.parametrize("count, age, policy, due, reason", [
    (150, 60.0, TablePolicy(), True, "exceed snapshot_max_count=100"),
    (10, 8 * 86400.0, TablePolicy(), True, "older than snapshot_older_than"),
    (10, 86400.0, TablePolicy(), False, "expiry after"),
    (1, 30 * 86400.0, TablePolicy(), False, "keeps them all"),
    (150, 8 * 86400.0, TablePolicy(snapshot_min_age_seconds=30 * 86400), False, "retention window"),
    (150, 8 * 86400.0, TablePolicy(read_only=True), False, "read_only"),
])
def test_expiry_due(count, age, policy, due, reason):
    decided, why = expiry_due(count, age, policy)
    assert decided is due and reason in why


@pytest.mark.parametrize("count, small, policy, due, reason", [
    (25, 20, TablePolicy(), True, "25 manifests"),
    (10, 10, TablePolicy(), False, "below manifest_min_count=20"),
    (25, 1, TablePolicy(), False, "nothing to merge"),
    (25, 20, TablePolicy(read_only=True), False, "read_only"),
])
def test_manifests_due(count, small, policy, due, reason):
    decided, why = manifests_due(count, small, policy)
    assert decided is due and reason in why


def test_expiry_cleans_up_in_the_driver_up_to_its_limits_and_on_the_executors_above():
    assert expiry_cleanup(3_001, 9_003) == "driver"
    assert expiry_cleanup(DRIVER_CLEANUP_MAX_MANIFESTS, DRIVER_CLEANUP_MAX_FILES) == "driver"
    assert expiry_cleanup(DRIVER_CLEANUP_MAX_MANIFESTS + 1, 10) == "distributed"
    assert expiry_cleanup(10, DRIVER_CLEANUP_MAX_FILES + 1) == "distributed"
    assert expiry_cleanup(10, 10, "distributed") == "distributed"
    assert expiry_cleanup(10**6, 10**8, "driver") == "driver"
    with pytest.raises(RetentionError, match="cleanup='executors' must be one of auto, driver, distributed"):
        expiry_cleanup(1, 1, "executors")


# Both places an expiry's cleanup can run delete exactly what was predicted, checked against the disk.
CLEANUPS = pytest.mark.parametrize("cleanup", ["driver", "distributed"])


def previewed_both_ways(monkeypatch, spark, config, table_name: str, plan, cleanup: str):
    """The dry run's prediction, read both ways the manifest lists can be read (the driver's JVM, or Spark's
    aggregate of all_manifests for tables with more entries than DRIVER_PREDICTION_MAX_ENTRIES): both predict the
    same files. A dry run changes nothing, so one table serves both (each cleanup's test checks the prediction
    against what goes: with both predictions equal, every pairing of prediction and cleanup is covered)."""
    import icemaint.engine.expiry_release as expiry_release

    by_driver = expire(spark, config, table_name, plan, dry_run=True, cleanup=cleanup)
    monkeypatch.setattr(expiry_release, "DRIVER_PREDICTION_MAX_ENTRIES", 0)
    by_spark = expire(spark, config, table_name, plan, dry_run=True, cleanup=cleanup)
    monkeypatch.undo()
    assert by_spark == by_driver
    return by_driver


def procedure_counted(result, vanished_data: int) -> None:
    """The procedure's own counts (a distributed cleanup's) agree with what the result measured."""
    if result.cleanup == "distributed":
        assert result.procedure_counts["deleted_data_files_count"] == result.data_files_deleted == vanished_data
        assert result.procedure_counts["deleted_manifest_files_count"] == result.manifests_deleted
        assert result.procedure_counts["deleted_manifest_lists_count"] == result.manifest_lists_deleted
    else:
        assert result.cleanup == "driver" and not result.procedure_counts


def test_due_checks_refuse_bad_numbers():
    with pytest.raises(RetentionError, match="oldest_snapshot_age_seconds=-1"):
        expiry_due(3, -1, TablePolicy())
    with pytest.raises(RetentionError, match="small_manifest_count=5 exceeds"):
        manifests_due(3, 5, TablePolicy())
    assert orphan_cutoff(NOW, TablePolicy()) == NOW - timedelta(hours=72)


# ---------------------------------------------------------------------------------------------
# On Spark
# ---------------------------------------------------------------------------------------------

def create_table(spark, name: str, commits: int) -> None:
    spark.sql(f"CREATE TABLE lake.{name} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg "
              "PARTITIONED BY (days(ts)) TBLPROPERTIES ('format-version'='2')")
    for i in range(commits):
        rows = ", ".join(f"({i * 10 + j}, TIMESTAMP '2024-01-0{1 + (i + j) % 3} 0{j}:00:00', 'v{i}-{j}')"
                         for j in range(5))
        spark.sql(f"INSERT INTO lake.{name} VALUES {rows}")


def table_dir(config, name: str) -> Path:
    ns, table = name.split(".")
    return Path(config.catalog.warehouse) / ns / table


def listing(root: Path, checksums: bool = True) -> dict[str, tuple[int, int]]:
    """Every file under root -> (size, mtime_ns); optionally without Hadoop's hidden .crc files
    (the local filesystem's checksums of metadata files: not table files, not counted by Iceberg)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            if not checksums and n.endswith(".crc") and n.startswith("."):
                continue
            p = Path(dirpath) / n
            st = p.stat()
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def metadata_pointer(root: Path) -> tuple[str, str]:
    meta = root / "metadata"
    newest = max(meta.glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
    return newest.name, (meta / "version-hint.text").read_text()


def rows_at(spark, name: str, snapshot_id: int) -> list[tuple]:
    return sorted(tuple(r) for r in spark.sql(f"SELECT id, ts, v FROM lake.{name} VERSION AS OF {snapshot_id}").collect())


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


@CLEANUPS
def test_compaction_then_expiry_deletes_superseded_files_and_keeps_time_travel(spark, config, table_name, cleanup):
    create_table(spark, table_name, commits=5)  # each commit writes to each of the 3 days
    res = spark.sql(f"CALL lake.system.rewrite_data_files(table => '{table_name}', "
                    "options => map('min-input-files', '2'))").collect()[0]
    assert res["rewritten_data_files_count"] > res["added_data_files_count"] > 0
    spark.sql(f"INSERT INTO lake.{table_name} VALUES (999, TIMESTAMP '2024-01-02 05:00:00', 'late')")
    root = table_dir(config, table_name)
    snaps, refs = read_snapshots(spark, "lake", table_name)
    assert len(snaps) == 7

    plan = plan_expiry(snaps, refs, now_utc(), TablePolicy(snapshot_min_age_seconds=0), older_than_seconds=0,
                       retain_last=2)
    assert len(plan.expiring_snapshot_ids) == 5
    retained = [s.snapshot_id for s in snaps if s.snapshot_id not in plan.expiring_snapshot_ids]
    rows_before = {sid: rows_at(spark, table_name, sid) for sid in retained}
    files_before, pointer_before = listing(root), metadata_pointer(root)

    preview = expire(spark, config, table_name, plan, dry_run=True, cleanup=cleanup)
    assert listing(root) == files_before and metadata_pointer(root) == pointer_before
    assert read_snapshots(spark, "lake", table_name)[0] == snaps

    tables_files_before = listing(root, checksums=False)
    result = expire(spark, config, table_name, plan, cleanup=cleanup)
    assert preview.cleanup == result.cleanup == cleanup
    vanished = set(tables_files_before) - set(listing(root, checksums=False))
    assert result.expired_snapshot_ids == plan.expiring_snapshot_ids
    assert (result.snapshots_before, result.snapshots_after) == (7, 2)
    assert {s.snapshot_id for s in read_snapshots(spark, "lake", table_name)[0]} == set(retained)
    # the small files the compaction superseded are physically gone, and measured exactly
    vanished_data = {p for p in vanished if "/data/" in p}
    assert len(vanished_data) == result.data_files_deleted == res["rewritten_data_files_count"]
    assert result.bytes_reclaimed == sum(tables_files_before[p][0] for p in vanished) > 0
    assert result.data_files_deleted + result.manifests_deleted + result.manifest_lists_deleted == len(vanished)
    assert result.manifest_lists_deleted == 5
    procedure_counted(result, len(vanished_data))
    # the dry run predicted exactly this
    assert (preview.data_files_deleted, preview.manifests_deleted, preview.manifest_lists_deleted,
            preview.bytes_reclaimed, preview.snapshots_after) == (
        result.data_files_deleted, result.manifests_deleted, result.manifest_lists_deleted,
        result.bytes_reclaimed, result.snapshots_after)
    for sid in retained:
        assert rows_at(spark, table_name, sid) == rows_before[sid]
    assert len(rows_before[retained[-1]]) == 26


@CLEANUPS
def test_expiry_predicts_exactly_what_goes_when_released_files_span_several_snapshots(spark, config, table_name,
                                                                                     cleanup, monkeypatch):
    """Append, append, rewrite, append, rewrite, append, rewrite; the first five expire. The files released are
    the live files of the manifests only they reference (the appends', the first rewrite's output and the third
    append's, the second rewrite's output), each holding files the others do not, minus what the two retained
    snapshots hold: a reading that lost a manifest would predict other files than Iceberg deletes."""
    spark.sql(f"CREATE TABLE lake.{table_name} (id BIGINT, v STRING) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    rewrite = f"CALL lake.system.rewrite_data_files(table => '{table_name}', options => map('min-input-files', '2'))"
    for step in ["(1, 'a'), (2, 'b')", "(3, 'c')", None, "(4, 'd')", None, "(5, 'e')", None]:
        spark.sql(rewrite if step is None else f"INSERT INTO lake.{table_name} VALUES {step}")
    snaps, refs = read_snapshots(spark, "lake", table_name)
    ids = [s.snapshot_id for s in snaps]
    assert len(ids) == 7
    live = {sid: {r[0].removeprefix("file:") for r in spark.sql(
        f"SELECT file_path FROM lake.{table_name}.files VERSION AS OF {sid}").collect()} for sid in ids}
    released = set().union(*(live[sid] for sid in ids[:5])) - live[ids[5]] - live[ids[6]]
    # the appends' files, and the first rewrite's output and the third append's (live only from the fourth on)
    assert live[ids[1]] <= released and (live[ids[3]] - live[ids[1]]) <= released and len(released) == 5
    plan = plan_expiry(snaps, refs, now_utc(), TablePolicy(snapshot_min_age_seconds=0), older_than_seconds=0,
                       retain_last=2)
    assert plan.expiring_snapshot_ids == tuple(sorted(ids[:5]))
    rows_before = {sid: rows_at_id(spark, table_name, sid) for sid in ids[5:]}
    root = table_dir(config, table_name)

    preview = previewed_both_ways(monkeypatch, spark, config, table_name, plan, cleanup)
    before = listing(root, checksums=False)
    result = expire(spark, config, table_name, plan, cleanup=cleanup)
    vanished = set(before) - set(listing(root, checksums=False))
    assert {p for p in vanished if "/data/" in p} == released
    assert result.data_files_deleted == len(released) and result.manifests_deleted > 0
    procedure_counted(result, len(released))
    assert result.data_files_deleted + result.manifests_deleted + result.manifest_lists_deleted == len(vanished)
    assert (preview.data_files_deleted, preview.manifests_deleted, preview.manifest_lists_deleted,
            preview.bytes_reclaimed) == (result.data_files_deleted, result.manifests_deleted,
                                         result.manifest_lists_deleted, result.bytes_reclaimed)
    assert result.bytes_reclaimed == sum(before[p][0] for p in vanished)
    for sid, rows in rows_before.items():
        assert rows_at_id(spark, table_name, sid) == rows
    assert [r[0] for r in rows_before[ids[6]]] == [1, 2, 3, 4, 5]


@CLEANUPS
def test_expiry_after_a_manifest_rewrite_predicts_no_data_file_goes(spark, config, table_name, cleanup,
                                                                    monkeypatch):
    """Three appends, their manifests rewritten into one, an append; the first three expire. Their manifests
    are released, but every file in them is live in the rewritten manifest: no data file goes, the preview
    says so (it did not when the released manifests' files were not checked against the retained ones)."""
    spark.sql(f"CREATE TABLE lake.{table_name} (id BIGINT, v STRING) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    for i in range(3):
        spark.sql(f"INSERT INTO lake.{table_name} VALUES ({i}, 'v{i}')")
    spark.sql(f"CALL lake.system.rewrite_manifests(table => '{table_name}')")
    spark.sql(f"INSERT INTO lake.{table_name} VALUES (3, 'v3')")
    snaps, refs = read_snapshots(spark, "lake", table_name)
    plan = plan_expiry(snaps, refs, now_utc(), TablePolicy(snapshot_min_age_seconds=0), older_than_seconds=0,
                       retain_last=2)
    assert len(plan.expiring_snapshot_ids) == 3
    root = table_dir(config, table_name)
    preview = previewed_both_ways(monkeypatch, spark, config, table_name, plan, cleanup)
    before = listing(root, checksums=False)
    result = expire(spark, config, table_name, plan, cleanup=cleanup)
    vanished = set(before) - set(listing(root, checksums=False))
    assert not {p for p in vanished if "/data/" in p}
    assert preview.data_files_deleted == result.data_files_deleted == 0
    procedure_counted(result, 0)
    assert preview.manifests_deleted == result.manifests_deleted == 3, (preview, result)
    assert preview.bytes_reclaimed == result.bytes_reclaimed == sum(before[p][0] for p in vanished)
    assert [r[0] for r in rows_at_id(spark, table_name, snaps[-1].snapshot_id)] == [0, 1, 2, 3]


def rows_at_id(spark, name: str, snapshot_id: int) -> list[tuple]:
    return sorted(tuple(r) for r in spark.sql(f"SELECT id, v FROM lake.{name} VERSION AS OF {snapshot_id}").collect())


def snapshots_by_spark(spark, table_name: str) -> tuple[list[SnapshotInfo], dict[str, SnapshotRef]]:
    """An independent reader: Spark's `snapshots` and `refs` metadata tables and SHOW TBLPROPERTIES."""
    keys = marker_keys(DEFAULT_CHECKPOINT_MARKERS)
    snaps = sorted((SnapshotInfo(r["snapshot_id"], r["parent_id"], r["ts_ms"], r["operation"], r["manifest_list"],
                                 {k: v for k, v in (r["summary"] or {}).items() if k in keys})
                    for r in spark.sql("SELECT snapshot_id, parent_id, unix_millis(committed_at) AS ts_ms, operation, "
                                       f"manifest_list, summary FROM lake.{table_name}.snapshots").collect()),
                   key=lambda s: (s.timestamp_ms, s.snapshot_id))
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES lake.{table_name}").collect()}
    table_age = props.get("history.expire.max-ref-age-ms")
    refs = {r["name"]: SnapshotRef(r["snapshot_id"], r["type"].upper(), r["min_snapshots_to_keep"],
                                   r["max_snapshot_age_in_ms"],
                                   r["max_reference_age_in_ms"] if r["max_reference_age_in_ms"] is not None
                                   else None if table_age is None else int(table_age))
            for r in spark.sql(f"SELECT * FROM lake.{table_name}.refs").collect()}
    return snaps, refs


def test_snapshots_read_from_the_metadata_equal_sparks_metadata_tables(spark, table_name):
    """Snapshots with a writer's checkpoint markers, a tag and a branch with retention settings of their own, a
    tag without, and the table-wide ref age: the one-call reading of the metadata says what Spark's metadata tables
    say."""
    create_table(spark, table_name, commits=3)
    (spark.sql("SELECT 100L AS id, TIMESTAMP '2024-01-03 00:00:00' AS ts, 'w' AS v").writeTo(f"lake.{table_name}")
     .option("snapshot-property.flink.job-id", "job-7").option("snapshot-property.flink.max-committed-checkpoint-id",
                                                                 "42")
     .option("snapshot-property.unrelated", "x").append())
    ids = [s.snapshot_id for s in snapshots_by_spark(spark, table_name)[0]]
    spark.sql(f"ALTER TABLE lake.{table_name} CREATE TAG kept AS OF VERSION {ids[0]} RETAIN 3 DAYS")
    spark.sql(f"ALTER TABLE lake.{table_name} CREATE TAG plain AS OF VERSION {ids[1]}")
    spark.sql(f"ALTER TABLE lake.{table_name} CREATE BRANCH dev AS OF VERSION {ids[2]} RETAIN 5 DAYS "
              "WITH SNAPSHOT RETENTION 4 SNAPSHOTS 2 DAYS")
    spark.sql(f"ALTER TABLE lake.{table_name} SET TBLPROPERTIES ('history.expire.max-ref-age-ms'='86400000')")

    snaps, refs = read_snapshots(spark, "lake", table_name)
    assert (snaps, refs) == snapshots_by_spark(spark, table_name)
    assert snaps[-1].markers == {"flink.job-id": "job-7", "flink.max-committed-checkpoint-id": "42"}
    assert refs["kept"] == SnapshotRef.tag(ids[0], max_ref_age_ms=3 * DAY_MS)
    assert refs["plain"] == SnapshotRef.tag(ids[1], max_ref_age_ms=DAY_MS)  # the table's
    assert refs["dev"] == SnapshotRef.branch(ids[2], min_snapshots_to_keep=4, max_snapshot_age_ms=2 * DAY_MS,
                                             max_ref_age_ms=5 * DAY_MS)
    assert refs["main"].snapshot_id == ids[-1] and [s.operation for s in snaps] == ["append"] * 4


def test_tag_branch_in_flight_and_owner_window_survive_expiry(spark, config, table_name):
    create_table(spark, table_name, commits=8)
    snaps, _ = read_snapshots(spark, "lake", table_name)
    ids = [s.snapshot_id for s in snaps]
    spark.sql(f"ALTER TABLE lake.{table_name} CREATE TAG audit AS OF VERSION {ids[1]}")
    spark.sql(f"ALTER TABLE lake.{table_name} CREATE BRANCH dev AS OF VERSION {ids[2]}")
    snaps, refs = read_snapshots(spark, "lake", table_name)
    assert refs["audit"] == SnapshotRef.tag(ids[1]) and refs["dev"] == SnapshotRef.branch(ids[2])

    now = now_utc()
    # the owner's window ends between snapshots 6 and 7 (0-based 5 and 6): those two must stay
    boundary_ms = (snaps[5].timestamp_ms + snaps[6].timestamp_ms) / 2
    policy = TablePolicy(snapshot_older_than_seconds=0, snapshot_retain_last=1,
                         snapshot_min_age_seconds=(now.timestamp() * 1000 - boundary_ms) / 1000)
    with pytest.raises(RetentionError, match="inside the owner's retention window"):
        plan_expiry(snaps, refs, now, policy, older_than_seconds=0)
    plan = plan_expiry(snaps, refs, now, policy, in_flight_snapshot_ids={ids[4]})
    rows_before = {sid: rows_at(spark, table_name, sid) for sid in ids}

    result = expire(spark, config, table_name, plan)
    left = {s.snapshot_id for s in read_snapshots(spark, "lake", table_name)[0]}
    # tag, branch head, in-flight base and everything newer on main survive; only 0 and 3 go
    assert set(result.expired_snapshot_ids) == set(plan.expiring_snapshot_ids) == {ids[0], ids[3]}
    assert left == set(ids) - {ids[0], ids[3]}
    assert "tagged 'audit'" in plan.protected[ids[1]] and "branch 'dev'" in plan.protected[ids[2]]
    assert "in-flight" in plan.protected[ids[4]]
    assert "retention window" in plan.protected[ids[6]]
    for sid in left:
        assert rows_at(spark, table_name, sid) == rows_before[sid]
    assert rows_at(spark, table_name, ids[2]) == sorted(
        tuple(r) for r in spark.sql(f"SELECT id, ts, v FROM lake.{table_name} VERSION AS OF 'dev'").collect())


def test_keep_files_expires_snapshots_but_leaves_files(spark, config, table_name):
    create_table(spark, table_name, commits=4)
    spark.sql(f"CALL lake.system.rewrite_data_files(table => '{table_name}', options => map('min-input-files', '2'))")
    root = table_dir(config, table_name)
    snaps, refs = read_snapshots(spark, "lake", table_name)
    plan = plan_expiry(snaps, refs, now_utc(), TablePolicy(keep_files=True), older_than_seconds=0)
    assert plan.keep_files and len(plan.expiring_snapshot_ids) == 4
    data_before = {p: v for p, v in listing(root).items() if "/data/" in p}
    rows = rows_at(spark, table_name, snaps[-1].snapshot_id)

    result = expire(spark, config, table_name, plan)
    assert result.expired_snapshot_ids == plan.expiring_snapshot_ids
    assert len(read_snapshots(spark, "lake", table_name)[0]) == 1
    after = listing(root)
    assert {p: v for p, v in after.items() if "/data/" in p} == data_before
    assert result.bytes_reclaimed == 0 and result.files_left_unreferenced > 0
    assert result.bytes_left_unreferenced > 0
    assert rows_at(spark, table_name, snaps[-1].snapshot_id) == rows


def test_bad_or_stale_plans_are_refused_and_change_nothing(spark, config, table_name):
    create_table(spark, table_name, commits=3)
    snaps, refs = read_snapshots(spark, "lake", table_name)
    plan = plan_expiry(snaps, refs, now_utc(), TablePolicy(), older_than_seconds=0, retain_last=2)
    root = table_dir(config, table_name)
    before = listing(root)
    with pytest.raises(RetentionError, match="plan.retain_last=0"):
        expire(spark, config, table_name, replace(plan, retain_last=0))
    with pytest.raises(RetentionError, match="older_than=-60"):
        plan_expiry(snaps, refs, now_utc(), TablePolicy(), older_than_seconds=-60)
    assert listing(root) == before

    # A writer's commit on top since planning: Iceberg's rule would now expire one more (retain_last counts
    # from the new head), the call expires exactly the planned one.
    spark.sql(f"INSERT INTO lake.{table_name} VALUES (1000, TIMESTAMP '2024-01-01 00:00:00', 'new')")
    result = expire(spark, config, table_name, plan)
    assert result.expired_snapshot_ids == plan.expiring_snapshot_ids == (snaps[0].snapshot_id,)
    left = read_snapshots(spark, "lake", table_name)[0]
    assert [s.snapshot_id for s in left][:2] == [s.snapshot_id for s in snaps[1:]] and len(left) == 3

    # A planned snapshot tagged since planning: stale, nothing changes.
    plan = plan_expiry(left, read_snapshots(spark, "lake", table_name)[1], now_utc(), TablePolicy(),
                       older_than_seconds=0, retain_last=1)
    assert len(plan.expiring_snapshot_ids) == 2
    spark.sql(f"ALTER TABLE lake.{table_name} CREATE TAG kept AS OF VERSION {plan.expiring_snapshot_ids[0]}")
    before = listing(root)
    with pytest.raises(RetentionError, match=f"stale: planned snapshots \\[{plan.expiring_snapshot_ids[0]}\\]"):
        expire(spark, config, table_name, plan)
    assert listing(root) == before
    assert len(read_snapshots(spark, "lake", table_name)[0]) == 3


def referenced_files(spark, name: str) -> set[str]:
    paths = {r[0] for r in spark.sql(f"SELECT file_path FROM lake.{name}.all_files").collect()}
    paths |= {r[0] for r in spark.sql(f"SELECT path FROM lake.{name}.all_manifests").collect()}
    paths |= {r[0] for r in spark.sql(f"SELECT manifest_list FROM lake.{name}.snapshots").collect()}
    return {p.removeprefix("file:") for p in paths}


def plant(path: Path, age: timedelta) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a table file" * 10)
    stamp = time.time() - age.total_seconds()
    os.utime(path, (stamp, stamp))
    return path


def test_orphan_files_removed_only_when_old_unreferenced_and_inside_the_table(spark, config, table_name, tmp_path):
    create_table(spark, table_name, commits=3)
    root = table_dir(config, table_name)
    old = plant(root / "data" / "ts_day=2024-01-01" / "orphan-old.parquet", timedelta(days=5))
    young = plant(root / "data" / "ts_day=2024-01-01" / "orphan-young.parquet", timedelta(hours=1))
    outside = plant(root.parent / (root.name + "_sibling") / "data" / "old.parquet", timedelta(days=5))
    referenced = referenced_files(spark, table_name)
    assert referenced and all(Path(p).exists() for p in referenced)
    rows = sorted(tuple(r) for r in spark.sql(f"SELECT * FROM lake.{table_name}").collect())
    now = now_utc()

    before, pointer = listing(root), metadata_pointer(root)
    with pytest.raises(RetentionError, match="less than 24 h"):
        remove_orphan_files(spark, "lake", table_name, older_than=now - timedelta(hours=2), now=now)
    with pytest.raises(RetentionError, match="after now"):
        remove_orphan_files(spark, "lake", table_name, older_than=now + timedelta(hours=1), now=now, force=True)
    preview = remove_orphan_files(spark, "lake", table_name, older_than=now - timedelta(days=3), now=now,
                                  dry_run=True)
    assert [p.removeprefix("file:") for p in preview.candidates] == [str(old)]
    assert listing(root) == before and metadata_pointer(root) == pointer

    result = remove_orphan_files(spark, "lake", table_name, older_than=now - timedelta(days=3), now=now)
    assert [p.removeprefix("file:") for p in result.deleted] == [str(old)]
    assert result.bytes == 160
    assert not old.exists() and young.exists() and outside.exists()
    assert all(Path(p).exists() for p in referenced)
    assert set(listing(root)) == set(before) - {str(old)}
    assert sorted(tuple(r) for r in spark.sql(f"SELECT * FROM lake.{table_name}").collect()) == rows


def test_forced_young_cutoff_quarantines_and_purges(spark, config, table_name, tmp_path):
    create_table(spark, table_name, commits=2)
    root = table_dir(config, table_name)
    young = plant(root / "data" / "ts_day=2024-01-02" / "orphan-young.parquet", timedelta(hours=1))
    fresh = plant(root / "data" / "ts_day=2024-01-02" / "in-flight.parquet", timedelta(seconds=0))
    referenced = referenced_files(spark, table_name)
    quarantine = tmp_path / "quarantine"
    now = now_utc()
    with pytest.raises(RetentionError, match="inside the table location"):
        remove_orphan_files(spark, "lake", table_name, older_than=now - timedelta(minutes=10), now=now,
                            force=True, quarantine_dir=str(root / "q"))
    assert young.exists()

    result = remove_orphan_files(spark, "lake", table_name, older_than=now - timedelta(minutes=10), now=now,
                                 force=True, quarantine_dir=str(quarantine))
    assert result.forced and [p.removeprefix("file:") for p in result.candidates] == [str(young)]
    moved_to = Path(result.quarantined_to.removeprefix("file:")) / "data" / "ts_day=2024-01-02" / young.name
    assert not young.exists() and moved_to.exists() and fresh.exists()
    assert str(moved_to).startswith(str(quarantine / table_name))
    assert all(Path(p).exists() for p in referenced)

    assert quarantine_batches(spark, "lake", str(quarantine), older_than=now - timedelta(days=1)) == {}
    assert moved_to.exists()
    listed = quarantine_batches(spark, "lake", str(quarantine), older_than=now + timedelta(seconds=1))
    assert sum(map(len, listed.values())) == 1 and moved_to.exists()  # listing deletes nothing
    [batches] = listed.values()
    assert delete_batches(spark, "lake", batches) == batches and not moved_to.exists()


def test_rewrite_manifests_merges_and_keeps_rows(spark, config, table_name):
    create_table(spark, table_name, commits=6)
    root = table_dir(config, table_name)
    rows = sorted(tuple(r) for r in spark.sql(f"SELECT * FROM lake.{table_name}").collect())
    before, pointer = listing(root), metadata_pointer(root)
    preview = rewrite_manifests(spark, "lake", table_name, dry_run=True)
    assert preview.manifests_before == 6 and preview.manifests_after == 1
    assert listing(root) == before and metadata_pointer(root) == pointer

    result = rewrite_manifests(spark, "lake", table_name)
    assert result.manifests_before == 6 and result.manifests_after < 6
    assert result.rewritten_manifests == 6 and result.added_manifests == result.manifests_after
    assert sorted(tuple(r) for r in spark.sql(f"SELECT * FROM lake.{table_name}").collect()) == rows
