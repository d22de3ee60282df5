"""Compaction at the entrance: one batch of a landing source's small files appended to its table as a few large
files, exactly once, under the operating contract (policy -> table claim -> act -> one audit record).

Under the claim of the source's table:
1. Recover: a batch journal a dead run left is finished (its batch is on `main`: only its files are moved to the
   processed area) or dropped (not on `main`: its files are still landed and go into this batch).
2. List the landed files. Those the source's newest batch on `main` lists in its summary (by name and size, older
   than its commit) were appended by a dead run whose journal is gone: they are moved, not appended. Decide (a
   threshold passed, or the run was forced), choose the oldest `max_files`. Files that land from here on wait for
   the next batch.
3. Check each file against the table (readable, same columns, compatible types); a bad one is moved to
   `<location>/_rejected/` with a `.reason.txt` beside it; the rest goes on.
4. Journal the batch (its id and files) in the state dir, then stage its rows on a branch (`main` does not move),
   prove with Great Expectations that the staged files hold exactly the landed rows, and append them to `main` in
   one commit whose summary carries the batch id, the files' digest and their names and sizes.
5. Move the landed files to the processed area, drop the journal and the branch.

A crash before 4's commit leaves the files landed (the next run appends them); after it, the next run finds the
batch id on `main` and only moves the files. Never appended twice: the batch id is looked for before every append.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from icemaint.config import MaintenanceConfig
from icemaint.domain.verdicts import DEFER, NOOP, NOT_PUBLISHED, RUN, Operation, launched_by_a_person
from icemaint.domain.health import STAGE_PREFIX
from icemaint.domain.landing import BATCH_ID_KEY, Batch, LandedFile, LandingSource, append_summary, \
    appended_leftovers, batch_committed, choose_batch, due, newest_batch, processed_due
from icemaint.domain.names import TableName
from icemaint.domain.units import counted, human_size
from icemaint.engine import landing as files
from icemaint.engine.staging import StagingArea
from icemaint.errors import UserError
from icemaint.observe.manifests import main_lineage
from icemaint.operations.contract import ContractOperation, ContractRun

log = logging.getLogger(__name__)
INGEST_BRANCH = f"{STAGE_PREFIX}ingest_"
PROOF_SEED = 0


class UnknownSource(UserError, KeyError):
    """No landing source of that name in the config."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class IngestRequest:
    source: str
    trigger: str = "manual"
    run_id: str | None = None
    force: bool = False  # a batch of whatever has landed, even below every threshold
    dry_run: bool = False
    identity: str | None = None


@dataclass
class IngestOutcome:
    source: str
    table: str
    decision: str
    reason: str
    dry_run: bool = False
    batch_id: str | None = None
    files: int = 0
    bytes: int = 0
    rows: int = 0
    rejected: list = field(default_factory=list)  # {"name", "reason", "moved_to"}
    recovered: list = field(default_factory=list)  # journals of dead runs: {"batch_id", "snapshot_id", "moved"}
    waiting: int = 0  # landed files left for a later batch (over max_files)
    read_by: str = ""  # "spark" (Spark reads the landed files) or "driver" (pyarrow on the driver: object stores)
    new_files: int = 0
    new_bytes: list = field(default_factory=list)
    before_snapshot_id: int | None = None
    after_snapshot_id: int | None = None
    committed_snapshot_ids: list = field(default_factory=list)
    state_was_unknown: bool = False
    moved: int = 0
    purged: int = 0
    validation: dict = field(default_factory=dict)
    due: dict = field(default_factory=dict)
    durations: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# Main's (snapshot id, summary properties), newest first.
Lineage = list[tuple[int, Mapping[str, str]]]
# Test seam: called with each step's name ("listed", "staged", "before_commit", "after_commit", "moved_one").
Hook = Callable[[str], None]


