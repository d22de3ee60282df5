"""The simulated streaming writer: rows, files, deletes, ledger, resume and refusals on real Iceberg tables."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import threading
from pathlib import Path

import pytest

from icemaint.domain.names import InvalidTableName, TableName
from icemaint.app.simulator import (ID_STRIDE, Ledger, LedgerBehindTable, SchemaMismatch, SimulatorError,
                                StreamingWriter, WorkloadSpec, batch_rows, choose_deletes, delete_sql,
                                main)

SMALL = dict(days=3, rows_per_day=4, delete_every=2, deletes_per_batch=3)


def table_ids(spark, catalog: str, table: str) -> set[int]:
    rows = spark.sql(f"SELECT event_id FROM {TableName.parse(table).sql(catalog)}").collect()
    ids = [r["event_id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate event ids in the table"
    return set(ids)


def files(spark, catalog: str, table: str):
    return spark.sql(f"SELECT content, partition.ts_day AS day, record_count "
                     f"FROM {TableName.parse(table).sql(catalog)}.`files`").collect()


def snapshot_count(spark, catalog: str, table: str) -> int:
    return spark.sql(f"SELECT count(*) AS n FROM {TableName.parse(table).sql(catalog)}.`snapshots`"
                     ).collect()[0]["n"]


# -- pure parts ----------------------------------------------------------------------------------

def test_batch_rows_are_seeded_unique_and_on_the_spec_days():
    spec = WorkloadSpec(table="t.x", **SMALL)
    rows0, rows1 = batch_rows(spec, 0), batch_rows(spec, 1)
    assert rows0 == batch_rows(spec, 0)
    assert batch_rows(WorkloadSpec(table="t.x", **{**SMALL, "seed": 8}), 0) != rows0
    ids0, ids1 = [r[0] for r in rows0], [r[0] for r in rows1]
    assert len(rows0) == 12 and len(set(ids0)) == 12 and not set(ids0) & set(ids1)
    assert min(ids1) == ID_STRIDE
    days = sorted({r[2].date() for r in rows0})
    assert days == [dt.date(2026, 1, 1), dt.date(2026, 1, 2), dt.date(2026, 1, 3)]
    assert all(r[2].tzinfo is dt.timezone.utc for r in rows0)


def test_choose_deletes_is_seeded_and_only_picks_live_ids():
    live = set(range(100)) - {5, 6, 7}
    picked = choose_deletes(live, 10, seed=7, batch=3)
    assert picked == choose_deletes(set(live), 10, seed=7, batch=3)
    assert picked != choose_deletes(live, 10, seed=7, batch=4)
    assert len(set(picked)) == 10 and set(picked) <= live
    assert choose_deletes({1, 2}, 5, seed=7, batch=0) == [1, 2]


def test_delete_sql_accepts_only_ints():
    assert delete_sql("`lake`.`t`.`x`", [3, 1]) == "DELETE FROM `lake`.`t`.`x` WHERE event_id IN (3, 1)"
    for bad in (["1); DROP TABLE x; --"], [True], [1.0]):
        with pytest.raises(TypeError):
            delete_sql("`lake`.`t`.`x`", bad)
    with pytest.raises(ValueError):
        delete_sql("`lake`.`t`.`x`", [])


def test_ledger_round_trips_and_refuses_garbage(tmp_path):
    ledger = Ledger("t.x")
    ledger.record_append(0, [1, 2, 3], 11)
    ledger.record_delete(0, [2], 12)
    ledger.save(tmp_path / "l.json")
    back = Ledger.load(tmp_path / "l.json")
    assert back == ledger
    assert back.expected_ids() == {1, 3} and back.expected_count() == 2 and back.next_batch == 1
    (tmp_path / "bad.json").write_text(json.dumps({"written": [1], "deleted": [2], "history": []}))
    with pytest.raises(ValueError, match="deletes ids it never wrote"):
        Ledger.load(tmp_path / "bad.json")
    (tmp_path / "bad2.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad2.json"):
        Ledger.load(tmp_path / "bad2.json")


@pytest.mark.parametrize("overrides", [{"days": 0}, {"rows_per_day": 0}, {"delete_every": -1},
                                       {"days": True}, {"start_date": "2026-01-01"},
                                       {"rows_per_day": ID_STRIDE}])
def test_spec_refuses_bad_values(overrides):
    with pytest.raises(ValueError):
        WorkloadSpec(table="t.x", **overrides)


# -- on Spark and Iceberg ----------------------------------------------------------------------

class VersionClaim:
    """A real claim stand-in that records the Hadoop table's metadata version on entry and exit."""

    def __init__(self, version_hint: Path):
        self.version_hint = version_hint
        self.spans: list[tuple[int, int]] = []
        self.held = False

    def version(self) -> int:
        return int(self.version_hint.read_text().strip())

    @contextlib.contextmanager
    def __call__(self):
        assert not self.held, "claims must not nest"
        self.held = True
        before = self.version()
        try:
            yield
        finally:
            self.held = False
            self.spans.append((before, self.version()))


