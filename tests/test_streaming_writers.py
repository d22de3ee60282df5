"""Streaming tables (issue 43): writer activity is read per date, so the dates a writer has finished with are
compacted while it keeps committing to today; the date it writes into is deferred, naming its last commit.

Real Spark, a real Hadoop-catalog table, a writer thread that never takes the claim, `icemaint tick` through the
CLI; rows checked with pyiceberg against both writers' ledgers.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from pathlib import Path

import pytest

from conftest import make_config, run_cli, streaming_table, write_config
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader

pytestmark = pytest.mark.usefixtures("isolated_dagster_home")

TODAY_IDS = 700_000_000  # far above the simulator's ids


class TodayWriter:
    """Appends one row to today's partition every `interval` seconds with Spark `INSERT INTO`, never taking the
    table's claim (as a Flink or Kafka Connect job does). `ledger`: the ids of every INSERT that returned."""

    def __init__(self, spark, sql: str, interval: float = 0.5):
        self.spark, self.sql, self.interval = spark, sql, interval
        self.ledger: set[int] = set()
        self.failed: list[str] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="today-writer", daemon=True)

    def __enter__(self) -> "TodayWriter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the writer did not stop"

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            now = dt.datetime.now(dt.timezone.utc)
            row = f"({TODAY_IDS + n}, 1, TIMESTAMP '{now:%Y-%m-%d %H:%M:%S}', 0.5, 'today')"
            try:
                self.spark.sql(f"INSERT INTO {self.sql} VALUES {row}")
            except Exception as exc:  # reported by the test's assertions
                self.failed.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            else:
                with self._cond:
                    self.ledger.add(TODAY_IDS + n)
                    self._cond.notify_all()
            n += 1
            self._stop.wait(self.interval)

    def wait_for(self, commits: int, timeout: float = 120.0) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.ledger) >= commits, timeout)
        assert ok, f"the writer stopped committing: {self.failed[-3:]}"


def reader_ids(path, table: str) -> list[int]:
    return CatalogReader(load_config(path)).load(table).scan().to_arrow().column("event_id").to_pylist()


def test_cold_dates_are_compacted_while_a_writer_keeps_committing_to_today(capsys, spark, lake_root, tmp_path,
                                                                          table_name):
    idle = 3.0
    history = streaming_table(spark, "lake", table_name, batches=3, days=2, rows_per_day=6, delete_every=0)
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [table_name]}, defaults={"writer_idle": f"{idle:g}s"})
    table_wide = write_config(tmp_path / "table-scope.yaml", lake_root, state_dir=str(tmp_path / "state-table"),
                              scope={"include": [table_name]},
                              defaults={"writer_idle": f"{idle:g}s", "writer_scope": "table"})
    time.sleep(idle + 0.5)  # the old dates' own commits leave the idle window
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    cold = ["2026-01-01", "2026-01-02"]
    with TodayWriter(spark, history.table_sql) as writer:
        writer.wait_for(4)  # today holds 4 small files: due but for its writer
        # the table-wide check (writer_scope: table) holds every date while the writer writes
        code, out, err = run_cli(capsys, "--config", str(table_wide), "tick", "--dry-run", "--json")
        assert code == 0, err
        held = {d["date"]: d for d in json.loads(out)["decisions"]}
        assert all(held[d]["decision"] == "defer" and held[d]["reason"].startswith("writer active: last writer commit")
                   for d in cold), held
        # the default (writer_scope: partition): the cold dates are compacted, today waits for its writer
        code, out, err = run_cli(capsys, "--config", str(path), "tick", "--json")
        assert code == 0, err
        seen = len(writer.ledger)
        writer.wait_for(seen + 2)  # still committing after the publish
    assert not writer.failed, writer.failed
    decisions = {d["date"]: d for d in json.loads(out)["decisions"]}
    for date in cold:
        assert decisions[date]["decision"] == "run" and decisions[date]["published"], decisions[date]
        assert decisions[date]["validation"] is True, decisions[date]
    assert decisions[today]["decision"] == "defer", decisions[today]
    assert decisions[today]["reason"].startswith(f"writer active on {today}: last commit "), decisions[today]
    assert "within the 3s idle window" in decisions[today]["reason"]

    health = CatalogReader(load_config(path)).health(table_name)
    parts = {p.key: p for p in health.partitions}
    assert [parts[d].data_files for d in cold] == [1, 1]
    assert parts[today].data_files == len(writer.ledger) and parts[today].seconds_since_writer_commit < 60
    # every row of both writers, once, by an independent reader
    assert sorted(reader_ids(path, table_name)) == sorted(history.ledger.expected_ids() | writer.ledger)


