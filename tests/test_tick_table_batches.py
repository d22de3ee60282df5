"""The same dates of several tables in one Dagster run (issue 20, item 2: the tick's requests batched).

An estate catch-up is many tables due on the same date or dates; one run per table paid Dagster's per-run
work (run record, event-log shard, steps, ~30 events) for each, about a third of a small table's compaction
on SQLite. The tick joins tables that are neighbours in the `table` partitions' order and due on the same
consecutive dates (a run's partition range covers every table between its first and last, and every date
between its first and last) into one run; each table-date keeps its own request, claim, proof, audit record
and materialization, and a failed proof leaves its table as it was while the batch's other tables publish.
Rows are read back by pyiceberg.
"""

from __future__ import annotations

import json
import uuid

import pytest

from conftest import run_cli, write_config
from icemaint.config import load_config
from icemaint.domain.tick import table_batches
from icemaint.observe.catalog import CatalogReader
from icemaint.safety.audit import open_audit
from maint_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, TABLE_TAG, TABLES_TAG, table_of, table_slot, \
    tables_of

DATE, NEXT = "2026-02-03", "2026-02-04"
FILES, ROWS_PER_FILE = 4, 50


# -- the pure rule -------------------------------------------------------------------------------------------

ORDER = ["a", "b", "c", "d", "e", "f"]


def test_one_date_of_neighbouring_tables_is_one_batch_in_rank_order():
    batches = [[("c", "2026-01-01")], [("a", "2026-01-01")], [("b", "2026-01-01")], [("e", "2026-01-01")]]
    # a, b, c are neighbours; d is not due, so e starts a batch of its own
    assert table_batches(batches, ORDER, 31) == [
        [("a", "2026-01-01"), ("b", "2026-01-01"), ("c", "2026-01-01")],  # ranked by c, its best member
        [("e", "2026-01-01")]]


def test_different_dates_never_share_a_batch():
    batches = [[("a", "2026-01-01")], [("b", "2026-01-02")], [("c", "2026-01-01")], [("d", "2026-01-02")]]
    assert table_batches(batches, ORDER, 31) == [[("a", "2026-01-01")], [("b", "2026-01-02")],
                                                 [("c", "2026-01-01")], [("d", "2026-01-02")]]


def test_neighbours_due_on_the_same_dates_share_a_batch_table_by_table():
    two = ["2026-01-01", "2026-01-02"]
    batches = [[("b", d) for d in two], [("a", d) for d in two], [("c", "2026-01-01")], [("d", "2026-01-01")]]
    assert table_batches(batches, ORDER, 31) == [
        [("a", "2026-01-01"), ("a", "2026-01-02"), ("b", "2026-01-01"), ("b", "2026-01-02")],
        [("c", "2026-01-01"), ("d", "2026-01-01")]]


def test_a_table_with_more_than_one_batch_keeps_its_own():
    batches = [[("a", "2026-01-01")],
               [("b", "2026-01-01"), ("b", "2026-01-02")],  # dates no neighbour is due on
               [("c", "2026-01-01")], [("c", "2026-01-05")],  # two batches: it must not be in two runs at once
               [("d", "2026-01-01")], [("e", None)],  # no date: compacted per partition
               [("f", "2026-01-01")], [("zz", "2026-01-01")]]  # zz: not a partition (yet)
    out = table_batches(batches, ORDER, 31)
    assert sorted(out) == sorted(batches)  # d and f are not neighbours of each other or of a


def test_long_stretches_are_cut_by_the_limit_and_spread_over_the_workers():
    order = [f"t{i:02d}" for i in range(10)]
    batches = [[(t, "2026-01-01")] for t in order]
    assert [len(b) for b in table_batches(batches, order, 4)] == [4, 4, 2]
    assert [len(b) for b in table_batches(batches, order, 31, spread=2)] == [5, 5]
    assert [len(b) for b in table_batches(batches, order, 3, spread=2)] == [3, 3, 3, 1]
    assert [[t for t, _ in b] for b in table_batches(batches, order, 31, spread=3)] == [
        order[0:4], order[4:8], order[8:10]]
    assert table_batches([], order, 31) == []
    # the limit counts table-dates: three dates each, at most 10 tables a run (7: two)
    three = [[(t, d) for d in ("2026-01-01", "2026-01-02", "2026-01-03")] for t in order]
    assert [len(b) for b in table_batches(three, order, 31)] == [30]
    assert [len(b) for b in table_batches(three, order, 7)] == [6, 6, 6, 6, 6]
    assert table_batches(three, order, 3) == three  # a table's dates fill a run: nothing to join


