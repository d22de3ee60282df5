"""Stage, prove, publish while a writer that ignores the claim keeps appending.

Every scenario is judged twice, independently of the code under test:
- by an independent reader: pyiceberg (`CatalogReader(config).load(table).scan().to_arrow()`), not Spark;
- by the writers' ledgers: the simulator's, plus the ids of every `INSERT` of the claim-ignoring writer
  that returned successfully.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims, table_claim
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.app.simulator import StreamingWriter
from icemaint.engine.staging import MAINTENANCE_TAG

from conftest import make_config, streaming_table, write_config
from staged_faults import corrupt_long, main_lineage, staging_refs, uncompressed
from waiting import Patience, cpu_steps

DATE = "2026-01-02"
OTHER_DATE = "2026-01-03"
FIRST_DATE = "2026-01-01"
CORRUPT = 77_000_001
WRITER_IDS = 500_000_000  # far above the simulator's ids (batch * 1_000_000 + row)
REPO = Path(__file__).resolve().parent.parent


# -- the claim-ignoring writer -------------------------------------------------------------------

class ClaimIgnoringWriter:
    """Appends 2-3 rows with unique ids every ~0.5 s with `INSERT INTO` on the shared SparkSession,
    mostly on the compacted date (every other batch also one row on another date). Never takes the
    table's claim. `ledger` holds the ids of every INSERT that returned successfully."""

    def __init__(self, spark, sql: str, first_id: int = WRITER_IDS, interval: float = 0.5):
        self.spark, self.sql, self.first_id, self.interval = spark, sql, first_id, interval
        self.ledger: set[int] = set()
        self.failed: list[tuple[list[int], str]] = []
        self.commits = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="claim-ignoring-writer", daemon=True)

    def __enter__(self) -> "ClaimIgnoringWriter":
        self._thread.start()
        self.wait_for_more(1)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            ids = [self.first_id + n * 10 + j for j in range(3 if n % 2 else 2)]
            rows = []
            for j, i in enumerate(ids):
                day = OTHER_DATE if n % 2 and j == len(ids) - 1 else DATE
                rows.append(f"({i}, {j + 1}, TIMESTAMP '{day} {n % 24:02d}:{j:02d}:{n % 60:02d}', {n}.25, 'writer')")
            try:
                self.spark.sql(f"INSERT INTO {self.sql} VALUES {', '.join(rows)}")
            except Exception as exc:  # reported by the tests' assertions
                self.failed.append((ids, f"{type(exc).__name__}: {str(exc)[:300]}"))
            else:
                with self._cond:
                    self.ledger.update(ids)
                    self.commits += 1
                    self._cond.notify_all()
            n += 1
            self._stop.wait(self.interval)

    def wait_for_more(self, more: int = 1, timeout: float = 120.0) -> None:
        """Blocks until `more` further INSERTs have returned successfully."""
        with self._cond:
            target = self.commits + more
            ok = self._cond.wait_for(lambda: self.commits >= target or not self._thread.is_alive(), timeout)
        assert ok and self.commits >= target, f"the writer stopped committing: {self.failed[-3:]}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the writer did not stop"


# -- helpers -------------------------------------------------------------------------------------

def simulate(spark, config, table: str, batches: int = 4) -> StreamingWriter:
    """The simulator's merge-on-read table, 3 days, one small file per day per batch, a few deletes."""
    return streaming_table(spark, config.catalog.name, table, batches=batches, rows_per_day=10)


def compactor(config, spark, **kwargs) -> Compactor:
    return Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config),
                     sleep=lambda s: None, **kwargs)


def is_writer_active_race(outcome) -> bool:
    return outcome.decision == "defer" and outcome.reason.startswith("writer active")


