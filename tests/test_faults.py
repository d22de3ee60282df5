"""Faults injected (issue 12). Maintenance never mutates a table it cannot record. When the audit sink is
unavailable (a file that cannot be appended to, PostgreSQL down) the run stops before acting: one readable
line names the sink, `main` and the metadata location are unchanged, no staging branch is left.

A quarantine move that fails halfway leaves each orphan whole, either in place or in quarantine, and says
which; a rerun finishes.

Chosen way for the audit: refuse to act. The contract stores its `started` marker in the audit log under the claim and
before the act; if that write fails the act never runs (an unrecorded rewrite is worse than a late one).
"""

from __future__ import annotations

import pytest

from conftest import current_snapshot, run_cli, streaming_table, write_config
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader
from staged_faults import staging_refs


pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


def assert_untouched(spark, config, table: str, sql: str, location: str, head: int) -> None:
    assert CatalogReader(config).metadata_location(table) == location
    assert current_snapshot(spark, sql) == head
    assert staging_refs(config, table) == {}


def test_an_audit_file_that_cannot_be_written_stops_the_run_before_it_acts(capsys, spark, lake_root, tmp_path,
                                                                           table_name):
    writer = streaming_table(spark, "lake", table_name, batches=4, days=1)
    sql = writer.name.sql("lake")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"))
    config = load_config(path)
    (tmp_path / "state" / "audit" / "audit.jsonl").mkdir(parents=True)  # a disk that refuses the append
    location, head = CatalogReader(config).metadata_location(table_name), current_snapshot(spark, sql)
    code, out, err = run_cli(capsys, "--config", str(path), "compact", table_name, "--date", "2026-01-01")
    assert code == 1 and out == "" and "Traceback" not in err
    [line] = err.strip().splitlines()
    assert "audit.jsonl" in line and "main is unchanged" in line, line
    assert_untouched(spark, config, table_name, sql, location, head)


def test_postgresql_down_for_the_audit_stops_the_run_before_it_acts(capsys, spark, lake_root, tmp_path, table_name,
                                                                     monkeypatch):
    writer = streaming_table(spark, "lake", table_name, batches=4, days=1)
    sql = writer.name.sql("lake")
    monkeypatch.setenv("ICEMAINT_PG_DSN", "postgresql://icemaint@127.0.0.1:1/none?connect_timeout=2")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"), audit={"sink": "postgres"})
    config = load_config(path)
    location, head = CatalogReader(config).metadata_location(table_name), current_snapshot(spark, sql)
    code, out, err = run_cli(capsys, "--config", str(path), "compact", table_name, "--date", "2026-01-01")
    assert code == 1 and "Traceback" not in err
    [line] = err.strip().splitlines()
    assert "127.0.0.1" in line or "connect" in line.lower(), line
    assert "main is unchanged" in line, line
    assert_untouched(spark, config, table_name, sql, location, head)


