"""Safe compaction on real Spark + Iceberg: the rows it keeps, a failed proof that publishes nothing,
claims, publish conflicts, bad input."""

import threading
import time
import uuid

import pytest

from icemaint.safety.audit import open_audit
from icemaint.safety.claims import ClaimBusy, open_claims, table_claim
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.observe.catalog import CatalogReader, TableNotFound
from icemaint.domain.names import InvalidTableName, TableName
from icemaint.domain.scope import InvalidDate
from conftest import streaming_table
from icemaint.engine.validation import full_row_hash
from staged_faults import corrupt_long, main_lineage, uncompressed
from own_statements import own_statements

DATE = "2026-01-02"


def simulate(spark, config, table, batches=3, **spec):
    """A streaming table of `batches` commits: the default three leave three small files on each date (the test
    config's min_input_files) and the writer's first merge-on-read delete (two of its rows on DATE)."""
    return streaming_table(spark, config.catalog.name, table, batches=batches, **spec)


def compactor(config, spark, **kwargs):
    return Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config), **kwargs)


def data_files(spark, config, table, date=None):
    sql = TableName.parse(table).sql(config.catalog.name)
    where = f" WHERE partition.ts_day = DATE '{date}'" if date else ""
    with own_statements(spark):
        return {(r.file_path, r.content) for r in spark.sql(f"SELECT file_path, content FROM {sql}.files{where}").collect()}


def current(spark, config, table):
    return CatalogReader(config).load(table).current_snapshot().snapshot_id


def ids(spark, config, table):
    with own_statements(spark):
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
    assert outcome.validation.passed is True
    assert outcome.before_snapshot_id == before_snapshot
    assert outcome.files_before == 3 and outcome.files_after < config.policy(table_name).min_input_files
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
    assert outcome.rewritten_files == 3 and outcome.rewritten_bytes > 0
    assert outcome.read_before.rows == outcome.read_after.rows > 0
    record = open_audit(config).records(table=table_name, operation="compact")[-1]
    assert record.decision == "run" and record.after_snapshot_id == after_snapshot
    assert record.validation["passed"] is True and record.identity == config.identity()


def test_after_a_failed_proof_automation_holds_the_date_and_a_person_may_run_it(spark, config, table_name):
    """A failed proof is not retried by a sensor's or a tick's run (each retry would rewrite the date again, to the
    same end): the run defers naming the failed run and the approval that lifts the hold, main untouched. A
    person's own `icemaint compact` is their decision and runs."""
    from icemaint.safety.audit import AuditRecord

    writer = simulate(spark, config, table_name)
    before = current(spark, config, table_name)
    open_audit(config).append(AuditRecord(table=table_name, operation="compact", decision="not_published", date=DATE,
                                          trigger="sensor", run_id="run-1", reason="proof failed: aggregates differ"))
    held = compactor(config, spark).run(CompactionRequest(table_name, DATE, trigger="sensor", run_id="run-2"))
    assert held.decision == "defer" and held.reason.startswith("held: run run-1 at "), held.reason
    assert f"icemaint approve {table_name} --date {DATE}" in held.reason
    assert current(spark, config, table_name) == before
    done = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert done.decision == "run" and done.published, done.reason
    assert sorted(ids(spark, config, table_name)) == sorted(writer.ledger.expected_ids())
    again = compactor(config, spark).run(CompactionRequest(table_name, DATE, trigger="sensor", run_id="run-3"))
    assert "held" not in again.reason  # its publish ended the hold


