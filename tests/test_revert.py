"""`icemaint revert`: an operator's undo of a published rewrite is a forward commit, proven first; what
cannot be reverted safely is refused in one line with nothing changed."""

from __future__ import annotations

import json
import uuid

import pytest

from conftest import current_snapshot, run_cli, write_config
from icemaint.config import load_config
from icemaint.domain.names import TableName
from icemaint.engine.revert import REVERT_OF_KEY
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims
from staged_faults import main_lineage

DAY = "2026-01-02"


def rows(spark, sql: str, snapshot_id: int | None = None) -> list[tuple]:
    at = f" VERSION AS OF {snapshot_id}" if snapshot_id else ""
    return sorted(tuple(r) for r in spark.sql(f"SELECT id, ts, v FROM {sql}{at}").collect())


def independent_rows(config, table: str) -> list[tuple]:
    arrow = CatalogReader(config).load(table).scan().to_arrow()
    return sorted(zip(arrow.column("id").to_pylist(), arrow.column("v").to_pylist()))


def write_small_files(spark, table: str) -> str:
    """A merge-on-read table with 4 small files (2 rows each) on one date; its SQL name."""
    sql = TableName.parse(table).sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (days(ts)) "
              "TBLPROPERTIES ('write.delete.mode'='merge-on-read')")
    for i in range(4):
        spark.sql(f"INSERT INTO {sql} VALUES ({i}, TIMESTAMP '{DAY} 0{i}:00:00', 'v{i}'), "
                  f"({i + 10}, TIMESTAMP '{DAY} 0{i}:30:00', 'w{i}')")
    return sql


@pytest.fixture
def small_files(spark, table_name) -> str:
    return write_small_files(spark, table_name)


def publish(config, spark, table: str) -> int:
    """Compacts the date and returns the snapshot that published the rewrite."""
    outcome = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config)).run(
        CompactionRequest(table, DAY))
    assert outcome.published, outcome.reason
    return outcome.after_snapshot_id


def compact_small_files(spark, sql: str, config_file, table: str) -> dict:
    config = load_config(config_file)
    before = rows(spark, sql)
    files_before = sorted(r[0] for r in spark.sql(f"SELECT file_path FROM {sql}.files").collect())
    return dict(sql=sql, table=table, path=str(config_file), config=config, before=before,
                files_before=files_before, published=publish(config, spark, table))


@pytest.fixture
def compacted(spark, small_files, config_file, table_name):
    """`small_files` compacted and published; its path, config and the publish snapshot."""
    return compact_small_files(spark, small_files, config_file, table_name)


@pytest.fixture(scope="module")
def refused_on(spark, lake_root, tmp_path_factory):
    """One `compacted` table for the refusals that change nothing (each checks its metadata stays put)."""
    root = tmp_path_factory.mktemp("revert_refusals")
    table = f"t.revert_refusals_{uuid.uuid4().hex[:8]}"
    path = write_config(root / "maintenance.yaml", lake_root, state_dir=str(root / "state"))
    return compact_small_files(spark, write_small_files(spark, table), path, table)


def test_a_published_rewrite_is_reverted_forward_with_its_proof(capsys, spark, compacted):
    sql, table = compacted["sql"], compacted["table"]
    # a writer keeps appending after the rewrite; its rows must survive the revert
    spark.sql(f"INSERT INTO {sql} VALUES (99, TIMESTAMP '{DAY} 09:00:00', 'late')")
    head = current_snapshot(spark, sql)
    expected = rows(spark, sql)
    code, out, err = run_cli(capsys, "--config", compacted["path"], "revert", table, "--snapshot",
                             str(compacted["published"]), "--json")
    outcome = json.loads(out)
    assert code == 0 and outcome["decision"] == "run", (outcome, err)
    assert outcome["validation"]["passed"] is True and outcome["restored_files"] == 4
    assert rows(spark, sql) == expected
    assert independent_rows(compacted["config"], table) == sorted((r[0], r[2]) for r in expected)
    # the replaced files are back, the late writer's file kept, the rewrite's file gone
    files_now = sorted(r[0] for r in spark.sql(f"SELECT file_path FROM {sql}.files").collect())
    assert set(compacted["files_before"]) <= set(files_now) and len(files_now) == 5
    # forward: the revert sits on top of the writer's commit; nothing was rewound
    lineage = main_lineage(spark, sql)
    assert lineage[0]["snapshot_id"] == outcome["after_snapshot_id"] and lineage[1]["snapshot_id"] == head
    assert compacted["published"] in [s["snapshot_id"] for s in lineage]
    summary = spark.sql(f"SELECT summary FROM {sql}.snapshots WHERE snapshot_id = {outcome['after_snapshot_id']}").first()[0]
    assert summary[REVERT_OF_KEY] == str(compacted["published"]) and summary["icemaint.proof"] == "passed"
    [record] = [r for r in open_audit(compacted["config"]).records(table=table) if r.operation == "revert"]
    assert record.decision == "run" and record.after_snapshot_id == outcome["after_snapshot_id"]
    # run again (as after an interrupt that landed after the commit): refused, naming the revert that did it
    location = CatalogReader(compacted["config"]).metadata_location(table)
    code, _, err = run_cli(capsys, "--config", compacted["path"], "revert", table, "--snapshot",
                           str(compacted["published"]))
    assert code == 1 and f"already reverted by snapshot {outcome['after_snapshot_id']}" in err, err
    assert CatalogReader(compacted["config"]).metadata_location(table) == location


