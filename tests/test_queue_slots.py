"""One run per table in the queue, for runs over several tables too (issue 20: the daemon's catch-up batches).

A Dagster run tag holds one value, so `icemaint/table` cannot keep a run over tables a, b and c apart from a
run of b. Every maintenance run also carries one slot tag per table (key: the table's slot, a stable hash of
its name; value: the table), and the queue allows one run per value of each slot key: two runs that share a
table wait for each other, runs of different tables do not. The sensor's batches never hold two tables of
one slot. Judged by Dagster's own queue counter over runs submitted through the instance's coordinator.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import dagster as dg
import pytest

from conftest import make_config
from icemaint.app.instance import ensure_dagster_home
from icemaint.domain.decisions import Decision
from icemaint.domain.verdicts import RUN
from icemaint.domain.tick import table_batches
from maint_assets.partitions import (
    RANGE_END_TAG, RANGE_START_TAG, SLOT_TAG_PREFIX, TABLE_SLOTS, TABLE_TAG, TABLES_TAG, range_tables, slot_tag,
    slot_tags, table_slot, tables_of,
)


def tables_in_distinct_slots(count: int, prefix: str = "db.t", avoid: frozenset[int] = frozenset()) -> list[str]:
    out, used, i = [], set(avoid), 0
    while len(out) < count:
        name = f"{prefix}{i:03d}"
        if table_slot(name) not in used:
            used.add(table_slot(name))
            out.append(name)
        i += 1
    return out


def two_tables_in_one_slot(prefix: str = "db.s") -> tuple[str, str]:
    seen = {}
    for i in range(10 * TABLE_SLOTS):
        name = f"{prefix}{i:04d}"
        if table_slot(name) in seen:
            return seen[table_slot(name)], name
        seen[table_slot(name)] = name
    raise AssertionError("no two names share a slot")


# -- the slot tags --------------------------------------------------------------------------------------------

def test_a_tables_slot_is_the_same_in_every_process():
    """Slots must agree between the sensor, the daemon and the CLI: not Python's per-process string hash."""
    names = ["db.events", "sales.orders", "a.b"]
    code = ("from maint_assets.partitions import table_slot; "
            f"print([table_slot(n) for n in {names!r}])")
    seen = set()
    for seed in ("1", "2", "3"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
        seen.add(out)
    assert seen == {str([table_slot(n) for n in names])}
    assert all(0 <= table_slot(n) < TABLE_SLOTS for n in names)


def test_one_run_cannot_carry_two_tables_of_one_slot():
    a, b = two_tables_in_one_slot()
    with pytest.raises(ValueError, match=f"{a} and {b} share queue slot"):
        slot_tags([a, b])
    assert slot_tags([a, b], strict=False) == {slot_tag(table_slot(a)): a}  # a UI range: the first keeps it
    assert slot_tags([a, a]) == {slot_tag(table_slot(a)): a}


def test_the_tables_of_a_range_come_from_the_partitions_order():
    order = ["db.a", "db.b", "db.c", "db.d"]
    tags = {RANGE_START_TAG: "2026-01-01|db.b", RANGE_END_TAG: "2026-01-02|db.d"}
    assert range_tables(tags, order) == ("db.b", "db.c", "db.d")
    assert range_tables({RANGE_START_TAG: "2026-01-01|db.b", RANGE_END_TAG: "2026-01-03|db.b"}, order) == ("db.b",)
    assert range_tables({RANGE_START_TAG: "2026-01-01|db.c", RANGE_END_TAG: "2026-01-01|db.a"}, order) == ()
    assert range_tables({RANGE_START_TAG: "2026-01-01|db.x", RANGE_END_TAG: "2026-01-01|db.a"}, order) == ()
    assert range_tables({RANGE_START_TAG: "2026-01-01", RANGE_END_TAG: "2026-01-03"}, order) == ()
    # a backfill of a table-partitioned asset (expiry, statistics, health): a range of table keys
    assert range_tables({RANGE_START_TAG: "db.a", RANGE_END_TAG: "db.c"}, order) == ("db.a", "db.b", "db.c")
    assert range_tables({RANGE_START_TAG: "db.c", RANGE_END_TAG: "db.c"}, order) == ("db.c",)
    assert range_tables({RANGE_START_TAG: "db.a", RANGE_END_TAG: "2026-01-01|db.c"}, order) == ()
    assert range_tables({RANGE_START_TAG: "db.x", RANGE_END_TAG: "db.x"}, order) == ()


def test_batches_are_cut_where_a_table_shares_a_slot_with_one_already_in():
    a, b = two_tables_in_one_slot()
    x, y = tables_in_distinct_slots(2, prefix="db.n", avoid=frozenset({table_slot(a)}))
    order = [a, x, b, y]  # a and b: one slot
    batches = [[(t, "2026-01-01")] for t in order]
    assert table_batches(batches, order, 31) == [[(a, "2026-01-01"), (x, "2026-01-01"), (b, "2026-01-01"),
                                                  (y, "2026-01-01")]]
    cut = table_batches(batches, order, 31, slot=table_slot)
    assert [[t for t, _ in batch] for batch in cut] == [[a, x], [b, y]]


# -- the queue ------------------------------------------------------------------------------------------------

@pytest.fixture
def instance(tmp_path, lake_root, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config = make_config(lake_root, state_dir=str(tmp_path / "state"))
    with dg.DagsterInstance.from_config(str(ensure_dagster_home(config))) as inst:
        yield inst


def submitter(instance):
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.run_coordinator import SubmitRunContext
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.utils import make_new_run_id

    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="maint_assets.definitions"))

    def submitted(tags: dict, job_name: str = "compaction_job") -> dg.DagsterRun:
        origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)
        run = instance.add_run(dg.DagsterRun(job_name=job_name, run_id=make_new_run_id(), tags=tags,
                                             status=dg.DagsterRunStatus.NOT_STARTED, remote_job_origin=origin))
        return instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))

    return submitted


