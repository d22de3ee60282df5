"""Safe compaction of one date of one table, following the operating contract.

Claim -> remove staging refs a dead run left -> (re)plan on snapshot S -> per file group: stage the
replacement files on a branch at S -> prove them with Great Expectations against the files they
replace as of S -> publish as one forward `replace` commit on `main` (validated from S) or, when the
proof fails, publish nothing -> record evidence and one audit record.

Nothing here moves `main` backwards: a failed proof leaves the table exactly as writers left it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable

from icemaint.config import MaintenanceConfig
from icemaint.operations.contract import ContractOperation, ContractRun
from icemaint.safety import interrupts
from icemaint.safety.approvals import held_runs, is_approved, reverted_scopes
from icemaint.domain.decisions import (Decision, Gates, choose_partitions, decide_compaction, decide_layout_compaction,
                                       measured_throughput)
from icemaint.domain.verdicts import (AUTOMATIC_TRIGGERS, DEFER, NOOP, NOT_PUBLISHED, REFUSE, RUN, Operation,
                                      ReasonKind, launched_by_a_person)
from icemaint.domain.drift import LayoutTarget
from icemaint.domain.layout import describe_all, partition_key, partitions_of
from icemaint.domain.health import TableHealth
from icemaint.domain.units import counted, human_size
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.domain.rewrite_plan import parse_sort_order, plan_groups
from icemaint.domain.scope import DateScope, parse_date, period_start, span_of
from icemaint.engine.delete_staging import plan_position_deletes, stage_position_deletes
from icemaint.engine.java import drop_interrupted_call, dropping_interrupted_call, is_interrupt
from icemaint.engine.validation import ValidationResult
from icemaint.operations.outcomes import GroupVerdict, ReadEvidence, RunProof, StagedGroup
from icemaint.engine.staging import PROOF_ID_KEY, PROOF_KEY, RUN_ID_KEY, StagedRewrite, StagingArea
from icemaint.engine.staging_errors import PublishConflict
from icemaint.errors import OperationalError

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)
PROOF_SEED = 0  # which rows the proof samples: the feeding read and the proof must use the same


class CompactionError(OperationalError, RuntimeError):
    """Compaction could not finish; the message says what state the table was left in."""


@dataclass(frozen=True)
class CompactionRequest:
    """One compaction: a date of a table, or (date None) the due partitions of a table without a time column."""

    table: str
    date: str | None
    dry_run: bool = False
    trigger: str = "manual"
    approved: bool = False
    run_id: str | None = None
    planned_snapshot_id: int | None = None
    planned_schema_id: int | None = None
    identity: str | None = None  # who asked, when not the process's identity (an agent's run: the agent)
    agent_reason: str | None = None  # the reason the agent gave for the request that launched the run


@dataclass
class CompactionOutcome:
    table: str
    date: str | None  # None: a table without a time column, compacted per partition (`partitions`)
    decision: str
    reason: str
    dry_run: bool = False
    before_snapshot_id: int | None = None
    after_snapshot_id: int | None = None
    committed_snapshot_ids: list = field(default_factory=list)
    files_before: int | None = None
    files_after: int | None = None
    small_files_before: int | None = None
    small_files_after: int | None = None
    avg_file_bytes_before: float | None = None
    avg_file_bytes_after: float | None = None
    delete_files_before: int | None = None
    delete_files_after: int | None = None
    rewritten_files: int = 0
    added_files: int = 0
    rewritten_bytes: int = 0
    removed_delete_files: int = 0
    # a rewrite of position-delete files alone (decision kind position_deletes_due): the files it merged
    rewritten_delete_files: int = 0
    added_delete_files: int = 0
    validation: RunProof = field(default_factory=RunProof)
    published: bool = False
    staged: list[StagedGroup] = field(default_factory=list)  # one per staged group: branch, S, staged snapshot
    cleaned_staging: list = field(default_factory=list)  # staging refs of dead runs removed by this run
    replanned: str | None = None
    period_key: str | None = None  # set when `date` lies in a month/year partition: the period's key
    partitions: list = field(default_factory=list)  # the partitions rewritten (no time column), best first
    attempts: int = 0
    # the publish commits: attempts made (a lost race is made again at once, without re-staging) and each one's
    # seconds, over every group of the run
    publish_attempts: int = 0
    publish_attempt_seconds: list = field(default_factory=list)
    read_before: ReadEvidence | None = None
    read_after: ReadEvidence | None = None
    durations: dict = field(default_factory=dict)
    decision_detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["validation"] = self.validation.to_dict()
        out["staged"] = [g.to_dict() for g in self.staged]
        out["read_before"] = self.read_before.to_dict() if self.read_before else {}
        out["read_after"] = self.read_after.to_dict() if self.read_after else {}
        return out


def _note_publish_attempts(outcome: CompactionOutcome, entry: StagedGroup, attempts: tuple[float, ...]) -> None:
    entry.publish_attempts = len(attempts)
    entry.publish_attempt_seconds = list(attempts)
    outcome.publish_attempts += len(attempts)
    outcome.publish_attempt_seconds.extend(attempts)


# Test seam: called with each staged rewrite after its files are written and before its proof.
AfterStage = Callable[[StagedRewrite], None]


class Compactor(ContractOperation):
    """Runs one compaction request end to end. Construct once per run; not thread-safe."""

    def __init__(self, config: MaintenanceConfig, spark, reader: CatalogReader, claims, audit, *,
                 after_stage: AfterStage | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 progress: Callable[[str], None] | None = None):
        super().__init__(config, spark, reader, claims, audit, progress=progress, sleep=sleep)
        self.after_stage = after_stage

    # -- public -----------------------------------------------------------------------------
    def run(self, request: CompactionRequest) -> CompactionOutcome:
        """Plan and (unless dry-run) execute; always returns an outcome and writes one audit record.

        Raises:
            InvalidTableName, InvalidDate, TableNotFound: bad input, before anything is touched.
            StagingError, PublishStateUnknown: staging or publishing could not finish; `main` holds
                only what was published (with its proof) before the error, never an unproven rewrite.
        """
        TableName.parse(request.table)
        date = parse_date(request.date, self.config.dates_start,
                          dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1)).isoformat() \
            if request.date is not None else None
        return self.contract.run(
            Operation.COMPACT, request.table, request.run_id,
            new_outcome=lambda run: CompactionOutcome(table=run.name.key, date=date, decision=NOOP, reason="",
                                                      dry_run=request.dry_run),
            act=lambda run, outcome: self._act(request, run, date, outcome),
            record=lambda run, outcome: self._record(request, outcome, run),
            wait_for_claim=launched_by_a_person(request.trigger), progress=self.progress, sleep=self.sleep,
            identity=request.identity, trigger=request.trigger)

    def _act(self, request: CompactionRequest, run: ContractRun, date: str | None, outcome: CompactionOutcome) -> None:
        try:
            self._run_claimed(request, run.name, date, run.policy, run.identity, outcome, loaded=run.loaded)
        finally:
            if outcome.period_key:
                outcome.reason = (f"{outcome.reason} [{date} lies in a month or year partition: the whole period "
                                  f"is maintained, keyed by its first day {outcome.period_key}]")

    # -- steps ------------------------------------------------------------------------------
    def _decide(self, name: TableName, date: str | None, policy, identity: str, approved: bool,
                trigger: str | None = None, loaded: Table | None = None) -> tuple[TableHealth, Decision, bool]:
        """Health now (of `loaded`, the table as the contract just read it under the claim, else read here), the
        decision for the period holding `date` (`decision.date` is its key), or
        with no date for the partitions of a table without a time column, and whether the run is approved (at
        launch, or by an operator's `icemaint approve`): the plan chooses partitions with the same approval.
        An automatic trigger's run is also held where automation's runs would repeat a failure (`held_runs`)."""
        health = self.reader.health(name.key, loaded=loaded)
        records = self.audit.records(table=name.key)
        past = [r.details for r in records if r.operation == "compact" and r.decision == RUN
                and r.details.get("rewrite_seconds")]
        if date is not None and health.dated:
            date = period_start(dt.date.fromisoformat(date), span_of(health.time_transform)).isoformat()
        # An operator's `icemaint approve` (newer than the scope's last run) counts as the launch's approval.
        approved = approved or is_approved(records, date)
        gates = Gates(now=dt.datetime.now(dt.timezone.utc), identity=identity, approved=approved,
                      bytes_per_second=measured_throughput(past), reverted=reverted_scopes(records),
                      held=held_runs(records) if trigger in AUTOMATIC_TRIGGERS else {}, trigger=trigger)
        if date is None:
            if health.dated:
                return health, Decision(table=name.key, operation=Operation.COMPACT, verdict=REFUSE, kind=ReasonKind.POLICY,
                                        reason=(f"{name.key} is maintained per date ({health.time_column} by "
                                                f"{health.time_transform}): give a date (--date YYYY-MM-DD)")), approved
            return health, decide_layout_compaction(health, policy, gates), approved
        return health, decide_compaction(health, date, policy, gates), approved

    def _run_claimed(self, request, name, date, policy, identity, outcome: CompactionOutcome,
                     loaded: Table | None = None) -> None:
        # Spark starts only for work: a dry run or a date that is not due decides from metadata alone, and
        # a dry run only names the staging a dead run left.
        staging = StagingArea(self.spark, self.config.catalog.name, name, request.run_id or uuid.uuid4().hex,
                              race_timeout_seconds=policy.publish_timeout_seconds)
        if not request.dry_run and self._stale_staging_names(name, loaded):
            self._clean_stale_staging(name, request, identity, outcome)
            loaded = None  # the clean-up committed: health reads the table as it left it
        t0 = time.perf_counter()
        health, decision, approved = self._decide(name, date, policy, identity, request.approved, request.trigger,
                                                  loaded=loaded)
        outcome.durations["plan_seconds"] = round(time.perf_counter() - t0, 3)
        if date is not None and decision.date != date:
            # A month (year) partition is maintained whole, keyed by its first day.
            outcome.period_key = decision.date
            date = decision.date
        if request.planned_snapshot_id is not None and request.planned_snapshot_id != health.snapshot_id:
            outcome.replanned = (f"stale plan: planned on snapshot {request.planned_snapshot_id}, table is now at "
                                 f"{health.snapshot_id}; re-planned on the current snapshot")
        if request.planned_schema_id is not None and request.planned_schema_id != health.schema_id:
            outcome.replanned = (f"stale plan: schema changed from {request.planned_schema_id} to "
                                 f"{health.schema_id}; re-planned on the current schema")
        self._fill_before(outcome, health, date, decision)
        if decision.verdict != RUN:
            outcome.decision, outcome.reason = decision.verdict, decision.reason
            return
        if request.approved and decision.cost_estimate.get("rewrite_bytes", 0) > policy.max_rewrite_bytes:
            self._record_approval(request, name, date, identity, decision)
        if request.dry_run:
            outcome.decision = RUN
            outcome.reason = f"dry-run: would rewrite ({decision.reason}); nothing changed"
            left = self._stale_staging_names(name)
            if left:
                outcome.reason += f"; the run would first remove staging left by a dead run: {', '.join(left)}"
            return

        scope = DateScope(health.time_column, health.time_column_type, dt.date.fromisoformat(date),
                          span_of(health.time_transform)) if date is not None else None
        outcome.validation = RunProof(scope=scope.predicate() if scope else
                                      f"partitions {describe_all(decision.rationale.get('partitions', []))}")
        if not getattr(self.spark, "started", True):
            from icemaint.engine.validation import import_in_background

            import_in_background()  # the JVM starts now: the proof's Great Expectations loads meanwhile
        try:
            with dropping_interrupted_call(self.spark):  # e.g. while planning: release_reads needs its own answers
                interrupts.check()
                self._stage_prove_publish(staging, request, name, date, policy, identity, scope, health, decision,
                                          approved, outcome)
        finally:
            staging.release_reads()
        if outcome.decision in (RUN, NOT_PUBLISHED):
            self._fill_after(outcome, name, date)

    def _plan(self, staging: StagingArea, base: int, health: TableHealth, scope: DateScope | None, policy,
              approved: bool, outcome: CompactionOutcome) -> tuple[list, dict]:
        """The files to consider as of `base`: the date's, or those of the due partitions chosen on the
        run's own plan (ranked by benefit within the cost ceiling, as the decision did)."""
        if scope is not None:
            return staging.plan_date_files(base, health.time_column, health.time_column_type, scope.start, scope.end)
        candidates, tasks = staging.plan_table_files(base)
        current = staging.current_spec_id()
        choice = choose_partitions(partitions_of(candidates, current, policy.small_file_size_bytes), policy, approved)
        outcome.partitions = list(choice.keys)
        keys = set(choice.keys)
        return [c for c in candidates if partition_key(c.spec_id, c.partition, current) in keys], tasks

    def _stage_prove_publish(self, staging: StagingArea, request, name, date, policy, identity,
                             scope: DateScope | None, health: TableHealth, decision: Decision, approved: bool,
                             outcome: CompactionOutcome) -> None:
        """Plan on S, then per group: stage -> prove -> publish; conflicts re-plan up to max_commit_retries."""
        sort_keys = parse_sort_order(policy.sort_order, policy.strategy) if policy.strategy != "binpack" else ()
        attempts, index = 0, 0
        while True:
            attempts += 1
            outcome.attempts = attempts
            base = health.snapshot_id
            candidates, tasks = self._plan(staging, base, health, scope, policy, approved, outcome)
            deletes_only = decision.kind == ReasonKind.POSITION_DELETES_DUE and scope is not None
            if deletes_only:
                groups = plan_position_deletes(staging, tasks)
            else:
                # A date due for its layout drift is written in the table's current spec and sort order.
                layout = LayoutTarget.of(health, policy) if decision.kind == ReasonKind.LAYOUT_DRIFT else None
                groups = plan_groups(candidates, small_file_size_bytes=policy.small_file_size_bytes,
                                     delete_file_threshold=policy.delete_file_threshold,
                                     partial_progress=policy.partial_progress,
                                     max_group_bytes=policy.max_file_group_size_bytes, layout=layout)
            if not groups:
                if not outcome.committed_snapshot_ids:
                    outcome.decision = NOOP
                    outcome.reason = (f"nothing to rewrite on snapshot {base}: no partition of "
                                      f"{'the date' if scope else 'the table'} has " + (
                                          "two or more position-delete files" if deletes_only else
                                          "two or more small files or a file with deletes to apply"))
                    if len(candidates) >= 2 and policy.partial_progress and not deletes_only:
                        outcome.reason = (f"nothing to rewrite on snapshot {base}: with partial_progress, no file "
                                          f"group of at most max_file_group_size_bytes "
                                          f"{human_size(policy.max_file_group_size_bytes)} holds two of the "
                                          f"{counted(len(candidates), 'candidate file')}: raise it")
                return
            try:
                for group in groups:
                    index += 1
                    stage = self._stager(staging, group, tasks, base, policy, sort_keys, index,
                                         scope if deletes_only else None, health)
                    if not self._one_group(staging, request, name, date, policy, stage, base, index, outcome):
                        return  # proof failed: nothing more is published
            except PublishConflict as exc:
                log.warning("publish conflict on %s %s (attempt %d): %s", name.key, date, attempts, exc)
                if attempts > policy.max_commit_retries:
                    outcome.decision = DEFER
                    outcome.reason = (f"a writer's commit conflicts with the rewrite of {date or 'its partitions'} "
                                      "(planned on snapshot "
                                      f"{base}) after {attempts} attempts (max_commit_retries "
                                      f"{policy.max_commit_retries}): {exc}; nothing was lost, main was not changed "
                                      "by the conflicting publish")
                    return
                self.sleep(policy.retry_backoff_seconds * 2 ** (attempts - 1))
                health, decision, approved = self._decide(name, date, policy, identity, request.approved, request.trigger)
                outcome.replanned = f"re-planned after a publish conflict on attempt {attempts}: {exc}"
                if decision.verdict != RUN:
                    if not outcome.committed_snapshot_ids:
                        outcome.decision, outcome.reason = decision.verdict, f"after a publish conflict: {decision.reason}"
                    return
                continue
            if not outcome.committed_snapshot_ids and outcome.staged and \
                    all(e.verdict == GroupVerdict.NO_GAIN for e in outcome.staged):
                e = outcome.staged[-1]
                outcome.decision = NOOP
                outcome.reason = (f"nothing gained: the rewrite of {e.replaced_files} files wrote {e.new_files}, "
                                  "so it was not published (main is unchanged); the writer rolls files before "
                                  "target_file_size_bytes: check it against small_file_size_bytes and the table's "
                                  "write.parquet.page-size-bytes / row-group size")
                return
            outcome.decision, outcome.reason = RUN, decision.reason
            unpublished = sum(1 for e in outcome.staged if e.verdict == GroupVerdict.NO_GAIN)
            if unpublished:
                outcome.reason += (f" ({unpublished} of {len(outcome.staged)} groups not published: their rewrite "
                                   "wrote as many files as it replaced)")
            return

    @staticmethod
    def _stager(staging: StagingArea, group, tasks: dict, base: int, policy, sort_keys, index: int,
                deletes_scope: DateScope | None, health: TableHealth) -> Callable[[], StagedRewrite]:
        """How one group is staged: its data files rewritten, or (`deletes_scope` set, a DeleteGroup) only
        its position-delete files."""
        if deletes_scope is None:
            from icemaint.engine.digest import digest_feed, fed_sample_fraction

            # The proof's old side is digested by the read that feeds the writer: the proof reads only the new files.
            def feed(rows, planned_rows: int):
                return digest_feed(rows, base, sample_fraction=fed_sample_fraction(policy.sample_fraction, planned_rows),
                                   seed=PROOF_SEED)

            return lambda: staging.stage(group, tasks, base, target_file_size_bytes=policy.target_file_size_bytes,
                                         strategy=policy.strategy, sort_keys=sort_keys, index=index, feed=feed)
        scan_filter = staging.date_filter(health.time_column, health.time_column_type, deletes_scope.start,
                                          deletes_scope.end)
        return lambda: stage_position_deletes(staging, group, tasks, base, scan_filter,
                                              target_file_size_bytes=policy.target_file_size_bytes, index=index)

    def _one_group(self, staging: StagingArea, request, name: TableName, date: str, policy,
                   stage: Callable[[], StagedRewrite], base: int, index: int, outcome: CompactionOutcome) -> bool:
        """Stage, prove and publish one group; False when its proof failed (nothing published)."""
        from icemaint.engine.validation import RowSet, failure_summary, prove_rows

        t0 = time.perf_counter()
        self.progress(f"staging group {index} of {name.key} {date} from snapshot {base}")
        staged = stage()
        try:  # from here on the branch is this run's to remove, whatever happens (an interrupt lands anywhere)
            entry = StagedGroup(target=staged.target, branch=staged.branch, base_snapshot_id=base,
                                staged_snapshot_id=staged.staged_snapshot_id,
                                replaced_files=len(staged.replaced_files), new_files=len(staged.new_files),
                                dangling_deletes=len(staged.dangling_deletes),
                                codec=staged.codec.to_dict() if staged.codec else {})
            outcome.staged.append(entry)
            _add_seconds(outcome, "rewrite_seconds", t0)
            if staged.target == "data" and not staged.applied_deletes and not staged.dangling_deletes \
                    and not staged.relayout and len(staged.new_files) >= len(staged.replaced_files):
                # Nothing gained: publishing would only make a new snapshot whose date is as due as before, so
                # every tick would rewrite it again (e.g. a writer that rolls files below small_file_size_bytes).
                # A rewrite that applies deletes gains even with as many files, and is published.
                entry.verdict = GroupVerdict.NO_GAIN
                self.progress(f"not publishing {name.key} {date}: {len(staged.replaced_files)} files rewrite to "
                              f"{len(staged.new_files)}")
                return True
            if self.after_stage:
                self.after_stage(staged)
            self.progress(f"proving {name.key} {date}: {len(staged.replaced_files)} files as of snapshot {base} "
                          f"-> {len(staged.new_files)} staged files (snapshot {staged.staged_snapshot_id})")
            t_val = time.perf_counter()
            try:
                fed = staged.feed.result() if staged.feed is not None else None
                proof = prove_rows(
                    RowSet(base, lambda: staging.before_rows(staged), f"the replaced files as of snapshot {base}"),
                    RowSet(staged.staged_snapshot_id, lambda: staging.after_rows(staged),
                           f"the staged files (snapshot {staged.staged_snapshot_id})"),
                    scope=outcome.validation.scope, sample_fraction=policy.sample_fraction, seed=PROOF_SEED,
                    what=name.key, fed=fed, planned_rows=staged.replaced_rows if fed is not None else None)
            except Exception as exc:
                # A proof that could not run proves nothing: treated as failed, nothing is published.
                log.exception("the proof of %s %s could not run", name.key, date)
                proof = ValidationResult.could_not_run(base, staged.staged_snapshot_id, outcome.validation.scope, exc)
            _add_seconds(outcome, "validation_seconds", t_val)
            outcome.validation.add(proof)
            # what the layout costs a reader, before and after: the proof's own read of the rewritten files (the
            # replaced side's times are 0 when the rewrite's read digested it: its cost is in the rewrite's)
            outcome.read_before, outcome.read_after = outcome.validation.read_before, outcome.validation.read_after
            if not proof.passed:
                entry.verdict = GroupVerdict.NOT_PUBLISHED
                outcome.decision = NOT_PUBLISHED
                outcome.reason = (f"proof failed for {name.key} {date} (snapshot {base} -> staged "
                                  f"{staged.staged_snapshot_id}): {failure_summary(proof)}; nothing was published, "
                                  "main is unchanged")
                self.progress(f"PROOF FAILED for {name.key} {date}: {outcome.reason}")
                return False
            interrupts.check()  # the last moment an operator's Ctrl-C keeps main as it is
            t_pub = time.perf_counter()
            try:
                published = staging.publish(staged, {
                    RUN_ID_KEY: request.run_id or "cli", PROOF_KEY: "passed",
                    PROOF_ID_KEY: f"{request.run_id or 'cli'}:{index}"}, sleep=self.sleep)
            except PublishConflict as exc:
                _note_publish_attempts(outcome, entry, exc.attempts)
                raise
            _add_seconds(outcome, "publish_seconds", t_pub)
            _note_publish_attempts(outcome, entry, published.attempts)
            entry.published_snapshot_id, entry.verdict = published.snapshot_id, GroupVerdict.PUBLISHED
            if published.state_was_unknown:
                entry.note = ("the catalog reported an unknown commit state; a re-read of the table found "
                                 "the publish on main, so it landed once and was not retried")
            outcome.published = True
            if not outcome.committed_snapshot_ids:
                outcome.before_snapshot_id = base
            outcome.committed_snapshot_ids.append(published.snapshot_id)
            outcome.after_snapshot_id = published.snapshot_id
            if staged.target == "position_deletes":
                outcome.rewritten_delete_files += len(staged.replaced_files)
                outcome.added_delete_files += len(staged.new_files)
            else:
                outcome.rewritten_files += len(staged.replaced_files)
                outcome.added_files += len(staged.new_files)
            outcome.rewritten_bytes += staged.replaced_bytes
            outcome.removed_delete_files += len(staged.dangling_deletes)
            return True
        except BaseException as exc:
            if is_interrupt(exc):
                drop_interrupted_call(self.spark)  # so the branch's removal below gets its own answer
                self._note_landed_publish(staging, staged, outcome)
            raise
        finally:
            staging.discard(staged.branch)

    @staticmethod
    def _note_landed_publish(staging: StagingArea, staged, outcome: CompactionOutcome) -> None:
        """An interrupt may land after the publish commit and before the run learnt its snapshot: look for it on
        main, so the interrupted run's record names what it committed."""
        try:
            landed = staging.find_published(staged.staged_snapshot_id)
        except Exception:  # the record then says where main is without naming the commit as ours
            return
        if landed is not None and landed.snapshot_id not in outcome.committed_snapshot_ids:
            outcome.published = True
            outcome.committed_snapshot_ids.append(landed.snapshot_id)
            outcome.after_snapshot_id = landed.snapshot_id

    def _stale_staging_names(self, name: TableName, loaded: Table | None = None) -> list[str]:
        """Staging branches on the table, read from its metadata (no Spark; `loaded`: as already read)."""
        from icemaint.engine.staging import STAGE_PREFIX

        table = loaded if loaded is not None else self.reader.load(name.key)
        return sorted(ref for ref in table.metadata.refs if ref.startswith(STAGE_PREFIX))

    def _clean_stale_staging(self, name: TableName, request, identity: str, outcome: CompactionOutcome) -> None:
        """Under the claim no staging of ours is live: any staging branch left is a dead run's. Remove and audit it."""
        from icemaint.operations.cleanup import clean_stale_staging

        for entry in clean_stale_staging(self.spark, self.config.catalog.name, name, self.audit, identity=identity,
                                         run_id=request.run_id, trigger=request.trigger, date=outcome.date):
            outcome.cleaned_staging.append({"branch": entry["branch"], "staged_snapshot_id": entry["staged_snapshot_id"]})

    def _fill_after(self, outcome: CompactionOutcome, name: TableName, date: str | None) -> None:
        after = self.reader.health(name.key)
        part = after.partition(date)
        outcome.files_after = part.data_files if part else 0
        outcome.small_files_after = part.small_files if part else 0
        outcome.delete_files_after = part.delete_files if part else 0
        outcome.avg_file_bytes_after = (part.total_bytes / part.data_files) if part and part.data_files else 0.0
        if not outcome.committed_snapshot_ids:
            outcome.after_snapshot_id = after.snapshot_id

    def _fill_before(self, outcome: CompactionOutcome, health: TableHealth, date: str | None,
                     decision: Decision) -> None:
        part = health.partition(date)
        outcome.before_snapshot_id = health.snapshot_id
        outcome.files_before = part.data_files if part else 0
        outcome.small_files_before = part.small_files if part else 0
        outcome.delete_files_before = part.delete_files if part else 0
        outcome.avg_file_bytes_before = (part.total_bytes / part.data_files) if part and part.data_files else 0.0
        outcome.decision_detail = decision.to_dict()

    def _record_approval(self, request, name: TableName, date: str, identity: str, decision: Decision) -> None:
        """A run launched as approved (CLI --approved, or `approved: true` in the UI launchpad) is the approval."""
        from icemaint.safety.audit import AuditRecord

        self.audit.append(AuditRecord(
            table=name.key, operation="approve", decision="approved", date=date, identity=identity,
            run_id=request.run_id, trigger=request.trigger, cost_estimate=decision.cost_estimate,
            reason=f"run over the cost ceiling approved at launch by {identity}"))

    def _record(self, request: CompactionRequest, outcome: CompactionOutcome, run: ContractRun) -> CompactionOutcome:
        from icemaint.safety.audit import AuditRecord

        identity, writer_check = run.identity, {"claim_holder": run.claim_holder} if run.claim_holder else None
        outcome.durations["total_seconds"] = round(time.perf_counter() - run.started, 3)
        detail = outcome.decision_detail or {}
        self.audit.append(AuditRecord(
            table=outcome.table, operation=Operation.COMPACT, decision=outcome.decision, reason=outcome.reason,
            date=outcome.date, trigger=request.trigger, identity=identity, run_id=request.run_id,
            before_snapshot_id=outcome.before_snapshot_id, after_snapshot_id=outcome.after_snapshot_id,
            writer_check=writer_check or detail.get("writer_check", {}),
            partition_rationale=detail.get("rationale", {}),
            cost_estimate=detail.get("cost_estimate", {}),
            validation=outcome.validation.to_dict(), durations=outcome.durations,
            details={**({"agent_reason": request.agent_reason} if request.agent_reason else {}),
                     "dry_run": outcome.dry_run, "files_before": outcome.files_before,
                     "files_after": outcome.files_after, "rewritten_bytes": outcome.rewritten_bytes,
                     "rewritten_delete_files": outcome.rewritten_delete_files,
                     "added_delete_files": outcome.added_delete_files,
                     "rewrite_seconds": outcome.durations.get("rewrite_seconds"),
                     "committed_snapshot_ids": outcome.committed_snapshot_ids,
                     "published": outcome.published, "staged": [g.to_dict() for g in outcome.staged],
                     "cleaned_staging": outcome.cleaned_staging,
                     "replanned": outcome.replanned, "attempts": outcome.attempts,
                     # the typed kind of the decision this record ends with (none when the run ended otherwise)
                     **({"reason_kind": detail["kind"]} if detail.get("verdict") == str(outcome.decision) else {}),
                     # which Spark application did the work (its executors' logs, the master's UI); none
                     # when the run decided from metadata alone
                     **_spark_app_of(self.spark)},
        ))
        return outcome


def _spark_app_of(spark) -> dict:
    if not getattr(spark, "started", True):
        return {"spark_app_id": None, "spark_master": None}
    return {"spark_app_id": spark.sparkContext.applicationId, "spark_master": spark.sparkContext.master}


def _add_seconds(outcome: CompactionOutcome, key: str, started: float) -> None:
    """Adds the time since `started` to a duration (several groups add to the same one)."""
    outcome.durations[key] = round(outcome.durations.get(key, 0.0) + time.perf_counter() - started, 3)