@pytest.mark.parametrize("name, limit, spread", [("limit", 0, 1), ("limit", True, 1), ("spread", 2, 0),
                                                 ("spread", 2, 1.5)])
def test_a_limit_or_spread_below_one_or_not_an_int_is_refused(name, limit, spread):
    with pytest.raises(ValueError, match=f"{name} must be an int of at least 1"):
        table_batches([[("a", "2026-01-01")]], ORDER, limit, spread=spread)


def test_a_run_over_several_tables_names_them_all():
    tags = {TABLES_TAG: "ns.a,ns.b,ns.c", RANGE_START_TAG: f"{DATE}|ns.a", RANGE_END_TAG: f"{DATE}|ns.c"}
    assert tables_of(tags) == ("ns.a", "ns.b", "ns.c")
    assert table_of(tags) is None  # not its first table: no per-table rule may take it for one table's run
    assert tables_of({TABLE_TAG: "ns.a"}) == ("ns.a",) and tables_of({}) == ()


# -- the tick ------------------------------------------------------------------------------------------------

def _namespace(prefix: str, count: int) -> str:
    """A fresh namespace whose tables t0..t<count-1> have different queue slots (one run carries one slot tag per
    table, so tables sharing a slot are never batched together)."""
    while True:
        namespace = f"{prefix}_{uuid.uuid4().hex[:8]}"
        if len({table_slot(f"{namespace}.t{t}") for t in range(count)}) == count:
            return namespace


def _tables(spark, prefix: str, count: int, dates: tuple[str, ...] = (DATE,)) -> list[str]:
    """`count` tables, each with FILES small files on each of `dates` (ids unique across the tables)."""
    namespace = _namespace(prefix, count)
    names = []
    for t in range(count):
        key = f"{namespace}.t{t}"
        table_sql = f"lake.{namespace}.t{t}"
        spark.sql(f"CREATE TABLE {table_sql} (id BIGINT, v STRING, ts TIMESTAMP) USING iceberg "
                  "PARTITIONED BY (days(ts))")
        # one commit: FILES write tasks of ROWS_PER_FILE ids each, a task's rows spread over the dates (a row lies
        # on one date) and written unshuffled, so each task leaves one small file on each date
        first = t * FILES * ROWS_PER_FILE
        when = " ".join(f"WHEN {i} THEN TIMESTAMP '{date} 03:00:00'" for i, date in enumerate(dates))
        spark.range(first, first + FILES * ROWS_PER_FILE, 1, FILES) \
            .selectExpr("id", "concat('v', id) AS v", f"CASE id % {len(dates)} {when} END AS ts") \
            .sortWithinPartitions("ts").writeTo(table_sql).option("distribution-mode", "none").append()
        names.append(key)
    return names


def _ids(reader, key: str) -> list[int]:
    return sorted(reader.load(key).scan().to_arrow().column("id").to_pylist())


def _expected(names: list[str], key: str) -> list[int]:
    t = names.index(key)
    return list(range(t * FILES * ROWS_PER_FILE, (t + 1) * FILES * ROWS_PER_FILE))


def _tick(capsys, lake_root, tmp_path, names: list[str]):
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        max_runs_total=1, scope={"include": names},
                        defaults={"writer_idle": "0s", "hot_partition_age": "0s", "min_input_files": 2,
                                  "sample_fraction": 1.0})
    config = load_config(path)
    reader = CatalogReader(config)
    locations = {key: reader.metadata_location(key) for key in names}
    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--json")
    report = json.loads(out)
    runs = {(d["table"], d["date"]): d for d in report["decisions"] if d.get("run_id")}
    return config, reader, locations, code, err, runs


