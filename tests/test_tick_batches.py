"""The tick's due dates of one table run as one Dagster run over their partition range (issue 20, item 2):
one run record and Spark session for the batch, each date still its own claim, proof, audit record and
materialization. Also the pure batching rule (`date_batches`)."""

from __future__ import annotations

import json
import uuid

import pytest

from conftest import run_cli, streaming_table, write_config
from icemaint.config import load_config
from icemaint.domain.tick import date_batches, table_lanes
from icemaint.observe.catalog import CatalogReader
from icemaint.safety.audit import open_audit


def test_consecutive_dates_of_a_table_batch_in_rank_order():
    runs = [("a", "2026-01-03"), ("b", "2026-01-01"), ("a", "2026-01-01"), ("a", "2026-01-02"), ("c", None),
            ("a", "2026-01-05"), ("a", "2026-01-02")]
    assert date_batches(runs, 31) == [
        [("a", "2026-01-01"), ("a", "2026-01-02"), ("a", "2026-01-03")],  # best rank: 2026-01-03's
        [("b", "2026-01-01")], [("c", None)], [("a", "2026-01-05")]]      # a gap starts a new batch
    assert date_batches(runs, 2) == [[("a", "2026-01-03")], [("b", "2026-01-01")],
                                     [("a", "2026-01-01"), ("a", "2026-01-02")], [("c", None)], [("a", "2026-01-05")]]
    assert date_batches([], 3) == []
    # the year's turn and a month's end are consecutive days (batches in the order of their best rank)
    assert date_batches([("t", "2026-12-31"), ("t", "2027-01-01"), ("t", "2026-02-28"), ("t", "2026-03-01")], 5) == [
        [("t", "2026-12-31"), ("t", "2027-01-01")], [("t", "2026-02-28"), ("t", "2026-03-01")]]


def test_a_tables_batches_share_one_lane_so_lanes_can_run_at_once():
    batches = date_batches([("a", "2026-01-03"), ("b", "2026-01-01"), ("a", "2026-01-01"), ("c", None),
                            ("a", "2026-01-05")], 31)
    # a's dates are not consecutive: three batches, one lane, in the tick's rank order; lanes by first batch
    assert table_lanes(batches) == [
        [[("a", "2026-01-03")], [("a", "2026-01-01")], [("a", "2026-01-05")]],
        [[("b", "2026-01-01")]],
        [[("c", None)]]]
    assert table_lanes([]) == []


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "3"])
def test_a_batch_limit_below_one_or_not_an_int_is_refused(limit):
    with pytest.raises(ValueError, match="limit must be an int of at least 1"):
        date_batches([("a", "2026-01-01")], limit)


@pytest.mark.usefixtures("isolated_dagster_home")
def test_a_tick_compacts_a_tables_due_dates_in_one_run(capsys, spark, lake_root, tmp_path):
    writer = streaming_table(spark, "lake", f"batch_{uuid.uuid4().hex[:8]}.events", batches=4, rows_per_day=8,
                             delete_every=0)
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [writer.name.key]})
    config = load_config(path)
    location = CatalogReader(config).metadata_location(writer.name.key)

    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--json")

    assert code == 0, err
    runs = [d for d in json.loads(out)["decisions"] if d.get("run_id")]
    assert sorted(d["date"] for d in runs) == ["2026-01-01", "2026-01-02", "2026-01-03"], runs
    assert len({d["run_id"] for d in runs}) == 1  # one Dagster run for the three dates
    assert all(d["success"] and d["result"] == "run" and d["published"] and d["validation"] for d in runs), runs
    # each date its own materialization (in that one run) and audit record
    from icemaint.app.instance import get_instance
    import dagster as dg

    instance = get_instance(config)
    for d in runs:
        records = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("compaction"), asset_partitions=[f"{d['date']}|{writer.name.key}"]), limit=1).records
        assert records and records[0].run_id == d["run_id"]
    # each date's proofs count on that date in the checks' partition view (Dagster's check state), not missing
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionResolvedStatus as Status
    from maint_assets.partitions import table_date_partitions

    for name in ("row_count_parity", "sample_comparison", "column_aggregates"):
        check_key = dg.AssetCheckKey(dg.AssetKey("compaction"), name)
        with dg.partition_loading_context(dynamic_partitions_store=instance):
            state = instance.event_log_storage.get_asset_check_state(
                [(check_key, table_date_partitions(config.dates_start))])[check_key]
            passed = sorted(str(k) for k in state.subsets[Status.SUCCEEDED].value.get_partition_keys())
        assert passed == sorted(f"{d['date']}|{writer.name.key}" for d in runs), (name, state)
    audit = open_audit(config).records(table=writer.name.key, operation="compact")
    assert sorted(r.date for r in audit if r.decision == "run") == ["2026-01-01", "2026-01-02", "2026-01-03"]
    reader = CatalogReader(config)
    assert reader.metadata_location(writer.name.key) != location
    assert [p.data_files for p in reader.health(writer.name.key).partitions] == [1, 1, 1]
    ids = reader.load(writer.name.key).scan().to_arrow().column("event_id").to_pylist()
    assert sorted(ids) == sorted(writer.ledger.expected_ids())


@pytest.mark.parametrize("outcome, done", [
    ({"decision": "run", "validation": {"passed": True}}, True),
    ({"decision": "noop", "validation": {"passed": None}}, True),
    ({"decision": "defer", "validation": {"passed": None}}, True),   # the tick tries it again later
    ({"decision": "not_published", "validation": {"passed": False}}, False),
    ({"decision": "run", "validation": {"passed": False}}, False),
    ({"decision": "refuse"}, False),
    ({"decision": "failed"}, False),
    ({}, False),                                                     # no outcome: never counted as done
])
def test_a_batched_date_is_done_only_by_its_own_outcome(outcome, done):
    from icemaint.app.ticker import date_done

    assert date_done(outcome) is done
