"""`icemaint maintain TABLE`: one pass, what is due in order, under one claim, every step in Dagster."""

from __future__ import annotations

import json
import threading

import pytest

from conftest import run_cli, streaming_table, write_config
from icemaint.app.instance import get_instance
from icemaint.config import load_config
from icemaint.domain.names import TableName
from icemaint.observe.catalog import CatalogReader
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims, table_claim


pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


def ids(spark, sql: str, column: str = "id") -> list[int]:
    return sorted(r[0] for r in spark.sql(f"SELECT {column} FROM {sql}").collect())


def test_one_pass_compacts_every_due_date_then_manifests_expiry_and_orphans_under_one_claim(
        capsys, spark, lake_root, tmp_path, table_name):
    # 3 batches: 3 small files a date (min_input_files 3, so every date is due) and one delete among them
    writer = streaming_table(spark, "lake", table_name, batches=3, days=3, rows_per_day=10)
    sql = writer.name.sql("lake")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        defaults={"snapshot_older_than": "0s", "retain_last": 1})
    config = load_config(path)
    claims = open_claims(config)
    seen, done = set(), threading.Event()

    def watch():  # who holds the claim while the pass runs: only the pass, never a step of its own
        while not done.is_set():
            info = claims.holder_of(table_name)
            # "unknown": the lock is held but its holder's note not yet written (the instant after a take)
            if info is not None and info.holder != "unknown":
                seen.add(info.holder)
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        code, out, err = run_cli(capsys, "--config", str(path), "maintain", table_name, "--expire-snapshots",
                                 "--orphans", "--statistics", "--json")
    finally:
        done.set()
        watcher.join()
    report = json.loads(out)
    assert code == 0 and report["success"], (report, err)
    steps = [(s["operation"], s["scope"], s["decision"]) for s in report["steps"]]
    dates = [s["scope"] for s in report["steps"] if s["operation"] == "compact"]
    assert len(dates) == 3 and all(d == "run" for op, _, d in steps if op == "compact"), steps
    assert [op for op, _, _ in steps][3:] == ["manifests", "statistics", "expire", "orphans"], steps
    # the statistics are of the snapshot the pass left, so expiry and orphan removal keep their file
    tbl = CatalogReader(config).load(table_name)
    assert [s.snapshot_id for s in tbl.metadata.statistics] == [tbl.current_snapshot().snapshot_id]
    assert seen and all(h == report["holder"] for h in seen), f"another holder got in between the steps: {seen}"
    assert claims.holder_of(table_name) is None, "the pass released its claim"
    # rows are the writer's, read by a fresh Spark query
    assert ids(spark, sql, "event_id") == sorted(writer.ledger.expected_ids())
    health = CatalogReader(config).health(table_name)
    assert [p.data_files for p in health.partitions] == [1, 1, 1]
    # each step is audited and is a run in the Dagster instance
    records = open_audit(config).records(table=table_name)
    assert {r.operation for r in records if r.trigger == "maintain"} >= {"compact", "manifests", "statistics", "expire",
                                                                         "orphans"}
    runs = get_instance(config).get_runs()
    assert {s["run_id"] for s in report["steps"]} <= {r.run_id for r in runs}


def test_a_table_without_a_time_column_gets_its_partitions_compacted(capsys, spark, lake_root, tmp_path, table_name):
    sql = TableName.parse(table_name).sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, kind STRING) USING iceberg PARTITIONED BY (kind)")
    for i in range(4):
        spark.sql(f"INSERT INTO {sql} VALUES ({i}, 'a'), ({i + 10}, 'b')")
    before = ids(spark, sql)
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"))
    code, out, err = run_cli(capsys, "--config", str(path), "maintain", table_name)
    assert code == 0, out + err
    assert "compact   (table)      run: 2 of 2 partitions due" in out and "manifests" in out
    assert ids(spark, sql) == before
    assert CatalogReader(load_config(path)).health(table_name).data_files == 2


