"""The sensors on a real warehouse: discovery keeps the `table` partitions equal to the catalog, and the
compaction sensor requests runs, defers or refuses, records why, and costs O(1) on an unchanged table."""

from __future__ import annotations

import time
import uuid

import dagster as dg
import pytest

from conftest import write_config
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.app.simulator import StreamingWriter, WorkloadSpec
from icemaint.domain.tick import decode_cursor
from maint_assets.partitions import PLANNED_SNAPSHOT_TAG, tables_of
from maint_assets.definitions import build_definitions

DATES = ["2026-01-01", "2026-01-02", "2026-01-03"]


@pytest.fixture(scope="module")
def namespace() -> str:
    # Every config here admits only this namespace: the shared warehouse holds other tests' tables.
    return f"sens_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def hot(spark, namespace):
    """A table with 3 small files on each of 3 dates and an idle-by-default writer."""
    writer = StreamingWriter(spark, "lake", WorkloadSpec(table=f"{namespace}.hot", days=3, rows_per_day=8,
                                                          delete_every=0, seed=5))
    writer.create_table()
    writer.run(3)
    return writer


pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


class Location:
    """The code location built from one config file, and what a sensor tick needs from it."""

    def __init__(self, path):
        self.path = path
        self.config = load_config(path)
        self.defs = build_definitions(str(path))
        self.resources = dict(self.defs.resources)
        self.audit = open_audit(self.config)

    def tick(self, name: str, instance, cursor: str | None = None):
        sensor = self.defs.resolve_sensor_def(name)
        with dg.build_sensor_context(instance=instance, cursor=cursor, resources=self.resources) as context:
            return sensor(context)

    def window(self, name: str, instance):
        schedule = self.defs.resolve_schedule_def(name)
        with dg.build_schedule_context(instance=instance, resources=self.resources) as context:
            return schedule(context)


def location(tmp_path, lake_root, namespace, name="maintenance", **overrides) -> Location:
    path = write_config(tmp_path / f"{name}.yaml", lake_root, state_dir=str(tmp_path / f"{name}-state"),
                        scope={"include": [f"{namespace}.*"]}, **overrides)
    return Location(path)


def apply_partition_requests(result: dg.SensorResult, instance) -> None:
    """What the daemon does with a tick's dynamic partition requests."""
    for request in result.dynamic_partitions_requests or []:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)


def instance_with(*tables):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("table", list(tables))
    return instance


def skip_text(result) -> str:
    if isinstance(result, dg.SkipReason):
        return result.skip_message or ""
    return (result.skip_reason.skip_message if result.skip_reason else "") or ""


@pytest.fixture
def health_reads(monkeypatch):
    """Spy on metadata reads: which tables the sensor read beyond their metadata location (the real read
    still runs)."""
    calls = []
    real = CatalogReader.tick_health

    def counted(self, table, *args, **kwargs):
        calls.append(table)
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(CatalogReader, "tick_health", counted)
    return calls