def test_a_late_commit_into_a_date_is_seen_after_the_date_was_rewritten(spark, lake_root, tmp_path, table_name,
                                                                       monkeypatch):
    """A writer commit whose files maintenance has since replaced is read from the manifests it added: the date
    stays 'being written' for the window, and with more such commits than the observer reads, the table's check
    applies (said in health as `writer_partitions_known`)."""
    from conftest import make_config
    from icemaint.app.runner import MaintenanceRunner
    from icemaint.observe import manifests

    history = streaming_table(spark, "lake", table_name, batches=3, days=2, rows_per_day=6, delete_every=0)
    spark.sql(f"INSERT INTO {history.table_sql} VALUES (900000001, 1, TIMESTAMP '2026-01-02 10:00:00', 1.0, 'late')")
    late = spark.sql(f"SELECT committed_at FROM {history.table_sql}.snapshots ORDER BY committed_at DESC LIMIT 1"
                     ).first()[0].replace(tzinfo=None)
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [table_name]})
    report = MaintenanceRunner(load_config(path), str(path)).compact(table_name, "2026-01-02")
    assert report.success and report.outcome["published"], report.outcome

    watching = make_config(lake_root, defaults={"writer_idle": "1h", "hot_partition_age": "0s",
                                                "small_file_size_bytes": "1MiB", "target_file_size_bytes": "8MiB",
                                                "min_input_files": 3})
    health = CatalogReader(watching).health(table_name)
    part = {p.key: p for p in health.partitions}["2026-01-02"]
    assert part.data_files == 1  # the late row's file was rewritten: only its commit's own manifest knows
    assert dt.datetime.fromisoformat(part.last_writer_commit_at).replace(tzinfo=None, microsecond=0) == \
        late.replace(microsecond=0)
    assert health.writer_partitions_known

    monkeypatch.setattr(manifests, "MAX_WRITER_SNAPSHOTS_READ", 0)
    assert not CatalogReader(watching).health(table_name).writer_partitions_known


# -- commits per table-date, and a publish that lost a race -------------------------------------------------

def _metadata_versions(config, table: str) -> int:
    tbl = CatalogReader(config).load(table)
    return len(tbl.metadata.metadata_log) + 1


def test_a_compaction_makes_two_table_commits_stage_and_publish(spark, config, table_name):
    """Every maintenance commit moves the table's metadata and sequence number under its writers: staging makes
    one commit (the branch and its append together), the publish one that also removes the branch (it was three,
    the branch's removal a commit of its own; four before that)."""
    from test_staged_publish import DATE, compactor, simulate
    from icemaint.operations.compaction import CompactionRequest

    simulate(spark, config, table_name, batches=3)  # min_input_files 3
    before = _metadata_versions(config, table_name)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.published and len(outcome.staged) == 1, outcome.reason
    assert _metadata_versions(config, table_name) - before == 2
    assert outcome.publish_attempts == 1 and len(outcome.publish_attempt_seconds) == 1
    tbl = CatalogReader(config).load(table_name)
    assert [name for name in tbl.metadata.refs if name != "main"] == []  # the publish removed the branch
    # ...in the publish's own metadata: the version before it still holds the branch at the staged snapshot
    assert _refs_before_last(tbl) == [outcome.staged[0].branch], "the branch was gone before the publish"