def test_failed_proof_publishes_nothing_and_keeps_a_writer_append(spark, config, table_name):
    writer = simulate(spark, config, table_name)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    uncompressed(spark, sql)
    victim = spark.sql(f"SELECT event_id FROM {sql} WHERE ts >= TIMESTAMP '{DATE} 00:00:00' "
                       f"AND ts < TIMESTAMP '{DATE} 23:59:59' ORDER BY event_id LIMIT 1").first()[0]
    before_snapshot = current(spark, config, table_name)
    seen = []

    def corrupt_then_writer_appends(staged):
        # a bad writer (or bad memory) changed one value in the staged file...
        seen.append(staged)
        assert corrupt_long(staged.new_files, victim, 77_000_001) >= 1
        # ...and a writer that does not take the claim commits before the proof
        spark.sql(f"INSERT INTO {sql} VALUES (990001, 1, TIMESTAMP '{DATE} 12:00:00', 1.5, 'late'), "
                  f"(990002, 2, TIMESTAMP '2026-01-03 12:00:00', 2.5, 'late')")

    outcome = compactor(config, spark, after_stage=corrupt_then_writer_appends).run(CompactionRequest(table_name, DATE))

    assert outcome.decision == "not_published" and outcome.published is False
    assert f"snapshot {before_snapshot}" in outcome.reason and "nothing was published" in outcome.reason
    failed = {c["name"] for r in outcome.to_dict()["validation"]["commits"] for c in r["checks"] if not c["passed"]}
    assert "column_aggregates" in failed  # the changed row is in the 5% sample only by chance
    # main moved only forward, by the writer's append; the staged snapshot never reached it
    lineage = main_lineage(spark, sql)
    assert lineage[0]["parent_id"] == before_snapshot and lineage[0]["operation"] == "append"
    assert seen[0].staged_snapshot_id not in {s["snapshot_id"] for s in lineage}
    # every snapshot of main in one Spark job (a job each cost 0.1-0.2 CPU-s, and main has about ten)
    with own_statements(spark):
        corrupted = spark.sql(" UNION ALL ".join(
            f"SELECT {int(snap['snapshot_id'])} AS snapshot_id, count(*) AS n FROM {sql} "
            f"VERSION AS OF {int(snap['snapshot_id'])} WHERE event_id = 77000001" for snap in lineage)).collect()
    assert len(corrupted) == len(lineage) and not [r for r in corrupted if r["n"]], "a corrupted value reached main"
    rows = ids(spark, config, table_name)
    assert sorted(rows) == sorted(writer.ledger.expected_ids() | {990001, 990002})
    assert spark.sql(f"SELECT count(*) FROM {sql}.refs WHERE name LIKE 'icemaint_stage_%'").first()[0] == 0
    records = open_audit(config).records(table=table_name, operation="compact")
    assert records[-1].decision == "not_published" and records[-1].validation["passed"] is False
    assert records[-1].details["staged"][0]["verdict"] == "not_published"


def test_writer_appending_during_compaction_loses_and_duplicates_nothing(spark, config, table_name):
    writer = simulate(spark, config, table_name)
    writer.claim_factory = lambda: table_claim(config, table_name, holder="ingest", wait_seconds=120)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    errors, stop, appended = [], threading.Event(), threading.Condition()
    appends = [0]

    def count_append(batch, kind):
        if kind == "append":
            with appended:
                appends[0] += 1
                appended.notify_all()

    def await_append(after):
        # The writer's commit, not a sleep, orders it against a compaction: on a slow machine the
        # writer's first batch can take longer than both compactions, which would then win its claim.
        with appended:
            assert appended.wait_for(lambda: appends[0] > after or errors, timeout=600), \
                "the writer committed nothing within 600 s"

    writer.on_commit = count_append

    def keep_writing():
        try:  # until both compactions are done (bounded), so that they surely overlap the writer
            writer.run(60, interval_seconds=0.3, stop=stop)
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    started_at = current(spark, config, table_name)
    thread = threading.Thread(target=keep_writing)
    thread.start()
    outcomes = []
    try:
        seen = 0
        for date in ("2026-01-01", DATE):
            await_append(seen)  # one before the first compaction, and one after the first publish
            # as the sensor would on its next ticks: a busy claim defers, a later attempt runs
            for _ in range(200):
                outcome = compactor(config, spark).run(CompactionRequest(table_name, date))
                outcomes.append(outcome)
                if outcome.decision != "defer":
                    break
                assert "claim busy" in outcome.reason and "ingest" in outcome.reason
                time.sleep(0.05)
            with appended:
                seen = appends[0]
    finally:
        stop.set()
        thread.join(timeout=300)
    assert not errors
    for outcome in outcomes:
        assert outcome.decision in ("run", "defer"), outcome.reason
        if outcome.decision == "run":
            assert outcome.validation.passed is True
    published = [o.after_snapshot_id for o in outcomes if o.decision == "run"]
    assert len(published) == 2
    # overlap, from main's own history: the writer, running throughout, committed both after it
    # started and before the first publish, and after the first publish
    operations = [(s["snapshot_id"], s["operation"]) for s in reversed(main_lineage(spark, sql))]
    order = [sid for sid, _ in operations]
    before = operations[order.index(started_at) + 1:order.index(published[0])]
    after = operations[order.index(published[0]) + 1:]
    assert any(op == "append" for _, op in before) and any(op == "append" for _, op in after), \
        f"the compactions did not overlap the writer: {operations}"
    rows = ids(spark, config, table_name)
    assert len(rows) == len(set(rows)), "duplicated rows"
    assert set(rows) == writer.ledger.expected_ids(), "lost or extra rows"