def test_discovery_adds_new_tables_removes_dropped_ones_and_requests_health(spark, tmp_path, lake_root, namespace,
                                                                             hot):
    loc = location(tmp_path, lake_root, namespace)
    gone = f"{namespace}.gone"
    spark.sql(f"CREATE TABLE {TableName.parse(gone).sql('lake')} (id BIGINT) USING iceberg")
    instance = dg.DagsterInstance.ephemeral()

    first = loc.tick("table_discovery", instance)
    assert isinstance(first, dg.SensorResult)
    adds = [r for r in first.dynamic_partitions_requests if isinstance(r, dg.AddDynamicPartitionsRequest)]
    assert [(r.partitions_def_name, sorted(r.partition_keys)) for r in adds] == [("table", sorted([hot.name.key, gone]))]
    assert not [r for r in first.dynamic_partitions_requests if isinstance(r, dg.DeleteDynamicPartitionsRequest)]
    # one health run over the new tables' range, in the order they are added
    new = sorted([hot.name.key, gone])
    assert adds[0].partition_keys == new
    [health] = first.run_requests
    assert health.partition_key_range == dg.PartitionKeyRange(new[0], new[-1])
    assert tables_of(health.tags) == tuple(new) and health.run_key == f"discovered:{new[0]}..{new[-1]}:2"
    apply_partition_requests(first, instance)
    assert sorted(instance.get_dynamic_partitions("table")) == sorted([hot.name.key, gone])
    # the run as the daemon would launch it: each table its own materialization, with its own numbers
    health_job = loc.defs.resolve_job_def("health_job")
    result = health_job.execute_in_process(instance=instance, tags=dict(health.tags))
    assert result.success
    read = {m.partition: m.metadata["data_files"].value for m in result.asset_materializations_for_node("table_health")}
    expected = len(CatalogReader(loc.config).load(hot.name.key).inspect.files())  # pyiceberg, no Dagster
    assert read == {hot.name.key: expected, gone: 0} and expected > 0

    quiet = loc.tick("table_discovery", instance)
    assert isinstance(quiet, dg.SkipReason) and "no change" in quiet.skip_message

    spark.sql(f"DROP TABLE {TableName.parse(gone).sql('lake')} PURGE")
    second = loc.tick("table_discovery", instance)
    deletes = [r for r in second.dynamic_partitions_requests if isinstance(r, dg.DeleteDynamicPartitionsRequest)]
    assert [(r.partitions_def_name, list(r.partition_keys)) for r in deletes] == [("table", [gone])]
    assert not [r for r in second.dynamic_partitions_requests if isinstance(r, dg.AddDynamicPartitionsRequest)]
    assert not second.run_requests  # nothing to observe on a dropped table
    # a table the batch cannot read fails the run, naming it; the others are still materialized
    failed = health_job.execute_in_process(instance=instance, tags=dict(health.tags), raise_on_error=False)
    assert not failed.success
    assert [m.partition for m in failed.asset_materializations_for_node("table_health")] == [hot.name.key]
    [failure] = [e for e in failed.all_events if e.is_step_failure]
    assert f"1 of 2 tables not read: {gone}:" in failure.event_specific_data.user_failure_data.description
    apply_partition_requests(second, instance)
    assert instance.get_dynamic_partitions("table") == [hot.name.key]


def test_idle_writer_gets_one_deterministic_run_per_due_date_and_an_unchanged_table_costs_o1(
        tmp_path, lake_root, namespace, hot, health_reads):
    loc = location(tmp_path, lake_root, namespace)
    table = hot.name.key
    snapshot = CatalogReader(loc.config).load(table).current_snapshot().snapshot_id
    instance = instance_with(table)

    result = loc.tick("compaction_sensor", instance)
    assert isinstance(result, dg.SensorResult)
    # the table's three consecutive due dates: one run over their partition range (each date decided,
    # proven, audited and materialized on its own inside it)
    [request] = result.run_requests
    requests = [request]
    assert request.partition_key is None and request.job_name == "compaction_job"
    assert request.partition_key_range == dg.PartitionKeyRange(f"{DATES[0]}|{table}", f"{DATES[-1]}|{table}")
    assert request.run_key == f"compact:{table}:{DATES[0]}..{DATES[-1]}:{snapshot}"
    assert request.tags["icemaint/table"] == table and request.tags["icemaint/trigger"] == "sensor"
    assert health_reads == [table]
    assert not [r for r in loc.audit.records(table=table) if r.decision in ("defer", "refuse")]
    cursor = decode_cursor(result.cursor)
    assert cursor[table].metadata_location == CatalogReader(loc.config).metadata_location(table)

    # the same table state plans the same runs: a run_key dedupes a repeated request
    again = loc.tick("compaction_sensor", instance_with(table))
    assert sorted(r.run_key for r in again.run_requests) == [r.run_key for r in requests]

    # unchanged since the cursor: nothing requested and no health read, only the metadata location
    health_reads.clear()
    unchanged = loc.tick("compaction_sensor", instance, cursor=result.cursor)
    assert not unchanged.run_requests
    assert health_reads == []
    assert "1 unchanged" in skip_text(unchanged)
    assert unchanged.cursor == result.cursor

    # a writer commit moves the metadata: the cursor advances and the plan is on the new snapshot
    hot.write_batch()
    moved = loc.tick("compaction_sensor", instance, cursor=result.cursor)
    new_snapshot = CatalogReader(loc.config).load(table).current_snapshot().snapshot_id
    assert health_reads == [table]
    assert [r.run_key for r in moved.run_requests] == [f"compact:{table}:{DATES[0]}..{DATES[-1]}:{new_snapshot}"]
    assert decode_cursor(moved.cursor)[table].metadata_location != cursor[table].metadata_location


