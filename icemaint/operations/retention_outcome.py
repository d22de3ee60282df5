"""What the housekeeping operations share: the outcome a run fills and records (`RetentionOutcome`), the check of
a request's age, and the re-plan after a writer's commit conflicted with an expiry or a manifest rewrite.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Callable

from icemaint.domain.verdicts import DEFER, RUN, Operation
from icemaint.domain.names import TableName
from icemaint.domain.retention import check_seconds
from icemaint.operations.contract import first_line

log = logging.getLogger(__name__)

EXPIRE, ORPHANS, MANIFESTS, STATISTICS = Operation.EXPIRE, Operation.ORPHANS, Operation.MANIFESTS, Operation.STATISTICS
# Audit records keep at most this many paths; the counts are always complete.
MAX_LISTED_PATHS = 100
# Test seam: called with (operation, attempt) right before each expiry or manifest commit.
BeforeCommit = Callable[[str, int], None]


def check_age(seconds: float | None, setting: str) -> float | None:
    """A validated age in seconds (`check_seconds`); None passes through."""
    return None if seconds is None else check_seconds(seconds, setting)


@dataclass
class RetentionOutcome:
    """What one expiry / orphan / manifest run decided and did.

    `metrics` holds the numbers a dashboard plots (counts and bytes); `evidence` the why (the
    expiry plan's protected snapshots and notes, the orphan candidates, ...).
    """

    table: str
    operation: str
    decision: str
    reason: str
    dry_run: bool = False
    settings: dict = field(default_factory=dict)
    before_snapshot_id: int | None = None
    after_snapshot_id: int | None = None
    metadata_location_before: str | None = None
    metadata_location_after: str | None = None
    claim_holder: str | None = None
    metrics: dict = field(default_factory=dict)
    evidence: dict = field(default_factory=dict)
    durations: dict = field(default_factory=dict)
    attempts: int = 0  # plan-and-commit attempts made (expiry and manifests; conflicts in evidence["conflicts"])

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def changed_table(self) -> bool:
        """Whether this run really changed the table or its files (not a dry run, defer, refusal or noop)."""
        return self.decision == RUN and not self.dry_run


def commit_seam(before_commit: BeforeCommit | None, operation: str, attempt: int) -> Callable[[], None] | None:
    """The test seam bound to one commit attempt of `operation`, or None when there is none."""
    return None if before_commit is None else (lambda: before_commit(operation, attempt))


def plan_again(what: str, name: TableName, policy, outcome: RetentionOutcome, attempt: int, planned_on: int | None,
               exc: Exception, sleep: Callable[[float], None]) -> bool:
    """Records a conflict; True to plan again (after the backoff), False when the outcome is now a defer."""
    log.warning("%s of %s conflicted (attempt %d): %s", what, name.key, attempt, exc)
    conflict = first_line(exc)
    outcome.evidence.setdefault("conflicts", []).append(f"attempt {attempt}: {conflict}")
    if attempt > policy.max_commit_retries:
        outcome.decision = DEFER
        outcome.reason = (f"a writer's commit conflicted with the {what} (planned on snapshot {planned_on}) after "
                          f"{attempt} attempts (max_commit_retries {policy.max_commit_retries}): {conflict}; "
                          "nothing changed; the next run plans again")
        return False
    sleep(policy.retry_backoff_seconds * 2 ** (attempt - 1))
    return True