def test_held_claim_defers_naming_the_holder_and_changes_nothing(spark, config, untouched):
    reader = CatalogReader(config)
    location = reader.metadata_location(untouched.key)
    with table_claim(config, untouched.key, holder="nightly-ingest"):
        outcome = compactor(config, spark).run(CompactionRequest(untouched.key, DATE))
        with pytest.raises(ClaimBusy, match="nightly-ingest"):
            open_claims(config).acquire(untouched.key, "someone-else")
    assert outcome.decision == "defer"
    assert "nightly-ingest" in outcome.reason
    assert reader.metadata_location(untouched.key) == location
    assert open_audit(config).records(table=untouched.key)[-1].decision == "defer"


def test_stale_plan_is_replanned_on_the_current_snapshot(spark, config, table_name):
    simulate(spark, config, table_name)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    planned = current(spark, config, table_name)
    spark.sql(f"INSERT INTO {sql} VALUES (880001, 1, TIMESTAMP '{DATE} 08:00:00', 0.5, 'moved')")
    moved = current(spark, config, table_name)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE, planned_snapshot_id=planned))
    assert outcome.replanned and "stale plan" in outcome.replanned
    assert outcome.decision == "run" and outcome.before_snapshot_id == moved
    assert outcome.validation.passed is True
    assert 880001 in ids(spark, config, table_name)