class Ingestor(ContractOperation):
    """Runs one ingest request of one landing source end to end."""

    def __init__(self, config: MaintenanceConfig, spark, reader, claims, audit, *, hook: Hook | None = None,
                 progress: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep):
        super().__init__(config, spark, reader, claims, audit, progress=progress, sleep=sleep)
        self.hook = hook or (lambda step: None)
        self.store = files.storage_properties(config)

    def source(self, name: str) -> LandingSource:
        found = self.config.landing.get(name)
        if found is None:
            known = ", ".join(sorted(self.config.landing)) or "none configured (config key `landing`)"
            raise UnknownSource(f"landing source {name!r} is not in the config; sources: {known}")
        return found

    def run(self, request: IngestRequest) -> IngestOutcome:
        """Ingests one batch (unless nothing is due, or a dry run); always writes one audit record.

        Raises:
            UnknownSource, TableNotFound: bad input, before anything is touched.
            LandingError, StagingError: staging or the append could not finish; the message says what landed.
        """
        source = self.source(request.source)
        return self.contract.run(
            Operation.INGEST, source.table, request.run_id,
            new_outcome=lambda run: IngestOutcome(source.name, run.name.key, NOOP, "", request.dry_run),
            act=lambda run, outcome: self._act(request, source, run, outcome),
            record=lambda run, outcome: self._record(request, run, outcome),
            wait_for_claim=launched_by_a_person(request.trigger), progress=self.progress, sleep=self.sleep,
            identity=request.identity, trigger=request.trigger)

    # -- the journal: a batch being appended, kept until its files are moved ------------------------------------
    def _journal_dir(self, source: LandingSource) -> Path:
        return self.config.state_path / "ingest-journal" / source.name

    def _write_journal(self, source: LandingSource, batch: Batch) -> Path:
        folder = self._journal_dir(source)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{batch.batch_id}.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            json.dump(batch.to_dict(), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        return path

    def _journals(self, source: LandingSource) -> list[Path]:
        folder = self._journal_dir(source)
        return sorted(folder.glob("*.json")) if folder.is_dir() else []

    # -- steps ---------------------------------------------------------------------------------------------------
    def _act(self, request: IngestRequest, source: LandingSource, run: ContractRun, outcome: IngestOutcome) -> None:
        t0 = time.perf_counter()
        name = TableName.parse(source.table)
        area = StagingArea(self.spark, self.config.catalog.name, name, request.run_id or uuid.uuid4().hex,
                           race_timeout_seconds=run.policy.publish_timeout_seconds)
        table = self.reader.load(name.key)
        snapshot = table.current_snapshot()
        outcome.before_snapshot_id = snapshot.snapshot_id if snapshot else None
        # Main's (snapshot id, summary) pairs, newest first, read once: under the claim no other ingest of this source
        # commits, so the batches this run looks for (a dead run's) are on it already or not at all.
        lineage = [(sid, summary) for sid, _, _, summary in main_lineage(table)]
        if not request.dry_run:
            self._recover(source, table, lineage, area, outcome)
        listed = files.list_landed(source.location, properties=self.store)
        if not request.dry_run:
            listed = self._finish_appended(source, table, lineage, listed, outcome)
        now = dt.datetime.now(dt.timezone.utc)
        verdict = due(listed, source, now)
        outcome.due = asdict(verdict)
        self.hook("listed")
        if not verdict.due and not (request.force and listed):
            outcome.decision, outcome.reason = NOOP, verdict.reason
            self._purge(source, now, outcome, request.dry_run)
            return
        batch = choose_batch(listed, source)
        if batch is None:  # every listed name is one a batch skips (listing already leaves them out)
            outcome.decision, outcome.reason = NOOP, "no landed files"
            return
        outcome.waiting = len(listed) - len(batch.files)
        stage = files.LandingStage(self.spark, area, source, self.store)
        outcome.read_by = stage.read_by
        columns = stage.table_columns()
        if source.format != "parquet":
            self._check_schema(source, columns)
        good, rows = [], 0
        checked = files.check_files(source, [f.name for f in batch.files], columns, self.store)
        for landed, (count, reason) in zip(batch.files, checked):
            if reason is None:
                good.append(landed)
                rows += count
                continue
            entry = {"name": landed.name, "reason": reason}
            if not request.dry_run:
                entry["moved_to"] = files.move(source.location, landed.name, source.rejected_location, reason,
                                               self.store)
            outcome.rejected.append(entry)
            self.progress(f"{source.name}: {landed.name} set aside: {reason}")
        outcome.durations["check_seconds"] = round(time.perf_counter() - t0, 3)
        if not good:
            outcome.decision, outcome.reason = NOOP, f"every chosen file ({len(batch.files)}) was set aside"
            return
        batch = Batch(source.name, tuple(good))
        outcome.batch_id, outcome.files, outcome.bytes, outcome.rows = batch.batch_id, len(good), batch.bytes, rows
        if request.dry_run:
            outcome.decision = NOOP
            outcome.reason = (f"dry run: would append batch {batch.batch_id} ({counted(len(good), 'file')}, "
                              f"{human_size(batch.bytes)}, {rows} rows) to {name.key} ({verdict.reason})")
            return
        committed, found = batch_committed(batch, lineage, table.properties)
        if committed:  # these very files were appended by a run whose journal is gone: only move them
            outcome.moved = self._move_processed(source, batch)
            outcome.decision = NOOP
            outcome.reason = (f"batch {batch.batch_id} was already appended (snapshot {found}); moved its "
                              f"{counted(outcome.moved, 'file')} to the processed area")
            return
        self._append(source, name, area, stage, batch, columns, rows, outcome)
        if outcome.decision != RUN:  # not appended: `_append` said why
            return
        outcome.reason = (f"appended batch {batch.batch_id}: {counted(len(good), 'landed file')} "
                          f"({human_size(batch.bytes)}, {rows} rows) as {counted(outcome.new_files, 'file')} in "
                          f"snapshot {outcome.after_snapshot_id} ({verdict.reason})"
                          + (f"; {counted(len(outcome.rejected), 'file')} set aside" if outcome.rejected else "")
                          + (f"; {counted(outcome.waiting, 'file')} wait for the next batch" if outcome.waiting else ""))
        self._purge(source, now, outcome, False)
        outcome.durations["act_seconds"] = round(time.perf_counter() - t0, 3)

    def _check_schema(self, source: LandingSource, columns: list[tuple[str, str]]) -> None:
        mine = [(c, files.SPARK_TYPES[t]) for c, t in source.schema]
        if sorted(c for c, _ in mine) != sorted(c for c, _ in columns):
            raise UserError(f"landing.{source.name}.schema: columns {[c for c, _ in mine]} are not the columns of "
                            f"{source.table} {[c for c, _ in columns]}")

    def _append(self, source, name, area, stage, batch: Batch, columns, rows: int, outcome: IngestOutcome) -> None:
        from icemaint.engine.validation import RowSet, prove_rows

        journal = self._write_journal(source, batch)
        branch = f"{INGEST_BRANCH}{batch.batch_id[:20]}"
        t0 = time.perf_counter()
        staged = stage.stage(batch, [f.name for f in batch.files], columns, branch)
        outcome.durations["stage_seconds"] = round(time.perf_counter() - t0, 3)
        self.hook("staged")
        try:
            t1 = time.perf_counter()
            proof = prove_rows(
                RowSet(staged.base_snapshot_id, lambda: stage.read([f.name for f in batch.files], columns),
                       f"the {len(batch.files)} landed files"),
                RowSet(staged.staged_snapshot_id, lambda: stage.staged_rows(staged), "the staged files"),
                sample_fraction=self.config.policy(name.key).sample_fraction, seed=PROOF_SEED, what=name.key)
            outcome.validation = proof.to_dict()
            outcome.validation["landed_rows_by_file_reader"] = rows
            outcome.durations["proof_seconds"] = round(time.perf_counter() - t1, 3)
            before_rows = proof.checks[0].observed.get("before_row_count")
            if not proof.passed or before_rows != rows:
                why = "the proof failed" if not proof.passed else \
                    f"Spark read {before_rows} rows where the files hold {rows}"
                outcome.decision = NOT_PUBLISHED
                outcome.reason = f"batch {batch.batch_id} not appended: {why}; its files stay landed"
                journal.unlink(missing_ok=True)
                return
            self.hook("before_commit")
            t2 = time.perf_counter()
            proof_id = f"{batch.batch_id}:{staged.staged_snapshot_id}"
            snapshot_id, unknown = stage.append(staged, append_summary(batch, proof_id))
            outcome.durations["commit_seconds"] = round(time.perf_counter() - t2, 3)
            outcome.after_snapshot_id, outcome.state_was_unknown = snapshot_id, unknown
            outcome.committed_snapshot_ids.append(snapshot_id)
            outcome.new_files, outcome.new_bytes = len(staged.new_paths), list(staged.new_bytes)
            outcome.decision = RUN
            self.hook("after_commit")
        finally:
            area.discard(branch)
        outcome.moved = self._move_processed(source, batch)
        journal.unlink(missing_ok=True)

    def _move_processed(self, source: LandingSource, batch: Batch) -> int:
        present = {f.name for f in files.list_landed(source.location, properties=self.store)}
        moved = 0
        for landed in batch.files:
            if landed.name in present:
                files.move(source.location, landed.name, source.processed_location, properties=self.store)
                moved += 1
                self.hook("moved_one")
        return moved

    def _recover(self, source: LandingSource, table, lineage: Lineage, area: StagingArea,
                 outcome: IngestOutcome) -> None:
        """Finishes or drops the batch journals a dead run left, and removes its staging branches."""
        for path in self._journals(source):
            batch = Batch.from_dict(json.loads(path.read_text()))
            committed, found = batch_committed(batch, lineage, table.properties)
            moved = self._move_processed(source, batch) if committed else 0
            outcome.recovered.append({"batch_id": batch.batch_id, "snapshot_id": found, "moved": moved,
                                      "committed": committed, "found_by": "journal"})
            self.progress(f"{source.name}: batch {batch.batch_id} of a dead run "
                          + (f"was appended (snapshot {found}): moved {moved} files" if committed
                             else "never committed: its files stay landed"))
            path.unlink(missing_ok=True)
        for branch, _ in area.stale_branches():
            if branch.startswith(INGEST_BRANCH):
                area.discard(branch)

    def _finish_appended(self, source: LandingSource, table, lineage: Lineage, listed: list[LandedFile],
                         outcome: IngestOutcome) -> list[LandedFile]:
        """Moves the landed files the source's newest batch on `main` already appended (a dead run's, whose journal
        is gone with a lost state dir); the rest of `listed`."""
        found = newest_batch(source.name, lineage)
        if found is None:
            return listed
        snapshot_id, summary = found
        left = appended_leftovers(listed, summary, table.snapshot_by_id(snapshot_id).timestamp_ms)
        if not left:
            return listed
        moved = self._move_processed(source, Batch(source.name, tuple(left)))
        outcome.recovered.append({"batch_id": summary[BATCH_ID_KEY], "snapshot_id": snapshot_id, "moved": moved,
                                  "committed": True, "found_by": "summary"})
        self.progress(f"{source.name}: {counted(moved, 'file')} of batch {summary[BATCH_ID_KEY]} were appended "
                      f"(snapshot {snapshot_id}) and never moved: moved them")
        names = {f.name for f in left}
        return [f for f in listed if f.name not in names]

    def _purge(self, source: LandingSource, now: dt.datetime, outcome: IngestOutcome, dry_run: bool) -> None:
        if source.delete_processed_after_seconds is None or dry_run:
            return
        old = processed_due(files.list_landed(source.processed_location, properties=self.store), source, now)
        for landed in old:
            files.delete(source.processed_location, landed.name, self.store)
        outcome.purged = len(old)

    def _record(self, request: IngestRequest, run: ContractRun, outcome: IngestOutcome) -> IngestOutcome:
        from icemaint.safety.audit import AuditRecord

        outcome.durations["total_seconds"] = round(time.perf_counter() - run.started, 3)
        if outcome.decision == DEFER and run.claim_holder:
            outcome.due = {**outcome.due, "claim_holder": run.claim_holder}
        details = outcome.to_dict()
        for key in ("validation", "durations", "before_snapshot_id", "after_snapshot_id", "reason", "decision"):
            details.pop(key, None)
        self.audit.append(AuditRecord(
            table=outcome.table, operation=Operation.INGEST, decision=outcome.decision, reason=outcome.reason,
            trigger=request.trigger, identity=run.identity, run_id=request.run_id,
            before_snapshot_id=outcome.before_snapshot_id, after_snapshot_id=outcome.after_snapshot_id,
            validation=outcome.validation, durations=outcome.durations, details=details))
        return outcome

