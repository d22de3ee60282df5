"""The operating contract's shell, written once: check policy -> claim -> verify -> mark started -> act ->
record -> release.

Every mutating operation runs through `OperatingContract.run`; compaction and housekeeping supply
only their own act and record steps (as pyiceberg's update classes supply only their changes to one
`commit`). The shell guarantees, whatever the act does:
- a table the policy refuses is refused before the claim is even asked for;
- a busy claim defers, naming its holder;
- under the claim, before the act, `main`'s lineage is verified: a data rewrite of ours that carries
  no passing proof (or a staging snapshot on `main`) cannot come from stage -> prove -> publish, so it
  is reported loudly (an error in the log and one `lineage`/`unproven` audit record per snapshot);
- before the act, a `started` marker naming this process is stored in the audit log, so a call
  killed mid-act reads back as `interrupted` instead of missing;
- an act that raises is recorded as failed, then the error propagates;
- the claim is always released, and exactly one audit record is read back per call: the call's
  decision (its `record` step writes it once), or `interrupted` when its process died before that,
  or `started` while it runs. Refusals and deferrals never act and store no marker. Records the act
  writes itself (a staging cleanup, an approval) are decisions of their own, one record each.

A pass over one table (`icemaint maintain`) takes the table's claim once and runs its steps inside
`under_pass(claim)`: each step's shell then works under that claim instead of taking its own, so no
other maintenance run (or cooperating writer) gets in between the steps.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Generic, Iterable, Mapping, TypeVar

from icemaint.safety.audit import INTERRUPTED, STARTED, AuditRecord, audit_call, open_audit
from icemaint.safety import interrupts
from icemaint.safety.claims import ClaimBusy
from icemaint.safety.process import ProcessRef
from icemaint.domain.decisions import refusal_for
from icemaint.domain.verdicts import DEFER, FAILED, REFUSE
from icemaint.domain.health import MAINTENANCE_TAG
from icemaint.domain.names import TableName
from icemaint.observe.manifests import main_lineage
from icemaint.domain.policy import TablePolicy
from icemaint.domain.units import format_duration
from icemaint.engine.staging import PROOF_ID_KEY, PROOF_KEY, RUN_ID_KEY, STAGE_KEY, STAGED_SNAPSHOT_KEY
from icemaint.errors import one_line

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icemaint.config import MaintenanceConfig
    from icemaint.observe.catalog import CatalogReader

log = logging.getLogger(__name__)
Outcome = TypeVar("Outcome")
LINEAGE, UNPROVEN = "lineage", "unproven"
# Summary counts that say a replace changed data or delete files (a manifest rewrite changes none).
_FILE_CHANGES = ("added-data-files", "deleted-data-files", "added-delete-files", "removed-delete-files",
                 "removed-position-delete-files", "removed-equality-delete-files")
CLAIM_POLL_SECONDS = 2.0
_PASS_CLAIM: ContextVar = ContextVar("icemaint_pass_claim", default=None)


@contextmanager
def under_pass(claim):
    """Runs the block's operations under `claim` (a held `Claim` of one table), taken once by a pass."""
    token = _PASS_CLAIM.set(claim)
    try:
        yield claim
    finally:
        _PASS_CLAIM.reset(token)


def _pass_claim_for(table: str):
    claim = _PASS_CLAIM.get()
    return claim if claim is not None and claim.table == table and claim.is_held() else None


@dataclass(frozen=True)
class ContractRun:
    """What the shell knows of one call, handed to the act and record steps."""

    operation: str
    name: TableName
    policy: TablePolicy
    identity: str
    metadata_location: str
    started: float
    claim_holder: str | None = None  # set when the claim was busy
    # the pyiceberg table as the shell read it under the claim, just before the act (None: not read): the act's own
    # first look at the table starts from it instead of reading the same metadata again
    loaded: Table | None = None


