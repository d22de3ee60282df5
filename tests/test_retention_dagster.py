"""Retention through Dagster: the assets' materializations and metadata, the retention sensor's
requests and order (expiry, then orphans), and the `icemaint expire | orphans | manifests` CLI."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import dagster as dg
import pytest

from conftest import streaming_table, write_config
from icemaint.safety.audit import open_audit
from icemaint.app.cli import main
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.policy import TablePolicy
from icemaint.engine.retention import read_snapshots
from icemaint.app.runner import MaintenanceRunner

from maint_assets.partitions import PLANNED_SNAPSHOT_TAG, TABLE_TAG
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource
from resources.settings import MaintenanceSettings
from icemaint.domain.retention_tick import RetentionSignals, decide_retention, expiry_due_at

NOW = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
DAY = 86400.0


def simulate(spark, table, batches=3):
    return streaming_table(spark, "lake", table, batches=batches, days=2, rows_per_day=10, delete_every=0)


def latest(instance, asset: str, table: str):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[table]), limit=1).records
    return records[0].asset_materialization if records else None


def rows(spark, table):
    return sorted(r[0] for r in spark.sql(f"SELECT event_id FROM lake.{table}").collect())


def plant(path: Path, age_seconds: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a table file" * 10)
    stamp = time.time() - age_seconds
    os.utime(path, (stamp, stamp))
    return path


# ---------------------------------------------------------------------------------------------
# The sensor's pure decision
# ---------------------------------------------------------------------------------------------

def signals(snapshots=5, oldest_age_days=10.0, manifests=3, small=3, location="/wh/t.a/metadata/v7.metadata.json"):
    return RetentionSignals("t.a", location, snapshots, NOW.timestamp() - oldest_age_days * DAY, manifests, small)


def decide(sig=None, policy=TablePolicy(), **kwargs):
    """The decisions with automatic orphan removal on (`automation.orphan_removal: true`) unless told otherwise."""
    args = dict(claim_holder=None, in_flight_jobs=set(), expiry_mark=None, orphans_mark=None, orphan_removal=True)
    args.update(kwargs)
    return {d.operation: d for d in decide_retention(sig or signals(), policy, "maint", NOW, **args)}


def test_expiry_is_requested_when_due_and_orphans_only_after_it():
    first = decide()
    assert first["expire"].verdict == "run" and "older than snapshot_older_than" in first["expire"].reason
    assert first["expire"].run_key == decide()["expire"].run_key  # deterministic
    assert first["expire"].run_key != decide(signals(location="/wh/t.a/metadata/v8.metadata.json"))["expire"].run_key
    assert first["orphans"].verdict == "noop" and "follows an expiry" in first["orphans"].reason
    assert first["manifests"].verdict == "noop" and "below manifest_min_count" in first["manifests"].reason

    # expiry due again before the last expiry's orphans were removed: expiry (cheap, it bounds the snapshots) goes
    # first, the orphans wait, never both at once
    both_due = decide(expiry_mark=10, orphans_mark=None)
    assert both_due["expire"].verdict == "run" and both_due["orphans"].verdict == "defer"
    assert "snapshot expiry goes first (waited 0s of at most 1h)" in both_due["orphans"].reason
    assert both_due["orphans"].kind == "ordering"
    busy = decide(expiry_mark=10, orphans_mark=None, in_flight_jobs={"compaction_job"})
    assert (busy["expire"].verdict, busy["orphans"].verdict) == ("run", "defer")

    after = decide(signals(snapshots=1, oldest_age_days=0.1), expiry_mark=10, orphans_mark=4)
    assert after["expire"].verdict == "noop"
    assert after["orphans"].verdict == "run" and after["orphans"].run_key == "orphans:t.a:10"
    done = decide(signals(snapshots=1, oldest_age_days=0.1), expiry_mark=10, orphans_mark=11)
    assert done["orphans"].verdict == "noop" and "after the latest expiry" in done["orphans"].reason


def test_orphan_removal_is_never_automatic_until_the_config_turns_it_on():
    # the very state in which automation would remove orphans (an expiry finished, none removed since)
    off = decide(expiry_mark=10, orphans_mark=None, orphan_removal=False)
    assert off["orphans"].verdict == "noop" and off["orphans"].kind == "policy"
    assert "automation.orphan_removal: false" in off["orphans"].reason
    # and expiry no longer waits behind an orphan removal that will not come
    assert off["expire"].verdict == "run"
    # on, the same state with expiry not due again runs orphan removal (when both are due, expiry goes first)
    quiet = signals(snapshots=1, oldest_age_days=0.1)
    assert decide(quiet, expiry_mark=10, orphans_mark=None)["orphans"].verdict == "run"
    assert decide(quiet, expiry_mark=10, orphans_mark=None, orphan_removal=False)["orphans"].verdict == "noop"
    # the tick's default is off too: a caller that forgets the key deletes nothing
    assert {d.operation: d for d in decide_retention(signals(), TablePolicy(), "maint", NOW, claim_holder=None,
                                                     in_flight_jobs=set(), expiry_mark=10, orphans_mark=None)
            }["orphans"].verdict == "noop"


@pytest.mark.parametrize("kwargs, operation, verdict, reason", [
    (dict(sig=signals(snapshots=1), in_flight_jobs={"compaction_job"}, expiry_mark=3), "orphans", "defer",
     "runs in flight on the table: compaction_job"),
    (dict(in_flight_jobs={"expiry_job"}), "expire", "defer", "expiry_job"),
    (dict(in_flight_jobs={"compaction_job"}), "expire", "run", "older than"),
    (dict(claim_holder="ingest"), "expire", "defer", "claim busy: held by ingest"),
    (dict(requested={"expire": None}), "expire", "run", "older than"),
    (dict(policy=TablePolicy(allowed_operations=frozenset({"compact"}))), "expire", "refuse", "not allowed by policy"),
    (dict(policy=TablePolicy(read_only=True)), "expire", "noop", "read_only"),
    (dict(policy=TablePolicy(manifest_min_count=3)), "manifests", "run", "3 manifests"),
    (dict(sig=signals(snapshots=1)), "expire", "noop", "keeps them all"),
    (dict(sig=signals(oldest_age_days=2)), "expire", "noop", "expiry after"),
])
def test_decisions_gate_on_runs_claims_and_policy(kwargs, operation, verdict, reason):
    decision = decide(**kwargs)[operation]
    assert decision.verdict == verdict and reason in decision.reason


def test_a_request_already_made_is_not_repeated():
    key = decide()["expire"].run_key
    again = decide(requested={"expire": key})["expire"]
    assert again.verdict == "noop" and "already requested" in again.reason
    # an orphan run still queued holds a new expiry back; once it is gone (done or failed) expiry may go
    orphans_key = "orphans:t.a:10"
    queued = decide(expiry_mark=10, requested={"orphans": orphans_key}, in_flight_jobs={"orphans_job"})
    assert queued["orphans"].verdict == queued["expire"].verdict == "defer"
    gone = decide(expiry_mark=10, requested={"orphans": orphans_key})
    assert gone["orphans"].verdict == "defer" and gone["expire"].verdict == "run"


@pytest.mark.parametrize("kwargs, expire, orphans, words", [
    # the soak's case: a busy table over snapshot_max_count with orphan removal owed: expiry is never starved
    (dict(sig=signals(snapshots=380), expiry_mark=10), "run", "defer", "snapshot expiry goes first"),
    (dict(sig=signals(snapshots=380), expiry_mark=10, orphans_held_since=NOW.timestamp() - 3599), "run", "defer",
     "waited 60m of at most 1h"),
    # ... nor is orphan removal: after ORPHANS_MAX_WAIT behind expiry it takes its turn, one tick
    (dict(sig=signals(snapshots=380), expiry_mark=10, orphans_held_since=NOW.timestamp() - 3600), "defer", "run",
     "waited 1h behind expiry: its turn"),
    # its turn, but a compaction runs on the table: orphan removal waits for it, expiry does not wait for both
    (dict(sig=signals(snapshots=380), expiry_mark=10, orphans_held_since=NOW.timestamp() - 7200,
          in_flight_jobs={"compaction_job"}), "run", "defer", "waiting for runs in flight on the table: compaction_job"),
    # an orphan removal in flight holds expiry (never both at once), and the other way round
    (dict(sig=signals(snapshots=380), expiry_mark=10, in_flight_jobs={"orphans_job"}), "defer", "defer",
     "snapshot expiry goes first"),
    (dict(sig=signals(snapshots=380), expiry_mark=10, orphans_held_since=NOW.timestamp() - 7200,
          in_flight_jobs={"expiry_job"}), "defer", "defer", "waiting for runs in flight on the table: expiry_job"),
    # expiry not allowed or not due: owed orphan removal does not wait for it
    (dict(expiry_mark=10, policy=TablePolicy(allowed_operations=frozenset({"orphans"}))), "refuse", "run",
     "an expiry finished after the last orphan removal"),
    (dict(sig=signals(snapshots=1), expiry_mark=10), "noop", "run", "an expiry finished after the last orphan removal"),
])
def test_expiry_goes_before_owed_orphan_removal_which_never_starves(kwargs, expire, orphans, words):
    decided = decide(**kwargs)
    assert (decided["expire"].verdict, decided["orphans"].verdict) == (expire, orphans), decided
    assert words in decided["orphans"].reason, decided["orphans"].reason


def test_the_tick_cursor_times_how_long_orphan_removal_waited_behind_expiry():
    """Through the tick: a table over snapshot_max_count at every tick expires at every tick, and its owed orphan
    removal runs once it has waited ORPHANS_MAX_WAIT_SECONDS, then expiry again."""
    from icemaint.domain.retention_tick import ORPHANS_MAX_WAIT_SECONDS, plan_retention_tick

    ticks = []

    def tick(now, cursor, snapshots=380, orphans_mark=None):
        plan = plan_retention_tick(
            ["t.a"], policy_of=lambda t: TablePolicy(), policy_fingerprint=lambda p: "p", identity="maint",
            metadata_location=lambda t: f"/wh/t.a/metadata/v{len(ticks)}.metadata.json",
            read_signals=lambda t, p: RetentionSignals("t.a", f"/wh/t.a/metadata/v{len(ticks)}.metadata.json",
                                                       snapshots, now.timestamp() - DAY, 3, 3),
            claim_holder=lambda t: None, in_flight_jobs=lambda: {},
            latest_mark=lambda op, t: {"expire": 10, "orphans": orphans_mark}[op], cursor=cursor, now=now, orphan_removal=True)
        ticks.append(plan)
        return {d.operation: d.verdict for d in plan.decisions}, plan.cursor

    start = NOW
    first, cursor = tick(start, {})
    assert first["expire"] == "run" and first["orphans"] == "defer"
    assert cursor["t.a"].orphans_held_since == start.timestamp()
    later, cursor = tick(start + dt.timedelta(minutes=30), cursor)
    assert later["expire"] == "run" and cursor["t.a"].orphans_held_since == start.timestamp()
    turn, cursor = tick(start + dt.timedelta(seconds=ORPHANS_MAX_WAIT_SECONDS), cursor)
    assert (turn["expire"], turn["orphans"]) == ("defer", "run") and cursor["t.a"].orphans_held_since is None
    after, cursor = tick(start + dt.timedelta(seconds=ORPHANS_MAX_WAIT_SECONDS + 60), cursor, orphans_mark=11)
    assert (after["expire"], after["orphans"]) == ("run", "noop")
    assert cursor["t.a"].orphans_held_since is None


def test_expiry_due_time_lets_an_unchanged_table_sleep():
    policy = TablePolicy()
    assert expiry_due_at(signals(oldest_age_days=2), policy) == pytest.approx(NOW.timestamp() + 5 * DAY + 1)
    assert expiry_due_at(signals(snapshots=1), policy) is None


# ---------------------------------------------------------------------------------------------
# Assets through the runner (the same path as the CLI and the UI)
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def runner(config_file):
    return MaintenanceRunner(load_config(config_file), str(config_file))


def test_assets_materialize_with_numeric_metadata(spark, runner, table_name):
    writer = simulate(spark, table_name, batches=3)
    spark.sql(f"CALL lake.system.rewrite_data_files(table => '{table_name}', options => map('min-input-files', '2'))")
    snapshots, _ = read_snapshots(spark, "lake", table_name)
    key = runner.check_table(table_name)
    # a compaction running on the second snapshot: expiry must keep it (and so everything newer)
    planned = snapshots[1].snapshot_id
    compaction = runner.instance.create_run_for_job(runner.defs.resolve_job_def("compaction_job"),
                                                    status=dg.DagsterRunStatus.STARTED,
                                                    tags={TABLE_TAG: key, PLANNED_SNAPSHOT_TAG: str(planned)})
    report = runner.expire(key, older_than="0s", retain_last=1)
    assert report.success, report.error
    assert report.outcome["decision"] == "run"
    assert "in-flight" in report.outcome["evidence"]["protected"][str(planned)]
    assert [s.snapshot_id for s in read_snapshots(spark, "lake", table_name)[0]] == [
        s.snapshot_id for s in snapshots[1:]]

    runner.instance.report_run_canceled(compaction)
    report = runner.expire(key, older_than="0s", retain_last=1)
    assert report.success and report.outcome["decision"] == "run", report.outcome
    assert [s.snapshot_id for s in read_snapshots(spark, "lake", table_name)[0]] == [snapshots[-1].snapshot_id]
    meta = latest(runner.instance, "expired_snapshots", key).metadata
    assert isinstance(meta["snapshots_before"], dg.IntMetadataValue) and meta["snapshots_before"].value == 3
    assert (meta["snapshots_after"].value, meta["snapshots_removed"].value) == (1, 2)
    assert meta["data_files_deleted"].value == 6 and meta["bytes_reclaimed"].value > 0
    assert isinstance(meta["duration_seconds"], dg.FloatMetadataValue)

    ns, name = table_name.split(".")
    orphan = plant(Path(load_config(runner.config.source).catalog.warehouse, ns, name, "data", "stray.parquet"), 4 * DAY)
    report = runner.orphans(key)
    assert report.success and report.outcome["decision"] == "run", report.outcome
    meta = latest(runner.instance, "orphan_files", key).metadata
    assert (meta["candidates"].value, meta["removed"].value, meta["bytes"].value) == (1, 1, 160)
    assert not orphan.exists()

    # 4 manifests < manifest_min_count 20: nothing to do; a person's run materializes the table as it is
    report = runner.manifests(key)
    assert report.success and report.outcome["decision"] == "noop"
    meta = latest(runner.instance, "rewritten_manifests", key).metadata
    assert meta["decision"].value == "noop" and meta["manifests_before"].value == 4
    report = runner.manifests(key, force=True)
    assert report.success and report.outcome["decision"] == "run"
    meta = latest(runner.instance, "rewritten_manifests", key).metadata
    assert meta["manifests_before"].value > meta["manifests_after"].value == 1
    assert rows(spark, table_name) == sorted(writer.ledger.expected_ids())
    ops = [(r.operation, r.decision, r.trigger) for r in open_audit(runner.config).records(table=key)]
    assert ops == [("expire", "run", "cli"), ("expire", "run", "cli"), ("orphans", "run", "cli"), ("manifests", "noop", "cli"),
                   ("manifests", "run", "cli")]


def test_read_only_table_is_refused_with_a_failure(spark, tmp_path, lake_root, table_name):
    path = write_config(tmp_path / "ro.yaml", lake_root, state_dir=str(tmp_path / "ro-state"),
                        tables={table_name: {"read_only": True}})
    runner = MaintenanceRunner(load_config(path), str(path))
    simulate(spark, table_name, batches=1)  # refused before any work: one commit will do
    location = CatalogReader(runner.config).metadata_location(table_name)
    report = runner.expire(table_name, older_than="0s")
    assert not report.success and "refused expire" in report.error and "read-only" in report.error
    assert report.outcome["decision"] == "refuse"
    assert CatalogReader(runner.config).metadata_location(table_name) == location
    assert latest(runner.instance, "expired_snapshots", table_name) is None
    assert [r.decision for r in open_audit(runner.config).records(table=table_name)] == ["refuse"]


def test_one_retention_run_over_neighbouring_tables_reports_each_and_names_the_one_refused(
        spark, tmp_path, lake_root, table_name):
    """The retention sensor's batch as the daemon launches it: one expiry run over three neighbouring tables, each
    table under its own claim, audit record and materialization; a read-only table among them is refused (its
    metadata unchanged), the others expired, and the run fails naming the refused table."""
    from maint_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, TABLES_TAG, TRIGGER_TAG

    tables = [f"{table_name}_{i}" for i in range(3)]
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        tables={tables[1]: {"read_only": True}})
    runner = MaintenanceRunner(load_config(path), str(path))
    writers = [simulate(spark, t, batches=2) for t in tables]
    for t in tables:
        runner.check_table(t)
    located = CatalogReader(runner.config).metadata_location(tables[1])
    result = runner.defs.resolve_job_def("expiry_job").execute_in_process(
        instance=runner.instance, raise_on_error=False,
        run_config={"ops": {"expired_snapshots": {"config": {"older_than": "0s", "retain_last": 1}}}},
        tags={TRIGGER_TAG: "sensor", TABLES_TAG: ",".join(tables), RANGE_START_TAG: tables[0],
              RANGE_END_TAG: tables[-1]})
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    text = failure.event_specific_data.user_failure_data.description
    assert text.startswith("1 of 3 tables not done: refused expire on ") and tables[1] in text, text
    assert sorted(m.partition for m in result.asset_materializations_for_node("expired_snapshots")) == [
        tables[0], tables[2]]
    assert [len(read_snapshots(spark, "lake", t)[0]) for t in tables] == [1, 2, 1]
    assert CatalogReader(runner.config).metadata_location(tables[1]) == located
    audit = open_audit(runner.config)
    assert [[r.decision for r in audit.records(table=t, operation="expire")] for t in tables] == [
        ["run"], ["refuse"], ["run"]]
    for t, writer in zip(tables, writers):
        assert rows(spark, t) == sorted(writer.ledger.expected_ids())


def test_the_retention_sensor_joins_neighbouring_tables_due_for_the_same_operation():
    from icemaint.domain.retention_tick import EXPIRE, MANIFESTS, ORPHANS, RetentionDecision
    from maint_assets.partitions import SLOT_TAG_PREFIX, TABLES_TAG, slot_tags, table_slot, tables_of
    from sensors.retention import retention_run_requests

    names, used = [], set()
    for i in range(200):
        if table_slot(f"db.r{i:03d}") not in used and len(names) < 5:
            used.add(table_slot(f"db.r{i:03d}"))
            names.append(f"db.r{i:03d}")
    a, b, c, d, e = names

    def due(table, operation):
        return RetentionDecision(table, operation, "run", "due", run_key=f"{operation}:{table}:1")

    runs = [due(a, EXPIRE), due(b, EXPIRE), due(c, EXPIRE), due(c, MANIFESTS), due(d, EXPIRE), due(e, ORPHANS)]
    requests = retention_run_requests(runs, names)
    joined = [r for r in requests if TABLES_TAG in r.tags]
    assert [(r.job_name, tables_of(r.tags)) for r in joined] == [("expiry_job", (a, b))]
    assert {k: v for k, v in joined[0].tags.items() if k.startswith(SLOT_TAG_PREFIX)} == slot_tags([a, b])
    assert joined[0].partition_key_range == dg.PartitionKeyRange(a, b)
    # c is due twice (it keeps its own runs), d's neighbour c is taken, e is the only orphans run
    singles = sorted((r.job_name, r.partition_key) for r in requests if TABLES_TAG not in r.tags)
    assert singles == [("expiry_job", c), ("expiry_job", d), ("manifests_job", c), ("orphans_job", e)]
    assert retention_run_requests(runs, names)[0].run_key == requests[0].run_key  # deterministic
    assert [tables_of(r.tags) for r in retention_run_requests([due(t, EXPIRE) for t in names], names, spread=2)] == [
        (a, b, c), (d, e)]
    # a (table, operation) listed twice is one entry of one batch, for the sensor and the tick alike
    from sensors.retention import retention_batches
    assert retention_batches([due(a, EXPIRE), due(b, EXPIRE), due(a, EXPIRE)], names) == [[(a, EXPIRE), (b, EXPIRE)]]


# ---------------------------------------------------------------------------------------------
# The sensor on a real table and instance
# ---------------------------------------------------------------------------------------------

def retention_sensor_of(runner: MaintenanceRunner, path: Path):
    """The code location's retention sensor, evaluated on the runner's instance: cursor -> its SensorResult."""
    settings = MaintenanceSettings(config_path=str(path))
    resources = {"catalog": IcebergCatalogResource(settings=settings), "claims": TableClaimResource(settings=settings),
                 "audit": AuditResource(settings=settings)}
    sensor = runner.defs.resolve_sensor_def("retention_sensor")

    def evaluate(cursor):
        with dg.build_sensor_context(instance=runner.instance, cursor=cursor, resources=resources) as context:
            return sensor(context)
    return evaluate


@pytest.mark.slow
def test_sensor_requests_expiry_then_orphans_and_nothing_for_an_unchanged_table(spark, tmp_path, lake_root,
                                                                                 table_name):
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        defaults={"snapshot_older_than": "0s", "manifest_min_count": 3},
                        automation={"orphan_removal": True})
    # The same estate with the shipped default (no `automation` key): never an orphan-removal run.
    default_path = write_config(tmp_path / "default.yaml", lake_root, state_dir=str(tmp_path / "state"),
                                defaults={"snapshot_older_than": "0s", "manifest_min_count": 3})
    runner = MaintenanceRunner(load_config(path), str(path))
    writer = simulate(spark, table_name, batches=3)
    key = runner.check_table(table_name)
    evaluate = retention_sensor_of(runner, path)

    def tick(cursor):
        result = evaluate(cursor)
        return result, {(r.job_name, r.partition_key): r for r in result.run_requests}

    first, requests = tick(None)
    assert set(requests) == {("expiry_job", key), ("manifests_job", key)}
    first_expiry_key = requests[("expiry_job", key)].run_key
    assert first_expiry_key.startswith(f"expire:{key}:")
    assert requests[("expiry_job", key)].tags == {TABLE_TAG: key, "icemaint/trigger": "sensor"}
    again, repeated = tick(None)
    assert {r.run_key for r in repeated.values()} == {r.run_key for r in requests.values()}  # deterministic

    # the daemon would launch these; run them as it would (no run config). Manifests first: its commit is
    # one more snapshot, which this policy (snapshot_older_than 0s) would want to expire again.
    assert runner.manifests(key, trigger="sensor").outcome["decision"] == "run"
    assert runner.expire(key, trigger="sensor").outcome["decision"] == "run"

    # a compaction running on the table holds orphan removal back
    queued = runner.instance.create_run_for_job(runner.defs.resolve_job_def("compaction_job"),
                                                status=dg.DagsterRunStatus.STARTED, tags={TABLE_TAG: key})
    held, requests = tick(first.cursor)
    assert requests == {}
    assert "waiting for runs in flight on the table: compaction_job" in held.skip_reason.skip_message
    runner.instance.report_run_canceled(queued)

    # orphans are due now, and the default config still requests nothing: it says why
    by_default = retention_sensor_of(runner, default_path)(held.cursor)
    assert [r.job_name for r in by_default.run_requests] == []
    assert "orphans: noop: not automatic (automation.orphan_removal: false)" in by_default.skip_reason.skip_message

    # the table moves on before its orphan removal ran: expiry, due again, goes first and the orphans wait
    writer.run(1)
    again, requests = tick(held.cursor)
    assert set(requests) == {("expiry_job", key)}, requests
    assert json.loads(again.cursor)[key]["orphans_held_since"] is not None
    assert runner.expire(key, trigger="sensor").outcome["decision"] == "run"

    second, requests = tick(again.cursor)
    assert set(requests) == {("orphans_job", key)}
    expiry_event = runner.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("expired_snapshots"), asset_partitions=[key]), limit=1).records[0]
    assert requests[("orphans_job", key)].run_key == f"orphans:{key}:{expiry_event.storage_id}"
    assert runner.orphans(key, trigger="sensor").success

    third, requests = tick(second.cursor)
    assert requests == {}
    assert "0 tables evaluated, 1 unchanged" in third.skip_reason.skip_message
    assert json.loads(third.cursor) == json.loads(second.cursor)

    writer.run(1)  # the table moves on: evaluated again, and (snapshot_older_than 0s) expiry is due again
    fourth, requests = tick(third.cursor)
    assert set(requests) - {("manifests_job", key)} == {("expiry_job", key)}  # manifests: two writer commits more
    assert requests[("expiry_job", key)].run_key != first_expiry_key
    assert rows(spark, table_name) == sorted(writer.ledger.expected_ids())


@pytest.mark.slow
def test_tick_runs_expiry_then_orphans_on_the_next_tick(spark, tmp_path, lake_root, table_name, capsys):
    from icemaint.app.ticker import Ticker

    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        defaults={"snapshot_older_than": "0s"}, scope={"include": [table_name]},
                        automation={"orphan_removal": True})
    writer = simulate(spark, table_name, batches=2)  # 2 small files a day: below min_input_files, no compaction

    def retention(report):
        return {d["operation"]: d for d in report["decisions"] if d["date"] is None}

    assert main(["--config", str(path), "tick", "--json"]) == 0
    first = retention(json.loads(capsys.readouterr().out))
    assert (first["expire"]["decision"], first["expire"]["result"]) == ("run", "run")
    assert first["expire"]["metrics"]["snapshots_removed"] == 1
    assert first["orphans"]["decision"] == "noop" and "result" not in first["orphans"]

    ticker = Ticker(load_config(path), str(path))
    second = retention(ticker.tick())
    assert second["expire"]["decision"] == "noop"
    assert (second["orphans"]["decision"], second["orphans"]["result"]) == ("run", "noop")  # nothing stray
    third = ticker.tick()
    assert retention(third) == {}
    assert "retention: 0 tables evaluated, 1 unchanged, 0 operations in 0 Dagster runs" in third["lines"]
    assert rows(spark, table_name) == sorted(writer.ledger.expected_ids())
    trail = [(r.operation, r.decision, r.trigger) for r in open_audit(load_config(path)).records(table=table_name)]
    assert trail == [("expire", "run", "tick"), ("orphans", "noop", "tick")]


def test_the_tick_expires_neighbouring_tables_in_one_run(spark, tmp_path, lake_root, table_name, capsys):
    """`icemaint tick` joins tables due for the same retention operation as the sensor does: three tables' expiry
    in one Dagster run, each table its own entry, outcome, audit record and materialization; rows unchanged."""
    from maint_assets.partitions import table_slot, tables_of

    tables, slots = [], set()
    for i in range(100):  # three names in different queue slots (a run never holds two of one slot)
        if len(tables) < 3 and table_slot(f"{table_name}_{i:02d}") not in slots:
            slots.add(table_slot(f"{table_name}_{i:02d}"))
            tables.append(f"{table_name}_{i:02d}")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        defaults={"snapshot_older_than": "0s"}, scope={"include": [f"{table_name}_*"]})
    writers = [simulate(spark, t, batches=2) for t in tables]  # below min_input_files: no compaction
    assert main(["--config", str(path), "tick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expiry = {d["table"]: d for d in report["decisions"] if d["operation"] == "expire"}
    assert sorted(expiry) == tables
    assert all((d["decision"], d["result"], d["success"]) == ("run", "run", True) for d in expiry.values()), expiry
    assert all(d["metrics"]["snapshots_removed"] == 1 for d in expiry.values())
    [run_id] = {d["run_id"] for d in expiry.values()}
    runner = MaintenanceRunner(load_config(path), str(path))
    run = runner.instance.get_run_by_id(run_id)
    assert run.job_name == "expiry_job" and tables_of(run.tags) == tuple(tables)
    for t, writer in zip(tables, writers):
        assert latest(runner.instance, "expired_snapshots", t).metadata["snapshots_removed"].value == 1
        assert [(r.operation, r.decision, r.run_id) for r in open_audit(load_config(path)).records(table=t)] == [
            ("expire", "run", run_id)]
        assert len(read_snapshots(spark, "lake", t)[0]) == 1
        assert rows(spark, t) == sorted(writer.ledger.expected_ids())


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def test_cli_json_output_and_exit_codes(spark, config_file, table_name, capsys):
    simulate(spark, table_name, batches=3)
    config = load_config(config_file)
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    base = ["--config", str(config_file)]

    for bad, message in [
        (["expire", table_name, "--retain-last", "0"], "retain_last=0"),
        (["expire", table_name, "--older-than=-1h"], "negative"),
        (["orphans", table_name, "--older-than", "3y"], "not a duration"),
        (["expire", "t.no_such_table"], "not found"),
        (["manifests", "t.x;drop"], "t.x;drop"),
    ]:
        assert main(base + bad) == 2, bad
        assert message in capsys.readouterr().err
    assert reader.metadata_location(table_name) == location
    assert open_audit(config).records(table=table_name) == []

    assert main(base + ["expire", table_name, "--older-than", "0s", "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["decision"], out["dry_run"], out["metrics"]["snapshots_removed"]) == ("run", True, 2)
    assert out["success"] is True and out["run_id"]
    assert reader.metadata_location(table_name) == location

    assert main(base + ["orphans", table_name, "--older-than", "1h", "--json"]) == 1  # under 24 h, not forced
    out = json.loads(capsys.readouterr().out)
    assert out["decision"] == "refuse" and "less than 24 h" in out["reason"]

    assert main(base + ["expire", table_name, "--older-than", "0s", "--retain-last", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decision"] == "run" and out["metrics"]["snapshots_after"] == 2
    assert reader.metadata_location(table_name) != location

    assert main(base + ["manifests", table_name]) == 0
    assert "manifests: noop: not due" in capsys.readouterr().out
    assert main(base + ["orphans", table_name, "--force", "--older-than", "1h", "--quarantine", "--dry-run"]) == 0
    assert "orphans: noop" in capsys.readouterr().out
    decisions = [(r.operation, r.decision) for r in open_audit(config).records(table=table_name)]
    assert decisions == [("expire", "run"), ("orphans", "refuse"), ("expire", "run"), ("manifests", "noop"),
                         ("orphans", "noop")]


def test_purge_quarantine_cli_deletes_old_batches_of_allowed_tables_only(spark, tmp_path, lake_root, capsys):
    state = tmp_path / "purge-state"
    path = write_config(tmp_path / "purge.yaml", lake_root, state_dir=str(state), tables={"q.ro": {"read_only": True}})
    now = dt.datetime.now(dt.timezone.utc)

    def batch(table: str, age: dt.timedelta) -> Path:
        stamp = (now - age).strftime("%Y%m%dT%H%M%S%fZ")
        planted = state / "quarantine" / table / stamp / "data" / "part-0.parquet"
        planted.parent.mkdir(parents=True)
        planted.write_bytes(b"orphan")
        return planted

    old, young = batch("q.ok", dt.timedelta(days=10)), batch("q.ok", dt.timedelta(hours=1))
    protected = batch("q.ro", dt.timedelta(days=10))
    strangers = [batch(name, dt.timedelta(days=10)) for name in ("x;DROP TABLE", "not_a_table")]  # not tables
    (state / "quarantine" / "q.ok" / "not-a-batch").mkdir()
    base = ["--config", str(path), "purge-quarantine"]

    assert main(base + ["--older-than=-1d"]) == 2
    assert "negative" in capsys.readouterr().err
    assert main(base + ["--older-than", "7d", "--dry-run", "--json"]) == 1  # q.ro is refused
    listed = {o["table"]: o for o in json.loads(capsys.readouterr().out)}
    assert listed["q.ok"]["decision"] == "run" and len(listed["q.ok"]["batches"]) == 1
    assert listed["q.ro"]["decision"] == "refuse" and "read-only" in listed["q.ro"]["reason"]
    assert old.exists() and young.exists() and protected.exists()

    assert main(base + ["--older-than", "7d"]) == 1
    out = capsys.readouterr()
    assert "q.ok purge_quarantine: run: purged 1 batch(es)" in out.out and "q.ro purge_quarantine: refuse" in out.err
    assert not old.parent.parent.exists() and young.exists() and protected.exists()
    assert (state / "quarantine" / "q.ok" / "not-a-batch").is_dir()
    assert all(p.exists() for p in strangers), "a directory that is not a table's quarantine was purged"
    records = [(r.table, r.decision, r.details["dry_run"])
               for r in open_audit(load_config(path)).records(operation="purge_quarantine")]
    assert sorted(records) == [("q.ok", "run", False), ("q.ok", "run", True),
                               ("q.ro", "refuse", False), ("q.ro", "refuse", True)]
    # the deleting call left a started marker first (a kill meanwhile reads back as interrupted), paired with its
    # record by the call id; dry runs and refusals delete nothing and need none
    stored = [json.loads(line) for line in (state / "audit" / "audit.jsonl").read_text().splitlines()]
    purges = [r for r in stored if r["operation"] == "purge_quarantine"]
    [marker] = [r for r in purges if r["decision"] == "started"]
    [done] = [r for r in purges if r["decision"] == "run" and not r["details"]["dry_run"]]
    assert marker["table"] == "q.ok" and marker["call_id"] == done["call_id"] and marker["details"]["process"]
    assert main(["--config", str(path), "audit", "--operation", "purge-quarantine", "--json"]) == 0  # as typed
    assert {r["table"] for r in json.loads(capsys.readouterr().out)} == {"q.ok", "q.ro"}
