"""Column statistics (Puffin NDV sketches): when they are stale (pure), what the statistics file holds (read by an
independent Puffin reader against pyiceberg's distinct counts), and that computing them keeps every row and every
writer's commit, moves no ref, and leaves nothing behind when refused or outrun by writers."""

from __future__ import annotations

import datetime as dt
import json
import struct
from pathlib import Path

import pyarrow.compute as pc
import pytest

from conftest import make_config
from icemaint.domain.verdicts import NOOP, REFUSE, RUN, ReasonKind
from icemaint.domain.names import TableName
from icemaint.domain.policy import PolicyError, TablePolicy, apply_overrides
from icemaint.domain.retention_tick import STATISTICS, RetentionSignals, decide_retention
from icemaint.domain.statistics import (
    SnapshotRows, StatisticsError, StatisticsState, statistics_columns, statistics_due, statistics_state, summary_rows,
)
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.statistics import StatisticsRequest
from test_retention_conflicts import claimless, commit_a_batch, housekeeper, lineage, other_catalog, simulate  # noqa: F401

# -- pure: staleness and columns -------------------------------------------------------------------------------------


def snap(sid, operation="append", changed=0, total=None):
    return SnapshotRows(sid, operation, changed, total)


def test_rows_changed_since_the_statistics_count_appends_and_deletes_but_not_rewrites():
    lineage = [snap(5, "append", 30, 1030), snap(4, "replace", 2000, 1000), snap(3, "delete", 20, 1000),
               snap(2, "append", 500, 1020), snap(1, "append", 520, 520)]
    assert statistics_state(lineage, {2}) == StatisticsState(5, 1030, 2, 1020, 50)
    assert statistics_state(lineage, {5, 2}).changed_rows == 0
    assert statistics_state(lineage, set()) == StatisticsState(5, 1030, None, None, None)
    assert statistics_state([], {1}) == StatisticsState(None, None, None, None, None)
    # a snapshot with statistics off main's lineage (a branch's) does not count
    assert statistics_state(lineage, {99}).statistics_snapshot_id is None


def test_summary_rows_sum_every_kind_of_change_and_skip_what_is_not_a_number():
    assert summary_rows({"added-records": "10", "deleted-records": "3", "added-position-deletes": "2",
                         "added-equality-deletes": "1", "total-records": "100"}) == (16, 100)
    assert summary_rows({"added-records": "x", "total-records": None}) == (0, None)


@pytest.mark.parametrize("state, fraction, due, words", [
    (StatisticsState(None, None, None, None, None), 0.1, False, "no snapshot"),
    (StatisticsState(7, 100, 7, 100, 0), 0.1, False, "of the current snapshot 7"),
    (StatisticsState(7, 100, None, None, None), 0.1, True, "no statistics file"),
    (StatisticsState(7, 1090, 6, 1000, 90), 0.1, False, "90 of 1,000 rows changed"),
    (StatisticsState(7, 1100, 6, 1000, 100), 0.1, True, "100 of 1,000 rows changed"),
    (StatisticsState(7, 1100, 6, 1000, 100), 0.5, False, "< statistics_stale_fraction 50.0%"),
    (StatisticsState(7, 5, 6, 0, 5), 0.1, True, "which had none"),
    (StatisticsState(7, 0, 6, 0, 0), 0.1, False, "no row changed"),
])
def test_statistics_are_due_by_the_share_of_rows_changed(state, fraction, due, words):
    got, why = statistics_due(state, fraction)
    assert got is due and words in why, why


@pytest.mark.parametrize("covered, wanted, due, words", [
    (frozenset({"id"}), None, True, "the statistics of snapshot 7 have no sketch of ts, v"),
    (frozenset({"id"}), ("id",), False, "of the current snapshot 7"),
    (frozenset({"id", "v"}), ("v", "ts"), True, "have no sketch of ts"),
    (frozenset({"id", "ts", "v"}), None, False, "of the current snapshot 7"),
    (None, None, False, "of the current snapshot 7"),  # coverage not read: rows decide alone
])
def test_statistics_that_lack_a_wanted_column_are_due_whatever_the_rows(covered, wanted, due, words):
    state = StatisticsState(7, 100, 7, 100, 0, covered, ("id", "ts", "v"))
    got, why = statistics_due(state, 0.1, wanted)
    assert got is due and words in why, why


