"""Compaction at the entrance on a real Spark session and a real Iceberg table: landed small files become a few
large files, every row exactly once (read back by pyiceberg, an independent reader), through a retry after the
commit, with bad files set aside and late files left for the next batch."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import make_config
from icemaint.domain.landing import BATCH_ID_KEY
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.ingest import IngestRequest, Ingestor
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims

TABLE = "t.landing_events"
SCHEMA = pa.schema([("id", pa.int64()), ("device", pa.string()), ("value", pa.float64())])


def drop(folder: Path, first: int, files: int, rows: int = 5) -> list[int]:
    """Drops `files` small parquet files of `rows` rows each, ids from `first`; the ids dropped."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = []
    for n in range(files):
        start = first + n * rows
        batch = list(range(start, start + rows))
        pq.write_table(pa.table({"id": batch, "device": [f"d{i % 3}" for i in batch],
                                 "value": [i / 10 for i in batch]}, schema=SCHEMA),
                       folder / f"f{start:08d}.parquet")
        ids += batch
    return ids


@pytest.fixture(scope="module")
def estate(spark, lake_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("landing")
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.t")
    spark.sql(f"CREATE TABLE lake.{TABLE} (id bigint, device string, value double) USING iceberg")
    config = make_config(lake_root, state_dir=str(root / "state"), landing={
        "events": {"location": str(root / "in"), "table": TABLE, "min_files": 10, "max_files": 40,
                   "max_age": "1h"},
        "json": {"location": str(root / "json"), "table": TABLE, "format": "jsonl", "min_files": 1,
                 "schema": {"id": "long", "device": "string", "value": "double"}}})
    return config, root


def ingestor(config, spark, **kwargs) -> Ingestor:
    return Ingestor(config, spark, CatalogReader(config), open_claims(config), open_audit(config), **kwargs)


def table_ids(config) -> list[int]:
    table = CatalogReader(config).load(TABLE)
    return sorted(table.scan().to_arrow()["id"].to_pylist())


def test_a_batch_lands_as_few_files_every_row_once_late_files_wait(spark, estate):
    config, root = estate
    landed = drop(root / "in", 0, 30)
    late: list[int] = []

    def hook(step):  # a producer keeps dropping while the run works: those wait for the next batch
        if step == "listed" and not late:
            late.extend(drop(root / "in", 10_000, 3))
        if step == "staged":  # a writer appending to the table directly meanwhile is kept
            spark.sql(f"INSERT INTO lake.{TABLE} VALUES (99999999, 'w', 0.5)")

    before = table_ids(config)
    out = ingestor(config, spark, hook=hook).run(IngestRequest("events"))
    assert out.decision == "run", out.reason
    assert out.files == 30 and out.rows == 150 and out.new_files == 1
    assert sorted(table_ids(config)) == sorted(before + landed + [99999999])
    assert sorted(p.name for p in (root / "in").glob("*.parquet")) == [f"f{i:08d}.parquet" for i in (10_000, 10_005, 10_010)]
    assert len(list((root / "in" / "_processed").glob("*.parquet"))) == 30
    snap = CatalogReader(config).load(TABLE).current_snapshot()
    assert snap.summary.additional_properties[BATCH_ID_KEY] == out.batch_id
    assert out.validation["passed"] is True
    record = open_audit(config).records(table=TABLE, operation="ingest")[-1]
    assert record.decision == "run" and record.details["batch_id"] == out.batch_id

    # below every threshold now (3 files, min_files 10, max_age 1h): nothing happens; forced, they go in
    assert ingestor(config, spark).run(IngestRequest("events")).decision == "noop"
    assert ingestor(config, spark).run(IngestRequest("events", force=True)).decision == "run"
    assert sorted(table_ids(config)) == sorted(before + landed + late + [99999999])


def test_a_retry_after_the_commit_before_the_bookkeeping_appends_nothing_twice(spark, estate):
    config, root = estate
    landed = drop(root / "in", 20_000, 12)
    before = table_ids(config)

    class Crash(Exception):
        pass

    def crash(step):
        if step == "after_commit":
            raise Crash("died between the commit and the bookkeeping")

    with pytest.raises(Crash):
        ingestor(config, spark, hook=crash).run(IngestRequest("events"))
    assert sorted(table_ids(config)) == sorted(before + landed)
    assert len(list((root / "in").glob("*.parquet"))) == 12  # still landed: not moved
    # before the retry, a writer commits and expiry removes the batch's snapshot from main's history: the table
    # property set in the same commit still says the batch went in
    spark.sql(f"INSERT INTO lake.{TABLE} VALUES (99999998, 'w', 0.5)")
    spark.sql(f"CALL lake.system.expire_snapshots(table => '{TABLE}', "
              "older_than => TIMESTAMP '2100-01-01 00:00:00', retain_last => 1)")
    drop(root / "in", 30_000, 1)  # a newcomer: the retry's listing differs, the journal still knows the batch
    out = ingestor(config, spark).run(IngestRequest("events", force=True))
    assert [r["committed"] for r in out.recovered] == [True] and out.recovered[0]["moved"] == 12
    assert out.decision == "run" and out.files == 1
    assert sorted(table_ids(config)) == sorted(before + landed + [99999998] + list(range(30_000, 30_005)))


def test_a_crash_during_the_moves_is_finished_by_the_next_run(spark, estate):
    config, root = estate
    landed = drop(root / "in", 40_000, 10)
    before = table_ids(config)
    moved: list[str] = []

    def crash(step):
        if step == "moved_one":
            moved.append(step)
            if len(moved) == 3:
                raise KeyboardInterrupt  # as a terminated run is interrupted, after 3 of the 10 moves

    with pytest.raises(KeyboardInterrupt):
        ingestor(config, spark, hook=crash).run(IngestRequest("events"))
    assert len(list((root / "in").glob("*.parquet"))) == 7
    from icemaint.safety import interrupts

    interrupts.reset()  # the next run is the next command's (in this one the interrupt stops every later run)
    out = ingestor(config, spark).run(IngestRequest("events", force=True))
    assert out.recovered == [{"batch_id": out.recovered[0]["batch_id"], "snapshot_id": out.recovered[0]["snapshot_id"],
                              "moved": 7, "committed": True, "found_by": "journal"}] and out.decision == "noop"
    assert sorted(table_ids(config)) == sorted(before + landed)
    records = open_audit(config).records(table=TABLE, operation="ingest")
    assert "interrupted" in [r.decision for r in records]


def test_a_crash_after_the_commit_with_the_journal_lost_appends_nothing_twice_beside_newcomers(spark, estate):
    """The state dir is lost with the dead run's journal, and new files landed beside its batch: the batch's own
    list in its snapshot summary says which landed files are already in (the retry's listing, and so its batch id,
    differs from the dead run's)."""
    config, root = estate
    landed = drop(root / "in", 50_000, 12)
    before = table_ids(config)

    def crash(step):
        if step == "after_commit":
            raise RuntimeError("died between the commit and the bookkeeping")

    with pytest.raises(RuntimeError):
        ingestor(config, spark, hook=crash).run(IngestRequest("events"))
    journals = list((Path(config.state_dir) / "ingest-journal" / "events").glob("*.json"))
    assert len(journals) == 1
    journals[0].unlink()  # the state dir is gone
    newcomers = drop(root / "in", 60_000, 3)
    out = ingestor(config, spark).run(IngestRequest("events", force=True))
    assert [(r["moved"], r["found_by"]) for r in out.recovered] == [(12, "summary")], out.recovered
    assert out.decision == "run" and out.files == 3, out.reason
    ids = table_ids(config)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(before + landed + newcomers)
    assert not list((root / "in").glob("*.parquet"))


def test_a_file_rewritten_during_the_run_fails_the_proof_and_nothing_is_appended(spark, estate):
    config, root = estate
    drop(root / "in", 90_000, 10)
    before = table_ids(config)
    location = CatalogReader(config).metadata_location(TABLE)

    def rewrite(step):  # a producer overwrites a landed file after the batch was staged: the rows differ
        if step == "staged":
            drop(root / "in", 90_000, 1, rows=4)

    out = ingestor(config, spark, hook=rewrite).run(IngestRequest("events"))
    assert out.decision == "not_published" and "not appended" in out.reason and out.validation["passed"] is False
    assert table_ids(config) == before and len(list((root / "in").glob("*.parquet"))) == 10
    snap = CatalogReader(config).load(TABLE).current_snapshot()
    assert (snap.snapshot_id if snap else None) == out.before_snapshot_id
    assert CatalogReader(config).metadata_location(TABLE) != location  # the staging branch came and went
    out = ingestor(config, spark).run(IngestRequest("events"))  # the next run takes the files as they are now
    assert out.decision == "run" and out.rows == 49


def test_a_bad_file_is_set_aside_with_its_reason_and_the_rest_goes_on(spark, estate):
    config, root = estate
    folder = root / "json"
    folder.mkdir(exist_ok=True)
    (folder / "good.jsonl").write_text("\n".join(json.dumps({"id": 50_000 + i, "device": "j", "value": 1.5})
                                                 for i in range(4)) + "\n")
    (folder / "bad.jsonl").write_text('{"id": "not a number", "device": "j", "value": 1}\n')
    (folder / "extra.jsonl").write_text('{"id": 1, "device": "j", "value": 1, "colour": "red"}\n')
    before = table_ids(config)
    dry = ingestor(config, spark).run(IngestRequest("json", dry_run=True))
    assert dry.decision == "noop" and "dry run: would append" in dry.reason and dry.rows == 4
    assert {r["name"] for r in dry.rejected} == {"bad.jsonl", "extra.jsonl"} and not any("moved_to" in r for r in dry.rejected)
    assert len(list(folder.glob("*.jsonl"))) == 3 and table_ids(config) == before
    out = ingestor(config, spark).run(IngestRequest("json"))
    assert out.decision == "run", out.reason
    reasons = {r["name"]: r["reason"] for r in out.rejected}
    assert set(reasons) == {"bad.jsonl", "extra.jsonl"}
    assert "cannot be read as jsonl" in reasons["bad.jsonl"]
    assert (folder / "_rejected" / "bad.jsonl").exists()
    assert "cannot be read" in (folder / "_rejected" / "bad.jsonl.reason.txt").read_text()
    assert sorted(table_ids(config)) == sorted(before + [50_000 + i for i in range(4)])


def test_the_cli_runs_the_landed_batches_asset_and_the_sensor_requests_a_due_source(
        spark, estate, lake_root, tmp_path, capsys, isolated_dagster_home):
    import dagster as dg

    from conftest import run_cli, write_config
    from maint_assets.landing import landing_partitions
    from resources.settings import MaintenanceSettings
    from sensors.landing import build_landing_sensor
    from maint_assets.landing import ingest_job

    _, root = estate
    folder = root / "cli"
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"), landing={
        "cli": {"location": str(folder), "table": TABLE, "min_files": 3, "max_age": "1h"}})
    config = make_config(lake_root, state_dir=str(tmp_path / "state"))
    landed = drop(folder, 60_000, 2)

    # the sensor: below min_files, then due once a third file lands; the cursor is the listing position
    sensor = build_landing_sensor(ingest_job)
    with dg.instance_for_test() as instance:
        settings = MaintenanceSettings(config_path=str(path))
        result = sensor(dg.build_sensor_context(instance=instance, resources={"settings": settings}))
        assert not result.run_requests and "below every threshold" in result.skip_reason.skip_message
        assert result.dynamic_partitions_requests[0].partition_keys == ["cli"]
        cursor = result.cursor
        landed += drop(folder, 60_010, 1)
        result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources={"settings": settings}))
        assert [r.partition_key for r in result.run_requests] == ["cli"]
        assert json.loads(result.cursor)["cli"] == {"after": None, "files": 0, "bytes": 0, "oldest_mtime": None,
                                                    "listed_all_at": None}

    before = table_ids(config)
    code, out, err = run_cli(capsys, "--config", str(path), "ingest", "cli", "--json")
    assert code == 0, err
    outcome = json.loads(out)
    assert outcome["decision"] == "run" and outcome["files"] == 3 and outcome["rows"] == 15
    assert sorted(table_ids(config)) == sorted(before + landed)
    from icemaint.app.instance import get_instance

    instance = get_instance(make_config(lake_root, state_dir=str(tmp_path / "state")), reap=False)
    event = instance.get_latest_materialization_event(dg.AssetKey("landed_batches"))
    assert event.asset_materialization.partition == "cli"
    assert event.asset_materialization.metadata["rows"].value == 15
    assert landing_partitions.name == "landing_source"

    # bad input: one line, exit 2, the table untouched
    location = CatalogReader(config).metadata_location(TABLE)
    code, out, err = run_cli(capsys, "--config", str(path), "ingest", "nosuch")
    assert code == 2 and "landing source 'nosuch' is not in the config" in err and err.count("\n") == 1
    bad = write_config(tmp_path / "bad.yaml", lake_root, state_dir=str(tmp_path / "state"), landing={
        "cli": {"location": str(folder), "table": TABLE, "format": "csv"}})
    code, out, err = run_cli(capsys, "--config", str(bad), "ingest", "cli")
    assert code == 2 and "landing.cli.schema: required for format 'csv'" in err
    assert CatalogReader(config).metadata_location(TABLE) == location


