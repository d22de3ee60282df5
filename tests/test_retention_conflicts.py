"""Expiry and manifest rewrites under writers that ignore the table's claim: a conflict is planned again
with backoff up to `max_commit_retries`, then deferred with its reason; an unknown commit state is
settled by re-reading the table. Never a failed run, never a lost row, never `main` moved backwards.

The claimless writer commits through a second catalog instance (`lake_other`, same warehouse, its own
table cache) in the same SparkSession, as another engine or process would. The forced conflicts land
through the `before_commit` seam: after the operation planned on snapshot S and before its commit.
Rows are counted by an independent reader (pyiceberg on the current metadata file).
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
from py4j.protocol import Py4JJavaError

from conftest import make_config, streaming_table
from icemaint.app.simulator import SimulatorError, StreamingWriter, delete_sql
from icemaint.domain.names import TableName
from icemaint.engine.manifests import rewrite_manifests
from icemaint.engine.retention import COMMIT_TOKEN_KEY, read_snapshots
from icemaint.engine.spark_session import iceberg_table
from icemaint.engine.java import java_exception_class
from icemaint.engine.staging import RUN_ID_KEY
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.expiry import ExpiryRequest
from icemaint.operations.housekeeping import Housekeeper
from icemaint.operations.manifests import ManifestRequest
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims

OTHER = "lake_other"
ICEBERG_EXCEPTIONS = "org.apache.iceberg.exceptions."


@pytest.fixture(scope="module")
def other_catalog(spark, config) -> str:
    """A second Iceberg catalog instance on the session's warehouse: the claimless writer's."""
    for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "hadoop",
                       ".warehouse": config.catalog.warehouse}.items():
        spark.conf.set(f"spark.sql.catalog.{OTHER}{key}", value)
    return OTHER


@pytest.fixture
def own_config(lake_root, tmp_path):
    def build(**policy):  # merged over the test estate's defaults
        return make_config(lake_root, state_dir=str(tmp_path / "state"), defaults=policy)
    return build


def housekeeper(config, spark, **kwargs) -> Housekeeper:
    return Housekeeper(config, spark, CatalogReader(config), open_claims(config), open_audit(config), **kwargs)


def simulate(spark, config, table, batches=4):
    """A streaming table whose deletes are copy-on-write: a delete rewrites data files and their manifests."""
    writer = streaming_table(spark, config.catalog.name, table, batches=batches, days=2, rows_per_day=10,
                             delete_every=0)
    spark.sql(f"ALTER TABLE {TableName.parse(table).sql(config.catalog.name)} "
              "SET TBLPROPERTIES ('write.delete.mode'='copy-on-write')")
    return writer


def claimless(spark, writer: StreamingWriter, catalog: str, delete_every: int = 0) -> StreamingWriter:
    """The same table and ledger, written through the other catalog and without the claim."""
    spec = dataclasses.replace(writer.spec, delete_every=delete_every, deletes_per_batch=2)
    return StreamingWriter(spark, catalog, spec, ledger=writer.ledger)


def commit_a_batch(other: StreamingWriter, delete_oldest: bool = True) -> None:
    """The claimless writer appends a batch, then deletes the two oldest live rows (copy-on-write: the
    files of the first batch, and the manifest listing them, are replaced)."""
    other.spark.sql(f"REFRESH TABLE {other.table_sql}")  # another process sees the table as it is now
    result = other.write_batch()
    if delete_oldest:
        ids = sorted(other.ledger.expected_ids())[:2]
        other.spark.sql(delete_sql(other.table_sql, ids))
        other.ledger.record_delete(result.batch, ids, None)


def ids_read_independently(config, table) -> list[int]:
    """The table's event ids read by pyiceberg from the current metadata file (no Spark, no cache)."""
    scan = CatalogReader(config).load(table).scan(selected_fields=("event_id",))
    return sorted(scan.to_arrow().column("event_id").to_pylist())