def test_columns_default_to_every_primitive_and_a_bad_name_is_refused_by_name():
    fields = [("id", True), ("tags", False), ("name", True)]
    assert statistics_columns(fields, None) == ("id", "name")
    assert statistics_columns(fields, ["name", "name"]) == ("name",)
    with pytest.raises(StatisticsError, match="no column 'nope'"):
        statistics_columns(fields, ["id", "nope"])
    with pytest.raises(StatisticsError, match="'tags' is not of a primitive type"):
        statistics_columns(fields, ["tags"])
    with pytest.raises(StatisticsError, match="no column of a primitive type"):
        statistics_columns([("tags", False)], None)


def test_the_statistics_policy_keys_are_validated():
    policy = apply_overrides(TablePolicy(), {"statistics": True, "statistics_stale_fraction": 0.25,
                                             "statistics_columns": ["id", "id", "ts"]}, "defaults")
    assert (policy.statistics, policy.statistics_stale_fraction, policy.statistics_columns) == (True, 0.25, ("id", "ts"))
    for key, value in [("statistics", "yes"), ("statistics_stale_fraction", 0), ("statistics_stale_fraction", 2),
                       ("statistics_columns", []), ("statistics_columns", "id")]:
        with pytest.raises(PolicyError, match=f"defaults.{key}"):
            apply_overrides(TablePolicy(), {key: value}, "defaults")


def test_the_retention_tick_requests_statistics_only_when_kept_and_stale():
    stale = StatisticsState(9, 2000, 3, 1000, 1000)

    def decide(policy, state=stale, **kwargs):
        signals = RetentionSignals("t.a", "s3://m/v9.json", 2, None, 1, 0, statistics=state)
        args = {"claim_holder": None, "in_flight_jobs": set(), "expiry_mark": None, "orphans_mark": None, **kwargs}
        now = dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc)
        return {d.operation: d for d in decide_retention(signals, policy, "maint", now, **args)}[STATISTICS]

    off = decide(TablePolicy())
    assert off.verdict == NOOP and off.kind == ReasonKind.POLICY and "statistics: false" in off.reason
    on = TablePolicy(statistics=True)
    run = decide(on)
    assert run.verdict == RUN and run.run_key == "statistics:t.a:9" and "1,000 of 1,000 rows" in run.reason
    assert decide(on, StatisticsState(9, 2000, 9, 2000, 0)).verdict == NOOP
    assert decide(on, in_flight_jobs={"statistics_job"}).verdict == "defer"
    assert decide(on, claim_holder="writer-1").verdict == "defer"
    assert decide(on, requested={"statistics": "statistics:t.a:9"}).verdict == NOOP
    refused = decide(TablePolicy(statistics=True, allowed_operations=frozenset({"compact"})))
    assert refused.verdict == REFUSE


# -- on Spark ---------------------------------------------------------------------------------------------------------


def puffin_blobs(path: str) -> list[dict]:
    """The blobs listed in a Puffin file's footer, read with nothing but the format's layout: ... magic, the
    footer's JSON, its length (int32, little-endian), 4 flag bytes, magic."""
    data = local(path).read_bytes()
    assert data[:4] == b"PFA1" and data[-4:] == b"PFA1", "not a Puffin file"
    (length,) = struct.unpack("<i", data[-12:-8])
    flags = data[-8:-4]
    assert flags[0] & 1 == 0, "a compressed footer"
    return json.loads(data[-12 - length:-12])["blobs"]


def local(path: str) -> Path:
    return Path(str(path).removeprefix("file:"))


def stats_files_on_disk(config, table) -> list[Path]:
    ns, name = table.split(".")
    return sorted((Path(config.catalog.warehouse) / ns / name / "metadata").glob("*.stats"))


@pytest.fixture
def stats_config(lake_root, tmp_path):
    def build(**policy):
        return make_config(lake_root, state_dir=str(tmp_path / "state"), defaults={"statistics": True, **policy})
    return build