def test_a_quarantine_move_that_fails_halfway_loses_nothing_and_says_what_moved(spark, lake_root, tmp_path,
                                                                                 table_name):
    """Three orphans; the place of the second in quarantine is already taken (a failing rename): the first
    is whole in quarantine, the other two whole in place, the error says so, and a rerun finishes."""
    import datetime as dt
    import os

    from icemaint.operations.housekeeping import Housekeeper
    from icemaint.operations.orphans import OrphanRequest
    from icemaint.safety.audit import open_audit
    from icemaint.safety.claims import open_claims

    writer = streaming_table(spark, "lake", table_name, batches=2, days=1)
    config = load_config(write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state")))
    ns, name = table_name.split(".")
    data = lake_root / "warehouse" / ns / name / "data"
    orphans = []
    for i in range(3):
        path = data / f"orphan-{i}.parquet"
        path.write_bytes(b"not a table file" * (10 + i))
        stamp = dt.datetime.now().timestamp() - 5 * 86400
        os.utime(path, (stamp, stamp))
        orphans.append(path)
    now = dt.datetime.now(dt.timezone.utc)
    quarantine = tmp_path / "state" / "quarantine" / table_name / now.strftime("%Y%m%dT%H%M%S%fZ")
    blocker = quarantine / "data" / "orphan-1.parquet"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file already stands where orphan-1 would go")
    location = CatalogReader(config).metadata_location(table_name)
    rows = spark.sql(f"SELECT count(*) FROM {writer.name.sql('lake')}").first()[0]

    keeper = Housekeeper(config, spark, CatalogReader(config), open_claims(config), open_audit(config),
                         clock=lambda: now)
    with pytest.raises(Exception) as failed:
        keeper.remove_orphans(OrphanRequest(table_name, quarantine=True))
    message = str(failed.value)
    assert "1 of 3 orphan files are already in quarantine" in message and "still in place" in message, message
    moved = quarantine / "data" / "orphan-0.parquet"
    assert moved.read_bytes() == b"not a table file" * 10 and not orphans[0].exists()
    assert orphans[1].exists() and orphans[2].exists(), "the files not moved are whole, in place"
    [record] = [r for r in open_audit(config).records(table=table_name) if r.operation == "orphans"]
    assert record.decision == "failed" and "already in quarantine" in record.reason
    assert CatalogReader(config).metadata_location(table_name) == location
    assert spark.sql(f"SELECT count(*) FROM {writer.name.sql('lake')}").first()[0] == rows

    blocker.unlink()  # the obstacle cleared: a rerun (its own stamp) moves the other two
    later = now + dt.timedelta(seconds=1)
    keeper = Housekeeper(config, spark, CatalogReader(config), open_claims(config), open_audit(config),
                         clock=lambda: later)
    outcome = keeper.remove_orphans(OrphanRequest(table_name, quarantine=True))
    assert outcome.decision == "run" and outcome.metrics["removed"] == 2, outcome.reason
    assert not any(p.exists() for p in orphans)


def test_a_catalog_that_never_answers_fails_in_one_line_within_its_timeout(capsys, tmp_path):
    """A REST catalog that accepts the connection and never answers: `icemaint health` gives up after
    `catalog.timeout` with one line naming what timed out, instead of hanging."""
    import socket
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held, stop = [], threading.Event()

    def accept():  # take connections, read nothing, answer nothing
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    uri = f"http://127.0.0.1:{server.getsockname()[1]}"
    path = write_config(tmp_path / "m.yaml", tmp_path, state_dir=str(tmp_path / "state"),
                        catalog={"name": "silent", "type": "rest", "uri": uri, "warehouse": "w", "timeout": "2s"})
    try:
        started = time.monotonic()
        code, out, err = run_cli(capsys, "--config", str(path), "health", "db.t")
        took = time.monotonic() - started
    finally:
        stop.set()
        for conn in held:
            conn.close()
        server.close()
    assert code != 0 and "Traceback" not in err, err
    [line] = err.strip().splitlines()
    assert "timed out" in line.lower() and "127.0.0.1" in line, line
    assert took < 20, f"took {took:.0f}s for a 2s timeout"


def test_a_hadoop_commit_in_flight_is_not_a_missing_table(spark, lake_root, table_name):
    """For an instant in every Hadoop-catalog commit the version hint is missing (deleted, then the new one
    renamed in; found by the soak, where it ended whole ticks with "table not found"): the metadata location
    is then the highest vN.metadata.json, as Iceberg's HadoopTableOperations reads it."""
    from icemaint.config import parse_config
    from icemaint.domain.names import TableName
    from icemaint.observe.catalog import TableNotFound
    from conftest import config_doc

    config = parse_config(config_doc(lake_root), lake_root)
    sql = TableName.parse(table_name).sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id BIGINT) USING iceberg")
    spark.sql(f"INSERT INTO {sql} VALUES (1)")
    reader = CatalogReader(config)
    before = reader.metadata_location(table_name)
    ns, name = table_name.split(".")
    hint = lake_root / "warehouse" / ns / name / "metadata" / "version-hint.text"
    text = hint.read_text()
    hint.unlink()
    try:
        assert reader.metadata_location(table_name) == before
        hint.write_text("")
        assert reader.metadata_location(table_name) == before
    finally:
        hint.write_text(text)
    with pytest.raises(TableNotFound):
        reader.metadata_location(f"{ns}.no_such_table")