def test_an_uncontended_publish_swaps_in_the_rewrite_it_prepared(spark, config, table_name, monkeypatch):
    """No writer between the publish's prepare and its swap: the swap commits the snapshot the prepare applied (one
    `apply()`, one manifest list), instead of applying it again on a table that had not moved; every row is kept and
    the staging branch goes in the swap, with nothing written beside the committed snapshot's files."""
    from test_staged_publish import DATE, compactor, reader_ids, simulate
    from icemaint.engine import publish as publish_engine
    from icemaint.operations.compaction import CompactionRequest

    sim = simulate(spark, config, table_name, batches=3)  # min_input_files 3
    lists_at_swap = []
    monkeypatch.setattr(publish_engine, "before_swap", lambda pending: lists_at_swap.append(
        list(pending._manifest_lists)))
    tdir = Path(str(CatalogReader(config).load(table_name).metadata.location).removeprefix("file:"))
    lists_before = _files_under(tdir, ".avro")
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.published and outcome.publish_attempts == 1, outcome.reason
    assert len(lists_at_swap) == 1 and len(lists_at_swap[0]) == 1, lists_at_swap  # one apply, its list swapped in
    assert sorted(reader_ids(config, table_name)) == sorted(sim.ledger.expected_ids())
    tbl = CatalogReader(config).load(table_name)
    assert tbl.current_snapshot().manifest_list.endswith(Path(lists_at_swap[0][0]).name)
    assert [name for name in tbl.metadata.refs if name != "main"] == []
    referenced = set()
    for snap in tbl.metadata.snapshots:
        referenced.add(Path(snap.manifest_list).name)
        referenced.update(Path(m.manifest_path).name for m in snap.manifests(tbl.io))
    assert not _files_under(tdir, ".avro") - lists_before - referenced


def _refs_before_last(tbl) -> list[str]:
    """The ref names of the table's metadata version before the current one."""
    from pyiceberg.serializers import FromInputFile

    previous = tbl.metadata.metadata_log[-1].metadata_file
    return [name for name in FromInputFile.table_metadata(tbl.io.new_input(previous)).refs if name != "main"]


def _files_under(table_dir: Path, suffix: str) -> set[str]:
    return {p.name for p in (table_dir / "metadata").glob(f"*{suffix}")}


def test_a_publish_that_lost_a_race_is_committed_again_reusing_its_rewrite(spark, config, table_name, monkeypatch):
    """A writer's commit lands between the publish's apply and its swap, twice (a real race: the catalog refuses the
    swap). The next attempt reuses the pending rewrite (built once: its filtered manifests cached, not re-staged, not
    re-proven), validates only the snapshots the lost attempt had not (the window does not grow), lands, keeps every
    row, and leaves no file of the lost attempt behind."""
    from test_staged_publish import DATE, WRITER_IDS, compactor, reader_ids, simulate, sql_of
    from icemaint.engine import publish as publish_engine
    from icemaint.engine.staging import StagingArea
    from icemaint.operations.compaction import CompactionRequest

    sim = simulate(spark, config, table_name, batches=3)  # min_input_files 3
    sql = sql_of(config, table_name)
    built, windows, heads = [], [], []
    real_build = StagingArea._pending_publish

    def counted(self, staged, properties):
        built.append(staged.staged_snapshot_id)
        return real_build(self, staged, properties)

    def a_writer_commits_before_the_first_two_swaps(pending):
        windows.append(pending.validated_from)
        if len(windows) <= 2:
            spark.sql(f"INSERT INTO {sql} VALUES ({WRITER_IDS + len(windows)}, 1, TIMESTAMP '{DATE} 01:00:00', 1.0, "
                      "'writer')")
            heads.append(CatalogReader(config).load(table_name).metadata.current_snapshot_id)

    monkeypatch.setattr(StagingArea, "_pending_publish", counted)
    monkeypatch.setattr(publish_engine, "before_swap", a_writer_commits_before_the_first_two_swaps)
    tdir = Path(str(CatalogReader(config).load(table_name).metadata.location).removeprefix("file:"))
    lists_before = _files_under(tdir, ".avro")
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.published and outcome.validation.passed is True, outcome.reason
    assert outcome.attempts == 1 and outcome.replanned is None  # not re-staged, not re-proven
    assert outcome.publish_attempts == 3 and outcome.staged[0].publish_attempts == 3
    assert len(built) == 1  # one pending rewrite for every attempt
    # each attempt validates from the head the one before applied on (found clean up to there), not from S again:
    # the first two applied on S (main had not moved), the third on the writer's first insert
    assert windows == [outcome.before_snapshot_id, outcome.before_snapshot_id, heads[0]]
    assert sorted(reader_ids(config, table_name)) == sorted(sim.ledger.expected_ids() | {WRITER_IDS + 1,
                                                                                           WRITER_IDS + 2})
    tbl = CatalogReader(config).load(table_name)
    referenced = set()
    for snap in tbl.metadata.snapshots:
        referenced.add(Path(snap.manifest_list).name)
        referenced.update(Path(m.manifest_path).name for m in snap.manifests(tbl.io))
    left = _files_under(tdir, ".avro") - lists_before - referenced
    assert not left, f"the lost attempts' manifest lists or filtered manifests were left: {sorted(left)[:5]}"