def test_publish_conflicts_are_replanned_then_deferred(spark, lake_root, tmp_path, table_name):
    """A writer's conflicting commit is planned again; one retry (the table's `max_commit_retries`: every
    attempt stages and proves a rewrite again) shows both the re-plan and the defer when conflicts go on."""
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"max_commit_retries": 1}})
    writer = simulate(spark, config, table_name)
    sql = TableName.parse(table_name).sql(config.catalog.name)
    deleted = []

    def writer_deletes_a_row_of_the_date(staged, times):
        # a claim-ignoring writer's merge-on-read DELETE on a file the rewrite replaces
        if len(deleted) < times:
            victim = spark.sql(f"SELECT event_id FROM {sql} WHERE ts >= TIMESTAMP '{staged_date[0]} 00:00:00' "
                               f"AND ts < TIMESTAMP '{staged_date[0]} 23:59:59' ORDER BY event_id LIMIT 1").first()[0]
            spark.sql(f"DELETE FROM {sql} WHERE event_id = {int(victim)}")
            deleted.append(victim)

    staged_date = [DATE]
    outcome = compactor(config, spark, sleep=lambda s: None,
                        after_stage=lambda staged: writer_deletes_a_row_of_the_date(staged, 1)).run(
        CompactionRequest(table_name, DATE))
    assert outcome.decision == "run" and outcome.attempts == 2 and outcome.validation.passed is True
    assert "publish conflict" in outcome.replanned
    assert set(ids(spark, config, table_name)) == writer.ledger.expected_ids() - set(deleted)

    staged_date[0] = "2026-01-03"
    before = current(spark, config, table_name)
    first_deleted = set(deleted)
    deleted.clear()
    retries = config.policy(table_name).max_commit_retries
    assert retries == 1
    outcome = compactor(config, spark, sleep=lambda s: None,
                        after_stage=lambda staged: writer_deletes_a_row_of_the_date(staged, 99)).run(
        CompactionRequest(table_name, "2026-01-03"))
    assert outcome.decision == "defer" and "conflicts with the rewrite" in outcome.reason
    assert outcome.attempts == retries + 1 and len(deleted) == retries + 1
    # main holds the writer's deletes and nothing of ours
    lineage = main_lineage(spark, sql)
    new = lineage[:lineage.index(next(s for s in lineage if s["snapshot_id"] == before))]
    assert len(new) == retries + 1 and all(s["operation"] in ("delete", "overwrite") for s in new)
    assert set(ids(spark, config, table_name)) == writer.ledger.expected_ids() - set(deleted) - first_deleted


@pytest.fixture(scope="module")
def untouched(spark, config):
    """One table for the tests whose subject is that nothing is changed: each compares the table's metadata
    location (or, where a run stages and then discards a rewrite, main's snapshot) before and after its own
    refused, deferred, dry or interrupted run, so a run that did change it fails there."""
    from types import SimpleNamespace

    name = f"t.untouched_{uuid.uuid4().hex[:8]}"
    writer = simulate(spark, config, name)
    return SimpleNamespace(key=name, expected=writer.ledger.expected_ids())


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
def test_bad_input_is_refused_and_mutates_nothing(spark, config, untouched, table, date, error):
    reader = CatalogReader(config)
    location = reader.metadata_location(untouched.key)
    with pytest.raises(error):
        compactor(config, spark).run(CompactionRequest(table or untouched.key, date))
    assert reader.metadata_location(untouched.key) == location


def test_dry_run_changes_nothing(spark, config, untouched):
    reader = CatalogReader(config)
    location = reader.metadata_location(untouched.key)
    outcome = compactor(config, spark).run(CompactionRequest(untouched.key, DATE, dry_run=True))
    assert outcome.decision == "run" and outcome.dry_run and "dry-run" in outcome.reason
    assert outcome.files_before == 3 and outcome.after_snapshot_id is None
    assert reader.metadata_location(untouched.key) == location


def test_cost_ceiling_waits_for_approval_then_runs_and_audits_the_approval(spark, lake_root, tmp_path, table_name):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"max_rewrite_bytes": 100}})
    simulate(spark, config, table_name)
    reader = CatalogReader(config)
    location = reader.metadata_location(table_name)
    waiting = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert waiting.decision == "defer" and "awaiting approval" in waiting.reason
    assert f"icemaint approve {table_name} --date {DATE}" in waiting.reason
    assert reader.metadata_location(table_name) == location

    approved = compactor(config, spark).run(CompactionRequest(table_name, DATE, approved=True))
    assert approved.decision == "run" and approved.validation.passed is True
    records = open_audit(config).records(table=table_name)
    assert [r.decision for r in records] == ["defer", "approved", "run"]
    assert records[1].identity == config.identity() and records[1].operation == "approve"