# One process (one JVM) runs an ingest per (source, step) argument, each in its own thread; once every run has
# reached its step, the process kills itself with SIGKILL: every run dies there, as a killed process's would.
KILLED_RUN = """
import os, signal, sys, threading
from icemaint.config import load_config
from icemaint.engine.spark_session import get_spark
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.ingest import IngestRequest, Ingestor
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims

config = load_config(sys.argv[1])
spark = get_spark(config)
spark.sql(f"SHOW NAMESPACES IN {config.catalog.name}").collect()  # the catalog loads once, not in two threads at once
runs = [arg.split("=", 1) for arg in sys.argv[2:]]
arrived = threading.Barrier(len(runs), timeout=240)

def run(source, step):
    def hook(name):
        if name == step:
            arrived.wait()  # every run at its step
            os.kill(os.getpid(), signal.SIGKILL)

    Ingestor(config, spark, CatalogReader(config), open_claims(config), open_audit(config),
             hook=hook).run(IngestRequest(source, force=True))

threads = [threading.Thread(target=run, args=pair) for pair in runs]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
sys.exit(3)  # not killed: a run ended (or failed) before its step
"""


@pytest.mark.slow
def test_kill_9_before_and_after_the_commit_leaves_every_row_exactly_once(spark, estate, lake_root, tmp_path):
    """Two runs killed with SIGKILL (one process, one JVM), one just before the append's commit, one just after it
    (before any file moved); the next run appends the first batch, only moves the second, and every landed row is in
    its table once."""
    import subprocess
    import sys
    import textwrap

    import yaml

    from conftest import config_doc

    _, root = estate
    spark.sql("CREATE TABLE lake.t.landing_killed (id bigint, device string, value double) USING iceberg")
    sources = {"before": {"location": str(root / "k1"), "table": "t.landing_killed", "min_files": 1},
               "after": {"location": str(root / "k2"), "table": TABLE, "min_files": 1}}
    doc = config_doc(lake_root, state_dir=str(tmp_path / "state"), landing=sources)
    path = tmp_path / "maintenance.yaml"
    path.write_text(yaml.safe_dump(doc))
    config = make_config(lake_root, state_dir=str(tmp_path / "state"), landing=sources)
    ids = {"before": drop(root / "k1", 70_000, 6), "after": drop(root / "k2", 80_000, 6)}
    main_before = {name: sorted(CatalogReader(config).load(s["table"]).scan().to_arrow()["id"].to_pylist())
                   for name, s in sources.items()}
    repo = Path(__file__).parent.parent
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_RUN), str(path), "before=before_commit",
                               "after=after_commit"], cwd=repo, stdout=out, stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode == -9, log.read_text()[-3000:]

    def rows(name):
        return sorted(CatalogReader(config).load(sources[name]["table"]).scan().to_arrow()["id"].to_pylist())

    assert rows("before") == main_before["before"]  # killed before its commit: nothing appended
    assert rows("after") == sorted(main_before["after"] + ids["after"])  # killed after: appended, files not moved
    assert len(list((root / "k2").glob("*.parquet"))) == 6

    first = ingestor(config, spark).run(IngestRequest("before", force=True))
    assert first.decision == "run" and first.recovered[0]["committed"] is False
    second = ingestor(config, spark).run(IngestRequest("after", force=True))
    assert second.recovered[0]["committed"] is True and second.recovered[0]["moved"] == 6
    assert second.decision == "noop"  # nothing left landed
    assert rows("before") == sorted(main_before["before"] + ids["before"])
    assert rows("after") == sorted(main_before["after"] + ids["after"])
    assert not list((root / "k1").glob("*.parquet")) and not list((root / "k2").glob("*.parquet"))
    interrupted = [r for r in open_audit(config).records(operation="ingest") if r.decision == "interrupted"]
    assert len(interrupted) == 2  # the started markers of the killed processes read back as interrupted