@pytest.mark.usefixtures("isolated_dagster_home")
def test_a_tick_compacts_the_same_dates_of_several_tables_in_one_run(capsys, spark, lake_root, tmp_path):
    names = _tables(spark, "tb", 3, dates=(DATE, NEXT))

    config, reader, locations, code, err, runs = _tick(capsys, lake_root, tmp_path, names)

    assert code == 0, err
    assert sorted(runs) == sorted((key, date) for key in names for date in (DATE, NEXT))
    assert len({d["run_id"] for d in runs.values()}) == 1  # one Dagster run for the three tables' two dates
    assert all(d["success"] and d["result"] == "run" and d["published"] and d["validation"]
               for d in runs.values()), runs
    import dagster as dg

    from icemaint.app.instance import get_instance

    instance = get_instance(config)
    run = instance.get_run_by_id(runs[(names[0], DATE)]["run_id"])
    assert tables_of(run.tags) == tuple(names) and run.is_success
    audit = open_audit(config).records(operation="compact")
    for key in names:  # each table-date its own materialization and audit record; every row kept
        for date in (DATE, NEXT):
            records = instance.fetch_materializations(dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("compaction"), asset_partitions=[f"{date}|{key}"]), limit=1).records
            assert records and records[0].run_id == run.run_id
        assert sorted((r.date, r.decision) for r in audit if r.table == key) == [(DATE, "run"), (NEXT, "run")]
        assert reader.metadata_location(key) != locations[key]
        assert [p.data_files for p in reader.health(key).partitions] == [1, 1]
        assert _ids(reader, key) == _expected(names, key)


@pytest.mark.usefixtures("isolated_dagster_home")
def test_a_failed_proof_in_a_batch_leaves_its_table_as_it_was_and_the_others_publish(capsys, spark, lake_root,
                                                                                     tmp_path, monkeypatch):
    from icemaint.engine.staging import StagingArea

    names = _tables(spark, "tf", 3)
    broken = names[1]
    original = StagingArea._write_replacements

    def drops_a_row_of_one_table(self, rows, set_id, options):
        if self.name.key == broken:  # the writer loses one row: the proof must catch it
            rows = rows.where(f"id <> {_expected(names, broken)[7]}")
        return original(self, rows, set_id, options)

    monkeypatch.setattr(StagingArea, "_write_replacements", drops_a_row_of_one_table)
    config, reader, locations, code, err, runs = _tick(capsys, lake_root, tmp_path, names)

    assert code != 0  # the tick says something was not done
    assert len({d["run_id"] for d in runs.values()}) == 1
    failed = runs[(broken, DATE)]
    assert failed["result"] == "not_published" and failed["success"] is False
    assert failed["validation"] is False and not failed["published"]
    assert reader.metadata_location(broken) != locations[broken]  # the staging branch came and went...
    tbl = reader.load(broken)
    assert [r for r in tbl.metadata.refs] == ["main"]
    assert [p.data_files for p in reader.health(broken).partitions] == [FILES]  # ...main never moved
    assert _ids(reader, broken) == _expected(names, broken)
    for key in (names[0], names[2]):
        done = runs[(key, DATE)]
        assert done["success"] and done["published"] and done["validation"], done
        assert [p.data_files for p in reader.health(key).partitions] == [1]
        assert _ids(reader, key) == _expected(names, key)
    from icemaint.app.instance import get_instance

    instance = get_instance(config)
    run = instance.get_run_by_id(runs[(broken, DATE)]["run_id"])
    assert not run.is_success  # the run does not report success for work not done
    # ...and neither does the partition: the published ones are materialized, the failed proof's is not
    import dagster as dg

    materialized = instance.get_materialized_partitions(dg.AssetKey("compaction"))
    assert {f"{DATE}|{names[0]}", f"{DATE}|{names[2]}"} <= materialized
    assert f"{DATE}|{broken}" not in materialized


@pytest.mark.usefixtures("isolated_dagster_home")
def test_a_run_over_tables_that_are_not_neighbours_is_refused_before_it_starts(spark, lake_root, tmp_path):
    from icemaint.app.runner import MaintenanceRunner

    names = _tables(spark, "tn", 3)
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": names})
    config = load_config(path)
    runner = MaintenanceRunner(config, str(path))
    for key in names:
        runner.check_table(key)  # registered in this order
    reader = CatalogReader(config)
    locations = {key: reader.metadata_location(key) for key in names}

    for tables in ([names[0], names[2]], [names[1], names[0]], [names[0], names[0]]):
        with pytest.raises(ValueError, match="must be neighbours in the table partitions' order"):
            runner.compact_tables(tables, [DATE], trigger="tick")
    with pytest.raises(ValueError, match="dates of one run must be consecutive and ascending"):
        runner.compact_tables(names[:2], [NEXT, DATE], trigger="tick")

    assert runner.instance.get_run_records() == []
    assert {key: reader.metadata_location(key) for key in names} == locations
