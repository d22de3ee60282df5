"""The retention tick, pure: per table, expiry when due, orphan removal once an expiry finished, manifest
rewrites, and column statistics when the policy keeps them; the cursor that makes an unchanged table cost one
metadata-location read.

Expiry and orphan removal never run at once on a table. When both are due, expiry goes first: it is cheap (a
metadata commit) and bounds what the table keeps (`snapshot_max_count`), while orphan removal lists every file
and can only find files older than `orphan_older_than` (24 h at least), so a delay costs it nothing. On a busy
table expiry is due at every change; orphan removal then takes its turn once it has waited `ORPHANS_MAX_WAIT`
behind expiry (`RetentionCursor.orphans_held_since`), so neither starves.

Every read is a callable the caller passes (the sensor and `icemaint tick` pass Dagster- and
pyiceberg-backed ones; tests pass an in-memory estate), as `icemaint.domain.tick.plan_compaction_tick` does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping, Optional

from icemaint.domain.decisions import refusal_for
from icemaint.domain.verdicts import DEFER, NOOP, REFUSE, RUN, Operation, ReasonKind, Verdict
from icemaint.domain.policy import TablePolicy
from icemaint.domain.retention import expiry_due, manifests_due
from icemaint.domain.statistics import StatisticsState, statistics_due
from icemaint.domain.units import human_duration

EXPIRE, ORPHANS, MANIFESTS, STATISTICS = Operation.EXPIRE, Operation.ORPHANS, Operation.MANIFESTS, Operation.STATISTICS
# The run that carries each operation: a run of that name in flight on a table holds the operation.
RETENTION_JOBS: dict[str, str] = {EXPIRE: "expiry_job", ORPHANS: "orphans_job", MANIFESTS: "manifests_job",
                  STATISTICS: "statistics_job"}
# How long orphan removal owed after an expiry waits behind further expiries before it goes first (one tick).
ORPHANS_MAX_WAIT_SECONDS = 3600.0


# Why a tick never starts orphan removal until the config turns it on.
ORPHANS_NOT_AUTOMATIC = ("not automatic (automation.orphan_removal: false): orphan removal deletes files, so it runs "
                         "when a person runs `icemaint orphans TABLE` or turns the key on")


@dataclass(frozen=True)
class RetentionSignals:
    """What the tick reads of one table (pyiceberg, no Spark)."""

    table: str
    metadata_location: str
    snapshots: int
    oldest_snapshot_at: Optional[float]  # epoch seconds, of the oldest snapshot no branch or tag points at
    manifests: int
    small_manifests: int
    statistics: Optional[StatisticsState] = None  # where its column statistics stand (None: not read)
    staging_branches: int = 0  # staging branches on the table: left by dead runs, they pin the files they replaced


@dataclass(frozen=True)
class RetentionDecision:
    table: str
    operation: str
    verdict: Verdict
    reason: str
    run_key: Optional[str] = None
    kind: ReasonKind = ReasonKind.DUE


@dataclass
class RetentionCursor:
    """Per table: the metadata location and policy last evaluated, and when to look again."""

    metadata_location: str
    policy: str
    recheck_at: Optional[float] = None   # epoch seconds: expiry becomes due by age alone
    pending: bool = False                # a deferral: evaluate again next tick even if unchanged
    requested: dict[str, Optional[str]] = field(default_factory=dict)  # operation -> run key last requested
    recorded: Optional[str] = None       # digest of the refusals/defers last written to the audit
    orphans_held_since: Optional[float] = None  # epoch seconds: owed orphan removal first waited behind expiry


@dataclass
class RetentionTickPlan:
    runs: list[RetentionDecision] = field(default_factory=list)  # the decisions with verdict run
    decisions: list[RetentionDecision] = field(default_factory=list)
    cursor: dict[str, RetentionCursor] = field(default_factory=dict)
    evaluated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    to_record: list[RetentionDecision] = field(default_factory=list)

    def summary(self) -> str:
        text = (f"retention: {len(self.evaluated)} tables evaluated, {len(self.unchanged)} unchanged; "
                f"{len(self.runs)} due to run")
        reasons = [f"{d.table} {d.operation}: {d.verdict}: {d.reason}" for d in self.decisions]
        reasons += [f"{t}: ERROR {e}" for t, e in self.errors.items()]
        return text + ("\n" + "\n".join(reasons[:50]) if reasons else "")


def encode_cursor(cursor: dict[str, RetentionCursor]) -> str:
    return json.dumps({t: asdict(c) for t, c in sorted(cursor.items())})


def decode_cursor(text: Optional[str]) -> dict[str, RetentionCursor]:
    if not text:
        return {}
    return {t: RetentionCursor(**v) for t, v in json.loads(text).items()}


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def expiry_due_at(signals: RetentionSignals, policy: TablePolicy) -> Optional[float]:
    """When expiry becomes due by age alone on an unchanged table (epoch seconds), or None if never."""
    if signals.oldest_snapshot_at is None or signals.snapshots <= policy.snapshot_retain_last:
        return None
    threshold = (policy.snapshot_min_age_seconds if signals.snapshots > policy.snapshot_max_count
                 else max(policy.snapshot_older_than_seconds, policy.snapshot_min_age_seconds))
    return signals.oldest_snapshot_at + threshold + 1.0


def decide_retention(signals: RetentionSignals, policy: TablePolicy, identity: str, now: dt.datetime, *,
                     claim_holder: Optional[str], in_flight_jobs: set[str], expiry_mark: Optional[int],
                     orphans_mark: Optional[int], requested: Optional[dict[str, Optional[str]]] = None,
                     jobs: Mapping[str, str] = RETENTION_JOBS, trigger: Optional[str] = None,
                     orphans_held_since: Optional[float] = None,
                     orphan_removal: bool = False) -> list[RetentionDecision]:
    """Expiry, orphan, manifest and column-statistics decisions for one table.

    Args:
        signals: The table's metadata, as the tick read it.
        policy: The table's policy.
        identity: Who maintenance runs as.
        now: The tick's time (timezone-aware).
        claim_holder: Who holds the table's claim, or None.
        in_flight_jobs: Names of runs queued or running on this table.
        expiry_mark: Event id of the table's latest expired_snapshots materialization (None: never).
        orphans_mark: Event id of its latest orphan_files materialization (None: never).
        requested: Operation -> run key already requested; the same key again is not a new run.
        jobs: The run name that carries each operation.
        trigger: Who asks (an agent's request is also held to the policy's agent_operations).
        orphans_held_since: Since when (epoch seconds) owed orphan removal has waited behind expiry; once that is
            ORPHANS_MAX_WAIT_SECONDS ago, orphan removal goes first (None: it has not waited).
        orphan_removal: Whether orphan removal may be started automatically (config `automation.orphan_removal`);
            off, it is never due here: it deletes files, so a person turns it on or runs it.
    """
    table = signals.table
    location_key = digest(signals.metadata_location)
    age = max(now.timestamp() - signals.oldest_snapshot_at, 0.0) if signals.oldest_snapshot_at else 0.0

    def gated(operation: str, why: str, run_key: str, busy_jobs: set[str]) -> RetentionDecision:
        refused = refusal_for(policy, operation, identity, trigger)
        if refused:
            return RetentionDecision(table, operation, REFUSE, refused, kind=ReasonKind.POLICY)
        if busy_jobs:
            return RetentionDecision(table, operation, DEFER,
                                     f"{why}; waiting for runs in flight on the table: {', '.join(sorted(busy_jobs))}",
                                     kind=ReasonKind.RUNS_IN_FLIGHT)
        if claim_holder:
            return RetentionDecision(table, operation, DEFER, f"claim busy: held by {claim_holder}",
                                     kind=ReasonKind.CLAIM_BUSY)
        if (requested or {}).get(operation) == run_key:
            # Dagster skips a repeated run key anyway; saying so keeps the tick honest.
            return RetentionDecision(table, operation, NOOP, f"already requested ({run_key}): {why}",
                                     kind=ReasonKind.ALREADY_REQUESTED)
        return RetentionDecision(table, operation, RUN, why, run_key)

    due, why = expiry_due(signals.snapshots, age, policy)
    if signals.staging_branches:  # expiry removes them first (under the claim no run's staging is live)
        left = (f"{signals.staging_branches} staging branch{'es' if signals.staging_branches > 1 else ''} left by "
                "dead runs pin the files they replaced")
        due, why = True, (f"{why}; {left}" if due else left)
    # A staging branch is a live run's until no run is in flight on the table: wait for them all then. Else
    # only another expiry or an orphan removal in flight holds it (never both at once on a table).
    expire_busy = set(in_flight_jobs) if signals.staging_branches else set(in_flight_jobs) & {jobs[EXPIRE], jobs[ORPHANS]}
    expire = (gated(EXPIRE, why, f"expire:{table}:{location_key}", expire_busy) if due
              else RetentionDecision(table, EXPIRE, NOOP, why, kind=ReasonKind.BELOW_THRESHOLDS))

    if not orphan_removal:
        orphans = RetentionDecision(table, ORPHANS, NOOP, ORPHANS_NOT_AUTOMATIC, kind=ReasonKind.POLICY)
    elif expiry_mark is None:
        orphans = RetentionDecision(table, ORPHANS, NOOP, "no snapshot expiry yet: orphan removal follows an expiry",
                                    kind=ReasonKind.ORDERING)
    elif orphans_mark is not None and orphans_mark > expiry_mark:
        orphans = RetentionDecision(table, ORPHANS, NOOP, "orphan files were removed after the latest expiry",
                                    kind=ReasonKind.BELOW_THRESHOLDS)
    else:
        waited = max(now.timestamp() - orphans_held_since, 0.0) if orphans_held_since is not None else 0.0
        if expire.verdict in (RUN, DEFER) and waited < ORPHANS_MAX_WAIT_SECONDS:
            # Expiry is cheap and bounds the snapshots; orphan removal lists every file and finds only files
            # older than orphan_older_than, so it waits (at most ORPHANS_MAX_WAIT_SECONDS) rather than expiry.
            orphans = RetentionDecision(
                table, ORPHANS, DEFER,
                f"an expiry finished after the last orphan removal; snapshot expiry goes first (waited "
                f"{human_duration(waited)} of at most {human_duration(ORPHANS_MAX_WAIT_SECONDS)})",
                kind=ReasonKind.ORDERING)
        else:
            # Never while anything runs on the table: its files in flight would look orphaned.
            orphans = gated(ORPHANS, "an expiry finished after the last orphan removal"
                            + (f" (it waited {human_duration(waited)} behind expiry: its turn)" if waited else ""),
                            f"orphans:{table}:{expiry_mark}", set(in_flight_jobs))
            if orphans.verdict == RUN and expire.verdict in (RUN, DEFER):  # deferred by a run or claim: expiry goes
                expire = RetentionDecision(table, EXPIRE, DEFER,
                                           f"{why}; orphan removal goes first: it waited "
                                           f"{human_duration(waited)} behind expiry", kind=ReasonKind.ORDERING)

    due, why = manifests_due(signals.manifests, signals.small_manifests, policy)
    manifests = (gated(MANIFESTS, why, f"manifests:{table}:{location_key}", set(in_flight_jobs) & {jobs[MANIFESTS]})
                 if due else RetentionDecision(table, MANIFESTS, NOOP, why, kind=ReasonKind.BELOW_THRESHOLDS))
    return [expire, orphans, manifests, _statistics_decision(signals, policy, gated, in_flight_jobs, jobs)]


def _statistics_decision(signals: RetentionSignals, policy: TablePolicy,
                         gated: Callable[[str, str, str, set[str]], RetentionDecision], in_flight_jobs: set[str],
                         jobs: Mapping[str, str]) -> RetentionDecision:
    table, state = signals.table, signals.statistics
    if not policy.statistics:
        return RetentionDecision(table, STATISTICS, NOOP, "column statistics are not kept (policy statistics: false)",
                                 kind=ReasonKind.POLICY)
    if state is None:
        return RetentionDecision(table, STATISTICS, NOOP, "the statistics state was not read",
                                 kind=ReasonKind.NO_DATA)
    due, why = statistics_due(state, policy.statistics_stale_fraction, policy.statistics_columns)
    if not due:
        return RetentionDecision(table, STATISTICS, NOOP, why, kind=ReasonKind.BELOW_THRESHOLDS)
    return gated(STATISTICS, why, f"statistics:{table}:{state.current_snapshot_id}",
                 set(in_flight_jobs) & {jobs[STATISTICS]})


def _orphans_held_since(decisions: list[RetentionDecision], previous: Optional[RetentionCursor],
                        now: dt.datetime) -> Optional[float]:
    """Since when owed orphan removal has waited: kept while it is deferred, started when expiry first goes ahead of
    it, cleared once it runs or is no longer owed."""
    [orphans] = [d for d in decisions if d.operation == ORPHANS]
    if orphans.verdict != DEFER:
        return None
    if previous is not None and previous.orphans_held_since is not None:
        return previous.orphans_held_since
    return now.timestamp() if orphans.kind == ReasonKind.ORDERING else None


def plan_retention_tick(
    tables: Iterable[str],
    *,
    policy_of: Callable[[str], TablePolicy],
    policy_fingerprint: Callable[[TablePolicy], str],
    identity: str,
    metadata_location: Callable[[str], str],
    read_signals: Callable[[str, TablePolicy], RetentionSignals],
    claim_holder: Callable[[str], Optional[str]],
    in_flight_jobs: Callable[[], Mapping[str, set[str]]],
    latest_mark: Callable[[str, str], Optional[int]],
    cursor: dict[str, RetentionCursor],
    now: dt.datetime,
    orphan_removal: bool = False,
) -> RetentionTickPlan:
    """The tick's retention plan over `tables`; unchanged tables cost one `metadata_location` call. Orphan removal
    is planned only with `orphan_removal` (config `automation.orphan_removal`).

    One unreadable table never stops the estate's tick: its error is in `plan.errors`, and it gets no
    cursor entry so the next tick reads it again. Refusals and busy claims go to `plan.to_record`
    once per change (the caller writes them to the audit).
    """
    plan = RetentionTickPlan()
    in_flight = None
    for table in tables:
        try:
            location = metadata_location(table)
        except Exception as exc:  # reported in the plan, never swallowed
            plan.errors[table] = f"{type(exc).__name__}: {exc}"
            continue
        policy = policy_of(table)
        # Turning orphan removal on is a change of what the tick may do: every table is evaluated again.
        fingerprint = policy_fingerprint(policy) + ("+orphans" if orphan_removal else "")
        previous = cursor.get(table)
        if (previous and previous.metadata_location == location and previous.policy == fingerprint
                and not previous.pending and (previous.recheck_at is None or now.timestamp() < previous.recheck_at)):
            plan.cursor[table] = previous
            plan.unchanged.append(table)
            continue
        try:
            signals = read_signals(table, policy)
        except Exception as exc:  # as above
            plan.errors[table] = f"{type(exc).__name__}: {exc}"
            continue
        if in_flight is None:
            in_flight = in_flight_jobs()
        decisions = decide_retention(
            signals, policy, identity, now, claim_holder=claim_holder(table),
            in_flight_jobs=set(in_flight.get(table, set())),
            expiry_mark=latest_mark(EXPIRE, table), orphans_mark=latest_mark(ORPHANS, table),
            requested=previous.requested if previous else None,
            orphans_held_since=previous.orphans_held_since if previous else None, orphan_removal=orphan_removal)
        requested = dict(previous.requested) if previous else {}
        for d in decisions:
            if d.verdict == RUN:
                requested[str(d.operation)] = d.run_key
                plan.runs.append(d)
        plan.evaluated.append(table)
        plan.decisions.extend(decisions)
        notable = [d for d in decisions if d.verdict == REFUSE
                   or (d.verdict == DEFER and d.kind == ReasonKind.CLAIM_BUSY)]
        recorded = digest("\n".join(f"{d.operation}|{d.verdict}|{d.kind}" for d in notable)) if notable else None
        if recorded is not None and (previous is None or previous.recorded != recorded):
            plan.to_record.extend(notable)
        due_at = expiry_due_at(signals, policy)
        plan.cursor[table] = RetentionCursor(
            location, fingerprint, recheck_at=due_at if due_at is not None and due_at > now.timestamp() else None,
            pending=any(d.verdict == DEFER for d in decisions), requested=requested, recorded=recorded,
            orphans_held_since=_orphans_held_since(decisions, previous, now))
    return plan
