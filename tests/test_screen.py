"""The tick's screen: a table whose manifest list shows that no date can be due is not read further.

Pure checks of the bound, then real tables written by pyiceberg into a SQLite SQL catalog (no Spark):
the screen must agree with the full health of the same table, and an hourly table's files of one day
must be counted on that one day (a wrong unit would screen a due table out).
"""

from __future__ import annotations

import datetime as dt

import pytest

from icemaint.config import parse_config
from icemaint.domain.decisions import Gates, decide_table_compactions
from icemaint.domain.verdicts import NOOP, REFUSE, RUN
from icemaint.domain.screen import ManifestSummary, Screened, most_files_on_one_date, screen_compaction
from icemaint.domain.tick import plan_compaction_tick
from icemaint.observe.catalog import CatalogReader

D = dt.date(2024, 3, 1)


def data(files, first, last=None):
    return ManifestSummary(deletes=False, live_files=files, first_date=first, last_date=last or first)


def test_the_bound_adds_up_manifests_whose_date_ranges_overlap():
    week = [data(7, D, D + dt.timedelta(days=6)) for _ in range(3)]
    assert most_files_on_one_date(week) == 21
    apart = [data(2, D), data(2, D + dt.timedelta(days=1)), data(2, D + dt.timedelta(days=2))]
    assert most_files_on_one_date(apart) == 2
    # a range ending the day before another starts does not overlap it
    assert most_files_on_one_date([data(3, D, D + dt.timedelta(days=1)), data(3, D + dt.timedelta(days=2))]) == 3
    assert most_files_on_one_date([data(3, D, D + dt.timedelta(days=2)), data(3, D + dt.timedelta(days=2))]) == 6
    assert most_files_on_one_date([data(3, None)]) is None
    assert most_files_on_one_date([ManifestSummary(False, None, D, D)]) is None


def test_screen_only_when_no_threshold_can_pass():
    apart = [data(2, D + dt.timedelta(days=i)) for i in range(5)]
    assert "at most 2 data files on any date < min_input_files 3" in screen_compaction(apart, 3, dated=True)
    assert screen_compaction(apart, 2, dated=True) is None
    assert screen_compaction(apart, 3, dated=False) is None  # per partition of a layout: not bounded by date
    assert "4 data files in the whole table < min_input_files 5" in screen_compaction(apart[:2], 5, dated=False)
    deletes = ManifestSummary(deletes=True, live_files=1)
    assert screen_compaction([*apart, deletes], 3, dated=True) is None
    # a delete manifest whose files are all gone does not count
    assert screen_compaction([*apart, ManifestSummary(True, 0)], 3, dated=True) is not None
    assert screen_compaction([*apart, ManifestSummary(False, None, D, D)], 3, dated=True) is None
    assert "0 data files" in screen_compaction([], 3, dated=True)


# -- real tables (pyiceberg, SQLite SQL catalog) ------------------------------------------------------

@pytest.fixture
def lake(tmp_path, monkeypatch):
    from pyiceberg.catalog.sql import SqlCatalog

    monkeypatch.setenv("ICEMAINT_IDENTITY", "maint-bot")
    wh = tmp_path / "wh"
    wh.mkdir()
    catalog = SqlCatalog("lake", uri=f"sqlite:///{wh}/catalog.db", warehouse=f"file://{wh}")
    catalog.create_namespace("t")
    config = parse_config({
        "catalog": {"name": "lake", "type": "jdbc", "uri": f"jdbc:sqlite:{wh}/catalog.db", "warehouse": str(wh)},
        "state_dir": str(tmp_path / "state"),
        "defaults": {"min_input_files": 3, "writer_idle": "0s", "hot_partition_age": "0s",
                     "small_file_size_bytes": "1MiB"},
        "tables": {"t.locked": {"enabled": False}},
    }, tmp_path)
    return catalog, config


def make_table(catalog, name, transform):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform, HourTransform
    from pyiceberg.types import LongType, NestedField, TimestampType

    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "ts", TimestampType()))
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, name="ts_p",
                                        transform={"day": DayTransform(), "hour": HourTransform()}[transform]))
    return catalog.create_table(name, schema=schema, partition_spec=spec)