def test_the_approval_its_own_reason_names_is_honoured_by_the_next_run(spark, lake_root, tmp_path, table_name):
    """`icemaint approve TABLE --date D`, as the awaiting-approval reason says, lets the next plain run go (once)."""
    from conftest import make_config
    from icemaint.safety.approvals import approve

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"max_rewrite_bytes": 100}})
    writer = simulate(spark, config, table_name)
    assert compactor(config, spark).run(CompactionRequest(table_name, DATE)).decision == "defer"
    approve(config, open_audit(config), table_name, DATE, "one-off backfill")
    approved = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert approved.decision == "run" and approved.validation.passed is True, approved.reason
    assert set(ids(spark, config, table_name)) == writer.ledger.expected_ids()
    writer.run(2)  # the approval was used up by that run: new files over the ceiling (three with its own) wait again
    again = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert again.decision == "defer" and "awaiting approval" in again.reason


def test_read_only_table_refuses_and_changes_nothing(spark, lake_root, tmp_path, untouched):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={untouched.key: {"read_only": True}})
    reader = CatalogReader(config)
    location = reader.metadata_location(untouched.key)
    outcome = compactor(config, spark).run(CompactionRequest(untouched.key, DATE))
    assert outcome.decision == "refuse" and "read-only" in outcome.reason
    assert reader.metadata_location(untouched.key) == location
    assert open_audit(config).records(table=untouched.key)[-1].decision == "refuse"


@pytest.mark.slow
@pytest.mark.parametrize("strategy, sort_order", [("sort", "device_id ASC NULLS LAST, event_id DESC"),
                                                  ("zorder", "device_id, event_id")])
def test_sort_and_zorder_strategies_rewrite_with_proof(spark, lake_root, tmp_path, table_name, strategy, sort_order):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={table_name: {"strategy": strategy, "sort_order": sort_order}})
    writer = simulate(spark, config, table_name)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "run" and outcome.validation.passed is True
    assert outcome.files_after == 1
    assert set(ids(spark, config, table_name)) == writer.ledger.expected_ids()
    if strategy == "sort":
        sql = TableName.parse(table_name).sql(config.catalog.name)
        path = spark.sql(f"SELECT file_path FROM {sql}.files WHERE partition.ts_day = DATE '{DATE}' AND content = 0").first()[0]
        devices = [r.device_id for r in spark.read.parquet(path).select("device_id").collect()]
        assert devices == sorted(devices), "the rewritten file is sorted by the policy's sort order"


def test_zorder_over_a_column_with_nan_infinities_and_the_widest_range_keeps_every_row(spark, lake_root, tmp_path,
                                                                                        table_name):
    """The z-order scales each column by its finite range (min and max as wide as the doubles, max - min overflows);
    NaN and the infinities in the data neither break the order's SQL nor the proof."""
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={table_name: {"strategy": "zorder", "sort_order": "zorder(id, d)"}})
    sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP, d DOUBLE) USING iceberg PARTITIONED BY (days(ts))")
    values = ["1.0D", "-1.7976931348623157E308D", "1.7976931348623157E308D", "CAST('NaN' AS DOUBLE)",
              "CAST('Infinity' AS DOUBLE)", "CAST('-Infinity' AS DOUBLE)", "NULL", "-0.0D", "0.0D"]
    rows = ", ".join(f"({i}L, TIMESTAMP '{DATE} 0{i}:00:00', {value})" for i, value in enumerate(values))
    # three small files (min_input_files) in one commit: a round-robin split of three rows each, kept by the write
    (spark.sql(f"SELECT * FROM VALUES {rows} AS v(id, ts, d)").repartition(3).writeTo(sql)
     .option("distribution-mode", "none").append())
    before = full_row_hash(spark, sql, current(spark, config, table_name))
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "run" and outcome.validation.passed is True, outcome.reason
    assert outcome.files_after == 1
    assert full_row_hash(spark, sql, current(spark, config, table_name)) == before
    assert len(CatalogReader(config).load(table_name).scan().to_arrow()) == len(values)