def lineage(spark, config, table) -> list[int]:
    """`main`'s snapshot ids, newest first, from the freshly re-read table."""
    jtable = iceberg_table(spark, config.catalog.name, TableName.parse(table))
    jtable.refresh()
    out, snap = [], jtable.currentSnapshot()
    while snap is not None:
        out.append(int(snap.snapshotId()))
        parent = snap.parentId()
        snap = jtable.snapshot(parent) if parent is not None else None
    return out


def snapshots_marked(spark, config, table, key, value) -> list[int]:
    sql = TableName.parse(table).sql(config.catalog.name)
    return [r[0] for r in spark.sql(f"SELECT snapshot_id, summary FROM {sql}.`snapshots`").collect()
            if r[1].get(key) == value]


def java_error(spark, name: str, message: str) -> Py4JJavaError:
    """A Py4J error carrying a real Iceberg Java exception of class `name` (only the raise point is simulated)."""
    jvm = spark._jvm
    cause = jvm.java.lang.RuntimeException(message)
    if name == "CommitStateUnknownException":
        java = jvm.org.apache.iceberg.exceptions.CommitStateUnknownException(cause)
    else:
        no_args = spark.sparkContext._gateway.new_array(jvm.java.lang.Object, 0)
        java = getattr(jvm.org.apache.iceberg.exceptions, name)(cause, message, no_args)
    error = Py4JJavaError(f"simulated {name}", java)
    assert java_exception_class(error) == ICEBERG_EXCEPTIONS + name
    return error


# -- manifests: a real conflict, forced between planning and commit ------------------------------

def test_a_conflicting_writer_commit_is_planned_again_and_the_rewrite_lands(spark, own_config, table_name,
                                                                           other_catalog):
    config = own_config(max_commit_retries=3, retry_backoff="1s")
    writer = simulate(spark, config, table_name)
    other = claimless(spark, writer, other_catalog)
    start = lineage(spark, config, table_name)[0]
    slept, calls = [], []

    def writer_commits_first(operation, attempt):
        calls.append((operation, attempt))
        if attempt == 1:  # a copy-on-write delete replaces a manifest the rewrite planned to replace
            commit_a_batch(other)

    outcome = housekeeper(config, spark, sleep=slept.append, before_commit=writer_commits_first).rewrite_manifests(
        ManifestRequest(table_name, force=True, run_id="conflict-then-run"))

    assert outcome.decision == "run", outcome.reason
    assert outcome.attempts == 2 and calls == [("manifests", 1), ("manifests", 2)]
    [conflict] = outcome.evidence["conflicts"]
    assert conflict.startswith("attempt 1: ValidationException: Deleted manifest") and "latest snapshot" in conflict
    assert slept == [1.0]  # retry_backoff, doubling from there
    assert "planned again after 1 conflict(s)" in outcome.reason
    ours = snapshots_marked(spark, config, table_name, RUN_ID_KEY, "conflict-then-run")
    assert ours == [outcome.after_snapshot_id]
    main = lineage(spark, config, table_name)
    assert main[0] == outcome.after_snapshot_id and start in main  # forward from where it started
    assert ids_read_independently(config, table_name) == sorted(writer.ledger.expected_ids())
    [record] = open_audit(config).records(table=table_name, operation="manifests")
    assert (record.decision, record.details["evidence"]["conflicts"]) == ("run", [conflict])


