"""Layout drift rewritten end to end (real Spark, real Iceberg, pyiceberg as the independent reader): three tables that
evolved (days -> hours, an added sort order, oversized backfill files) are found by the default tick's plan, rewritten
by the run it requests into the table's current layout while a claimless writer appends, and prune better after."""

from __future__ import annotations

import datetime as dt

import pyarrow.compute as pc
import pytest

from conftest import make_config
from icemaint.domain.names import TableName
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims
from staged_faults import main_lineage

pytestmark = pytest.mark.slow

DATE, OTHER = "2026-01-02", "2026-01-03"
HOURS, SORTED, BACKFILL, HOURS_TO_DAYS = "t.drift_hours", "t.drift_sorted", "t.drift_backfill", "t.drift_days"
# small sizes, so that "oversized" is a few MiB and a sorted date writes several files
POLICIES = {
    HOURS: {"drift_min_bytes": "1KiB", "drift_min_files": 1, "small_file_size_bytes": "16KiB"},
    HOURS_TO_DAYS: {"drift_min_bytes": "1KiB", "drift_min_files": 1, "small_file_size_bytes": "1KiB"},
    SORTED: {"drift_min_bytes": "1KiB", "drift_min_files": 1, "small_file_size_bytes": "16KiB",
             "target_file_size_bytes": "160KiB"},
    BACKFILL: {"drift_min_bytes": "1KiB", "drift_min_files": 1, "small_file_size_bytes": "64KiB",
               "target_file_size_bytes": "1MiB"},
}
PAYLOAD = "concat(" + ", ".join(["md5(CAST(rand() AS STRING))"] * 6) + ")"  # ~190 bytes of hex a row


@pytest.fixture(scope="module")
def drift_config(lake_root, tmp_path_factory):
    return make_config(lake_root, state_dir=str(tmp_path_factory.mktemp("drift-state")), tables=POLICIES)


def sql(config, table: str) -> str:
    return TableName.parse(table).sql(config.catalog.name)


def insert_day(spark, target: str, day: str, rows: int, first_id: int, stride: int = 1) -> None:
    """One file of `rows` rows spread over the day's 24 hours, ids `first_id` + k x `stride`, in random order."""
    spark.range(first_id, first_id + rows * stride, stride).selectExpr(
        "id", f"TIMESTAMP '{day} 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, (id * 7919 % 86400)) AS ts",
        f"{PAYLOAD} AS v").orderBy("v").coalesce(1).writeTo(target).append()


@pytest.fixture(scope="module")
def tables(spark, drift_config):
    hours, ordered, backfill = (sql(drift_config, t) for t in (HOURS, SORTED, BACKFILL))
    for target in (hours, ordered, backfill):
        spark.sql(f"CREATE TABLE {target} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (days(ts))")
    # days -> hours: two day files of the date, one of the next, then a small file in the new spec
    insert_day(spark, hours, DATE, 400, 0)
    insert_day(spark, hours, DATE, 400, 400)
    insert_day(spark, hours, OTHER, 200, 800)
    spark.sql(f"ALTER TABLE {hours} REPLACE PARTITION FIELD days(ts) WITH hours(ts)")
    spark.sql(f"INSERT INTO {hours} VALUES (5000, TIMESTAMP '{DATE} 10:00:00', 'new spec')")
    # an added sort order: three unsorted files of ~200 KiB (above small_file_size), each with ids over the whole range
    for i in range(3):
        insert_day(spark, ordered, DATE, 1000, i, stride=3)
    spark.sql(f"ALTER TABLE {ordered} WRITE ORDERED BY id")
    # a backfill: two files of ~3 MiB, each over the whole date, above 1.8 x a 1 MiB target
    insert_day(spark, backfill, DATE, 28000, 0)
    insert_day(spark, backfill, DATE, 28000, 28000)
    return {HOURS: hours, SORTED: ordered, BACKFILL: backfill}


def tick_runs(config, table: str) -> list:
    """The compaction runs the default tick would request for `table` (its sensor's plan, no cursor)."""
    from icemaint.app.explain import compaction_plan

    return [d for d, _ in compaction_plan(config, [table]).runs]