def test_a_sort_order_naming_no_column_is_refused_before_any_run(spark, lake_root, tmp_path, untouched):
    """The policy's sort order is checked against the table's schema when deciding: refused, said why, nothing
    read or written (it used to fail a run at every tick)."""
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={untouched.key: {"strategy": "sort", "sort_order": "no_such_column DESC"}})
    location = CatalogReader(config).metadata_location(untouched.key)
    outcome = compactor(config, spark).run(CompactionRequest(untouched.key, DATE))
    assert outcome.decision == "refuse" and "'no_such_column' is not a column of the table" in outcome.reason, outcome
    assert open_audit(config).records(table=untouched.key)[-1].decision == "refuse"
    tbl = CatalogReader(config).load(untouched.key)
    assert tbl.metadata_location == location and set(tbl.metadata.refs) == {"main"}
    assert set(ids(spark, config, untouched.key)) == untouched.expected


def test_a_sort_the_rows_cannot_take_fails_before_the_staging_branch(spark, lake_root, tmp_path, untouched,
                                                                      monkeypatch):
    """Planning the rows to write (read, digest, order) comes before the branch: a failure there (injected: an
    ORDER BY Spark cannot resolve) leaves the table's metadata as it was, no branch behind."""
    import icemaint.engine.relayout
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={untouched.key: {"strategy": "sort", "sort_order": "event_id"}})
    location = CatalogReader(config).metadata_location(untouched.key)
    monkeypatch.setattr(icemaint.engine.relayout, "order_by_sql", lambda keys: "`no_such_column` ASC")
    with pytest.raises(Exception, match="no_such_column"):
        compactor(config, spark).run(CompactionRequest(untouched.key, DATE))
    assert open_audit(config).records(table=untouched.key)[-1].decision == "failed"
    tbl = CatalogReader(config).load(untouched.key)
    assert tbl.metadata_location == location and set(tbl.metadata.refs) == {"main"}
    assert set(ids(spark, config, untouched.key)) == untouched.expected


def test_a_proof_that_cannot_run_publishes_nothing(spark, config, untouched, monkeypatch):
    """Fault injection into our own validation step (e.g. GX crashing): an unproven rewrite never reaches main."""
    import icemaint.engine.validation

    table_name = untouched.key
    before = current(spark, config, table_name)

    def crashing_validation(*args, **kwargs):
        raise RuntimeError("injected: the validation engine crashed")

    monkeypatch.setattr(icemaint.engine.validation, "prove_rows", crashing_validation)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "not_published" and outcome.validation.passed is False
    assert "injected" in outcome.to_dict()["validation"]["commits"][0]["error"] and "injected" in outcome.reason
    assert current(spark, config, table_name) == before
    assert set(ids(spark, config, table_name)) == untouched.expected
    assert CatalogReader(config).health(table_name).partition(DATE).data_files == 3


def test_read_only_refuses_even_while_a_writer_holds_the_claim(spark, lake_root, tmp_path, untouched):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={untouched.key: {"read_only": True}})
    with table_claim(config, untouched.key, holder="ingest"):
        outcome = compactor(config, spark).run(CompactionRequest(untouched.key, DATE))
    assert outcome.decision == "refuse" and "read-only" in outcome.reason


# -- who launched the run: a person waits for the claim, a sensor defers ------------------------------

def test_a_run_a_person_launched_waits_for_the_claim_then_runs(spark, lake_root, tmp_path, table_name):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"claim_wait": "30s"}})
    writer = simulate(spark, config, table_name)
    held, messages = threading.Event(), []

    def writer_holds_the_claim_for_a_while():
        with table_claim(config, table_name, holder="ingest"):
            held.set()
            time.sleep(3)

    thread = threading.Thread(target=writer_holds_the_claim_for_a_while)
    thread.start()
    held.wait(10)
    outcome = compactor(config, spark, progress=messages.append).run(CompactionRequest(table_name, DATE, trigger="cli"))
    thread.join()
    assert outcome.decision == "run" and outcome.published, outcome.reason
    assert any("claim held by ingest; waiting" in m for m in messages), messages
    assert set(ids(spark, config, table_name)) == writer.ledger.expected_ids()