def test_statistics_hold_each_columns_distinct_count_and_change_no_row(spark, stats_config, table_name):
    config = stats_config()
    sql = TableName.parse(table_name).sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id bigint, name string, day date, amount decimal(10,2), flag boolean, "
              "tags array<string>) USING iceberg PARTITIONED BY (day)")
    spark.sql(f"INSERT INTO {sql} SELECT id, CASE WHEN id % 10 = 0 THEN NULL ELSE concat('n', id % 37) END, "
              "date_add(DATE'2026-01-01', CAST(id % 3 AS INT)), CAST(id % 11 AS DECIMAL(10,2)), id % 2 = 0, "
              "array('a') FROM range(1200)")
    reader = CatalogReader(config)
    before = reader.load(table_name)
    rows_before = before.scan().to_arrow()
    head, location = before.current_snapshot().snapshot_id, before.metadata_location

    outcome = housekeeper(config, spark).compute_statistics(StatisticsRequest(table_name, run_id="r-stats"))

    assert outcome.decision == RUN and "no statistics file on main's lineage" in outcome.reason, outcome.reason
    after = reader.load(table_name)
    assert after.current_snapshot().snapshot_id == head and lineage(spark, config, table_name)[0] == head
    assert after.metadata_location != location  # a metadata-only commit: no snapshot, no ref moved
    assert after.scan().to_arrow().sort_by("id").equals(rows_before.sort_by("id"))
    (statistics,) = after.metadata.statistics
    assert statistics.snapshot_id == head and str(statistics.statistics_path) == outcome.evidence["statistics_file"]
    blobs = puffin_blobs(statistics.statistics_path)
    schema = after.schema()
    by_column = {schema.find_column_name(b["fields"][0]): b for b in blobs}
    assert set(by_column) == {"id", "name", "day", "amount", "flag"}  # every primitive column, not the array
    for column, blob in by_column.items():
        exact = pc.count_distinct(rows_before.column(column), mode="only_valid").as_py()
        assert blob["type"] == "apache-datasketches-theta-v1" and blob["snapshot-id"] == head
        assert int(blob["properties"]["ndv"]) == exact == outcome.evidence["ndv"][column], column
    assert outcome.evidence["ndv"] == {"id": 1200, "name": 37, "day": 3, "amount": 11, "flag": 2}
    (record,) = [r for r in reader_records(config, table_name) if r.decision == RUN]
    assert record.details["evidence"]["statistics_file"] == statistics.statistics_path

    again = housekeeper(config, spark).compute_statistics(StatisticsRequest(table_name))
    assert again.decision == NOOP and "of the current snapshot" in again.reason
    assert reader.load(table_name).metadata_location == after.metadata_location


def test_statistics_of_columns_named_with_dots_back_quotes_and_keywords(spark, stats_config, table_name):
    """Iceberg allows any column name; a sketch per column is over that column, never parsed as a path (`a.b` was
    read as a struct field and `x``y` failed to parse, so statistics of such a table could never run)."""
    config = stats_config()
    sql = TableName.parse(table_name).sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id bigint, `a.b` string, `x``y` int, `select` int) USING iceberg")
    spark.sql(f"INSERT INTO {sql} SELECT id, concat('v', id % 5), CAST(id % 7 AS INT), CAST(id % 3 AS INT) "
              "FROM range(100)")
    outcome = housekeeper(config, spark).compute_statistics(StatisticsRequest(table_name, run_id="r-odd"))
    assert outcome.decision == RUN, outcome.reason
    assert outcome.evidence["ndv"] == {"id": 100, "a.b": 5, "x`y": 7, "select": 3}


def reader_records(config, table):
    from icemaint.safety.audit import open_audit

    return open_audit(config).records(table=table, operation="statistics")