def run_compaction(config, spark, request: CompactionRequest, **kwargs):
    """Runs the compaction as the sensor would on its next ticks: a deferral because a writer's commit
    landed while health was read (with writer_idle 0s: see
    `test_a_writer_commit_during_the_health_read_does_not_defer_a_zero_idle_window`) is retried. It
    happens before anything is staged, so the seam has not run."""
    for _ in range(20):
        outcome = compactor(config, spark, **kwargs).run(request)
        if not is_writer_active_race(outcome):
            break
    return outcome


def sql_of(config, table: str) -> str:
    return TableName.parse(table).sql(config.catalog.name)


def reader_ids(config, table: str, snapshot_id: int | None = None) -> list[int]:
    """The table's event ids read by pyiceberg (deletes applied), not by Spark."""
    scan = CatalogReader(config).load(table).scan(snapshot_id=snapshot_id)
    return scan.to_arrow().column("event_id").to_pylist()


def assert_rows(config, table: str, expected: set[int], writer: ClaimIgnoringWriter) -> None:
    assert not writer.failed, f"the claim-ignoring writer's INSERTs failed: {writer.failed[:3]}"
    ids = reader_ids(config, table)
    duplicated = sorted(i for i, n in Counter(ids).items() if n > 1)
    assert not duplicated, f"{len(duplicated)} duplicated rows, e.g. {duplicated[:5]}"
    missing, extra = expected - set(ids), set(ids) - expected
    assert not missing and not extra, (f"{len(missing)} lost rows (writer's: {len(missing & writer.ledger)}), "
                                       f"e.g. {sorted(missing)[:5]}; {len(extra)} unexpected, e.g. {sorted(extra)[:5]}")


def date_ids(spark, sql: str, snapshot_id: int, date: str) -> list[int]:
    """Simulator ids of `date` as of a snapshot (the writer's ids excluded)."""
    return [r[0] for r in spark.sql(
        f"SELECT event_id FROM {sql} VERSION AS OF {int(snapshot_id)} WHERE ts >= TIMESTAMP '{date} 00:00:00' "
        f"AND ts < TIMESTAMP '{date} 00:00:00' + INTERVAL 1 DAY AND event_id < {WRITER_IDS} "
        "ORDER BY event_id").collect()]


def newer_than(lineage: list[dict], snapshot_id: int) -> list[dict]:
    """main's snapshots committed after `snapshot_id` (which must be on main's lineage), newest first."""
    ids = [s["snapshot_id"] for s in lineage]
    assert snapshot_id in ids, f"snapshot {snapshot_id} is not on main's lineage"
    return lineage[:ids.index(snapshot_id)]


def assert_not_ours(snapshots: list[dict]) -> None:
    """None of these snapshots was committed by maintenance (no replace, no maintenance marker)."""
    ours = [(s["snapshot_id"], s["operation"]) for s in snapshots
            if s["operation"] == "replace" or MAINTENANCE_TAG in (s["summary"] or {})]
    assert not ours, f"maintenance committed to main: {ours}"


# -- (a) + (e): a passing proof publishes while the writer appends -------------------------------

@pytest.fixture(scope="module")
def published_under_writer(spark, config):
    """Scenario (a): one compaction of DATE with the claim-ignoring writer running throughout."""
    table = f"t.staged_publish_{uuid.uuid4().hex[:8]}"
    sim = simulate(spark, config, table)
    sql = sql_of(config, table)
    seen = {}

    with ClaimIgnoringWriter(spark, sql) as writer:
        def after_stage(staged):
            seen["staged"] = staged
            seen["commits_at_stage"] = writer.commits
            writer.wait_for_more(1)  # a writer commit lands between S and the proof

        outcome = run_compaction(config, spark, CompactionRequest(table, DATE), after_stage=after_stage)
        writer.wait_for_more(2)  # and the writer keeps committing after the publish
    return {"table": table, "sql": sql, "sim": sim, "writer": writer, "outcome": outcome, **seen}