def test_active_writer_defers_with_a_reason_and_an_audit_record(tmp_path, lake_root, namespace, hot):
    table = hot.name.key
    loc = location(tmp_path, lake_root, namespace, tables={table: {"writer_idle": "1h"}})
    result = loc.tick("compaction_sensor", instance_with(table))
    assert not result.run_requests
    text = skip_text(result)
    assert "writer active" in text and "3 deferred" in text
    defers = [r for r in loc.audit.records(table=table, operation="compact") if r.decision == "defer"]
    assert sorted(r.date for r in defers) == DATES
    for record in defers:
        assert record.reason.startswith("writer active"), record.reason
        assert record.trigger == "sensor" and record.writer_check["idle"] is False
        assert record.writer_check["writer_idle_seconds"] == 3600
    # a recheck is scheduled for when the idle window ends, not before
    recheck = decode_cursor(result.cursor)[table].recheck_at
    assert recheck is not None and time.time() + 3000 < recheck <= time.time() + 3600
    # each deferral is also on its own compaction partition, with the numbers behind it
    observed = {e.partition: e.metadata for e in result.asset_events}
    assert sorted(observed) == sorted(f"{d}|{table}" for d in DATES)
    for meta in observed.values():
        assert meta["decision"].value == "defer" and meta["reason_kind"].value == "writer_active"
        assert meta["reason"].value.startswith("writer active") and meta["seconds_since_writer_commit"].value >= 0
    # ...once per change, like the audit: an unchanged deferral is not observed again
    again = loc.tick("compaction_sensor", instance_with(table), cursor=result.cursor)
    assert not again.asset_events


def test_claim_held_by_a_writer_defers_naming_the_holder(tmp_path, lake_root, namespace, hot):
    table = hot.name.key
    loc = location(tmp_path, lake_root, namespace)
    with open_claims(loc.config).acquire(table, holder="ingest-job"):
        result = loc.tick("compaction_sensor", instance_with(table))
    assert not result.run_requests
    assert "claim busy: held by ingest-job" in skip_text(result)
    defers = [r for r in loc.audit.records(table=table, operation="compact") if r.decision == "defer"]
    assert sorted(r.date for r in defers) == DATES
    assert all("ingest-job" in r.reason for r in defers)
    # once the claim is free the same (unchanged) table is rechecked later, then runs
    assert decode_cursor(result.cursor)[table].recheck_at is not None


def test_a_run_in_flight_on_the_table_is_waited_for_not_recorded_as_a_busy_claim(tmp_path, lake_root, namespace,
                                                                                  hot):
    """The sensor's own compaction run holds the table's claim while it runs: the next tick waits for it (no
    second request, even at a new snapshot) and does not write 'claim busy' into the audit trail."""
    table = hot.name.key
    loc = location(tmp_path, lake_root, namespace)
    instance = instance_with(table)
    job = loc.defs.resolve_job_def("compaction_job")
    run = instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED, tags={"icemaint/table": table})
    with open_claims(loc.config).acquire(table, holder=f"run {run.run_id}"):
        result = loc.tick("compaction_sensor", instance)
    assert not result.run_requests
    assert "waiting for runs in flight on the table: compaction_job" in skip_text(result)
    assert not [r for r in loc.audit.records(table=table, operation="compact") if r.decision == "defer"]
    assert not result.asset_events
    assert decode_cursor(result.cursor)[table].recheck_at is not None

    instance.report_run_canceled(run)  # the run ended (here: cancelled) and the claim is free again
    after = loc.tick("compaction_sensor", instance)  # (with the cursor: rechecked a minute later)
    [request] = after.run_requests
    assert request.tags["icemaint/table"] == table