def test_statistics_go_stale_with_changed_rows_not_with_a_rewrite(spark, stats_config, table_name):
    config = stats_config(statistics_stale_fraction=0.5)
    writer = simulate(spark, config, table_name, batches=4)  # 80 rows over 8 small files
    keeper = housekeeper(config, spark)
    assert keeper.compute_statistics(StatisticsRequest(table_name)).decision == RUN
    spark.sql(f"CALL lake.system.rewrite_data_files(table => '{table_name}', options => map('min-input-files', '2'))")
    rewritten = keeper.compute_statistics(StatisticsRequest(table_name))
    assert rewritten.decision == NOOP and "0 of 80 rows changed" in rewritten.reason, rewritten.reason
    writer.run(2)  # 40 more rows: half of what the statistics saw
    stale = keeper.compute_statistics(StatisticsRequest(table_name))
    assert stale.decision == RUN and "40 of 80 rows changed" in stale.reason, stale.reason
    assert stale.evidence["ndv"]["event_id"] == 120 == len(writer.ledger.expected_ids())

    # statistics of a few columns leave the others due, although no row changed since
    assert keeper.compute_statistics(StatisticsRequest(table_name, columns=("event_id",), force=True)).decision == RUN
    partial = keeper.compute_statistics(StatisticsRequest(table_name))
    assert partial.decision == RUN and "have no sketch of device_id, ts, reading, status" in partial.reason, \
        partial.reason
    assert keeper.compute_statistics(StatisticsRequest(table_name)).decision == NOOP


def test_writers_committing_meanwhile_keep_their_rows_and_the_statistics_land_on_top(spark, stats_config, table_name,
                                                                                    other_catalog):
    config = stats_config(max_commit_retries=3)
    writer = simulate(spark, config, table_name, batches=1)  # one commit: the statistics' snapshot to outrun
    other = claimless(spark, writer, other_catalog)
    planned = lineage(spark, config, table_name)[0]
    calls = []

    def writer_commits_first(operation, attempt):
        calls.append((operation, attempt))
        if attempt <= 2:
            commit_a_batch(other, delete_oldest=False)

    outcome = housekeeper(config, spark, before_commit=writer_commits_first).compute_statistics(
        StatisticsRequest(table_name))

    assert outcome.decision == RUN and outcome.attempts == 3, outcome.reason
    assert calls == [("statistics", 1), ("statistics", 2), ("statistics", 3)]
    assert "committed at attempt 3" in outcome.reason
    now = lineage(spark, config, table_name)
    assert planned in now and now[0] != planned  # main only moved forward, by the writer's two commits
    tbl = CatalogReader(config).load(table_name)
    assert [s.snapshot_id for s in tbl.metadata.statistics] == [planned]
    ids = sorted(tbl.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist())
    assert ids == sorted(writer.ledger.expected_ids())
    assert len(stats_files_on_disk(config, table_name)) == 1


def test_outrun_by_writers_it_defers_and_leaves_no_file(spark, stats_config, table_name, other_catalog):
    config = stats_config(max_commit_retries=1)
    writer = simulate(spark, config, table_name, batches=1)
    other = claimless(spark, writer, other_catalog)

    outcome = housekeeper(config, spark, before_commit=lambda op, attempt: commit_a_batch(other, delete_oldest=False)
                          ).compute_statistics(StatisticsRequest(table_name))

    assert outcome.decision == "defer" and "at each of 2 attempts" in outcome.reason, outcome.reason
    assert "nothing changed" in outcome.reason and "CommitFailedException" in outcome.reason
    tbl = CatalogReader(config).load(table_name)
    assert tbl.metadata.statistics == [] and stats_files_on_disk(config, table_name) == []
    ids = sorted(tbl.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist())
    assert ids == sorted(writer.ledger.expected_ids())


def test_a_refused_column_or_policy_changes_nothing(spark, stats_config, table_name):
    config = stats_config()
    simulate(spark, config, table_name, batches=1)
    location = CatalogReader(config).metadata_location(table_name)
    bad = housekeeper(config, spark).compute_statistics(StatisticsRequest(table_name, columns=("event_id", "nope")))
    assert bad.decision == REFUSE and "no column 'nope'" in bad.reason
    read_only = stats_config(read_only=True)
    refused = housekeeper(read_only, spark).compute_statistics(StatisticsRequest(table_name))
    assert refused.decision == REFUSE and "read-only" in refused.reason
    assert CatalogReader(config).metadata_location(table_name) == location
    assert stats_files_on_disk(config, table_name) == []
    with pytest.raises(StatisticsError):
        StatisticsRequest(table_name, columns=("",))