def test_a_busy_claim_does_nothing_and_says_who_holds_it(capsys, spark, lake_root, tmp_path, table_name):
    streaming_table(spark, "lake", table_name, batches=1, days=1)  # refused before any work: one commit will do
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"))
    config = load_config(path)
    location = CatalogReader(config).metadata_location(table_name)
    with table_claim(config, table_name, holder="ingest-job"):
        code, out, err = run_cli(capsys, "--config", str(path), "maintain", table_name)
    assert code == 1 and "nothing done" in err and "ingest-job" in err and len(err.strip().splitlines()) == 1
    assert CatalogReader(config).metadata_location(table_name) == location


def test_dates_and_all_due_exclude_each_other(capsys, config_file):
    code, out, err = run_cli(capsys, "--config", str(config_file), "maintain", "db.t", "--date", "2026-01-01",
                             "--all-due")
    assert code == 2 and err.strip() == ("error: --date and --all-due exclude each other: give dates, or let the "
                                         "pass find the due ones")


def test_due_manifests_go_before_compaction(capsys, spark, lake_root, tmp_path, table_name):
    writer = streaming_table(spark, "lake", table_name, batches=3, days=3, rows_per_day=10)
    sql = writer.name.sql("lake")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        defaults={"manifest_min_count": 2})
    manifests_before = len(CatalogReader(load_config(path)).load(table_name).inspect.manifests())

    code, out, err = run_cli(capsys, "--config", str(path), "maintain", table_name, "--json")

    report = json.loads(out)
    assert code == 0 and report["success"], (report, err)
    steps = [(s["operation"], s["decision"]) for s in report["steps"]]
    assert steps[0] == ("manifests", "run") and [op for op, _ in steps[1:4]] == ["compact"] * 3, steps
    assert [op for op, _ in steps[4:]] in ([], ["manifests"]), steps  # again only when the compactions made it due
    assert all(d == "run" for _, d in steps), steps
    assert manifests_before >= 4  # the writer's three appends and its delete
    assert ids(spark, sql, "event_id") == sorted(writer.ledger.expected_ids())
    assert [p.data_files for p in CatalogReader(load_config(path)).health(table_name).partitions] == [1, 1, 1]


def test_dates_a_gate_holds_back_are_named_and_the_pass_does_not_succeed(capsys, spark, lake_root, tmp_path,
                                                                          table_name):
    """A due date waiting for approval is not "nothing due": the pass lists it with its reason and exits 1; once
    approved, the next pass compacts it."""
    from icemaint.safety.approvals import approve

    writer = streaming_table(spark, "lake", table_name, batches=3, days=2, rows_per_day=10)
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        tables={table_name: {"max_rewrite_bytes": "1KiB"}})
    config = load_config(path)
    location = CatalogReader(config).metadata_location(table_name)
    code, out, err = run_cli(capsys, "--config", str(path), "maintain", table_name, "--json")
    report = json.loads(out)
    held = [(s["scope"], s["decision"]) for s in report["steps"] if s["operation"] == "compact"]
    assert code == 1 and not report["success"] and len(held) == 2 and {d for _, d in held} == {"defer"}, report
    assert all("awaiting approval" in s["reason"] for s in report["steps"] if s["operation"] == "compact")
    assert all(f"icemaint approve {table_name} --date {s['scope']}" in s["hint"]  # what lets each go
               for s in report["steps"] if s["operation"] == "compact"), report
    assert CatalogReader(config).metadata_location(table_name) == location

    first = held[0][0]
    approve(config, open_audit(config), table_name, first)
    code, out, err = run_cli(capsys, "--config", str(path), "maintain", table_name, "--json")
    report = json.loads(out)
    steps = {(s["scope"], s["decision"]) for s in report["steps"] if s["operation"] == "compact"}
    assert code == 1 and (first, "run") in steps and (held[1][0], "defer") in steps, report
    assert ids(spark, writer.name.sql("lake"), "event_id") == sorted(writer.ledger.expected_ids())