def test_a_tick_ingests_a_source_past_its_threshold_and_says_why_it_leaves_one_below(
        spark, estate, lake_root, tmp_path, capsys, isolated_dagster_home):
    from conftest import run_cli, write_config

    _, root = estate
    sources = {"due": {"location": str(root / "tick_due"), "table": TABLE, "min_files": 3, "max_age": "1h"},
               "waits": {"location": str(root / "tick_waits"), "table": TABLE, "min_files": 3, "max_age": "1h"}}
    # the table admits ingest alone: the tick's compaction and retention lanes refuse it without Spark work
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"), landing=sources,
                        scope={"include": [TABLE]}, tables={TABLE: {"allowed_operations": ["ingest"]}})
    config = make_config(lake_root, state_dir=str(tmp_path / "state"), landing=sources)
    landed = drop(root / "tick_due", 90_000, 3)
    waiting = drop(root / "tick_waits", 91_000, 2)
    before = table_ids(config)

    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--json")
    assert code == 0, err
    report = json.loads(out)
    [entry] = report["landing"]
    assert (entry["source"], entry["success"], entry["result"]) == ("due", True, "run"), entry
    assert "3 files >= min_files 3" in entry["due"]
    assert any(line.startswith("landing waits: 2 files") and "below every threshold" in line
               for line in report["lines"]), report["lines"]
    assert sorted(table_ids(config)) == sorted(before + landed)
    assert len(list((root / "tick_waits").glob("*.parquet"))) == 2 and waiting
    [record] = [r for r in open_audit(config).records(operation="ingest") if r.run_id == entry["run_id"]]
    assert (record.decision, record.trigger) == ("run", "tick")