def test_a_run_over_several_tables_and_a_run_of_one_of_them_never_run_together(instance):
    """The sensor's batch (its own tags), a backfill of one of its tables and a UI range over two of them
    (Dagster's partition tags only), a run of another table: submitted through the real coordinator."""
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    from sensors.compaction import compaction_run_requests

    a, b, c, other = tables_in_distinct_slots(4)
    instance.add_dynamic_partitions("table", [a, b, c, other])
    runs = [(Decision(t, "compact", RUN, "due", date="2026-01-01"), SimpleNamespace(snapshot_id=1, schema_id=0))
            for t in (a, b, c)]
    (request,) = compaction_run_requests(runs, order=[a, b, c, other])
    submitted = submitter(instance)
    batch = submitted(dict(request.tags))
    backfill = submitted({"dagster/partition": f"2026-01-02|{b}", "dagster/partition/table": b})
    ui_range = submitted({RANGE_START_TAG: f"2026-01-03|{c}", RANGE_END_TAG: f"2026-01-03|{other}"})
    single = submitted({TABLE_TAG: other})
    assert tables_of(batch.tags) == (a, b, c) and TABLE_TAG not in batch.tags
    assert {k: v for k, v in batch.tags.items() if k.startswith(SLOT_TAG_PREFIX)} == slot_tags([a, b, c])
    assert backfill.tags[TABLE_TAG] == b and backfill.tags[slot_tag(table_slot(b))] == b
    # the UI's range over c and `other` names both tables and holds both slots
    assert tables_of(ui_range.tags) == (c, other) and ui_range.tags[TABLES_TAG] == f"{c},{other}"
    assert TABLE_TAG not in ui_range.tags
    assert {k: v for k, v in ui_range.tags.items() if k.startswith(SLOT_TAG_PREFIX)} == slot_tags([c, other])

    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    counter = TagConcurrencyLimitsCounter(limits, [batch])  # the batch is in progress
    assert counter.is_blocked(backfill), "a backfill of b ran beside the batch that holds b"
    assert counter.is_blocked(ui_range), "a range holding c ran beside the batch that holds c"
    assert not counter.is_blocked(single)
    counter = TagConcurrencyLimitsCounter(limits, [backfill])
    assert counter.is_blocked(batch) and not counter.is_blocked(ui_range)
    counter = TagConcurrencyLimitsCounter(limits, [single])
    assert counter.is_blocked(ui_range) and not counter.is_blocked(batch)

    # a backfill of a table-partitioned asset (expiry over b..other): its range of table keys names every table
    retention = submitted({RANGE_START_TAG: b, RANGE_END_TAG: other}, job_name="expiry_job")
    assert tables_of(retention.tags) == (b, c, other)
    counter = TagConcurrencyLimitsCounter(limits, [retention])
    assert counter.is_blocked(ui_range) and counter.is_blocked(single) and not counter.is_blocked(
        submitted({TABLE_TAG: a}))


def test_a_cli_batch_of_tables_that_share_a_slot_is_refused_before_any_run(spark, tmp_path, lake_root,
                                                                          monkeypatch):
    """A run the CLI executes in-process is never queued, but the daemon counts it among the runs in progress,
    so it carries the same slot tags: one run cannot hold two tables of one slot, and is refused before any
    run is made, the tables untouched."""
    import uuid

    from conftest import write_config
    from icemaint.app.runner import MaintenanceRunner
    from icemaint.config import load_config
    from icemaint.domain.names import TableName

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    a, b = two_tables_in_one_slot(f"q{uuid.uuid4().hex[:6]}.s")
    for table in (a, b):
        spark.sql(f"CREATE TABLE {TableName.parse(table).sql('lake')} (id BIGINT, ts TIMESTAMP) USING iceberg")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"))
    runner = MaintenanceRunner(load_config(path))
    before = [runner.reader.metadata_location(t) for t in (a, b)]
    runner.instance.add_dynamic_partitions("table", [a, b])
    with pytest.raises(ValueError, match="share queue slot"):
        runner.compact_tables([a, b], ["2026-01-01"])
    assert runner.instance.get_runs() == []
    assert [runner.reader.metadata_location(t) for t in (a, b)] == before