def test_a_run_the_tick_cannot_launch_fails_alone():
    """A table that vanished (or whose catalog went down) between the tick's decision and its run is that
    table's failed entry, not the end of the tick for every other table (the soak saw whole ticks end)."""
    from icemaint.app.ticker import Ticker
    from icemaint.observe.catalog import TableNotFound

    def gone(table, date, trigger):
        raise TableNotFound(f"table {table} not found in catalog 'lake'")

    report = Ticker._launch(gone, "db.t", "2026-01-01", trigger="tick")
    assert not report.success and report.error == "TableNotFound: table db.t not found in catalog 'lake'"
    assert report.failure_line.startswith("TableNotFound: table db.t not found")


def test_a_staging_branch_change_is_retried_when_a_writer_committed_first(spark, lake_root, table_name):
    """Creating or removing a staging branch touches no data: when a writer's commit lands between reading
    the table and committing the ref change (CI saw `CommitFailedException: Table metadata refresh is
    required` turn a deferred conflict into a failed run), the change is retried on the fresh table."""
    from icemaint.domain.names import TableName
    from icemaint.engine.commits import commit_ref_change
    from icemaint.engine.staging import StagingArea

    name = TableName.parse(table_name)
    sql = name.sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id BIGINT) USING iceberg")
    spark.sql(f"INSERT INTO {sql} VALUES (1)")
    head = current_snapshot(spark, sql)
    staging, calls = StagingArea(spark, "lake", name, "retry"), []

    def change(table):
        update = table.manageSnapshots().createBranch("icemaint_stage_retry_0", head)
        if not calls:
            spark.sql(f"INSERT INTO {sql} VALUES (2)")  # a writer commits after the change was prepared
        calls.append(1)
        return update

    commit_ref_change(staging.table, change)
    refs = {r[0]: r[1] for r in spark.sql(f"SELECT name, snapshot_id FROM {sql}.refs").collect()}
    assert len(calls) == 2 and refs["icemaint_stage_retry_0"] == head
    staging.discard("icemaint_stage_retry_0")
    assert "icemaint_stage_retry_0" not in {r[0] for r in spark.sql(f"SELECT name FROM {sql}.refs").collect()}
    assert spark.sql(f"SELECT count(*) FROM {sql}").first()[0] == 2


def test_a_damaged_tick_cursor_is_read_as_none_and_replaced_whole(tmp_path, lake_root):
    from icemaint.app.ticker import Ticker

    config = load_config(write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state")))
    ticker = Ticker(config, str(tmp_path / "m.yaml"))
    ticker.cursor_path.parent.mkdir(parents=True, exist_ok=True)
    ticker.cursor_path.write_text('{"compaction": "{\\"db.t\\": [')  # cut off mid-write
    assert ticker._cursor("compaction") is None
    ticker._save_cursor("compaction", "{}")
    assert ticker._cursor("compaction") == "{}" and not ticker.cursor_path.with_suffix(".json.partial").exists()


def test_discovery_keeps_a_hadoop_table_whose_version_hint_is_mid_commit(spark, lake_root, table_name):
    from conftest import config_doc
    from icemaint.config import parse_config
    from icemaint.domain.names import TableName

    config = parse_config(config_doc(lake_root), lake_root)
    spark.sql(f"CREATE TABLE {TableName.parse(table_name).sql('lake')} (id BIGINT) USING iceberg")
    ns, name = table_name.split(".")
    hint = lake_root / "warehouse" / ns / name / "metadata" / "version-hint.text"
    text = hint.read_text()
    hint.unlink()
    try:
        assert table_name in CatalogReader(config).list_tables()
    finally:
        hint.write_text(text)