class OperatingContract(Generic[Outcome]):
    """Runs one operation on one table under the contract (see `run`)."""

    def __init__(self, config, reader, claims, audit=None):
        """`audit` receives the started markers and lineage reports; by default the config's audit log
        (the one the operations' record steps write to)."""
        self.config = config
        self.reader = reader
        self.claims = claims
        self._audit = audit

    @property
    def audit(self):
        if self._audit is None:
            self._audit = open_audit(self.config)
        return self._audit

    def run(self, operation: str, table: str, run_id: str | None, *,
            new_outcome: Callable[[ContractRun], Outcome],
            act: Callable[[ContractRun, Outcome], None],
            record: Callable[[ContractRun, Outcome], Outcome],
            wait_for_claim: bool = False,
            progress: Callable[[str], None] = lambda message: None,
            sleep: Callable[[float], None] = time.sleep,
            identity: str | None = None, trigger: str | None = None) -> Outcome:
        """Runs `act` under the table's claim, after the policy allowed it; `record` always runs once.

        Args:
            new_outcome: Builds the operation's outcome object (it has `decision` and `reason`).
            act: Does the work under the claim; sets the outcome's decision and reason.
            record: Writes the one audit record for the call and returns the outcome.
            wait_for_claim: Await a busy claim up to the policy's `claim_wait` (progress reported every
                poll) before deferring; runs a person launched do, automatic ones do not.
            identity: Who the call runs as (an agent's run: the agent); None: the process's `config.identity()`.
            trigger: Who launched it: an agent's call is also held to the policy's `agent_operations`.

        Raises:
            InvalidTableName, TableNotFound: bad input, before anything is touched.
            Whatever `act` raised, after the failure was recorded and the claim released.
        """
        with audit_call(uuid.uuid4().hex):  # pairs the started marker with the record step's decision
            return self._run(operation, table, run_id, new_outcome=new_outcome, act=act, record=record,
                             wait_for_claim=wait_for_claim, progress=progress, sleep=sleep, identity=identity,
                             trigger=trigger)

    def _run(self, operation, table, run_id, *, new_outcome, act, record, wait_for_claim, progress, sleep,
             identity=None, trigger=None):
        started = time.perf_counter()
        name = TableName.parse(table)
        location = self.reader.metadata_location(name.key)  # TableNotFound before anything else
        run = ContractRun(str(operation), name, self.config.policy(name.key), identity or self.config.identity(),
                          location, started)
        outcome = new_outcome(run)
        refused = refusal_for(run.policy, run.operation, run.identity, trigger)
        if refused:  # policy first: a read-only table refuses whether or not a writer holds its claim
            outcome.decision, outcome.reason = REFUSE, refused
            return record(run, outcome)
        holder = f"icemaint:{run.operation}:{run_id or 'cli'}"
        bound = run.policy.claim_wait_seconds if wait_for_claim else 0.0
        waited = 0.0
        claim = passed = _pass_claim_for(name.key)
        while claim is None:
            try:
                claim = self.claims.acquire(name.key, holder=holder)
                break
            except ClaimBusy as exc:
                if waited >= bound:
                    waiting = f" after waiting {format_duration(waited)} (claim_wait)" if bound else ""
                    outcome.decision = DEFER
                    outcome.reason = f"claim busy{waiting}: held by {exc.holder or 'an unknown holder'}"
                    return record(replace(run, claim_holder=exc.holder), outcome)
                step = min(CLAIM_POLL_SECONDS, bound - waited)
                progress(f"{name.key}: claim held by {exc.holder or 'an unknown holder'}; waiting "
                         f"({format_duration(waited)} of {format_duration(bound)})")
                sleep(step)
                waited += step
        try:
            interrupts.check()  # a Ctrl-C swallowed before the claim was taken still stops the run here
            run = replace(run, loaded=self._begin(run, outcome, claim.holder, run_id, progress))
            act(run, outcome)
        except Exception as exc:
            outcome.decision = FAILED
            outcome.reason = f"{type(exc).__name__}: {first_line(exc)}"
            record(run, outcome)
            raise
        except BaseException as exc:  # an interrupt (Ctrl-C, a terminated run): recorded with what had landed
            interrupts.acknowledge()  # acted upon here; the rest of the command stops too
            outcome.decision = INTERRUPTED
            outcome.reason = self._interrupted(run, outcome, exc)
            try:
                record(run, outcome)
            except Exception as failed:  # the started marker still reads back as interrupted
                log.warning("%s: the interrupted %s was not recorded: %s", name.key, run.operation, failed)
            raise
        finally:
            if claim is not passed:
                claim.release()
        return record(run, outcome)

    def _interrupted(self, run: ContractRun, outcome, exc: BaseException) -> str:
        """The reason of an interrupted run: what it had committed, and where main is now (an interrupt may land
        after a commit and before the run learnt its snapshot, so main is read again)."""
        committed = [s for s in getattr(outcome, "committed_snapshot_ids", None) or () if s is not None]
        text = f"interrupted ({type(exc).__name__}) before it finished"
        if committed:
            text += f", after committing snapshot{'s' if len(committed) > 1 else ''} {', '.join(map(str, committed))}"
        try:
            snapshot = self.reader.load(run.name.key).current_snapshot()
            now = snapshot.snapshot_id if snapshot else None
        except Exception:  # the record still says what the run knew
            return text
        before = getattr(outcome, "before_snapshot_id", None)
        if before is not None and now != before:
            outcome.after_snapshot_id = now
            return f"{text}; main moved from snapshot {before} to {now} meanwhile (by this run or a writer)"
        return f"{text}; main is at snapshot {now}"

    def _begin(self, run: ContractRun, outcome, holder: str, run_id: str | None,
               progress: Callable[[str], None]):
        """Under the claim, before the act: verify main's lineage, then store the started marker; the table as read
        for it (None when it could not be read)."""
        main_id, lineage, table = None, {}, None
        try:
            table = self.reader.load(run.name.key)
            snapshot = table.current_snapshot()
            main_id = snapshot.snapshot_id if snapshot else None
            snapshots = list(main_lineage(table))
            unproven = unproven_rewrites(snapshots)
            lineage = {"checked_snapshots": len(snapshots), "unproven": [u["snapshot_id"] for u in unproven]}
        except Exception as exc:  # the act reads the table too and fails loudly if it cannot; noted here
            log.warning("%s: main's lineage could not be verified: %s", run.name.key, exc)
            unproven, lineage, table = [], {"error": f"{type(exc).__name__}: {first_line(exc)}"}, None
        if unproven:
            self._report_unproven(run, unproven, run_id, progress)
        self.audit.append(AuditRecord(
            table=run.name.key, operation=run.operation, decision=STARTED, identity=run.identity, run_id=run_id,
            date=getattr(outcome, "date", None), before_snapshot_id=main_id,
            reason=f"started under claim {holder} with main at snapshot {main_id}",
            details={"process": ProcessRef.current().to_dict(), "claim_holder": holder,
                     "metadata_location": run.metadata_location, "lineage": lineage}))
        return table

    def _report_unproven(self, run: ContractRun, unproven: list[dict], run_id: str | None,
                         progress: Callable[[str], None]) -> None:
        reported = {r.after_snapshot_id for r in self.audit.records(table=run.name.key, operation=LINEAGE)
                    if r.decision == UNPROVEN}
        for found in unproven:
            message = f"{run.name.key}: {found['what']}"
            log.error(message)
            progress(f"UNPROVEN REWRITE ON MAIN: {message}")
            if found["snapshot_id"] in reported:
                continue
            self.audit.append(AuditRecord(
                table=run.name.key, operation=LINEAGE, decision=UNPROVEN, identity=run.identity, run_id=run_id,
                before_snapshot_id=found["parent_id"], after_snapshot_id=found["snapshot_id"],
                reason=found["what"], details=found))