def test_passing_proof_publishes_one_replace_and_loses_or_duplicates_nothing(spark, config, published_under_writer):
    run = published_under_writer
    outcome, writer, sql, table = run["outcome"], run["writer"], run["sql"], run["table"]
    assert outcome.decision == "run", outcome.reason
    assert outcome.published and outcome.validation.passed is True and outcome.attempts == 1
    assert len(outcome.committed_snapshot_ids) == 1
    staged = run["staged"]
    base = staged.base_snapshot_id
    assert base == outcome.before_snapshot_id
    # main moved forward only: the writer's appends, our one replace on top of them, more appends
    lineage = main_lineage(spark, sql)
    newer = newer_than(lineage, base)
    ours = [s for s in newer if MAINTENANCE_TAG in (s["summary"] or {})]
    assert [s["snapshot_id"] for s in ours] == outcome.committed_snapshot_ids
    assert ours[0]["operation"] == "replace"
    assert ours[0]["summary"].get("icemaint.staged-snapshot-id") == str(staged.staged_snapshot_id)
    after_publish = newer_than(newer, ours[0]["snapshot_id"])
    between = newer[newer.index(ours[0]) + 1:]
    assert between and all(s["operation"] == "append" for s in between), \
        "the writer should have committed between S and the publish"
    assert after_publish and all(s["operation"] == "append" for s in after_publish), \
        "the writer should have committed after the publish"
    assert staged.staged_snapshot_id not in {s["snapshot_id"] for s in lineage}
    assert not staging_refs(config, table)
    # the independent reader: every ledger row exactly once
    assert writer.commits >= run["commits_at_stage"] + 3
    assert_rows(config, table, run["sim"].ledger.expected_ids() | writer.ledger, writer)
    # the date was compacted: the replaced files are gone from main
    files = {r[0] for r in spark.sql(f"SELECT file_path FROM {sql}.files").collect()}
    assert not files & set(staged.replaced_files) and set(staged.new_files) <= files


def test_incremental_read_across_the_publish_sees_no_duplicates(spark, config, published_under_writer):
    """(e) An incremental read from S to now sees only the writer's appends: the replace is not an append."""
    run = published_under_writer
    table, sql, writer = run["table"], run["sql"], run["writer"]
    base = run["outcome"].before_snapshot_id
    end = CatalogReader(config).load(table).current_snapshot().snapshot_id
    assert run["outcome"].after_snapshot_id in {s["snapshot_id"] for s in newer_than(main_lineage(spark, sql), base)}
    rows = [r[0] for r in spark.read.format("iceberg").option("start-snapshot-id", str(base))
            .option("end-snapshot-id", str(end)).load(sql).select("event_id").collect()]
    duplicated = sorted(i for i, n in Counter(rows).items() if n > 1)
    assert not duplicated, f"the incremental read duplicates {len(duplicated)} rows, e.g. {duplicated[:5]}"
    # exactly what was appended after S (pyiceberg's reads of S and of now), all of it the writer's
    appended = set(reader_ids(config, table)) - set(reader_ids(config, table, base))
    assert set(rows) == appended
    assert appended and appended <= writer.ledger
    assert writer.ledger - appended == set(reader_ids(config, table, base)) & writer.ledger


# -- (b) a corrupted staged value ----------------------------------------------------------------

