"""Safe compaction on real Spark + Iceberg: the rows it keeps, rollback, claims, conflicts, bad input."""

import threading
import time

import pytest

from icemaint.audit import open_audit
from icemaint.claims import ClaimBusy, open_claims, table_claim
from icemaint.compaction import COMMITTED_KEY, CompactionRequest, Compactor, call_rewrite_data_files
from icemaint.metadata import CatalogReader, TableNotFound
from icemaint.names import InvalidTableName, TableName
from icemaint.scope import InvalidDate
from icemaint.simulator import StreamingWriter, WorkloadSpec
from icemaint.validation import full_row_hash

DATE = "2026-01-02"


def simulate(spark, config, table, batches=6, **spec):
    writer = StreamingWriter(spark, config.catalog.name,
                             WorkloadSpec(table=table, days=3, rows_per_day=15, delete_every=3, **spec))
    writer.create_table()
    writer.run(batches)
    return writer


def compactor(config, spark, **kwargs):
    return Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config), **kwargs)


def data_files(spark, config, table, date=None):
    sql = TableName.parse(table).sql(config.catalog.name)
    where = f" WHERE partition.ts_day = DATE '{date}'" if date else ""
    return {(r.file_path, r.content) for r in spark.sql(f"SELECT file_path, content FROM {sql}.files{where}").collect()}


def current(spark, config, table):
    return CatalogReader(config).load(table).current_snapshot().snapshot_id


def ids(spark, config, table):
    return [r[0] for r in spark.sql(f"SELECT event_id FROM {TableName.parse(table).sql(config.catalog.name)}").collect()]


def test_happy_path_keeps_every_row_and_compacts_only_that_date(spark, config, table_name):
    writer = simulate(spark, config, table_name)
    reader = CatalogReader(config)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    before_snapshot = current(spark, config, table_name)
    before_hash = full_row_hash(spark, sql, before_snapshot)
    before_files = data_files(spark, config, table_name)
    other_dates_before = {f for f in before_files if DATE not in f[0] and f[1] == 0}
    date_deletes_before = {f for f in data_files(spark, config, table_name, DATE) if f[1] == 1}
    assert date_deletes_before, "the simulator should have produced position deletes on the date"

    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))

    assert outcome.decision == "run", outcome.reason
    assert outcome.validation["passed"] is True
    assert outcome.before_snapshot_id == before_snapshot
    assert outcome.files_before == 6 and outcome.files_after < config.policy(table_name).min_input_files
    after_snapshot = current(spark, config, table_name)
    assert after_snapshot == outcome.after_snapshot_id != before_snapshot
    # every row, with position deletes applied, is identical before and after
    assert full_row_hash(spark, sql, after_snapshot) == before_hash
    assert sorted(ids(spark, config, table_name)) == sorted(writer.ledger.expected_ids())
    # other dates' data files untouched; the date's delete files applied and gone
    after_files = data_files(spark, config, table_name)
    assert {f for f in after_files if DATE not in f[0] and f[1] == 0} == other_dates_before
    assert not {f for f in data_files(spark, config, table_name, DATE) if f[1] == 1}
    assert reader.health(table_name).partition(DATE).small_files == outcome.files_after
    # evidence
    assert outcome.rewritten_files == 6 and outcome.rewritten_bytes > 0
    assert outcome.read_before["rows"] == outcome.read_after["rows"] > 0
    record = open_audit(config).records(table=table_name, operation="compact")[-1]
    assert record.decision == "run" and record.after_snapshot_id == after_snapshot
    assert record.validation["passed"] is True and record.identity == config.identity()


def lossy_rewrite(config, victim_id):
    """A faulty rewrite: the real procedure, then a commit that loses one row of the date."""
    def rewrite(spark, catalog, table, scope, options, strategy, sort_order):
        result = call_rewrite_data_files(spark, catalog, table, scope, options, strategy, sort_order)
        rewrite_id = current(spark, config, table.key)
        spark.sql(f"DELETE FROM {table.sql(catalog)} WHERE event_id = {int(victim_id)}")
        return {**result, COMMITTED_KEY: [rewrite_id, current(spark, config, table.key)]}
    return rewrite