def test_a_writer_that_keeps_conflicting_defers_the_rewrite_and_changes_nothing(spark, own_config, table_name,
                                                                               other_catalog):
    config = own_config(max_commit_retries=2, retry_backoff="1s")
    writer = simulate(spark, config, table_name)
    other = claimless(spark, writer, other_catalog)
    start = lineage(spark, config, table_name)[0]
    slept = []

    outcome = housekeeper(config, spark, sleep=slept.append,
                          before_commit=lambda operation, attempt: commit_a_batch(other)).rewrite_manifests(
        ManifestRequest(table_name, force=True, run_id="always-conflicts"))

    assert outcome.decision == "defer", outcome.reason
    assert outcome.attempts == 3 and len(outcome.evidence["conflicts"]) == 3
    assert outcome.reason.startswith("a writer's commit conflicted with the manifest rewrite")
    assert "after 3 attempts (max_commit_retries 2)" in outcome.reason and "nothing changed" in outcome.reason
    assert slept == [1.0, 2.0]
    assert snapshots_marked(spark, config, table_name, RUN_ID_KEY, "always-conflicts") == []
    main = lineage(spark, config, table_name)
    # main moved only by the writer's three batches (an append and a delete each), forward from the start
    assert main.index(start) == 6
    sql = TableName.parse(table_name).sql(config.catalog.name)
    operations = {r[0]: r[1] for r in spark.sql(f"SELECT snapshot_id, operation FROM {sql}.`snapshots`").collect()}
    assert sorted(operations[s] for s in main[:6]) == ["append"] * 3 + ["overwrite"] * 3
    assert ids_read_independently(config, table_name) == sorted(writer.ledger.expected_ids())
    assert open_audit(config).records(table=table_name, operation="manifests")[-1].decision == "defer"


def test_an_unknown_commit_state_is_settled_by_reading_the_table(spark, own_config, table_name):
    config = own_config()
    writer = simulate(spark, config, table_name)
    name = TableName.parse(table_name)
    marker = {COMMIT_TOKEN_KEY: "token-landed", RUN_ID_KEY: "unknown-landed"}

    def commits_then_loses_the_answer():
        rewrite_manifests(spark, "lake", name, properties=marker)  # the commit lands ...
        raise java_error(spark, "CommitStateUnknownException", "simulated: the catalog did not answer")

    landed = rewrite_manifests(spark, "lake", name, properties=marker, before_commit=commits_then_loses_the_answer)
    assert landed.state_was_unknown and landed.snapshot_id == lineage(spark, config, table_name)[0]
    assert landed.rewritten_manifests == 4 and landed.added_manifests == 1
    assert snapshots_marked(spark, config, table_name, COMMIT_TOKEN_KEY, "token-landed") == [landed.snapshot_id]

    head = lineage(spark, config, table_name)[0]
    location = CatalogReader(config).metadata_location(table_name)

    def loses_the_answer(operation, attempt):
        raise java_error(spark, "CommitStateUnknownException", "simulated: the catalog did not answer")

    outcome = housekeeper(config, spark, before_commit=loses_the_answer).rewrite_manifests(
        ManifestRequest(table_name, force=True))
    assert outcome.decision == "defer" and outcome.attempts == 1, outcome.reason
    assert "could not confirm the manifest rewrite" in outcome.reason and "not retried" in outcome.reason
    assert lineage(spark, config, table_name)[0] == head
    assert CatalogReader(config).metadata_location(table_name) == location
    assert ids_read_independently(config, table_name) == sorted(writer.ledger.expected_ids())


# -- expiry --------------------------------------------------------------------------------------

def test_a_writer_commit_between_check_and_commit_expires_exactly_the_planned_snapshots(spark, own_config,
                                                                                       table_name, other_catalog):
    # Before the explicit snapshot ids this expired the planning moment's head too and failed the run
    # (ConcurrentExpiry).
    config = own_config()
    writer = simulate(spark, config, table_name, batches=4)
    other = claimless(spark, writer, other_catalog)
    head = lineage(spark, config, table_name)[0]

    outcome = housekeeper(config, spark,
                          before_commit=lambda operation, attempt: commit_a_batch(other, delete_oldest=False)).expire(
        ExpiryRequest(table_name, older_than_seconds=0, retain_last=1))

    assert outcome.decision == "run" and outcome.attempts == 1, outcome.reason
    planned = outcome.evidence["expiring_snapshot_ids"]
    assert len(planned) == 3 and outcome.evidence["expired_snapshot_ids"] == planned
    left = {s.snapshot_id for s in read_snapshots(spark, "lake", table_name)[0]}
    main = lineage(spark, config, table_name)
    assert main[1] == head and left == set(main[:2])  # the writer's batch on top of the planned-on head
    assert ids_read_independently(config, table_name) == sorted(writer.ledger.expected_ids())