def files_scanned(config, table: str, row_filter: str) -> int:
    """Data files a filtered scan opens, as pyiceberg plans it (partition and column-bound pruning)."""
    return len(list(CatalogReader(config).load(table).scan(row_filter=row_filter).plan_files()))


def rows(config, table: str):
    return CatalogReader(config).load(table).scan().to_arrow().sort_by("id")


def rewrite_with_a_writer(spark, config, table: str, target: str, writer_id: int):
    """Runs each compaction the tick requests for `table`, a claimless writer appending one row of DATE between the
    staging and the publish of the first; returns the decisions and outcomes."""
    writes: list[int] = []

    def writer_appends(staged):
        if not writes:
            spark.sql(f"INSERT INTO {target} VALUES ({writer_id}, TIMESTAMP '{DATE} 05:30:00', 'writer')")
            writes.append(CatalogReader(config).load(table).current_snapshot().snapshot_id)

    decisions = tick_runs(config, table)
    compactor = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config),
                          after_stage=writer_appends)
    outcomes = [compactor.run(CompactionRequest(table, d.date, trigger="sensor")) for d in decisions]
    return decisions, outcomes, writes


def assert_rewritten_safely(spark, config, table: str, target: str, before, writer_id: int, result,
                            writer_drifts: int = 0) -> None:
    decisions, outcomes, writes = result
    assert decisions and all(d.kind == "layout_drift" for d in decisions), [d.reason for d in decisions]
    assert all(o.decision == "run" and o.published for o in outcomes), [o.reason for o in outcomes]
    # every row as pyiceberg reads it, the writer's row besides
    after = rows(config, table)
    assert after.filter(pc.not_equal(after["id"], writer_id)).equals(before)
    assert after.filter(pc.equal(after["id"], writer_id)).num_rows == 1
    # main only moved forward: the writer's append is in the lineage below the publish
    lineage = [s["snapshot_id"] for s in main_lineage(spark, target)]
    assert writes and writes[0] in lineage and lineage.index(writes[0]) > 0
    # nothing drifted is left but the writer's own file (Spark records no sort order on it); the next tick requests
    # no layout rewrite (a date of tiny hour files may still be due for its small files)
    health = CatalogReader(config).health(table)
    assert health.drift_files == writer_drifts, health.to_dict()
    assert not [d for d in tick_runs(config, table) if d.kind == "layout_drift"]


def test_days_to_hours_is_rewritten_into_hours_and_prunes(spark, drift_config, tables):
    config, target = drift_config, tables[HOURS]
    hour = f"ts >= '{DATE}T05:00:00+00:00' and ts < '{DATE}T06:00:00+00:00'"
    before, scanned_before = rows(config, HOURS), files_scanned(config, HOURS, hour)
    reasons = {d.date: d.reason for d in tick_runs(config, HOURS)}
    assert "in 2 files under spec 0 (day(ts)), table spec 1 (hour(ts))" in reasons[DATE], reasons

    from icemaint.app.explain import explain

    assert "under spec 0 (day(ts)), table spec 1 (hour(ts))" in str(explain(config, HOURS, DATE).compaction)
    result = rewrite_with_a_writer(spark, config, HOURS, target, 90001)
    assert sorted(d.date for d in result[0]) == [DATE, OTHER]
    assert_rewritten_safely(spark, config, HOURS, target, before, 90001, result)
    specs = {r["spec_id"] for r in spark.sql(f"SELECT spec_id FROM {target}.files").collect()}
    assert specs == {1}
    # 24 hour files (and the writer's) instead of two day files: an hour's query opens one
    assert scanned_before == 2 and files_scanned(config, HOURS, hour) < scanned_before


