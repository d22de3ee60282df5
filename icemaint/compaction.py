"""Safe compaction of one date of one table, following the operating contract.

Claim -> (re)plan -> rewrite the date's small files (retrying commit conflicts) -> prove with Great
Expectations that every committed rewrite changed no data -> on failure roll back, re-applying any
writer commit that landed after -> record evidence and one audit record.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from icemaint.claims import ClaimBusy
from icemaint.config import MaintenanceConfig
from icemaint.decisions import DEFER, NOOP, REFUSE, RUN, Decision, Gates, decide_compaction, measured_throughput, \
    refusal_for
from icemaint.health import TableHealth
from icemaint.metadata import CatalogReader, read_snapshots
from icemaint.names import TableName
from icemaint.scope import DateScope, parse_date
from icemaint.snapshots import CHERRY_PICKABLE, chain_since, proof_spans

log = logging.getLogger(__name__)

CONFLICT_MARKERS = ("CommitFailedException", "ValidationException", "CommitStateUnknownException")


class CompactionError(RuntimeError):
    """Compaction could not finish safely; the message says what state the table was left in."""


class RollbackImpossible(CompactionError):
    """Validation failed, but a later writer commit cannot be re-applied: the table was left as it is."""


@dataclass(frozen=True)
class CompactionRequest:
    table: str
    date: str
    dry_run: bool = False
    trigger: str = "manual"
    approved: bool = False
    run_id: str | None = None
    planned_snapshot_id: int | None = None
    planned_schema_id: int | None = None


@dataclass
class CompactionOutcome:
    table: str
    date: str
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
    validation: dict = field(default_factory=lambda: {"passed": None})
    rolled_back: bool = False
    rollback: dict = field(default_factory=dict)
    replanned: str | None = None
    attempts: int = 0
    read_before: dict = field(default_factory=dict)
    read_after: dict = field(default_factory=dict)
    durations: dict = field(default_factory=dict)
    decision_detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# (spark, catalog, table, scope, options, strategy, sort_order) -> the procedure's result row.
# Swappable so tests can inject a faulty rewrite; the default is Iceberg's rewrite_data_files (which
# commits one `replace` for the rewrite and one for dangling deletes). A rewrite that commits other
# snapshots too names them under COMMITTED_KEY so that they are validated (and rolled back) with it.
RewriteFn = Callable[..., dict]
COMMITTED_KEY = "committed_snapshot_ids"


def is_conflict(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in CONFLICT_MARKERS)


def rewrite_sql(catalog: str, table: TableName, scope: str, options: dict[str, str], strategy: str,
                sort_order: str | None) -> str:
    """The CALL statement. Every value here comes from validated policy or our own scope builder."""
    opts = ", ".join(f"'{k}', '{v}'" for k, v in sorted(options.items()))
    args = [f"table => {table.procedure_arg()}", f"strategy => '{'sort' if strategy == 'zorder' else strategy}'",
            f'where => "{scope}"', f"options => map({opts})"]
    if strategy == "sort":
        args.append(f"sort_order => '{sort_order}'")
    elif strategy == "zorder":
        args.append(f"sort_order => 'zorder({sort_order})'")
    return f"CALL `{catalog}`.system.rewrite_data_files({', '.join(args)})"


def call_rewrite_data_files(spark, catalog: str, table: TableName, scope: str, options: dict[str, str],
                            strategy: str = "binpack", sort_order: str | None = None) -> dict:
    row = spark.sql(rewrite_sql(catalog, table, scope, options, strategy, sort_order)).collect()[0]
    return row.asDict()


class Compactor:
    """Runs one compaction request end to end. Construct once per run; not thread-safe."""

    def __init__(self, config: MaintenanceConfig, spark, reader: CatalogReader, claims, audit, *,
                 rewrite: RewriteFn = call_rewrite_data_files,
                 after_commit: Callable[[list[int]], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 progress: Callable[[str], None] | None = None):
        self.config = config
        self.spark = spark
        self.reader = reader
        self.claims = claims
        self.audit = audit
        self.rewrite = rewrite
        self.after_commit = after_commit
        self.sleep = sleep
        self.progress = progress or (lambda msg: log.info(msg))

    # -- public -----------------------------------------------------------------------------
    def run(self, request: CompactionRequest) -> CompactionOutcome:
        """Plan and (unless dry-run) execute; always returns an outcome and writes one audit record.

        Raises:
            InvalidTableName, InvalidDate, TableNotFound: bad input, before anything is touched.
            RollbackImpossible, CompactionError: the table could not be made safe automatically.
        """
        started = time.perf_counter()
        name = TableName.parse(request.table)
        date = parse_date(request.date, self.config.dates_start,
                          dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1)).isoformat()
        self.reader.metadata_location(name.key)  # TableNotFound before anything else
        policy = self.config.policy(name.key)
        identity = self.config.identity()
        outcome = CompactionOutcome(table=name.key, date=date, decision=NOOP, reason="", dry_run=request.dry_run)
        refused = refusal_for(policy, "compact", identity)
        if refused:  # policy first: a read-only table refuses whether or not a writer holds its claim
            outcome.decision, outcome.reason = REFUSE, refused
            self._record(request, outcome, identity, started)
            return outcome
        try:
            claim = self.claims.acquire(name.key, holder=f"icemaint:compact:{request.run_id or 'cli'}")
        except ClaimBusy as exc:
            outcome.decision, outcome.reason = DEFER, f"claim busy: {exc}"
            self._record(request, outcome, identity, started, writer_check={"claim_holder": getattr(exc, "holder", None)})
            return outcome
        try:
            self._run_claimed(request, name, date, policy, identity, outcome)
        except Exception as exc:
            outcome.decision = outcome.decision if outcome.decision != RUN else "failed"
            outcome.reason = f"{type(exc).__name__}: {exc}"
            self._record(request, outcome, identity, started)
            raise
        finally:
            claim.release()
        self._record(request, outcome, identity, started)
        return outcome

    # -- steps ------------------------------------------------------------------------------
    def _decide(self, name: TableName, date: str, policy, identity: str, approved: bool) -> tuple[TableHealth, Decision]:
        health = self.reader.health(name.key)
        past = [r.details for r in self.audit.records(table=name.key, operation="compact")
                if r.decision == RUN and r.details.get("rewrite_seconds")]
        gates = Gates(now=dt.datetime.now(dt.timezone.utc), identity=identity, approved=approved,
                      bytes_per_second=measured_throughput(past))
        return health, decide_compaction(health, date, policy, gates)

    def _run_claimed(self, request, name, date, policy, identity, outcome: CompactionOutcome) -> None:
        t0 = time.perf_counter()
        health, decision = self._decide(name, date, policy, identity, request.approved)
        outcome.durations["plan_seconds"] = round(time.perf_counter() - t0, 3)
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
            return

        scope = DateScope(health.time_column, health.time_column_type, dt.date.fromisoformat(date)).predicate()
        table_sql = name.sql(self.config.catalog.name)
        self.spark.sql(f"REFRESH TABLE {table_sql}")
        result, health = self._rewrite_with_retries(name, date, policy, identity, request, scope, health, outcome)
        if result is None:
            return
        outcome.decision, outcome.reason = RUN, decision.reason
        outcome.rewritten_files = int(result.get("rewritten_data_files_count") or 0)
        outcome.added_files = int(result.get("added_data_files_count") or 0)
        outcome.rewritten_bytes = int(result.get("rewritten_bytes_count") or 0)

        tbl = self.reader.load(name.key)
        snapshots = read_snapshots(tbl)
        current = tbl.current_snapshot().snapshot_id
        new = chain_since(snapshots, current, health.snapshot_id)
        declared = set(result.get(COMMITTED_KEY) or ())
        committed = [s for s in new if s.by_maintenance or s.snapshot_id in declared]
        if not committed:
            outcome.decision = NOOP
            outcome.reason = "nothing rewritten: no file group of the date met the rewrite options"
            outcome.after_snapshot_id = current
            return
        outcome.committed_snapshot_ids = [s.snapshot_id for s in committed]
        outcome.before_snapshot_id = committed[0].parent_id
        outcome.after_snapshot_id = committed[-1].snapshot_id
        if self.after_commit:
            self.after_commit(outcome.committed_snapshot_ids)

        self.progress(f"validating {name.key} {date}: snapshot {outcome.before_snapshot_id} -> {outcome.after_snapshot_id}")
        t_val = time.perf_counter()
        validation = self._validate(table_sql, proof_spans(new, {s.snapshot_id for s in committed}), scope, policy)
        outcome.durations["validation_seconds"] = round(time.perf_counter() - t_val, 3)
        outcome.validation = validation
        self._fill_read_evidence(outcome, validation)
        if not validation["passed"]:
            self.progress(f"validation FAILED for {name.key} {date}: rolling back to {outcome.before_snapshot_id}")
            outcome.rollback = self._roll_back(name, table_sql, scope, outcome.before_snapshot_id, committed)
            outcome.rolled_back = True
            outcome.reason = "validation failed: rolled back to the snapshot before the rewrite"
        after = self.reader.health(name.key)
        part = after.partition(date)
        outcome.files_after = part.data_files if part else 0
        outcome.small_files_after = part.small_files if part else 0
        outcome.delete_files_after = part.delete_files if part else 0
        outcome.avg_file_bytes_after = (part.total_bytes / part.data_files) if part and part.data_files else 0.0

    @staticmethod
    def _fill_read_evidence(outcome: CompactionOutcome, validation: dict) -> None:
        """What the layout costs a reader, before and after: the proof's own read of the date.

        The proof reads every row of the date once from each side (count, aggregates, sample), so
        its planning and scan times before and after are the same query on the two layouts; no
        extra probe query is run.
        """
        proofs = validation.get("commits") or []
        if proofs:
            outcome.read_before = dict(proofs[0].get("reads", {}).get("before", {}))
            outcome.read_after = dict(proofs[-1].get("reads", {}).get("after", {}))

    def _fill_before(self, outcome: CompactionOutcome, health: TableHealth, date: str, decision: Decision) -> None:
        part = health.partition(date)
        outcome.before_snapshot_id = health.snapshot_id
        outcome.files_before = part.data_files if part else 0
        outcome.small_files_before = part.small_files if part else 0
        outcome.delete_files_before = part.delete_files if part else 0
        outcome.avg_file_bytes_before = (part.total_bytes / part.data_files) if part and part.data_files else 0.0
        outcome.decision_detail = decision.to_dict()

    def _options(self, policy) -> dict[str, str]:
        return {
            "target-file-size-bytes": str(policy.target_file_size_bytes),
            # Only files below the small-file size are rewritten for their size...
            "min-file-size-bytes": str(policy.small_file_size_bytes),
            "max-file-size-bytes": str(max(policy.target_file_size_bytes * 2, policy.small_file_size_bytes + 1)),
            # ...and any group of two or more is worth it once the decision said run.
            "min-input-files": "2",
            "delete-file-threshold": str(policy.delete_file_threshold),
            "partial-progress.enabled": str(policy.partial_progress).lower(),
            "max-concurrent-file-group-rewrites": str(policy.max_concurrent_file_group_rewrites),
            # Position deletes whose data files were rewritten are dropped in the same commit. New
            # files take the commit's sequence number so that deletes committed at the starting
            # sequence number count as dangling too; a conflicting new delete still fails Iceberg's
            # commit validation (retried, then deferred), and the GX proof is the second net.
            "remove-dangling-deletes": "true",
            "use-starting-sequence-number": "false",
        }

    def _rewrite_with_retries(self, name, date, policy, identity, request, scope, health, outcome):
        attempts = 0
        while True:
            attempts += 1
            outcome.attempts = attempts
            t0 = time.perf_counter()
            try:
                self.progress(f"rewriting {name.key} {date} (attempt {attempts}): {scope}")
                result = self.rewrite(self.spark, self.config.catalog.name, name, scope, self._options(policy),
                                      policy.strategy, policy.sort_order)
                outcome.durations["rewrite_seconds"] = round(time.perf_counter() - t0, 3)
                return result, health
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                log.warning("commit conflict on %s %s (attempt %d): %s", name.key, date, attempts, exc)
                if attempts > policy.max_commit_retries:
                    outcome.decision = DEFER
                    outcome.reason = (f"commit conflict persisted after {attempts} attempts "
                                      f"(max_commit_retries {policy.max_commit_retries}): {str(exc).splitlines()[0][:300]}")
                    return None, health
                self.sleep(policy.retry_backoff_seconds * 2 ** (attempts - 1))
                # The table moved: re-plan on what is there now.
                health, decision = self._decide(name, date, policy, identity, request.approved)
                outcome.replanned = f"re-planned after commit conflict on attempt {attempts}"
                if decision.verdict != RUN:
                    outcome.decision, outcome.reason = decision.verdict, f"after commit conflict: {decision.reason}"
                    return None, health

    def _validate(self, table_sql: str, spans: list[tuple[int, int]], scope: str, policy) -> dict:
        """One GX proof per span of consecutive maintenance commits (see `proof_spans`)."""
        from icemaint.validation import validate_rewrite

        try:
            results = [validate_rewrite(self.spark, table_sql, before, after, scope,
                                        sample_fraction=policy.sample_fraction).to_dict() for before, after in spans]
        except Exception as exc:
            # A proof that could not run proves nothing: the rewrite is treated as failed and rolled back.
            log.exception("validation of %s could not run", table_sql)
            return {"passed": False, "scope": scope, "commits": [],
                    "error": f"validation could not run: {type(exc).__name__}: {str(exc)[:500]}"}
        return {"passed": all(r["passed"] for r in results), "scope": scope, "commits": results}

    def _roll_back(self, name: TableName, table_sql: str, scope: str, before_id: int, committed) -> dict:
        """Back to `before_id`, then re-apply every writer commit that landed after the rewrite."""
        tbl = self.reader.load(name.key)
        snapshots = read_snapshots(tbl)
        new = chain_since(snapshots, tbl.current_snapshot().snapshot_id, before_id)
        committed_ids = {s.snapshot_id for s in committed}
        later = [s for s in new if s.snapshot_id not in committed_ids and not s.by_maintenance]
        blocked = [s for s in later if s.operation not in CHERRY_PICKABLE]
        if blocked:
            raise RollbackImpossible(
                f"validation failed on {name.key}, but writer commit(s) "
                f"{[(s.snapshot_id, s.operation) for s in blocked]} landed after the rewrite and cannot be "
                f"re-applied by cherry-pick: the table was left as it is (current snapshot "
                f"{tbl.current_snapshot().snapshot_id}); restore by hand from snapshot {before_id}")
        expected_delta = {"scope": 0, "table": 0}
        for s in later:
            expected_delta["scope"] += self._count(table_sql, s.snapshot_id, scope) - self._count(table_sql, s.parent_id, scope)
            expected_delta["table"] += self._count(table_sql, s.snapshot_id) - self._count(table_sql, s.parent_id)
        catalog = self.config.catalog.name
        self.spark.sql(f"CALL `{catalog}`.system.rollback_to_snapshot({name.procedure_arg()}, {int(before_id)})")
        for s in later:
            self.spark.sql(f"CALL `{catalog}`.system.cherrypick_snapshot({name.procedure_arg()}, {int(s.snapshot_id)})")
        self.spark.sql(f"REFRESH TABLE {table_sql}")
        current = self.reader.load(name.key).current_snapshot().snapshot_id
        proof = {
            "rolled_back_to": before_id,
            "reapplied_writer_snapshots": [s.snapshot_id for s in later],
            "current_snapshot_id": current,
            "rows_before_scope": self._count(table_sql, before_id, scope),
            "rows_now_scope": self._count(table_sql, current, scope),
            "rows_before_table": self._count(table_sql, before_id),
            "rows_now_table": self._count(table_sql, current),
            "expected_writer_delta": expected_delta,
        }
        proof["parity"] = (proof["rows_now_scope"] == proof["rows_before_scope"] + expected_delta["scope"]
                           and proof["rows_now_table"] == proof["rows_before_table"] + expected_delta["table"])
        if not proof["parity"]:
            raise CompactionError(f"rollback of {name.key} did not restore row parity: {proof}")
        return proof

    def _count(self, table_sql: str, snapshot_id: int | None, scope: str | None = None) -> int:
        if snapshot_id is None:
            return 0
        where = f" WHERE {scope}" if scope else ""
        return self.spark.sql(f"SELECT count(*) AS n FROM {table_sql} VERSION AS OF {int(snapshot_id)}{where}").collect()[0]["n"]

    def _record_approval(self, request, name: TableName, date: str, identity: str, decision: Decision) -> None:
        """A run launched as approved (CLI --approved, or `approved: true` in the UI launchpad) is the approval."""
        from icemaint.audit import AuditRecord

        self.audit.append(AuditRecord(
            table=name.key, operation="approve", decision="approved", date=date, identity=identity,
            run_id=request.run_id, trigger=request.trigger, cost_estimate=decision.cost_estimate,
            reason=f"run over the cost ceiling approved at launch by {identity}"))

    def _record(self, request: CompactionRequest, outcome: CompactionOutcome, identity: str, started: float,
                writer_check: dict | None = None) -> None:
        from icemaint.audit import AuditRecord

        outcome.durations["total_seconds"] = round(time.perf_counter() - started, 3)
        detail = outcome.decision_detail or {}
        decision = "rollback" if outcome.rolled_back else outcome.decision
        self.audit.append(AuditRecord(
            table=outcome.table, operation="compact", decision=decision, reason=outcome.reason,
            date=outcome.date, trigger=request.trigger, identity=identity, run_id=request.run_id,
            before_snapshot_id=outcome.before_snapshot_id, after_snapshot_id=outcome.after_snapshot_id,
            writer_check=writer_check or detail.get("writer_check", {}),
            partition_rationale=detail.get("rationale", {}),
            cost_estimate=detail.get("cost_estimate", {}),
            validation=outcome.validation, rollback=outcome.rollback, durations=outcome.durations,
            details={"dry_run": outcome.dry_run, "files_before": outcome.files_before,
                     "files_after": outcome.files_after, "rewritten_bytes": outcome.rewritten_bytes,
                     "rewrite_seconds": outcome.durations.get("rewrite_seconds"),
                     "committed_snapshot_ids": outcome.committed_snapshot_ids,
                     "replanned": outcome.replanned, "attempts": outcome.attempts},
        ))