def test_corrupted_staged_value_is_never_published_and_the_writer_loses_nothing(spark, config, table_name):
    sim = simulate(spark, config, table_name)
    sql = sql_of(config, table_name)
    uncompressed(spark, sql)
    seen = {}

    with ClaimIgnoringWriter(spark, sql) as writer:
        def corrupt(staged):
            seen["staged"] = staged
            victim = date_ids(spark, sql, staged.base_snapshot_id, DATE)[0]
            seen["victim"] = victim
            assert corrupt_long(staged.new_files, victim, CORRUPT) >= 1
            writer.wait_for_more(1)

        outcome = run_compaction(config, spark, CompactionRequest(table_name, DATE), after_stage=corrupt)
        writer.wait_for_more(1)

    staged = seen["staged"]
    assert outcome.decision == "not_published", outcome.reason
    assert not outcome.published and outcome.validation.passed is False
    assert outcome.committed_snapshot_ids == [] and outcome.staged[0].verdict == "not_published"
    # the fault was real: the staged snapshot holds the corrupted value...
    assert spark.sql(f"SELECT count(*) FROM {sql} VERSION AS OF {staged.staged_snapshot_id} "
                     f"WHERE event_id = {CORRUPT}").first()[0] == 1
    # ...and no snapshot of main's lineage ever did; nothing of ours was committed after S. Only S and the
    # snapshots after it need reading: the older ones were committed before the staged files were written, and
    # the corruption changed nothing but those files.
    lineage = main_lineage(spark, sql)
    assert staged.staged_snapshot_id not in {s["snapshot_id"] for s in lineage}
    newer = newer_than(lineage, staged.base_snapshot_id)
    for snap in newer + [lineage[len(newer)]]:
        assert spark.sql(f"SELECT count(*) FROM {sql} VERSION AS OF {snap['snapshot_id']} "
                         f"WHERE event_id = {CORRUPT}").first()[0] == 0, f"corrupted value in {snap}"
    assert newer and all(s["operation"] == "append" for s in newer)
    assert_not_ours(newer)
    assert not staging_refs(config, table_name)
    ids = reader_ids(config, table_name)
    assert CORRUPT not in ids and seen["victim"] in ids
    assert_rows(config, table_name, sim.ledger.expected_ids() | writer.ledger, writer)


# -- (c) a conflicting delete during the proof, no retries -----------------------------------------

def test_conflicting_delete_during_the_proof_defers_and_leaves_main_to_the_writers(spark, lake_root, tmp_path,
                                                                                  table_name):
    config = make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table_name: {"max_commit_retries": 0}})
    sim = simulate(spark, config, table_name)
    sql = sql_of(config, table_name)
    deleted, seen = [], {}

    with ClaimIgnoringWriter(spark, sql) as writer:
        def writer_deletes_a_replaced_row(staged):
            seen["staged"] = staged
            victim = date_ids(spark, sql, staged.base_snapshot_id, DATE)[0]
            spark.sql(f"DELETE FROM {sql} WHERE event_id = {victim}")  # merge-on-read: a position delete
            deleted.append(victim)

        outcome = run_compaction(config, spark, CompactionRequest(table_name, DATE),
                                 after_stage=writer_deletes_a_replaced_row)
        writer.wait_for_more(1)

    assert outcome.decision == "defer", outcome.reason
    assert "conflicts with the rewrite" in outcome.reason and "max_commit_retries 0" in outcome.reason
    assert outcome.attempts == 1 and len(deleted) == 1 and not outcome.published
    lineage = main_lineage(spark, sql)
    newer = newer_than(lineage, seen["staged"].base_snapshot_id)
    assert_not_ours(newer)
    assert any(s["operation"] in ("delete", "overwrite") for s in newer)  # the writer's delete is on main
    assert not staging_refs(config, table_name)
    assert_rows(config, table_name, (sim.ledger.expected_ids() | writer.ledger) - set(deleted), writer)
    assert open_audit(config).records(table=table_name, operation="compact")[-1].decision == "defer"


# -- (d) a delete on a file the rewrite does not replace --------------------------------------------