@pytest.mark.parametrize("trigger, wait, reason", [
    ("sensor", "30s", "claim busy: held by nightly-ingest"),            # automatic: the next tick decides again
    ("manual", "2s", "claim busy after waiting 2s (claim_wait): held by nightly-ingest"),
])
def test_a_claim_busy_beyond_the_wait_defers_naming_the_holder(spark, lake_root, tmp_path, untouched, trigger, wait,
                                                                reason):
    from conftest import make_config

    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={untouched.key: {"claim_wait": wait}})
    location = CatalogReader(config).metadata_location(untouched.key)
    slept = []
    with table_claim(config, untouched.key, holder="nightly-ingest"):
        outcome = compactor(config, spark, sleep=slept.append).run(CompactionRequest(untouched.key, DATE,
                                                                                     trigger=trigger))
    assert outcome.decision == "defer" and outcome.reason == reason
    # a sensor's run does not wait at all; a person's waits out the whole claim_wait
    assert sum(slept) == (0 if trigger == "sensor" else 2.0) and bool(slept) == (trigger != "sensor")
    assert CatalogReader(config).metadata_location(untouched.key) == location


def test_a_run_interrupted_in_the_middle_of_a_java_call_still_removes_the_staging_branch(spark, config, untouched,
                                                                                       monkeypatch):
    """A run's termination (Dagster's interrupt, raised where the run is: here inside a Py4J call waiting for the JVM,
    in the proof) ends the run; the staging branch is removed over a fresh connection (Py4J drops its connection
    only for a KeyboardInterrupt: the interrupted call's answer was left unread on it and read by the clean-up,
    "KeyError: 'm'", the branch left), main is as the writer left it, and the session works on."""
    import os
    import signal

    from dagster._core.errors import DagsterExecutionInterruptedError

    import icemaint.engine.validation

    table_name = untouched.key
    before = current(spark, config, table_name)

    def interrupted_proof(*args, **kwargs):
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        spark._jvm.java.lang.Thread.sleep(3000)  # the interrupt arrives while Python waits for this answer
        raise AssertionError("the interrupt did not arrive")

    def dagster_like(signum, frame):  # what Dagster's handler does inside a run
        raise DagsterExecutionInterruptedError()

    monkeypatch.setattr(icemaint.engine.validation, "prove_rows", interrupted_proof)
    previous = signal.signal(signal.SIGINT, dagster_like)
    try:
        with pytest.raises(DagsterExecutionInterruptedError):
            compactor(config, spark).run(CompactionRequest(table_name, DATE))
    finally:
        signal.signal(signal.SIGINT, previous)
    tbl = CatalogReader(config).load(table_name)
    assert set(tbl.metadata.refs) == {"main"}, tbl.metadata.refs
    assert current(spark, config, table_name) == before
    assert set(ids(spark, config, table_name)) == untouched.expected
    assert spark.sql("SELECT 41 + 1").first()[0] == 42