@pytest.mark.parametrize("failing_attempts, decision", [(1, "run"), (99, "defer")])
def test_expiry_commit_conflicts_are_planned_again_then_deferred(spark, own_config, table_name, failing_attempts,
                                                                decision):
    config = own_config(max_commit_retries=1, retry_backoff="3s")
    writer = simulate(spark, config, table_name, batches=3)
    slept = []

    def catalog_refuses(operation, attempt):
        if attempt <= failing_attempts:
            raise java_error(spark, "CommitFailedException", f"simulated: version {attempt} already exists")

    outcome = housekeeper(config, spark, sleep=slept.append, before_commit=catalog_refuses).expire(
        ExpiryRequest(table_name, older_than_seconds=0))

    assert outcome.decision == decision, outcome.reason
    assert outcome.evidence["conflicts"][0] == "attempt 1: CommitFailedException: simulated: version 1 already exists"
    snapshots = read_snapshots(spark, "lake", table_name)[0]
    if decision == "run":
        assert outcome.attempts == 2 and slept == [3.0] and len(snapshots) == 1
    else:
        assert outcome.attempts == 2 and slept == [3.0] and len(snapshots) == 3
        assert "a writer's commit conflicted with the snapshot expiry" in outcome.reason
        assert "after 2 attempts (max_commit_retries 1)" in outcome.reason and "nothing changed" in outcome.reason
    assert ids_read_independently(config, table_name) == sorted(writer.ledger.expected_ids())


def test_expiry_with_an_unknown_commit_state_reads_the_table_to_decide(spark, own_config, table_name):
    config = own_config()
    writer = simulate(spark, config, table_name, batches=3)
    name = TableName.parse(table_name)

    def loses_the_answer(operation, attempt):
        raise java_error(spark, "CommitStateUnknownException", "simulated: no answer")

    deferred = housekeeper(config, spark, before_commit=loses_the_answer).expire(
        ExpiryRequest(table_name, older_than_seconds=0))
    assert deferred.decision == "defer" and "could not confirm the expiry" in deferred.reason
    assert len(read_snapshots(spark, "lake", table_name)[0]) == 3

    def expires_then_loses_the_answer(operation, attempt):
        iceberg_table(spark, "lake", name).expireSnapshots().expireOlderThan(2**62).retainLast(1) \
            .cleanExpiredFiles(False).commit()
        raise java_error(spark, "CommitStateUnknownException", "simulated: no answer")

    landed = housekeeper(config, spark, before_commit=expires_then_loses_the_answer).expire(
        ExpiryRequest(table_name, older_than_seconds=0))
    assert landed.decision == "run", landed.reason
    assert "could not confirm the commit, a re-read shows the planned snapshots gone" in landed.reason
    assert landed.metrics["snapshots_removed"] == 2 and landed.metrics["files_left_unreferenced"] > 0
    assert ids_read_independently(config, table_name) == sorted(writer.ledger.expected_ids())


# -- a real writer, running throughout ------------------------------------------------------------

class WriterThread:
    """Commits batches through the other catalog, without the claim, until stopped, a batch every `pause`
    seconds at most (a streaming job's trigger interval: without one the writer spends the suite's CPU on
    batches no assertion needs); its own failed commits (it meets ours too) are retried as a streaming job
    would, and counted."""

    def __init__(self, other: StreamingWriter, pause: float = 0.25):
        self.other, self.pause = other, pause
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.fatal: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.other.write_batch()
            except SimulatorError as exc:  # the ledger no longer matches the table: stop and fail the test
                self.fatal.append(exc)
                return
            except Exception as exc:  # a commit that did not land; the ledger only records what did
                self.failures.append(java_exception_class(exc) or type(exc).__name__)
            self.stop.wait(self.pause)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=300)


def appended_snapshots(ledger) -> list[int]:
    return [h["snapshot_id"] for h in ledger.history if h["kind"] == "append" and h["snapshot_id"] is not None]