def test_the_driver_read_hands_spark_the_landed_values_exactly(spark, estate):
    """The object-store path (`read_by` "driver": pyarrow on the driver, Arrow batches to Spark) on a local copy:
    a nullable bigint past 2**53, arrays, structs and a UTC timestamp arrive as they were written, cast by name to
    the table's types; a file that no longer reads fails the batch in one line."""
    import datetime as dt

    from icemaint.domain.landing import LandingSource
    from icemaint.domain.names import TableName
    from icemaint.engine.landing import LandingError, LandingStage
    from icemaint.engine.staging import StagingArea

    _, root = estate
    spark.sql("CREATE TABLE lake.t.landing_exact (id bigint, tags array<int>, pos struct<x:double>, ts timestamp) "
              "USING iceberg")
    folder = root / "exact"
    folder.mkdir()
    when = dt.datetime(2026, 11, 28, 12, 30, tzinfo=dt.timezone.utc)
    pq.write_table(pa.table({  # columns in another order, narrower types than the table's
        "ts": pa.array([when, None], pa.timestamp("ms", "UTC")), "id": pa.array([2**60 + 1, None], pa.int64()),
        "pos": pa.array([{"x": 1.5}, None], pa.struct([("x", pa.float32())])),
        "tags": pa.array([[1, 2], None], pa.list_(pa.int32()))}), folder / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), folder / "empty.parquet")
    source = LandingSource("exact", str(folder), "parquet", "t.landing_exact")
    stage = LandingStage(spark, StagingArea(spark, "lake", TableName.parse("t.landing_exact"), "exact"), source, {})
    frame = stage.arrow_frame(["a.parquet"]).selectExpr("id", "tags", "pos", "CAST(ts AS STRING) AS ts")
    rows = sorted(frame.collect(), key=lambda r: r.id is None)
    assert [r.asDict(recursive=True) for r in rows] == [  # the session's time zone is UTC
        {"id": 2**60 + 1, "tags": [1, 2], "pos": {"x": 1.5}, "ts": "2026-11-28 12:30:00"},
        {"id": None, "tags": None, "pos": None, "ts": None}]
    with pytest.raises(LandingError, match="empty.parquet of exact no longer reads as the table's columns"):
        stage.arrow_frame(["empty.parquet"]).collect()