def test_a_sensor_run_that_deferred_at_run_time_is_requested_again_and_a_failed_proof_is_held(
        tmp_path, lake_root, namespace, hot):
    """The sensor's run can defer at run time (a writer took the claim after the tick) and end without moving the
    table's metadata. The sensor decides the table again a minute later and requests it under a new run key
    (Dagster skips a key it has launched). Before, the cursor held the table as unchanged and the key was the
    same, so the dates stayed uncompacted until the writer's next commit. A failed proof is not retried by
    automation: its date is held, saying so, until an operator approves it."""
    from icemaint.app.runner import MaintenanceRunner
    from icemaint.domain.tick import encode_cursor
    from icemaint.safety.approvals import approve
    from icemaint.safety.audit import AuditRecord

    table = hot.name.key
    loc = location(tmp_path, lake_root, namespace)
    instance = instance_with(table)
    first = loc.tick("compaction_sensor", instance)
    [request] = first.run_requests
    head = CatalogReader(loc.config).metadata_location(table)

    with open_claims(loc.config).acquire(table, holder="ingest-job"):  # what the launched run meets
        report = MaintenanceRunner(loc.config, str(loc.path)).compact_dates(table, DATES, trigger="sensor")
    assert report.success and {o["decision"] for o in report.outcomes.values()} == {"defer"}, report
    assert CatalogReader(loc.config).metadata_location(table) == head  # nothing moved: the cursor would hold it

    cursor = decode_cursor(first.cursor)
    assert cursor[table].recheck_at is not None and cursor[table].recheck_at <= time.time() + 61
    cursor[table].recheck_at = time.time() - 1  # a minute later
    retry = loc.tick("compaction_sensor", instance, cursor=encode_cursor(cursor))
    [again] = retry.run_requests
    assert again.run_key == f"{request.run_key}:retry3", again.run_key  # each of the 3 dates deferred once
    assert again.partition_key_range == request.partition_key_range

    # a failed proof of the first date (as its run records it): automation holds that date, and says why
    loc.audit.append(AuditRecord(table=table, operation="compact", decision="not_published", date=DATES[0],
                                 trigger="sensor", run_id="run-with-a-failed-proof",
                                 reason="proof failed: aggregates differ"))
    held = loc.tick("compaction_sensor", instance)
    [rest] = held.run_requests
    assert rest.partition_key_range == dg.PartitionKeyRange(f"{DATES[1]}|{table}", f"{DATES[-1]}|{table}")
    [record] = [r for r in loc.audit.records(table=table, operation="compact") if r.decision == "defer"
                and r.run_id is None]
    assert record.date == DATES[0] and record.reason.startswith("held: run run-with-a-failed-proof at ")
    assert f"icemaint approve {table} --date {DATES[0]}" in record.reason
    [observed] = held.asset_events
    assert observed.partition == f"{DATES[0]}|{table}" and observed.metadata["reason_kind"].value == "proof_failed"

    approve(loc.config, loc.audit, table, DATES[0])
    lifted = loc.tick("compaction_sensor", instance)
    [whole] = lifted.run_requests
    assert whole.partition_key_range == request.partition_key_range
    # a new key: the failed run counts too, so Dagster does not skip the run the approval lets go
    assert whole.run_key == f"{request.run_key}:retry4", whole.run_key


def test_read_only_table_is_refused_and_the_refusal_recorded(tmp_path, lake_root, namespace, hot):
    table = hot.name.key
    loc = location(tmp_path, lake_root, namespace, tables={table: {"read_only": True}})
    result = loc.tick("compaction_sensor", instance_with(table))
    assert not result.run_requests
    assert "3 refused" in skip_text(result) and "read-only" in skip_text(result)
    refusals = [r for r in loc.audit.records(table=table, operation="compact") if r.decision == "refuse"]
    assert sorted(r.date for r in refusals) == DATES
    assert all("read-only" in r.reason for r in refusals)


def test_run_requests_batch_a_tables_consecutive_dates_and_keep_the_rest_single():
    """Consecutive dates of one table: one range request; a gap, another table or an undated table: their
    own requests, a single date still carrying the snapshot it was planned on. In the tick's rank order."""
    from types import SimpleNamespace

    from icemaint.domain.decisions import Decision
    from icemaint.domain.verdicts import RUN
    from sensors.compaction import compaction_run_requests

    def run(table, date, snapshot):
        return Decision(table, "compact", RUN, "due", date=date), SimpleNamespace(snapshot_id=snapshot, schema_id=0)

    runs = [run("a.t", "2026-01-02", 7), run("b.t", "2026-01-05", 9), run("a.t", "2026-01-01", 7),
            run("a.t", "2026-01-04", 7), run("c.t", None, 3)]
    requests = compaction_run_requests(runs, trigger="window")
    assert [r.run_key for r in requests] == ["compact:a.t:2026-01-01..2026-01-02:7", "compact:b.t:2026-01-05:9",
                                             "compact:a.t:2026-01-04:7", "compact:c.t:partitions:3"]
    ranged, single, gap, undated = requests
    assert ranged.partition_key_range == dg.PartitionKeyRange("2026-01-01|a.t", "2026-01-02|a.t")
    assert ranged.partition_key is None and PLANNED_SNAPSHOT_TAG not in ranged.tags  # each date decides afresh
    assert single.partition_key == "2026-01-05|b.t" and single.tags[PLANNED_SNAPSHOT_TAG] == "9"
    assert gap.partition_key == "2026-01-04|a.t"
    assert undated.job_name == "table_compaction_job" and undated.partition_key == "c.t"
    assert all(r.tags["icemaint/trigger"] == "window" for r in requests)