def test_delete_on_a_file_not_replaced_does_not_block_the_publish(spark, config, table_name):
    sim = simulate(spark, config, table_name)
    sql = sql_of(config, table_name)
    deleted, seen = [], {}

    with ClaimIgnoringWriter(spark, sql) as writer:
        def writer_deletes_a_row_of_another_date(staged):
            seen["staged"] = staged
            victim = date_ids(spark, sql, staged.base_snapshot_id, FIRST_DATE)[0]
            spark.sql(f"DELETE FROM {sql} WHERE event_id = {victim}")
            deleted.append(victim)

        outcome = run_compaction(config, spark, CompactionRequest(table_name, DATE),
                                 after_stage=writer_deletes_a_row_of_another_date)
        writer.wait_for_more(1)

    assert outcome.decision == "run", outcome.reason
    assert outcome.published and outcome.attempts == 1 and outcome.validation.passed is True
    lineage = main_lineage(spark, sql)
    newer = newer_than(lineage, seen["staged"].base_snapshot_id)
    after_publish = newer_than(newer, outcome.after_snapshot_id)
    assert newer[len(after_publish)]["operation"] == "replace"
    between = newer[len(after_publish) + 1:]
    assert any(s["operation"] in ("delete", "overwrite") for s in between), "the delete landed before the publish"
    # the delete file of the other date is still live
    assert spark.sql(f"SELECT count(*) FROM {sql}.files WHERE content = 1 "
                     f"AND partition.ts_day = DATE '{FIRST_DATE}'").first()[0] >= 1
    assert deleted[0] not in reader_ids(config, table_name)
    assert_rows(config, table_name, (sim.ledger.expected_ids() | writer.ledger) - set(deleted), writer)


# -- (f) kill -9 between staging and publish ------------------------------------------------------

DYING_RUN = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path

    from icemaint.safety.audit import open_audit
    from icemaint.safety.claims import open_claims
    from icemaint.operations.compaction import CompactionRequest, Compactor
    from icemaint.config import load_config
    from icemaint.observe.catalog import CatalogReader
    from icemaint.engine.spark_session import get_spark

    config_path, table, date, report, go = sys.argv[1:6]
    config = load_config(config_path)
    spark = get_spark(config)

    def die(staged):
        Path(report).write_text(json.dumps({
            "pid": os.getpid(), "branch": staged.branch, "base": staged.base_snapshot_id,
            "staged": staged.staged_snapshot_id, "new_files": list(staged.new_files)}))
        deadline = time.monotonic() + 120
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)

    for _ in range(20):  # as the sensor would: retry the writer-active race (see run_compaction)
        outcome = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config),
                            after_stage=die).run(CompactionRequest(table, date, run_id="killed-run"))
        if not (outcome.decision == "defer" and outcome.reason.startswith("writer active")):
            break
    print(f"the run was not killed: {outcome.decision}: {outcome.reason}")
    sys.exit(3)
""")


def reap(proc: subprocess.Popen) -> None:
    """Kills the subprocess if it still runs (a failed assertion) and closes its output."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.mark.slow