def test_failed_validation_rolls_back_and_keeps_a_later_writer_append(spark, config, table_name):
    writer = simulate(spark, config, table_name)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    victim = spark.sql(f"SELECT event_id FROM {sql} WHERE ts >= TIMESTAMP '{DATE} 00:00:00' "
                       f"AND ts < TIMESTAMP '{DATE} 23:59:59' ORDER BY event_id LIMIT 1").first()[0]
    before_snapshot = current(spark, config, table_name)

    def writer_appends_after_commit(_committed):
        # a writer that does not take the claim commits between the rewrite and its validation
        spark.sql(f"INSERT INTO {sql} VALUES (990001, 1, TIMESTAMP '{DATE} 12:00:00', 1.5, 'late'), "
                  f"(990002, 2, TIMESTAMP '2026-01-03 12:00:00', 2.5, 'late')")

    outcome = compactor(config, spark, rewrite=lossy_rewrite(config, victim),
                        after_commit=writer_appends_after_commit).run(CompactionRequest(table_name, DATE))

    assert outcome.validation["passed"] is False
    failed = {c["name"] for r in outcome.validation["commits"] for c in r["checks"] if not c["passed"]}
    assert "row_count_parity" in failed
    assert outcome.rolled_back is True
    proof = outcome.rollback
    assert proof["rolled_back_to"] == before_snapshot and proof["parity"] is True
    assert len(proof["reapplied_writer_snapshots"]) == 1
    rows = ids(spark, config, table_name)
    assert victim in rows, "the row the faulty rewrite lost is back"
    assert {990001, 990002} <= set(rows), "the writer's append survived the rollback"
    assert sorted(rows) == sorted(writer.ledger.expected_ids() | {990001, 990002})
    records = open_audit(config).records(table=table_name, operation="compact")
    assert records[-1].decision == "rollback"
    assert records[-1].rollback["reapplied_writer_snapshots"] == proof["reapplied_writer_snapshots"]
    assert records[-1].validation["passed"] is False


def test_writer_appending_during_compaction_loses_and_duplicates_nothing(spark, config, table_name):
    writer = simulate(spark, config, table_name, batches=5)
    writer.claim_factory = lambda: table_claim(config, table_name, holder="ingest", wait_seconds=120)
    errors = []

    def keep_writing():
        try:
            writer.run(4, interval_seconds=0.5)
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=keep_writing)
    thread.start()
    time.sleep(0.5)
    outcomes = []
    for date in ("2026-01-01", DATE):
        # as the sensor would on its next ticks: a busy claim defers, a later attempt runs
        for _ in range(60):
            outcome = compactor(config, spark).run(CompactionRequest(table_name, date))
            outcomes.append(outcome)
            if outcome.decision != "defer":
                break
            assert "claim busy" in outcome.reason and "ingest" in outcome.reason
            time.sleep(0.05)
    still_writing = thread.is_alive()
    thread.join(timeout=300)
    assert not errors
    for outcome in outcomes:
        assert outcome.decision in ("run", "defer"), outcome.reason
        if outcome.decision == "run":
            assert outcome.validation["passed"] is True
    assert sum(o.decision == "run" for o in outcomes) == 2
    assert still_writing or writer.ledger.next_batch == 9, "compaction should overlap the writer"
    rows = ids(spark, config, table_name)
    assert len(rows) == len(set(rows)), "duplicated rows"
    assert set(rows) == writer.ledger.expected_ids(), "lost or extra rows"


def test_held_claim_defers_naming_the_holder_and_changes_nothing(spark, config, table_name):
    simulate(spark, config, table_name, batches=4)
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    with table_claim(config, table_name, holder="nightly-ingest"):
        outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
        with pytest.raises(ClaimBusy, match="nightly-ingest"):
            open_claims(config).acquire(table_name, "someone-else")
    assert outcome.decision == "defer"
    assert "nightly-ingest" in outcome.reason
    assert reader.metadata_location(table_name) == location
    assert open_audit(config).records(table=table_name)[-1].decision == "defer"


def test_stale_plan_is_replanned_on_the_current_snapshot(spark, config, table_name):
    simulate(spark, config, table_name, batches=4)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    planned = current(spark, config, table_name)
    spark.sql(f"INSERT INTO {sql} VALUES (880001, 1, TIMESTAMP '{DATE} 08:00:00', 0.5, 'moved')")
    moved = current(spark, config, table_name)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE, planned_snapshot_id=planned))
    assert outcome.replanned and "stale plan" in outcome.replanned
    assert outcome.decision == "run" and outcome.before_snapshot_id == moved
    assert outcome.validation["passed"] is True
    assert 880001 in ids(spark, config, table_name)


def test_commit_conflicts_are_retried_then_deferred(spark, config, table_name):
    simulate(spark, config, table_name, batches=4)
    reader = CatalogReader(config)
    calls = []

    def conflicting_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("org.apache.iceberg.exceptions.CommitFailedException: injected conflict")
        return call_rewrite_data_files(*args)

    outcome = compactor(config, spark, rewrite=conflicting_once, sleep=lambda s: None).run(
        CompactionRequest(table_name, DATE))
    assert outcome.decision == "run" and outcome.attempts == 2 and outcome.validation["passed"] is True

    location = reader.metadata_location(table_name)

    def always_conflicting(*args):
        raise RuntimeError("ValidationException: Cannot commit, found new position delete for replaced data file")

    outcome = compactor(config, spark, rewrite=always_conflicting, sleep=lambda s: None).run(
        CompactionRequest(table_name, "2026-01-03"))
    assert outcome.decision == "defer" and "commit conflict persisted" in outcome.reason
    assert outcome.attempts == config.policy(table_name).max_commit_retries + 1
    assert reader.metadata_location(table_name) == location