def test_run_requests_join_neighbouring_tables_due_on_the_same_dates():
    """The daemon's catch-up: tables next to each other in the partitions' order and due on the same dates share
    one run over their range (each table-date still its own decision at run time), spread over the queue's
    runs at once, never two tables of one queue slot in a run; the key changes with any table's snapshot."""
    from types import SimpleNamespace

    from icemaint.domain.decisions import Decision
    from icemaint.domain.verdicts import RUN
    from maint_assets.partitions import SLOT_TAG_PREFIX, TABLES_TAG, slot_tags, table_slot, tables_of
    from sensors.compaction import compaction_run_requests

    names, used = [], set()
    for i in range(200):  # six tables in six different slots
        if table_slot(f"db.t{i:03d}") not in used and len(names) < 6:
            used.add(table_slot(f"db.t{i:03d}"))
            names.append(f"db.t{i:03d}")
    a, b, c, d, e, f = names

    def run(table, date, snapshot=7):
        return Decision(table, "compact", RUN, "due", date=date), SimpleNamespace(snapshot_id=snapshot, schema_id=0)

    two = ["2026-01-01", "2026-01-02"]
    runs = [run(b, two[0]), run(a, two[0]), run(b, two[1]), run(a, two[1]), run(c, two[0]), run(e, two[0]),
            run(f, two[0])]
    order = names
    joined, single, pair = compaction_run_requests(runs, order=order)
    assert tables_of(joined.tags) == (a, b) and joined.tags[TABLES_TAG] == f"{a},{b}"
    assert joined.partition_key_range == dg.PartitionKeyRange(f"{two[0]}|{a}", f"{two[1]}|{b}")
    assert {k: v for k, v in joined.tags.items() if k.startswith(SLOT_TAG_PREFIX)} == slot_tags([a, b])
    assert PLANNED_SNAPSHOT_TAG not in joined.tags and "icemaint/table" not in joined.tags
    assert joined.run_key.startswith(f"compact:{a}..{b}:{two[0]}..{two[1]}:")
    assert single.partition_key == f"{two[0]}|{c}"  # d is not due: c's neighbour e is not next to it
    assert tables_of(pair.tags) == (e, f)
    # any table's new snapshot makes the batch a new request; the same plan is the same key
    moved = compaction_run_requests([run(b, two[0], 8) if (r[0].table, r[0].date) == (b, two[0]) else r
                                     for r in runs], order=order)
    assert moved[0].run_key != joined.run_key
    assert compaction_run_requests(runs, order=order)[0].run_key == joined.run_key
    # spread over two runs at once; without the order (a single run's tick) nothing is joined
    spread = compaction_run_requests([run(t, two[0]) for t in names], order=order, spread=2)
    assert [tables_of(r.tags) for r in spread] == [(a, b, c), (d, e, f)]
    assert len(compaction_run_requests([run(t, two[0]) for t in names])) == 6


def test_the_nightly_window_requests_what_the_sensor_would_as_window_runs(tmp_path, lake_root, namespace, hot):
    """The window (stopped by default) evaluates every table without a cursor: the due table's three dates
    as one run over their range, triggered by the window; the window of undated tables has nothing here."""
    loc = location(tmp_path, lake_root, namespace)
    table = hot.name.key
    snapshot = CatalogReader(loc.config).load(table).current_snapshot().snapshot_id
    with dg.instance_for_test() as instance:  # a schedule's context opens its instance by reference
        instance.add_dynamic_partitions("table", [table])
        requests = loc.window("nightly_maintenance_window", instance)
        undated = loc.window("nightly_table_window", instance)
    assert [r.run_key for r in requests] == [f"compact:{table}:{DATES[0]}..{DATES[-1]}:{snapshot}"]
    assert requests[0].partition_key_range == dg.PartitionKeyRange(f"{DATES[0]}|{table}", f"{DATES[-1]}|{table}")
    assert requests[0].tags["icemaint/trigger"] == "window"
    assert isinstance(undated, dg.SkipReason) and "evaluated" in (undated.skip_message or "")


def test_discovery_on_a_deployment_without_its_warehouse_yet_says_so(tmp_path, lake_root, namespace):
    """No table known and no warehouse: a fresh deployment, not an error; the skip names the missing path (a
    typo in it would otherwise read as an empty estate, tick after tick)."""
    loc = location(tmp_path, lake_root, namespace, catalog={"warehouse": str(tmp_path / "not-yet")})
    result = loc.tick("table_discovery", dg.DagsterInstance.ephemeral())
    assert isinstance(result, dg.SkipReason), result
    assert f"its warehouse {tmp_path / 'not-yet'} does not exist yet: no table to maintain" in skip_text(result)
