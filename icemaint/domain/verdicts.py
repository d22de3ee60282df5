"""The words decisions and run outcomes are recorded in: verdicts, reason kinds, operations, and who launched a run.

Typed (each an enum whose members are their words), so that records, JSON, Dagster metadata and the reference keep the
plain text while rechecks, ranking and alerts never read a reason's wording. No Dagster, no Spark.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """An enum whose members are their words: records, JSON and Dagster metadata keep the plain text."""

    def __str__(self) -> str:
        return str(self.value)


class Verdict(Word):
    """What a decision (or a run's outcome) is."""

    RUN = "run"
    DEFER = "defer"
    REFUSE = "refuse"
    NOOP = "noop"
    # A compaction whose proof failed: its staged files were discarded and `main` was not changed.
    NOT_PUBLISHED = "not_published"
    FAILED = "failed"


class ReasonKind(Word):
    """Why a decision came out as it did, so that rechecks and ranking never read the reason's text."""

    DUE = "due"
    BELOW_THRESHOLDS = "below_thresholds"
    NO_DATA = "no_data"
    NO_TIME_COLUMN = "no_time_column"
    POLICY = "policy"                  # disabled, read-only, operation or identity not allowed
    HOT_PARTITION = "hot_partition"
    WRITER_ACTIVE = "writer_active"
    CLAIM_BUSY = "claim_busy"
    RUNS_IN_FLIGHT = "runs_in_flight"
    AWAITING_APPROVAL = "awaiting_approval"
    TICK_BUDGET = "tick_budget"
    ALREADY_REQUESTED = "already_requested"
    ORDERING = "ordering"              # another operation of the table goes first
    UNSUPPORTED = "unsupported"        # a table shape this version cannot maintain safely
    # due for a rewrite of its position-delete files alone (many of them; the data files are fine)
    POSITION_DELETES_DUE = "position_deletes_due"
    # an operator reverted the scope's published compaction: held until they approve compacting it again
    REVERTED = "reverted"
    # automation's last run of the scope failed its proof, or its last runs all failed: held until approved
    PROOF_FAILED = "proof_failed"
    RUNS_FAILED = "runs_failed"
    # due for a rewrite into the table's current layout (`icemaint.domain.drift`): files under an older partition
    # spec or sort order, or oversized, though none may be small
    LAYOUT_DRIFT = "layout_drift"


class Operation(Word):
    """The maintenance operations (policy `allowed_operations`, audit records, run reports)."""

    COMPACT = "compact"
    EXPIRE = "expire"
    ORPHANS = "orphans"
    MANIFESTS = "manifests"
    STATISTICS = "statistics"  # column statistics (Puffin NDV sketches) of the current snapshot
    PURGE_QUARANTINE = "purge_quarantine"
    CLEANUP = "cleanup"  # removing a staging branch a dead run left
    REVERT = "revert"    # an operator's forward undo of a published rewrite
    INGEST = "ingest"    # a batch of landed files appended to its table (compaction at the entrance)


# Who launched a run. Automatic triggers come back on their own (the next tick decides again), so
# they defer at once; a person, a backfill or a script waits for a busy claim (policy `claim_wait`)
# and a run of theirs that could not do its work fails, naming why.
# An AI agent (`icemaint mcp`) is automatic here on purpose: it polls and asks again rather than holding a run
# worker on a busy claim, its deferral is an answer (the run ends with the reason, it does not fail), and the holds
# automation respects (a failed proof, runs that kept failing) hold its requests too until a person approves.
AGENT_TRIGGER = "agent"
AUTOMATIC_TRIGGERS = frozenset({"sensor", "window", "tick", AGENT_TRIGGER})


def launched_by_a_person(trigger: str | None) -> bool:
    return (trigger or "manual") not in AUTOMATIC_TRIGGERS


RUN, DEFER, REFUSE, NOOP = Verdict.RUN, Verdict.DEFER, Verdict.REFUSE, Verdict.NOOP
NOT_PUBLISHED, FAILED = Verdict.NOT_PUBLISHED, Verdict.FAILED