@pytest.mark.parametrize("table, date, error", [
    ("t.does_not_exist", DATE, TableNotFound),
    ("t.x; DROP TABLE t.y", DATE, InvalidTableName),
    ("../../etc.passwd", DATE, InvalidTableName),
    ("t.`x`", DATE, InvalidTableName),
    (None, "2026-13-01", InvalidDate),
    (None, "yesterday", InvalidDate),
    (None, "2026-01-02' OR '1'='1", InvalidDate),
    (None, "2019-12-31", InvalidDate),
])
def test_bad_input_is_refused_and_mutates_nothing(spark, config, table_name, table, date, error):
    simulate(spark, config, table_name, batches=3)
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    with pytest.raises(error):
        compactor(config, spark).run(CompactionRequest(table or table_name, date))
    assert reader.metadata_location(table_name) == location


def test_dry_run_changes_nothing(spark, config, table_name):
    simulate(spark, config, table_name, batches=4)
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE, dry_run=True))
    assert outcome.decision == "run" and outcome.dry_run and "dry-run" in outcome.reason
    assert outcome.files_before == 4 and outcome.after_snapshot_id is None
    assert reader.metadata_location(table_name) == location


def test_cost_ceiling_waits_for_approval_then_runs_and_audits_the_approval(spark, lake_root, tmp_path, table_name):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"max_rewrite_bytes": 100}})
    simulate(spark, config, table_name, batches=4)
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    waiting = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert waiting.decision == "defer" and "awaiting approval" in waiting.reason
    assert f"icemaint approve {table_name} --date {DATE}" in waiting.reason
    assert reader.metadata_location(table_name) == location

    approved = compactor(config, spark).run(CompactionRequest(table_name, DATE, approved=True))
    assert approved.decision == "run" and approved.validation["passed"] is True
    records = open_audit(config).records(table=table_name)
    assert [r.decision for r in records] == ["defer", "approved", "run"]
    assert records[1].identity == config.identity() and records[1].operation == "approve"


def test_read_only_table_refuses_and_changes_nothing(spark, lake_root, tmp_path, table_name):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"read_only": True}})
    simulate(spark, config, table_name, batches=4)
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "refuse" and "read-only" in outcome.reason
    assert reader.metadata_location(table_name) == location
    assert open_audit(config).records(table=table_name)[-1].decision == "refuse"


@pytest.mark.slow
@pytest.mark.parametrize("strategy, sort_order", [("sort", "device_id ASC NULLS LAST, event_id DESC"),
                                                  ("zorder", "device_id, event_id")])
def test_sort_and_zorder_strategies_rewrite_with_proof(spark, lake_root, tmp_path, table_name, strategy, sort_order):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={table_name: {"strategy": strategy, "sort_order": sort_order}})
    writer = simulate(spark, config, table_name, batches=4)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "run" and outcome.validation["passed"] is True
    assert outcome.files_after == 1
    assert set(ids(spark, config, table_name)) == writer.ledger.expected_ids()
    if strategy == "sort":
        sql = TableName.parse(table_name).sql(config.catalog.name)
        path = spark.sql(f"SELECT file_path FROM {sql}.files WHERE partition.ts_day = DATE '{DATE}' AND content = 0").first()[0]
        devices = [r.device_id for r in spark.read.parquet(path).select("device_id").collect()]
        assert devices == sorted(devices), "the rewritten file is sorted by the policy's sort order"


def test_a_proof_that_cannot_run_rolls_the_rewrite_back(spark, config, table_name, monkeypatch):
    """Fault injection into our own validation step (e.g. GX crashing): an unproven rewrite is undone."""
    import icemaint.validation

    writer = simulate(spark, config, table_name, batches=4)
    before = current(spark, config, table_name)

    def crashing_validation(*args, **kwargs):
        raise RuntimeError("injected: the validation engine crashed")

    monkeypatch.setattr(icemaint.validation, "validate_rewrite", crashing_validation)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.validation["passed"] is False and "injected" in outcome.validation["error"]
    assert outcome.rolled_back is True and outcome.rollback["parity"] is True
    assert current(spark, config, table_name) == before
    assert set(ids(spark, config, table_name)) == writer.ledger.expected_ids()
    assert CatalogReader(config).health(table_name).partition(DATE).data_files == 4


def test_read_only_refuses_even_while_a_writer_holds_the_claim(spark, lake_root, tmp_path, table_name):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"read_only": True}})
    simulate(spark, config, table_name, batches=3)
    with table_claim(config, table_name, holder="ingest"):
        outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "refuse" and "read-only" in outcome.reason