def test_a_run_interrupted_right_after_its_publish_records_what_landed(spark, config, table_name, monkeypatch):
    """An interrupt that lands after the publish commit: the call's audit record says interrupted, names the snapshot
    it committed and main's move (it said only 'interrupted', with no snapshot), main keeps the proven rewrite and
    every row, and the next run's cleanup of the branch says the rewrite was published, not that main never moved."""
    from icemaint.engine.staging import StagingArea
    from icemaint.safety import interrupts

    writer = simulate(spark, config, table_name)
    before = current(spark, config, table_name)
    real_publish = StagingArea.publish

    def publish_then_interrupt(self, staged, properties, **kwargs):
        real_publish(self, staged, properties, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(StagingArea, "publish", publish_then_interrupt)
    monkeypatch.setattr(StagingArea, "discard", lambda self, branch: None)  # as a kill before the removal
    with pytest.raises(KeyboardInterrupt):
        compactor(config, spark).run(CompactionRequest(table_name, DATE))
    monkeypatch.undo()
    published = current(spark, config, table_name)
    assert published != before and set(ids(spark, config, table_name)) == writer.ledger.expected_ids()
    [record] = [r for r in open_audit(config).records(table=table_name, operation="compact")
                if r.decision == "interrupted"]
    assert record.after_snapshot_id == published, record
    assert f"after committing snapshot {published}" in record.reason, record.reason
    assert f"main moved from snapshot {before} to {published}" in record.reason, record.reason

    # the publish removed the staging branch in its own metadata commit: an interrupt after it strands no branch
    table = CatalogReader(config).load(table_name)
    assert set(table.metadata.refs) == {"main"}, table.metadata.refs
    # a branch stranded the way earlier versions could (a kill between the publish and the branch's removal, then a
    # commit of its own) is named as published by the next run's cleanup
    from icemaint.domain.health import STAGE_PREFIX
    from icemaint.engine.staging import STAGED_SNAPSHOT_KEY

    staged_id = int(table.snapshot_by_id(published).summary.additional_properties[STAGED_SNAPSHOT_KEY])
    spark.sql(f"ALTER TABLE lake.{table_name} CREATE BRANCH `{STAGE_PREFIX}stranded_0` AS OF VERSION {staged_id}")
    interrupts.reset()  # the next run is the next command's (in this one the interrupt stops every later run)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    [cleanup] = open_audit(config).records(table=table_name, operation="cleanup")
    assert f"its rewrite is on main as snapshot {published}" in cleanup.reason, cleanup.reason
    assert "never changed" not in cleanup.reason and cleanup.details["published_snapshot_id"] == published
    assert outcome.cleaned_staging and set(CatalogReader(config).load(table_name).metadata.refs) == {"main"}
    assert set(ids(spark, config, table_name)) == writer.ledger.expected_ids()


def test_a_ctrl_c_whose_exception_was_swallowed_still_stops_the_run_before_its_publish(spark, config, untouched,
                                                                                       monkeypatch):
    """Python drops an interrupt raised inside a finalizer ("Exception ignored in ..."): the run went on, published
    and exited 0. The signal itself is seen on the wakeup pipe the CLI installs, and the run stops at its next step
    boundary: before the publish, main as the writer left it, no branch, the call recorded as interrupted."""
    import os
    import signal

    from icemaint.engine.staging import StagingArea
    from icemaint.safety import interrupts

    table_name = untouched.key
    before = current(spark, config, table_name)
    assert interrupts.install()
    interrupts.requested()  # nothing pending from earlier tests

    def ctrl_c_lost_then_publish(self, staged, properties, **kwargs):
        raise AssertionError("published after the operator's Ctrl-C")

    def swallowed(signum, frame):  # as a KeyboardInterrupt raised in a finalizer ends: printed and dropped
        pass

    real_stage = StagingArea.stage

    def stage_then_ctrl_c(self, *args, **kwargs):
        staged = real_stage(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return staged

    monkeypatch.setattr(StagingArea, "stage", stage_then_ctrl_c)
    monkeypatch.setattr(StagingArea, "publish", ctrl_c_lost_then_publish)
    previous = signal.signal(signal.SIGINT, swallowed)
    try:
        with pytest.raises(interrupts.InterruptLost):
            compactor(config, spark).run(CompactionRequest(table_name, DATE))
    finally:
        signal.signal(signal.SIGINT, previous)
        monkeypatch.undo()
    assert not interrupts.requested()  # acted upon once
    assert current(spark, config, table_name) == before
    assert set(CatalogReader(config).load(table_name).metadata.refs) == {"main"}
    assert set(ids(spark, config, table_name)) == untouched.expected
    [record] = open_audit(config).records(table=table_name, operation="compact")[-1:]
    assert record.decision == "interrupted" and "InterruptLost" in record.reason, record