def test_manifest_rewrites_under_a_claimless_writer_run_or_defer_and_lose_nothing(spark, own_config, table_name,
                                                                                 other_catalog):
    config = own_config(max_commit_retries=3)
    writer = simulate(spark, config, table_name)
    keeper = housekeeper(config, spark)
    heads, outcomes = [lineage(spark, config, table_name)[0]], []
    with WriterThread(claimless(spark, writer, other_catalog, delete_every=2)) as thread:
        for i in range(6):
            outcome = keeper.rewrite_manifests(ManifestRequest(table_name, force=True, trigger="sensor",
                                                               run_id=f"under-writer-{i}"))
            outcomes.append(outcome)
            heads.append(lineage(spark, config, table_name)[0])
    assert not thread.fatal and not thread.thread.is_alive()

    conflicts = sum(len(o.evidence.get("conflicts", [])) for o in outcomes)
    print(f"\nmanifests under a claimless writer: decisions {[str(o.decision) for o in outcomes]}, attempts "
          f"{[o.attempts for o in outcomes]}, conflicts {conflicts}, writer batches {writer.ledger.next_batch}, "
          f"writer's failed commits {thread.failures}, rows {writer.ledger.expected_count()}")
    # noop: a forced rewrite right after another, before the writer's next commit, found one manifest
    assert all(o.decision in ("run", "defer", "noop") for o in outcomes), [(o.decision, o.reason) for o in outcomes]
    assert any(o.decision == "run" for o in outcomes)
    for o in outcomes:
        if o.decision == "noop":
            assert "found nothing to merge" in o.reason
        if o.decision == "defer":
            assert "a writer's commit conflicted" in o.reason and "nothing changed" in o.reason
    assert writer.ledger.next_batch > 4  # the writer really ran alongside
    main = lineage(spark, config, table_name)
    # Never backwards: every head seen, every writer append and every rewrite is on the final lineage.
    assert set(heads) <= set(main)
    assert set(appended_snapshots(writer.ledger)) <= set(main)
    assert {o.after_snapshot_id for o in outcomes if o.decision == "run"} <= set(main)
    assert ids_read_independently(config, table_name) == sorted(writer.ledger.expected_ids())
    assert [r.decision for r in open_audit(config).records(table=table_name, operation="manifests")] == \
        [o.decision for o in outcomes]


def test_expiry_under_a_claimless_writer_runs_or_defers_and_lose_nothing(spark, own_config, table_name,
                                                                        other_catalog):
    config = own_config(max_commit_retries=3)
    writer = simulate(spark, config, table_name)
    keeper = housekeeper(config, spark)
    outcomes = []
    with WriterThread(claimless(spark, writer, other_catalog, delete_every=2)) as thread:
        for _ in range(4):
            outcome = keeper.expire(ExpiryRequest(table_name, older_than_seconds=0, retain_last=2, trigger="sensor"))
            outcomes.append(outcome)
            # the snapshot it planned on (main's head then) survives, and main still descends from it
            assert outcome.before_snapshot_id in lineage(spark, config, table_name)
    assert not thread.fatal and not thread.thread.is_alive()

    conflicts = sum(len(o.evidence.get("conflicts", [])) for o in outcomes)
    print(f"\nexpiry under a claimless writer: decisions {[str(o.decision) for o in outcomes]}, attempts "
          f"{[o.attempts for o in outcomes]}, conflicts {conflicts}, writer batches {writer.ledger.next_batch}, "
          f"writer's failed commits {thread.failures}, rows {writer.ledger.expected_count()}")
    assert all(o.decision in ("run", "defer", "noop") for o in outcomes), [(o.decision, o.reason) for o in outcomes]
    assert any(o.decision == "run" for o in outcomes)
    for o in outcomes:
        if o.decision == "run":
            assert o.evidence["expired_snapshot_ids"] == o.evidence["expiring_snapshot_ids"]
    assert ids_read_independently(config, table_name) == sorted(writer.ledger.expected_ids())