def test_a_conflicting_delete_after_a_lost_race_still_fails_the_publish(spark, lake_root, tmp_path, table_name,
                                                                        monkeypatch):
    """The window moved past what the lost attempt validated must still see what came after: a writer deletes a row
    of a replaced file (merge-on-read: a position delete) and wins the race; the next attempt finds the delete, the
    publish is a conflict (nothing published, the row stays deleted, every other row kept)."""
    from test_staged_publish import DATE, compactor, date_ids, reader_ids, simulate, sql_of
    from icemaint.engine import publish as publish_engine
    from icemaint.operations.compaction import CompactionRequest

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"max_commit_retries": 0}})
    sim = simulate(spark, config, table_name, batches=3)  # min_input_files 3
    sql = sql_of(config, table_name)
    deleted = []

    def a_writer_deletes_a_replaced_row_before_the_first_swap(pending):
        if not deleted:
            victim = date_ids(spark, sql, pending.validated_from, DATE)[0]
            spark.sql(f"DELETE FROM {sql} WHERE event_id = {victim}")
            deleted.append(victim)

    monkeypatch.setattr(publish_engine, "before_swap", a_writer_deletes_a_replaced_row_before_the_first_swap)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert not outcome.published and outcome.decision == "defer", outcome.reason
    assert "found new position delete for replaced data file" in outcome.reason
    assert outcome.publish_attempts == 2  # lost the race, then the conflict
    ids = reader_ids(config, table_name)
    assert deleted[0] not in ids and sorted(ids) == sorted(sim.ledger.expected_ids() - set(deleted))


def test_the_publish_merges_no_manifest(spark, config, table_name):
    """A streaming writer's fast appends leave a small manifest per commit; past min-count-to-merge a `replace` merges
    them all, a different set at every attempt (the writer adds one per commit). The publish's rewrite does not merge:
    applied (not committed) beside the same rewrite as Iceberg builds it, it keeps the other manifests as they are."""
    from icemaint.engine.publish import PendingPublish
    from icemaint.engine.spark_session import iceberg_table
    from icemaint.domain.names import TableName
    from icemaint.engine.java import listed_java

    name = TableName.parse(table_name)
    sql = name.sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} (id BIGINT) USING iceberg")
    for i in range(4):
        spark.sql(f"INSERT INTO {sql} VALUES ({i})")  # one manifest each (fewer than 100: not merged)
    spark.sql(f"ALTER TABLE {sql} SET TBLPROPERTIES ('commit.manifest.min-count-to-merge'='2')")
    tbl = iceberg_table(spark, config.catalog.name, name)
    tbl.refresh()
    base = tbl.currentSnapshot().snapshotId()
    scan = tbl.newScan().planFiles()
    replaced = listed_java(spark._jvm, scan)[0].file()
    scan.close()

    def applied_manifests(skip: bool) -> int:
        rewrite = tbl.newRewrite().validateFromSnapshot(base).deleteFile(replaced).addFile(replaced.copy())
        pending = PendingPublish(spark._jvm, spark.sparkContext._gateway, tbl, rewrite, base)
        if skip:
            assert pending.skip_manifest_merge()
        manifests = rewrite.apply().dataManifests(tbl.io()).size()
        pending.abandon()
        return manifests

    assert applied_manifests(skip=False) == 1  # Iceberg's own: everything merged into one
    assert applied_manifests(skip=True) == 5  # the new one, the replaced file's (its delete) and three untouched