def test_batches_commit_inside_the_claim_and_the_ledger_matches_the_table(spark, config, table_name):
    catalog = config.catalog.name
    spec = WorkloadSpec(table=table_name, **SMALL)
    commits = []
    writer = StreamingWriter(spark, catalog, spec, on_commit=lambda b, k: commits.append((b, k)))
    writer.create_table()
    ns, name = table_name.split(".")
    claim = VersionClaim(Path(config.catalog.warehouse) / ns / name / "metadata" / "version-hint.text")
    writer.claim_factory = claim
    created_version = claim.version()

    results = [writer.write_batch() for _ in range(2)]

    # Every commit happened inside a claim, and none outside one.
    assert commits == [(0, "append"), (1, "append"), (1, "delete")]
    assert len(claim.spans) == 3
    assert claim.spans[0][0] == created_version
    assert all(after == before + 1 for before, after in claim.spans)
    assert all(nxt[0] == prev[1] for prev, nxt in zip(claim.spans, claim.spans[1:]))

    ledger = writer.ledger
    assert ledger.expected_count() == 2 * 12 - 3
    assert table_ids(spark, catalog, table_name) == ledger.expected_ids()
    assert [r.batch for r in results] == [0, 1]
    assert [len(r.deleted_ids) for r in results] == [0, 3]
    assert set(results[1].deleted_ids) <= set(results[0].appended_ids) | set(results[1].appended_ids)

    # One small data file per day per append; merge-on-read deletes left position-delete files.
    live_files = files(spark, catalog, table_name)
    data = [f for f in live_files if f["content"] == 0]
    deletes = [f for f in live_files if f["content"] == 1]
    per_day = {}
    for f in data:
        per_day[f["day"]] = per_day.get(f["day"], 0) + 1
    assert per_day == {dt.date(2026, 1, d): 2 for d in (1, 2, 3)}
    assert all(f["record_count"] == 4 for f in data)
    assert deletes and sum(f["record_count"] for f in deletes) == 3

    snaps = {r["snapshot_id"]: r for r in spark.sql(
        f"SELECT snapshot_id, operation, summary FROM {writer.table_sql}.`snapshots`").collect()}
    for r in results:
        append = snaps[r.append_snapshot_id]
        assert append["operation"] == "append" and append["summary"]["added-data-files"] == "3"
        assert append["summary"]["icemaint.app.simulator.batch"] == str(r.batch)
        if r.deleted_ids:
            delete = snaps[r.delete_snapshot_id]
            assert delete["operation"] == "delete"
            assert int(delete["summary"]["added-position-delete-files"]) >= 1


def test_same_seed_writes_the_same_rows(spark, config, table_name):
    catalog = config.catalog.name
    contents = []
    for suffix in ("a", "b"):
        spec = WorkloadSpec(table=f"{table_name}_{suffix}", **{**SMALL, "delete_every": 1})
        writer = StreamingWriter(spark, catalog, spec)
        writer.create_table()
        writer.run(2)  # two appends, each followed by a seeded delete
        contents.append(spark.sql(
            f"SELECT event_id, device_id, CAST(ts AS STRING) AS ts, reading, status "
            f"FROM {writer.table_sql} ORDER BY event_id").collect())
    assert len(contents[0]) == 2 * 12 - 6
    assert contents[0] == contents[1]


def test_resume_continues_ids_and_a_stale_ledger_is_refused(spark, config, table_name, tmp_path):
    catalog = config.catalog.name
    spec = WorkloadSpec(table=table_name, **SMALL)
    first = StreamingWriter(spark, catalog, spec)
    first.create_table()
    first.ledger.save(tmp_path / "stale.json")
    first.write_batch()
    first.ledger.save(tmp_path / "ledger.json")
    ids_before = first.ledger.written

    stop = threading.Event()
    resumed = StreamingWriter(spark, catalog, spec, ledger=Ledger.load(tmp_path / "ledger.json"),
                              on_commit=lambda batch, kind: stop.set() if kind == "delete" else None)
    assert resumed.next_batch == 1
    resumed.run(5, interval_seconds=5.0, stop=stop)  # stops after batch 1's delete, without sleeping
    assert resumed.next_batch == 2
    new_ids = resumed.ledger.written - ids_before
    assert len(new_ids) == 12 and min(new_ids) == ID_STRIDE
    assert len(resumed.ledger.deleted) == 3
    assert table_ids(spark, catalog, table_name) == resumed.ledger.expected_ids()

    snapshots = snapshot_count(spark, catalog, table_name)
    stale = StreamingWriter(spark, catalog, spec, ledger=Ledger.load(tmp_path / "stale.json"))
    with pytest.raises(LedgerBehindTable, match="batch 1 committed"):
        stale.write_batch()
    assert snapshot_count(spark, catalog, table_name) == snapshots
    assert table_ids(spark, catalog, table_name) == resumed.ledger.expected_ids()

    with pytest.raises(SimulatorError, match="belongs to table"):
        StreamingWriter(spark, catalog, WorkloadSpec(table=table_name + "_other"),
                        ledger=Ledger.load(tmp_path / "ledger.json"))