def test_a_reverted_date_is_held_from_automation_until_an_operator_approves_it(capsys, spark, compacted, tmp_path,
                                                                                lake_root):
    """Automation does not redo what a person undid: after the revert the date is due again by its files, yet the
    tick, `compact` and `explain` hold it, naming who reverted and the approve command; an approval releases it."""
    sql, table = compacted["sql"], compacted["table"]
    # the same state (audit, claims, instance), the tick scoped to this table
    path = str(write_config(tmp_path / "scoped.yaml", lake_root, state_dir=str(compacted["config"].state_dir),
                            scope={"include": [table]}))
    code, out, err = run_cli(capsys, "--config", path, "revert", table, "--snapshot", str(compacted["published"]))
    assert code == 0, err
    location = CatalogReader(compacted["config"]).metadata_location(table)

    code, out, err = run_cli(capsys, "--config", path, "tick", "--json")
    [held] = [d for d in json.loads(out)["decisions"] if d["table"] == table and d["operation"] == "compact"]
    assert held["decision"] == "defer" and held["reason"].startswith("held after a revert: "), held
    assert f"reverted snapshot {compacted['published']}" in held["reason"]
    assert f"icemaint approve {table} --date {DAY}" in held["reason"]
    code, out, err = run_cli(capsys, "--config", path, "compact", table, "--date", DAY, "--json")
    [outcome] = json.loads(out)
    assert code == 1 and outcome["decision"] == "defer" and "held after a revert" in outcome["reason"], outcome
    code, out, _ = run_cli(capsys, "--config", path, "explain", table, "--json")
    [explained] = json.loads(out)["compaction"]
    assert explained["kind"] == "reverted", explained
    assert CatalogReader(compacted["config"]).metadata_location(table) == location

    code, _, err = run_cli(capsys, "--config", path, "approve", table, "--date", DAY)
    assert code == 0, err
    code, out, err = run_cli(capsys, "--config", path, "compact", table, "--date", DAY, "--json")
    [again] = json.loads(out)
    assert code == 0 and again["decision"] == "run" and again["published"], again
    assert rows(spark, sql) == compacted["before"]


def test_a_row_deleted_since_the_rewrite_is_never_resurrected(capsys, spark, compacted):
    sql, table = compacted["sql"], compacted["table"]
    spark.sql(f"DELETE FROM {sql} WHERE id = 2")
    location = CatalogReader(compacted["config"]).metadata_location(table)
    code, out, err = run_cli(capsys, "--config", compacted["path"], "revert", table, "--snapshot",
                             str(compacted["published"]))
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "not reverted" in err and "main is unchanged" in err
    assert 2 not in [r[0] for r in rows(spark, sql)]
    assert CatalogReader(compacted["config"]).metadata_location(table) == location


@pytest.mark.parametrize("which, words", [
    ("writer", "not a proven icemaint rewrite"),
    ("missing", "is not in"),
])
def test_what_is_not_a_proven_rewrite_is_refused_with_nothing_changed(capsys, spark, refused_on, which, words):
    compacted = refused_on
    sql, table = compacted["sql"], compacted["table"]
    snapshot = main_lineage(spark, sql)[-1]["snapshot_id"] if which == "writer" else 123456789
    location = CatalogReader(compacted["config"]).metadata_location(table)
    code, out, err = run_cli(capsys, "--config", compacted["path"], "revert", table, "--snapshot", str(snapshot))
    assert code == 1 and words in err and len(err.strip().splitlines()) == 1, err
    assert CatalogReader(compacted["config"]).metadata_location(table) == location


def test_a_rewrite_that_applied_deletes_is_refused(capsys, spark, small_files, config_file, table_name):
    spark.sql(f"DELETE FROM {small_files} WHERE id = 1")
    config = load_config(config_file)
    published = publish(config, spark, table_name)
    location = CatalogReader(config).metadata_location(table_name)
    code, out, err = run_cli(capsys, "--config", str(config_file), "revert", table_name, "--snapshot", str(published))
    assert code == 1 and "deletes" in err and len(err.strip().splitlines()) == 1, err
    assert CatalogReader(config).metadata_location(table_name) == location


def test_a_snapshot_id_beyond_64_bits_is_bad_input(capsys, spark, refused_on):
    compacted = refused_on
    table = compacted["table"]
    location = CatalogReader(compacted["config"]).metadata_location(table)
    code, out, err = run_cli(capsys, "--config", compacted["path"], "revert", table, "--snapshot", str(2**63))
    assert code == 2 and "64-bit" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert CatalogReader(compacted["config"]).metadata_location(table) == location


def test_a_rewrite_whose_base_snapshot_was_expired_is_refused_in_one_line(capsys, spark, compacted):
    from icemaint.operations.expiry import ExpiryRequest
    from icemaint.operations.housekeeping import Housekeeper

    config, table = compacted["config"], compacted["table"]
    expired = Housekeeper(config, spark, CatalogReader(config), open_claims(config), open_audit(config)).expire(
        ExpiryRequest(table, older_than_seconds=0, retain_last=1))
    assert expired.decision == "run", expired.reason
    location = CatalogReader(config).metadata_location(table)
    code, out, err = run_cli(capsys, "--config", compacted["path"], "revert", table, "--snapshot",
                             str(compacted["published"]), "--dry-run")
    assert code == 1 and "has been expired" in err and len(err.strip().splitlines()) == 1, err
    assert CatalogReader(config).metadata_location(table) == location
    assert independent_rows(config, table) == sorted((r[0], r[2]) for r in compacted["before"])