class ContractOperation:
    """The wiring every operation run under the contract shares: the config, a Spark session, the catalog
    reader, the claims, the audit log its record step writes to, the contract itself, and how it reports
    progress (by default to its own module's log) and waits."""

    def __init__(self, config: MaintenanceConfig, spark, reader: CatalogReader, claims, audit, *,
                 progress: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self.spark = spark
        self.reader = reader
        self.claims = claims
        self.audit = audit
        self.contract = OperatingContract(config, reader, claims)
        own_log = logging.getLogger(type(self).__module__)
        self.progress = progress or (lambda msg: own_log.info(msg))
        self.sleep = sleep


def unproven_rewrites(lineage: Iterable[tuple[int, int | None, str | None, Mapping[str, str]]]) -> list[dict]:
    """Snapshots on `main` that stage -> prove -> publish cannot have produced, newest first.

    Our data rewrite (`replace` tagged as maintenance or with a run id, changing data or delete files)
    without `icemaint.proof=passed`; or a staging snapshot (it duplicates the rows it rewrites) that
    reached `main`. A manifest rewrite changes no file and needs no proof.
    """
    out = []
    for snapshot_id, parent_id, operation, summary in lineage:
        ours = summary.get(MAINTENANCE_TAG) == "true" or RUN_ID_KEY in summary
        evidence = {"snapshot_id": snapshot_id, "parent_id": parent_id, "operation": operation,
                    "summary": {k: summary[k] for k in (MAINTENANCE_TAG, RUN_ID_KEY, PROOF_KEY, PROOF_ID_KEY,
                                                        STAGED_SNAPSHOT_KEY, STAGE_KEY, *_FILE_CHANGES)
                                if k in summary}}
        if STAGE_KEY in summary:
            out.append({**evidence, "what": (
                f"snapshot {snapshot_id} on main is a staging snapshot ({STAGE_KEY}={summary[STAGE_KEY]}): "
                "staged files were never meant to reach main, they hold a second copy of the rows they rewrite")})
        elif ours and operation == "replace" and summary.get(PROOF_KEY) != "passed" \
                and any(_count(summary.get(k)) for k in _FILE_CHANGES):
            proof = summary.get(PROOF_KEY)
            out.append({**evidence, "what": (
                f"snapshot {snapshot_id} on main is an icemaint rewrite (run {summary.get(RUN_ID_KEY, 'unknown')}) "
                f"without a passing proof ({PROOF_KEY}={proof if proof is not None else 'missing'}): it did not "
                f"come through stage -> prove -> publish; the files it replaced stay readable as of snapshot "
                f"{parent_id} until expiry removes that snapshot")})
    return out


def _count(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def first_line(exc: BaseException, limit: int = 500) -> str:
    """The line that says what failed: for a Java exception its root cause (Py4J's own first line, "An error
    occurred while calling o57.sql.", names none)."""
    if getattr(exc, "java_exception", None) is not None:
        from icemaint.engine.java import java_root_message

        return one_line(java_root_message(exc), limit)
    return one_line(exc, limit)