def append(tbl, times):
    """One commit: one row per time (pyiceberg writes one file per partition it touches)."""
    import pyarrow as pa

    ids = list(range(len(times)))
    tbl.append(pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array(times, pa.timestamp("us"))}))


def daily_commits(tbl, days=7, per_day=1):
    """A daily writer: each commit adds one file on one date (a manifest per commit, spanning one date)."""
    for d in range(days):
        for h in range(per_day):
            append(tbl, [dt.datetime(2024, 3, 1 + d, h + 1)])


def full_verdicts(reader, config, table):
    health = reader.health(table)
    gates = Gates(now=dt.datetime.now(dt.timezone.utc), identity="maint-bot")
    return {d.date: d.verdict for d in decide_table_compactions(health, config.policy(table), gates)}, health


def test_a_daily_writers_week_is_screened_and_agrees_with_its_full_health(lake):
    catalog, config = lake
    tbl = make_table(catalog, "t.week", "day")
    daily_commits(tbl, per_day=2)
    reader = CatalogReader(config)
    screened = reader.tick_health("t.week")
    assert isinstance(screened, Screened)
    assert "at most 2 data files on any date < min_input_files 3" in screened.reason
    assert screened.metadata_location == reader.metadata_location("t.week")
    verdicts, health = full_verdicts(reader, config, "t.week")
    assert set(verdicts.values()) == {NOOP} and len(verdicts) == 7  # what reading every manifest decides
    assert max(p.data_files for p in health.partitions) == 2 and health.data_files == 14

    append(tbl, [dt.datetime(2024, 3, 3, 5)])  # a third file on 2024-03-03: that date is due now
    observed = reader.tick_health("t.week")
    assert not isinstance(observed, Screened)
    assert {p.date: p.data_files for p in observed.partitions} == {p.date: p.data_files
                                                                   for p in reader.health("t.week").partitions}
    assert full_verdicts(reader, config, "t.week")[0]["2024-03-03"] == RUN


def test_an_hourly_tables_files_of_one_day_are_counted_on_that_day(lake):
    catalog, config = lake
    tbl = make_table(catalog, "t.hourly", "hour")
    for hour in (1, 2, 3):  # three commits, three hour partitions, one date
        append(tbl, [dt.datetime(2024, 3, 1, hour)])
    reader = CatalogReader(config)
    observed = reader.tick_health("t.hourly")
    assert not isinstance(observed, Screened)  # hours read as days would put each file on its own date
    assert full_verdicts(reader, config, "t.hourly")[0] == {"2024-03-01": RUN}


def test_the_tick_decides_a_screened_table_from_its_manifest_list_and_a_refusal_still_shows(lake):
    catalog, config = lake
    for name in ("t.small", "t.locked"):
        daily_commits(make_table(catalog, name, "day"))
    due = make_table(catalog, "t.due", "day")
    for _ in range(3):
        append(due, [dt.datetime(2024, 3, 2, 4)])
    reader = CatalogReader(config)
    plan = plan_compaction_tick(
        config, ["t.small", "t.locked", "t.due"], metadata_location=reader.metadata_location,
        health=reader.tick_health, claim_holder=lambda t: None, approved=lambda t, d: False,
        past_runs=lambda t: [], cursor={}, now=dt.datetime.now(dt.timezone.utc), read=reader.read_many)
    assert plan.evaluated == ["t.small", "t.locked", "t.due"] and plan.screened == ["t.small", "t.locked"]
    by_table = {d.table: d for d in plan.decisions}
    assert by_table["t.small"].verdict == NOOP
    assert "at most 1 data files on any date" in by_table["t.small"].reason
    assert by_table["t.locked"].verdict == REFUSE and "enabled: false" in by_table["t.locked"].reason
    assert [d.table for d, _ in plan.runs] == ["t.due"]
    assert "(2 from their manifest list alone)" in plan.summary()
    # the screened tables keep a cursor entry: unchanged, they cost one location read next tick
    again = plan_compaction_tick(
        config, ["t.small", "t.locked", "t.due"], metadata_location=reader.metadata_location,
        health=reader.tick_health, claim_holder=lambda t: None, approved=lambda t, d: False,
        past_runs=lambda t: [], cursor=plan.cursor, now=dt.datetime.now(dt.timezone.utc), read=reader.read_many)
    assert again.unchanged == ["t.small", "t.locked", "t.due"]