def test_an_added_sort_order_is_rewritten_sorted_and_prunes(spark, drift_config, tables):
    config, target = drift_config, tables[SORTED]
    one_id = "id = 1234"
    before, scanned_before = rows(config, SORTED), files_scanned(config, SORTED, one_id)
    result = rewrite_with_a_writer(spark, config, SORTED, target, 90002)
    assert_rewritten_safely(spark, config, SORTED, target, before, 90002, result, writer_drifts=1)
    files = CatalogReader(config).load(SORTED).inspect.files().to_pylist()
    rewritten = [f for f in files if f["record_count"] > 1]  # the writer's one-row file aside
    assert len(rewritten) >= 3 and {f["sort_order_id"] for f in rewritten} == {1}
    # sorted in fact, not only as recorded: each file's ids ascend, and the files' id ranges do not overlap
    import pyarrow.parquet as pq

    from staged_faults import local_path

    ranges = []
    for f in rewritten:
        ids = pq.read_table(local_path(f["file_path"]), columns=["id"])["id"].to_pylist()
        assert ids == sorted(ids)
        ranges.append((ids[0], ids[-1]))
    ranges.sort()
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])), ranges
    assert scanned_before == 3 and files_scanned(config, SORTED, one_id) == 1
    # the rewrite's planner reads each file's recorded order: the rewritten files are in layout, the writer's is not
    from icemaint.engine.staging import StagingArea

    area = StagingArea(spark, config.catalog.name, TableName.parse(SORTED), "check")
    candidates, _ = area.plan_date_files(area.current_snapshot_id(), "ts", "timestamptz", dt.date(2026, 1, 2),
                                         dt.date(2026, 1, 3))
    assert sorted(c.sort_order_id for c in candidates) == [0] + [1] * len(rewritten)


def test_oversized_backfill_files_are_split_and_prune(spark, drift_config, tables):
    config, target = drift_config, tables[BACKFILL]
    policy = config.policy(BACKFILL)
    hour = f"ts >= '{DATE}T14:00:00+00:00' and ts < '{DATE}T14:20:00+00:00'"  # away from the writer's row
    health = CatalogReader(config).health(BACKFILL)
    assert health.partition(DATE).oversized_files == 2, health.to_dict()
    before, scanned_before = rows(config, BACKFILL), files_scanned(config, BACKFILL, hour)
    result = rewrite_with_a_writer(spark, config, BACKFILL, target, 90003)
    assert_rewritten_safely(spark, config, BACKFILL, target, before, 90003, result)
    sizes = [r[0] for r in spark.sql(f"SELECT file_size_in_bytes FROM {target}.files").collect()]
    assert len(sizes) >= 4 and max(sizes) <= policy.max_file_size_bytes, sizes
    assert scanned_before == 2 and files_scanned(config, BACKFILL, hour) < scanned_before


def test_hours_to_days_merges_a_dates_hour_files_into_its_day(spark, drift_config):
    """The other way: hour files of the old spec and a day file of the new one become the date's one day file."""
    config = drift_config
    target = sql(config, HOURS_TO_DAYS)
    spark.sql(f"CREATE TABLE {target} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (hours(ts))")
    for h in (1, 2):
        spark.sql(f"INSERT INTO {target} SELECT id, TIMESTAMP '{DATE} 0{h}:00:00' + make_interval(0, 0, 0, 0, 0, 0, "
                  f"id % 3600), 'x' FROM range({h * 1000}, {h * 1000 + 500})")
    spark.sql(f"ALTER TABLE {target} REPLACE PARTITION FIELD hours(ts) WITH days(ts)")
    spark.sql(f"INSERT INTO {target} VALUES (9, TIMESTAMP '{DATE} 20:00:00', 'new spec')")
    before = rows(config, HOURS_TO_DAYS)
    [decision] = tick_runs(config, HOURS_TO_DAYS)
    assert "in 2 files under spec 0 (hour(ts)), table spec 1 (day(ts))" in decision.reason, decision.reason
    outcome = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config)).run(
        CompactionRequest(HOURS_TO_DAYS, DATE, trigger="sensor"))
    assert outcome.published, outcome.reason
    assert rows(config, HOURS_TO_DAYS).equals(before)
    assert [(r["spec_id"], r["n"]) for r in spark.sql(
        f"SELECT spec_id, count(*) AS n FROM {target}.files GROUP BY spec_id").collect()] == [(1, 1)]