def test_existing_table_with_another_schema_is_refused(spark, config, table_name):
    catalog = config.catalog.name
    name = TableName.parse(table_name)
    spark.sql(f"CREATE TABLE {name.sql(catalog)} (event_id BIGINT, device_id STRING, ts TIMESTAMP, "
              f"reading DOUBLE, status STRING) USING iceberg PARTITIONED BY (days(ts))")
    writer = StreamingWriter(spark, catalog, WorkloadSpec(table=table_name, **SMALL))
    with pytest.raises(SchemaMismatch, match="device_id"):
        writer.create_table()
    with pytest.raises(SchemaMismatch):
        writer.write_batch()
    assert snapshot_count(spark, catalog, table_name) == 0
    assert writer.ledger.written == set() and writer.ledger.history == []

    unpartitioned = f"{table_name}_flat"
    spark.sql(f"CREATE TABLE {TableName.parse(unpartitioned).sql(catalog)} (event_id BIGINT, "
              f"device_id INT, ts TIMESTAMP, reading DOUBLE, status STRING) USING iceberg")
    with pytest.raises(SchemaMismatch, match="partitioning is none"):
        StreamingWriter(spark, catalog, WorkloadSpec(table=unpartitioned)).create_table()


def test_create_table_is_idempotent_and_sets_merge_on_read(spark, config, table_name):
    writer = StreamingWriter(spark, config.catalog.name, WorkloadSpec(table=table_name, **SMALL))
    writer.create_table()
    writer.create_table()
    props = dict(spark.sql(f"SHOW TBLPROPERTIES {writer.table_sql}").collect())
    assert props["format-version"] == "2"
    for mode in ("delete", "update", "merge"):
        assert props[f"write.{mode}.mode"] == "merge-on-read"
    assert snapshot_count(spark, config.catalog.name, table_name) == 0


def test_invalid_table_name_is_refused_without_creating_anything(spark, config):
    warehouse = Path(config.catalog.warehouse)
    before = sorted(str(p) for p in warehouse.rglob("*")) if warehouse.exists() else []
    for bad in ("events", "t.x; DROP TABLE t.y", "t.`x`", "../etc.passwd"):
        with pytest.raises(InvalidTableName):
            WorkloadSpec(table=bad)
    with pytest.raises(ValueError, match="catalog name"):
        StreamingWriter(spark, "lake`; --", WorkloadSpec(table="t.never_created"))
    after = sorted(str(p) for p in warehouse.rglob("*")) if warehouse.exists() else []
    assert after == before
    assert not spark.catalog.tableExists("`lake`.`t`.`never_created`")


def test_command_line_creates_runs_and_resumes(spark, config, table_name, tmp_path, capsys):
    cfg = tmp_path / "maintenance.yaml"
    cfg.write_text(json.dumps({  # JSON is YAML
        "catalog": {"name": config.catalog.name, "type": "hadoop", "warehouse": config.catalog.warehouse},
        "spark": {"master": "local[2]"}, "state_dir": str(tmp_path / "state")}))
    ledger_path = tmp_path / "ledger.json"
    args = ["--config", str(cfg), "--table", table_name, "--interval", "0", "--ledger", str(ledger_path),
            "--days", "2", "--rows-per-day", "3", "--delete-every", "2", "--deletes-per-batch", "2"]

    assert main([*args, "--batches", "1"]) == 0
    assert Ledger.load(ledger_path).next_batch == 1
    assert main([*args, "--batches", "1"]) == 0  # resumes: batch 1, which ends with a delete
    ledger = Ledger.load(ledger_path)
    assert ledger.next_batch == 2 and ledger.expected_count() == 2 * 6 - 2
    assert table_ids(spark, config.catalog.name, table_name) == ledger.expected_ids()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["batches"] == 2 and report["expected_rows"] == 10

    assert main([*args, "--table", "t.bad name", "--batches", "1"]) == 2
    assert "is not allowed" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "state")
