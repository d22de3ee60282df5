"""`icemaint revert TABLE --snapshot P`: an operator's undo of a published rewrite, as a forward commit.

Under the operating contract (policy, claim, one audit record): plan the swap on the current head H
(`icemaint.engine.revert`), prove with the same Great Expectations suites that the files coming back
hold exactly the rows main reads from the rewrite's files now, and only then commit one `replace` on
main validated from H. A refused or unproven revert changes nothing. `main` is never rewound.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field

from icemaint.domain.verdicts import DEFER, NOT_PUBLISHED, REFUSE, RUN, Operation
from icemaint.domain.names import TableName
from icemaint.operations.contract import ContractOperation, ContractRun
from icemaint.operations.outcomes import RunProof


@dataclass(frozen=True)
class RevertRequest:
    table: str
    snapshot_id: int
    dry_run: bool = False
    trigger: str = "cli"
    run_id: str | None = None


@dataclass
class RevertOutcome:
    table: str
    snapshot_id: int
    decision: str
    reason: str
    dry_run: bool = False
    head_snapshot_id: int | None = None
    after_snapshot_id: int | None = None
    restored_files: int = 0
    removed_files: int = 0
    restored_records: int = 0
    validation: RunProof = field(default_factory=RunProof)
    durations: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["validation"] = self.validation.to_dict()
        return out


class RevertRunner(ContractOperation):
    """Runs one revert request under the contract (built as `ContractOperation` is)."""

    def run(self, request: RevertRequest) -> RevertOutcome:
        """Raises InvalidTableName / TableNotFound before anything is touched; otherwise returns an outcome."""
        TableName.parse(request.table)
        return self.contract.run(
            Operation.REVERT, request.table, request.run_id,
            new_outcome=lambda run: RevertOutcome(run.name.key, request.snapshot_id, RUN, "", request.dry_run),
            act=lambda run, outcome: self._act(request, run, outcome),
            record=lambda run, outcome: self._record(request, run, outcome),
            wait_for_claim=True, progress=self.progress)

    def _act(self, request: RevertRequest, run: ContractRun, outcome: RevertOutcome) -> None:
        from icemaint.engine.revert import Reverter, RevertRefused
        from icemaint.engine.staging_errors import PublishConflict
        from icemaint.engine.validation import RowSet, failure_summary, prove_rows

        reverter = Reverter(self.spark, self.config.catalog.name, run.name, request.run_id or uuid.uuid4().hex)
        started = time.perf_counter()
        try:
            try:
                plan = reverter.plan(request.snapshot_id)
            except RevertRefused as exc:
                outcome.decision, outcome.reason = REFUSE, f"not reverted: {exc}"
                return
            outcome.head_snapshot_id = plan.head_snapshot_id
            outcome.restored_files, outcome.removed_files = len(plan.restored_files), len(plan.removed_files)
            outcome.restored_records = plan.restored_records
            if request.dry_run:
                outcome.reason = (f"dry-run: would put back the {len(plan.restored_files)} files snapshot "
                                  f"{plan.published_snapshot_id} replaced, in place of its {len(plan.removed_files)} "
                                  "files; nothing changed")
                return
            self.progress(f"proving the revert of {run.name.key} snapshot {plan.published_snapshot_id} "
                          f"on {plan.head_snapshot_id}")
            proof = prove_rows(
                RowSet(plan.head_snapshot_id, lambda: reverter.rows_now(plan),
                       f"the rewrite's files as of snapshot {plan.head_snapshot_id}"),
                RowSet(plan.published_snapshot_id, lambda: reverter.rows_restored(plan),
                       f"the files snapshot {plan.published_snapshot_id} replaced"),
                scope=f"the files of snapshot {plan.published_snapshot_id}",
                sample_fraction=run.policy.sample_fraction, what=run.name.key)
            outcome.validation = RunProof(scope=proof.scope, proofs=[proof])
            outcome.durations["validation_seconds"] = round(time.perf_counter() - started, 3)
            if not proof.passed:
                outcome.decision = NOT_PUBLISHED
                outcome.reason = (f"not reverted: the files coming back differ from what main reads now "
                                  f"({failure_summary(proof)}; e.g. a writer deleted rows since the rewrite); "
                                  "main is unchanged")
                return
            try:
                outcome.after_snapshot_id = reverter.commit(plan, {
                    "icemaint.run-id": request.run_id or "cli", "icemaint.proof": "passed"})
            except PublishConflict as exc:
                outcome.decision = DEFER
                outcome.reason = (f"not reverted: a writer's commit since snapshot {plan.head_snapshot_id} conflicts "
                                  f"({exc}); main is unchanged")
                return
            outcome.reason = (f"reverted snapshot {plan.published_snapshot_id}: {len(plan.restored_files)} files back "
                              f"in place of {len(plan.removed_files)}, proven row for row, as snapshot "
                              f"{outcome.after_snapshot_id}")
        finally:
            reverter.release()
            outcome.durations["total_seconds"] = round(time.perf_counter() - started, 3)

    def _record(self, request: RevertRequest, run: ContractRun, outcome: RevertOutcome) -> RevertOutcome:
        from icemaint.safety.audit import AuditRecord

        self.audit.append(AuditRecord(
            table=outcome.table, operation=Operation.REVERT, decision=outcome.decision, reason=outcome.reason,
            trigger=request.trigger, identity=run.identity, run_id=request.run_id,
            before_snapshot_id=outcome.head_snapshot_id, after_snapshot_id=outcome.after_snapshot_id,
            validation=outcome.validation.to_dict(), durations=outcome.durations,
            details={"reverted_snapshot_id": request.snapshot_id, "dry_run": request.dry_run,
                     "restored_files": outcome.restored_files, "removed_files": outcome.removed_files}))
        return outcome