def test_kill_9_between_staging_and_publish_leaves_main_untouched_and_is_cleaned_up(spark, lake_root, tmp_path,
                                                                                 table_name):
    config_path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    config = load_config(config_path)  # the same file the dying process reads: shared claims and audit
    sim = simulate(spark, config, table_name)
    sql = sql_of(config, table_name)
    script, report, go = tmp_path / "dying_run.py", tmp_path / "staged.json", tmp_path / "go"
    script.write_text(DYING_RUN)
    claims = open_claims(config)

    # The claim-ignoring writer starts once the dying run has staged (while its JVM starts and it plans, the
    # writer's commits would only cost CPU): it commits while the dying run holds its staged rewrite, after the
    # kill, and throughout the next run.
    with contextlib.ExitStack() as stack:
        proc = subprocess.Popen([sys.executable, str(script), str(config_path), table_name, DATE, str(report), str(go)],
                                cwd=REPO, env={**os.environ, "ICEMAINT_IDENTITY": "maint-test"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stack.callback(reap, proc)
        patience = Patience("the dying run's staging", cap_s=1800)  # a JVM's start and a rewrite: slow on CI
        while not report.exists() and proc.poll() is None:
            patience.check(cpu_steps(proc.pid))
            time.sleep(0.1)
        assert report.exists(), f"the subprocess never staged (rc {proc.poll()}): {proc.stdout.read()[-3000:]}"
        staged = json.loads(report.read_text())
        holder = claims.holder_of(table_name)
        assert holder is not None and holder.pid == proc.pid == staged["pid"], holder  # it holds the claim
        writer = stack.enter_context(ClaimIgnoringWriter(spark, sql))  # its first commit lands meanwhile
        go.touch()
        assert proc.wait(timeout=60) == -signal.SIGKILL

        # main untouched by the dead run: only the writer's appends since S
        lineage = main_lineage(spark, sql)
        newer = newer_than(lineage, staged["base"])
        assert newer and all(s["operation"] == "append" for s in newer)
        assert_not_ours(newer)
        assert staged["staged"] not in {s["snapshot_id"] for s in lineage}
        assert staging_refs(config, table_name) == {staged["branch"]: staged["staged"]}
        # a flock claim dies with its holder: nothing to release
        assert claims.holder_of(table_name) is None
        # the dead run recorded no outcome: the audit reads it back as interrupted (its started marker and
        # a dead process); anything else is a deferral of the writer-active race before it staged
        records = open_audit(config).records(table=table_name, operation="compact")
        assert [r.run_id for r in records if r.decision == "interrupted"] == ["killed-run"]
        assert all(r.decision == "defer" and r.reason.startswith("writer active")
                   for r in records if r.decision != "interrupted")
        writer.wait_for_more(1)

        outcome = run_compaction(config, spark, CompactionRequest(table_name, DATE, run_id="after-the-kill"))
        writer.wait_for_more(1)

    assert outcome.decision == "run", outcome.reason
    assert outcome.published and outcome.validation.passed is True
    assert outcome.cleaned_staging == [{"branch": staged["branch"], "staged_snapshot_id": staged["staged"]}]
    cleanup = open_audit(config).records(table=table_name, operation="cleanup")
    assert len(cleanup) == 1 and cleanup[0].details["branch"] == staged["branch"] and cleanup[0].decision == "run"
    assert not staging_refs(config, table_name)
    newer = newer_than(main_lineage(spark, sql), staged["base"])
    assert [s["operation"] for s in newer if MAINTENANCE_TAG in (s["summary"] or {})] == ["replace"]
    files = {r[0] for r in spark.sql(f"SELECT file_path FROM {sql}.files").collect()}
    assert not files & set(staged["new_files"]), "the dead run's staged files reached main"
    assert_rows(config, table_name, sim.ledger.expected_ids() | writer.ledger, writer)


# -- a race these tests found (fixed: health reads `now` after the table, idle time is never negative)

def test_a_writer_commit_during_the_health_read_does_not_defer_a_zero_idle_window(spark, config, table_name,
                                                                                 monkeypatch):
    simulate(spark, config, table_name)
    sql = sql_of(config, table_name)
    assert config.policy(table_name).writer_idle_seconds == 0
    real_load, committed = CatalogReader.load, []

    def load_after_a_writer_commit(self, table):
        if not committed:  # a claim-ignoring writer commits while the health read is under way
            spark.sql(f"INSERT INTO {sql} VALUES ({WRITER_IDS}, 1, TIMESTAMP '{DATE} 12:00:00', 1.0, 'writer')")
            committed.append(WRITER_IDS)
        return real_load(self, table)

    monkeypatch.setattr(CatalogReader, "load", load_after_a_writer_commit)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert committed
    assert outcome.decision == "run", outcome.reason


# -- a dead run's staging ref, and partial progress ------------------------------------------------

def test_retention_keeps_a_live_staging_refs_files_and_expiry_removes_a_dead_runs_branch_first(spark, config,
                                                                                               table_name):
    """While a run holds the claim its staging branch is live: expiry waits (claim busy) and orphan removal keeps
    its files. A branch left by a dead run (no claim) pins the files it replaced: expiry removes it first, audited
    as cleanup, and the next compaction has none left to clean."""
    from icemaint.operations.expiry import ExpiryRequest
    from icemaint.operations.housekeeping import Housekeeper
    from icemaint.operations.orphans import OrphanRequest
    from icemaint.domain.rewrite_plan import plan_groups
    from icemaint.engine.staging import StagingArea
    from staged_faults import local_path

    writer = simulate(spark, config, table_name)
    name = TableName.parse(table_name)
    area = StagingArea(spark, config.catalog.name, name, "deadrun")
    base = area.current_snapshot_id()
    candidates, tasks = area.plan_date_files(base, "ts", "timestamptz", dt.date(2026, 1, 2), dt.date(2026, 1, 3))
    [group] = plan_groups(candidates, small_file_size_bytes=2**20, delete_file_threshold=1, partial_progress=False,
                          max_group_bytes=2**30)
    staged = area.stage(group, tasks, base, target_file_size_bytes=8 * 2**20)
    area.release_reads()
    keeper = Housekeeper(config, spark, CatalogReader(config), open_claims(config), open_audit(config))
    branch_count = f"SELECT count(*) FROM {name.sql(config.catalog.name)}.refs WHERE name = '{staged.branch}'"
    with table_claim(config, table_name, holder="a live compaction"):  # the run is alive and staging
        expired = keeper.expire(ExpiryRequest(table_name, older_than_seconds=0, retain_last=1))
        assert expired.decision == "defer" and "a live compaction" in expired.reason, expired.reason
    orphans = keeper.remove_orphans(OrphanRequest(table_name, older_than_seconds=0, force=True))
    assert orphans.decision in ("run", "noop"), orphans.reason
    assert all(os.path.exists(local_path(p)) for p in staged.new_files), "retention removed a live staging ref's files"
    assert spark.sql(branch_count).first()[0] == 1

    # ...and the run died: the next expiry removes its branch first
    expired = keeper.expire(ExpiryRequest(table_name, older_than_seconds=0, retain_last=1))
    assert expired.decision in ("run", "noop") and "removed 1 staging branch(es)" in expired.reason, expired.reason
    assert spark.sql(branch_count).first()[0] == 0
    [cleanup] = open_audit(config).records(table=table_name, operation="cleanup")
    assert cleanup.details["branch"] == staged.branch and "ended before publishing" in cleanup.reason
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.cleaned_staging == [] and outcome.decision == "run" and outcome.published, outcome.reason
    got = reader_ids(config, table_name)
    assert len(got) == len(set(got)) and set(got) == writer.ledger.expected_ids()


def test_partial_progress_with_groups_too_small_for_two_files_says_so(spark, lake_root, tmp_path, table_name):
    """Its reason said the date had no two small files (it had six): it names max_file_group_size_bytes now."""
    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={table_name: {"partial_progress": True, "max_file_group_size_bytes": "1B"}})
    streaming_table(spark, config.catalog.name, table_name, batches=3, rows_per_day=10, delete_every=0)
    location = CatalogReader(config).metadata_location(table_name)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "noop" and "no file group of at most max_file_group_size_bytes 1 B holds two of" \
        in outcome.reason and outcome.reason.endswith("candidate files: raise it"), outcome.reason
    assert CatalogReader(config).metadata_location(table_name) == location


def test_partial_progress_publishes_each_group_with_its_own_proof(spark, lake_root, tmp_path, table_name):
    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         tables={table_name: {"partial_progress": True, "max_file_group_size_bytes": "3KiB"}})
    sim = simulate(spark, config, table_name, batches=6)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "run" and outcome.published, outcome.reason
    assert len(outcome.staged) >= 2 and len(outcome.committed_snapshot_ids) == len(outcome.staged)
    assert len(outcome.to_dict()["validation"]["commits"]) == len(outcome.staged)
    assert all(p["passed"] for p in outcome.to_dict()["validation"]["commits"])
    lineage = main_lineage(spark, sql_of(config, table_name))
    published = [s for s in lineage if s["snapshot_id"] in outcome.committed_snapshot_ids]
    assert len(published) == len(outcome.staged) and all(s["operation"] == "replace" for s in published)
    ids = reader_ids(config, table_name)
    assert len(ids) == len(set(ids)) and set(ids) == sim.ledger.expected_ids()