def test_orphan_removal_keeps_the_statistics_file_and_expiry_drops_an_expired_snapshots(spark, stats_config,
                                                                                       table_name):
    from icemaint.operations.expiry import ExpiryRequest
    from icemaint.operations.orphans import OrphanRequest

    config = stats_config(statistics_stale_fraction=0.01)
    writer = simulate(spark, config, table_name, batches=2)
    keeper = housekeeper(config, spark)
    first = keeper.compute_statistics(StatisticsRequest(table_name)).evidence["statistics_file"]
    orphans = keeper.remove_orphans(OrphanRequest(table_name, older_than_seconds=0, force=True))
    assert orphans.decision in (RUN, NOOP) and first not in " ".join(orphans.evidence.get("candidates", []))
    assert local(first).exists()
    writer.run(1)
    second = keeper.compute_statistics(StatisticsRequest(table_name)).evidence["statistics_file"]
    expired = keeper.expire(ExpiryRequest(table_name, older_than_seconds=0, retain_last=1))
    assert expired.decision == RUN, expired.reason
    tbl = CatalogReader(config).load(table_name)
    assert [str(s.statistics_path) for s in tbl.metadata.statistics] == [second]
    assert local(second).exists() and not local(first).exists()
    ids = sorted(tbl.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist())
    assert ids == sorted(writer.ledger.expected_ids())


def test_the_cli_materializes_column_statistics_and_says_no_in_one_line(spark, tmp_path, lake_root, table_name,
                                                                       capsys, isolated_dagster_home):
    from dagster import AssetKey

    from conftest import run_cli, write_config
    from icemaint.app.runner import MaintenanceRunner
    from icemaint.config import load_config

    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    config = load_config(path)
    simulate(spark, config, table_name, batches=1)
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    base = ("--config", str(path), "statistics", table_name)

    for bad, code, words in [(("--columns", "event_id,,ts"), 2, "--columns"),
                             (("--columns", "nope"), 1, "no column 'nope'")]:
        got, out, err = run_cli(capsys, *base, *bad)
        assert got == code and words in err and "Traceback" not in out + err, (out, err)
        assert len(err.strip().splitlines()) <= 2, err
    got, out, err = run_cli(capsys, *base, "--dry-run")
    assert got == 0 and "dry-run: would compute statistics of" in out, (out, err)
    assert reader.metadata_location(table_name) == location and stats_files_on_disk(config, table_name) == []

    got, out, err = run_cli(capsys, *base, "--json")
    assert got == 0, (out, err)
    result = json.loads(out)
    assert result["decision"] == "run" and result["success"] is True
    tbl = reader.load(table_name)
    assert [str(s.statistics_path) for s in tbl.metadata.statistics] == [result["evidence"]["statistics_file"]]
    instance = MaintenanceRunner(config, str(path)).instance
    event = instance.get_latest_materialization_event(AssetKey("column_statistics"))
    assert event is not None and event.dagster_event.partition == table_name
    assert event.asset_materialization.metadata["columns"].value == len(result["evidence"]["columns"])


def test_the_retention_sensor_requests_statistics_of_a_stale_table_once(spark, tmp_path, lake_root, table_name,
                                                                       isolated_dagster_home):
    from conftest import write_config
    from icemaint.app.runner import MaintenanceRunner
    from icemaint.config import load_config
    from test_retention_dagster import retention_sensor_of

    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        defaults={"statistics": True, "statistics_stale_fraction": 0.5})
    config = load_config(path)
    runner = MaintenanceRunner(config, str(path))
    writer = simulate(spark, config, table_name, batches=2)
    key = runner.check_table(table_name)
    evaluate = retention_sensor_of(runner, path)

    def tick(cursor):
        result = evaluate(cursor)
        return result, {r.job_name: r for r in result.run_requests if r.partition_key == key}

    first, requests = tick(None)
    head = CatalogReader(config).load(key).current_snapshot().snapshot_id
    assert requests["statistics_job"].run_key == f"statistics:{key}:{head}"
    assert runner.statistics(key, trigger="sensor").outcome["decision"] == "run"  # as the daemon would launch it
    second, requests = tick(first.cursor)
    assert "statistics_job" not in requests
    writer.run(1)  # 20 rows on 40: half of what the statistics saw
    third, requests = tick(second.cursor)
    head = CatalogReader(config).load(key).current_snapshot().snapshot_id
    assert requests["statistics_job"].run_key == f"statistics:{key}:{head}"
