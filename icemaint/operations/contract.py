"""The operating contract's shell, written once: check policy -> claim -> act -> record -> release.

Every mutating operation runs through `OperatingContract.run`; compaction and housekeeping supply
only their own act and record steps (as pyiceberg's update classes supply only their changes to one
`commit`). The shell guarantees, whatever the act does:
- a table the policy refuses is refused before the claim is even asked for;
- a busy claim defers, naming its holder;
- an act that raises is recorded as failed, then the error propagates;
- the claim is always released, and exactly one audit record is written per call.

A pass over one table (`icemaint maintain`) takes the table's claim once and runs its steps inside
`under_pass(claim)`: each step's shell then works under that claim instead of taking its own, so no
other maintenance run (or cooperating writer) gets in between the steps.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Callable, Generic, TypeVar

from icemaint.safety.claims import ClaimBusy
from icemaint.domain.decisions import DEFER, FAILED, REFUSE, refusal_for
from icemaint.domain.names import TableName
from icemaint.domain.policy import TablePolicy
from icemaint.domain.units import format_duration

Outcome = TypeVar("Outcome")
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


class OperatingContract(Generic[Outcome]):
    """Runs one operation on one table under the contract (see `run`)."""

    def __init__(self, config, reader, claims):
        self.config = config
        self.reader = reader
        self.claims = claims

    def run(self, operation: str, table: str, run_id: str | None, *,
            new_outcome: Callable[[ContractRun], Outcome],
            act: Callable[[ContractRun, Outcome], None],
            record: Callable[[ContractRun, Outcome], Outcome],
            wait_for_claim: bool = False,
            progress: Callable[[str], None] = lambda message: None,
            sleep: Callable[[float], None] = time.sleep) -> Outcome:
        """Runs `act` under the table's claim, after the policy allowed it; `record` always runs once.

        Args:
            new_outcome: Builds the operation's outcome object (it has `decision` and `reason`).
            act: Does the work under the claim; sets the outcome's decision and reason.
            record: Writes the one audit record for the call and returns the outcome.
            wait_for_claim: Await a busy claim up to the policy's `claim_wait` (progress reported every
                poll) before deferring; runs a person launched do, automatic ones do not.

        Raises:
            InvalidTableName, TableNotFound: bad input, before anything is touched.
            Whatever `act` raised, after the failure was recorded and the claim released.
        """
        started = time.perf_counter()
        name = TableName.parse(table)
        location = self.reader.metadata_location(name.key)  # TableNotFound before anything else
        run = ContractRun(str(operation), name, self.config.policy(name.key), self.config.identity(), location,
                          started)
        outcome = new_outcome(run)
        refused = refusal_for(run.policy, run.operation, run.identity)
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
            act(run, outcome)
        except Exception as exc:
            outcome.decision = FAILED
            outcome.reason = f"{type(exc).__name__}: {first_line(exc)}"
            record(run, outcome)
            raise
        finally:
            if claim is not passed:
                claim.release()
        return record(run, outcome)


def first_line(exc: BaseException, limit: int = 500) -> str:
    text = str(exc)
    return text.splitlines()[0][:limit] if text else ""
