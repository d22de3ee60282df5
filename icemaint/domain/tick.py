"""One sensor tick over the estate: observe each table's metadata, decide, and say when to look again.

Spark-free and Dagster-free: sensors call `plan_compaction_tick` and turn its runs into RunRequests.
An unchanged table costs one metadata-location read (O(1)) unless a deferral is due for a recheck.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, TypeVar

from icemaint.domain.decisions import (Decision, Gates, RunHold, decide_with_approvals, measured_throughput,
                                       rank_within_budget, refusal_for)
from icemaint.domain.verdicts import DEFER, NOOP, REFUSE, RUN, ReasonKind
from icemaint.domain.health import TableHealth
from icemaint.domain.policy import TablePolicy
from icemaint.domain.screen import Screened

log = logging.getLogger(__name__)

# How long to wait before re-evaluating an unchanged table whose decision was a defer.
RECHECK_CLAIM_BUSY_SECONDS = 60.0
RECHECK_APPROVAL_SECONDS = 300.0
# How long after requesting a table's run to decide it again if its metadata has not moved: a published run moves
# it; one that did not publish is retried (a run-time deferral) or held (`Gates.held`), never just forgotten.
RECHECK_AFTER_RUN_SECONDS = 60.0


@dataclass
class TableCursor:
    metadata_location: str
    recheck_at: float | None = None  # epoch seconds; None: only when metadata changes
    policy: str | None = None        # fingerprint: a policy change re-evaluates an unchanged table
    recorded: str | None = None      # digest of the defers/refusals last written to the audit
    said: str | None = None          # the table's decisions in one line, repeated while it is unchanged


def policy_fingerprint(policy: TablePolicy) -> str:
    return hashlib.sha1(repr(policy).encode()).hexdigest()[:12]


def _decision_digest(decisions: list[Decision]) -> str | None:
    """What an operator would call 'the same decision again': date, verdict and kind of reason."""
    keys = sorted(f"{d.date}|{d.verdict}|{d.reason.split(':', 1)[0]}" for d in decisions if d.verdict in (DEFER, REFUSE))
    return hashlib.sha1("\n".join(keys).encode()).hexdigest()[:12] if keys else None


@dataclass
class KeptHealths:
    """The healths a tick read and then deferred only for its run budget, kept for the sensor's next tick.

    Everything in a health but its ages comes from the metadata file at its location, which a commit never
    rewrites: while a table stays at that location under the same policy, the next tick moves the ages to its
    own `now` (`TableHealth.at`) instead of reading the table's manifests again (at 10,000 tables with 200
    due and a budget of 20, those 180 re-reads were half of an unchanged tick). One per sensor, as its cursor;
    each tick replaces the entries, so it holds at most the last tick's budget deferrals.
    """
    entries: dict[tuple[str, str, str | None], TableHealth] = field(default_factory=dict)  # (table, location, policy)


@dataclass
class TickPlan:
    runs: list[tuple[Decision, TableHealth]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    cursor: dict[str, TableCursor] = field(default_factory=dict)
    evaluated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    screened: list[str] = field(default_factory=list)  # evaluated from their manifest list alone
    errors: dict[str, str] = field(default_factory=dict)
    # Defers and refusals that differ from what the previous evaluation of their table recorded:
    # a table deferred tick after tick for the same reason is audited once, not every tick.
    to_record: list[Decision] = field(default_factory=list)
    # What the tick read of each evaluated table (kept for the metrics endpoint's health summaries)
    observed: dict[str, TableHealth | Screened] = field(default_factory=dict)

    def summary(self) -> str:
        counts = {v: sum(1 for d in self.decisions if d.verdict == v) for v in (RUN, DEFER, REFUSE, NOOP)}
        screened = f" ({len(self.screened)} from their manifest list alone)" if self.screened else ""
        text = (f"{len(self.evaluated)} tables evaluated{screened}, {len(self.unchanged)} unchanged; "
                f"{len(self.runs)} due to run; {counts[DEFER]} deferred, {counts[REFUSE]} refused, "
                f"{counts[NOOP]} nothing to do")
        reasons = [f"{d.table} {d.scope}: {d.verdict}: {d.reason}" for d in self.decisions if d.verdict in (DEFER, REFUSE)]
        # A table held back tick after tick is not decided again while it is unchanged: its last word still says why.
        reasons += [f"{t} (unchanged) {said}" for t in self.unchanged
                    if (said := self.cursor[t].said) and (f": {DEFER}: " in said or f": {REFUSE}: " in said)]
        if self.errors:
            reasons += [f"{t}: ERROR {e}" for t, e in self.errors.items()]
        return text + ("\n" + "\n".join(reasons[:50]) if reasons else "")


def encode_cursor(cursor: dict[str, TableCursor]) -> str:
    return json.dumps({t: [c.metadata_location, c.recheck_at, c.policy, c.recorded, c.said]
                       for t, c in sorted(cursor.items())})


def decode_cursor(text: str | None) -> dict[str, TableCursor]:
    if not text:
        return {}
    return {t: TableCursor(*v[:5]) for t, v in json.loads(text).items()}


_ORDER: dict[str, int] = {RUN: 0, DEFER: 1, REFUSE: 2, NOOP: 3}


def table_summary(decisions: list[Decision], now: dt.datetime | None = None) -> str:
    """One table's decisions in one line: the most pressing one, and how many others there are; with `now`, when
    it was decided (the line is repeated while the table is unchanged, and the ages in its reason are that
    moment's)."""
    if not decisions:
        return "no decision"
    first = min(decisions, key=lambda d: (_ORDER.get(d.verdict, 9), d.date or ""))
    others = len(decisions) - 1
    when = f" (decided {now.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M} UTC)" if now is not None else ""
    return f"{first.scope}: {first.verdict}: {first.reason}" + (f" (+{others} more dates)" if others else "") + when


def recheck_after(decision: Decision, health: TableHealth, now: dt.datetime, policy: TablePolicy) -> float | None:
    """When an unchanged table's deferred date is worth deciding again (epoch seconds)."""
    kind = decision.kind
    if kind == ReasonKind.WRITER_ACTIVE:
        since = decision.writer_check.get("seconds_since_writer_commit") or 0.0
        return now.timestamp() + max(policy.writer_idle_seconds - since, 1.0)
    if kind == ReasonKind.HOT_PARTITION:
        assert decision.date is not None, "a hot-partition defer is about a date"
        day_end = dt.datetime.combine(dt.date.fromisoformat(decision.date) + dt.timedelta(days=1), dt.time(),
                                      dt.timezone.utc)
        return day_end.timestamp() + policy.hot_partition_age_seconds
    if kind in (ReasonKind.CLAIM_BUSY, ReasonKind.RUNS_IN_FLIGHT):
        return now.timestamp() + RECHECK_CLAIM_BUSY_SECONDS
    if decision.needs_approval or kind == ReasonKind.TICK_BUDGET:
        return now.timestamp() + RECHECK_APPROVAL_SECONDS
    return None


class PolicySource(Protocol):
    """Where the tick gets each table's policy and the identity runs act as (the config does both)."""

    def policy(self, table: str) -> TablePolicy: ...

    def identity(self) -> str: ...


def screened_decision(screened: Screened, policy: TablePolicy, identity: str) -> Decision:
    """The one decision of a table the screen let through without reading its manifests."""
    refused = refusal_for(policy, "compact", identity)
    if refused:
        return Decision(table=screened.table, operation="compact", verdict=REFUSE, reason=refused,
                        kind=ReasonKind.POLICY)
    return Decision(table=screened.table, operation="compact", verdict=NOOP, reason=screened.reason,
                    kind=ReasonKind.BELOW_THRESHOLDS)


T = TypeVar("T")
Mapper = Callable[[Callable[[str], object], Sequence[str]], list[Any]]


def in_order(fn: Callable[[str], T], tables: Sequence[str]) -> list[T]:
    """The default way a tick reads its tables' metadata: one after the other."""
    return [fn(t) for t in tables]


def _answer_or_error(fn: Callable[[str], T]) -> Callable[[str], T | Exception]:
    def call(table: str) -> T | Exception:
        try:
            return fn(table)
        except Exception as exc:  # one unreadable table must not stop the estate's tick; it is reported
            return exc
    return call


def plan_compaction_tick(
    config: PolicySource,
    tables: Iterable[str],
    *,
    metadata_location: Callable[[str], str],
    health: Callable[[str], TableHealth | Screened],
    claim_holder: Callable[[str], str | None],
    approved: Callable[[str, str | None], bool],
    past_runs: Callable[[str], list[dict[str, Any]]],
    cursor: dict[str, TableCursor],
    now: dt.datetime,
    max_runs: int | None = None,
    valid_dates: Callable[[str], bool] = lambda d: True,
    read: Mapper = in_order,
    run_of: Callable[[Decision], object] | None = None,
    kept: KeptHealths | None = None,
    in_flight: Callable[[], Mapping[str, set[str]]] | None = None,
    reverted: Callable[[str], Mapping[str | None, str]] | None = None,
    held: Callable[[str], Mapping[str | None, RunHold]] | None = None,
) -> TickPlan:
    """Observe and decide compaction for every table; returns the runs to request and the new cursor.

    `read` maps a metadata read over tables (default: `in_order`); a sensor passes a bounded thread
    pool, since on an object store or a REST catalog each read mostly waits. `run_of`: see
    `rank_within_budget` (the runs `max_runs` counts). `health` may answer
    `Screened` for a table whose manifest list shows that nothing can be due. `kept`: healths of the
    previous tick's budget deferrals, used instead of a read while their table has not moved, then replaced.
    `in_flight`: table -> jobs with a run queued or running on it (read once, when a table is decided): such a
    table's dates wait for them, and that wait is not recorded (its own run is no one else's claim). `reverted`:
    the table's scopes an operator reverted (`Gates.reverted`), held until approved again. `held`: the table's
    scopes whose last runs a retry would repeat (`Gates.held`). A table with a run requested is looked at again
    `RECHECK_AFTER_RUN_SECONDS` later even if its metadata has not moved: a run that did not publish (it
    deferred at run time, failed, or was interrupted) is decided again, not forgotten.
    Claim and audit outages still raise; a table whose metadata cannot be read is reported in
    `errors` and keeps no cursor entry, so the next tick reads it again.
    """
    plan = TickPlan()
    identity = config.identity()
    running: Mapping[str, set[str]] | None = None
    candidates: list[Decision] = []
    healths: dict[str, TableHealth] = {}
    tables = list(tables)
    policies, changed = {}, []
    for table, location in zip(tables, read(_answer_or_error(metadata_location), tables)):
        if isinstance(location, Exception):
            plan.errors[table] = f"{type(location).__name__}: {location}"
            continue
        previous = cursor.get(table)
        policy = policies[table] = config.policy(table)
        fingerprint = policy_fingerprint(policy)
        if previous and previous.metadata_location == location and previous.policy in (None, fingerprint) and (
                previous.recheck_at is None or now.timestamp() < previous.recheck_at):
            plan.cursor[table] = previous
            plan.unchanged.append(table)
            continue
        changed.append((table, location, fingerprint))
    reused = {t: kept.entries[(t, loc, fp)].at(now) for t, loc, fp in changed
              if kept is not None and (t, loc, fp) in kept.entries}
    fresh = [t for t, _, _ in changed if t not in reused]
    read_now = dict(zip(fresh, read(_answer_or_error(health), fresh)))
    observed = [reused[t] if t in reused else read_now[t] for t, _, _ in changed]
    for (table, location, fingerprint), h in zip(changed, observed):
        if isinstance(h, Exception):
            plan.errors[table] = f"{type(h).__name__}: {h}"
            continue
        previous, policy = cursor.get(table), policies[table]
        plan.evaluated.append(table)
        plan.observed[table] = h
        if isinstance(h, Screened):
            plan.screened.append(table)
            table_decisions = [screened_decision(h, policy, identity)]
            candidates.extend(table_decisions)
            digest = _decision_digest(table_decisions)
            if digest is not None and (previous is None or previous.recorded != digest):
                plan.to_record.extend(table_decisions)
            plan.cursor[table] = TableCursor(h.metadata_location, None, fingerprint, digest,
                                             table_summary(table_decisions, now))
            continue
        healths[table] = h
        if running is None:
            running = in_flight() if in_flight is not None else {}
        gates = Gates(now=now, identity=identity, claim_holder=claim_holder(table),
                      bytes_per_second=measured_throughput(past_runs(table)),
                      runs_in_flight=frozenset(running.get(table, ())),
                      reverted=reverted(table) if reverted is not None else {},
                      held=held(table) if held is not None else {})
        table_decisions = decide_with_approvals(h, policy, gates, lambda date: approved(table, date),
                                                [p.date for p in h.partitions if valid_dates(p.date)])
        candidates.extend(table_decisions)
        recheck_times = [recheck_after(d, h, now, policy) for d in table_decisions if d.verdict == DEFER]
        rechecks = [r for r in recheck_times if r is not None]
        digest = _decision_digest(table_decisions)
        if digest is not None and (previous is None or previous.recorded != digest):
            plan.to_record.extend(d for d in table_decisions if d.verdict in (DEFER, REFUSE)
                                  and d.kind != ReasonKind.RUNS_IN_FLIGHT)
        plan.cursor[table] = TableCursor(location, min(rechecks) if rechecks else None, fingerprint, digest,
                                         table_summary(table_decisions, now))
    ranked = rank_within_budget(candidates, max_runs=max_runs, run_of=run_of)
    for d in ranked:
        plan.decisions.append(d)
        if d.verdict == RUN:
            plan.runs.append((d, healths[d.table]))
            entry = plan.cursor[d.table]
            entry.recheck_at = min(entry.recheck_at or float("inf"), now.timestamp() + RECHECK_AFTER_RUN_SECONDS)
        elif d.kind == ReasonKind.TICK_BUDGET:
            plan.cursor[d.table].recheck_at = now.timestamp()  # look again next tick
    if kept is not None:
        kept.entries = {(d.table, healths[d.table].metadata_location, plan.cursor[d.table].policy): healths[d.table]
                        for d in ranked if d.kind == ReasonKind.TICK_BUDGET and d.table in healths}
    return plan


def date_batches(runs: Sequence[tuple[str, str | None]], limit: int) -> list[list[tuple[str, str | None]]]:
    """The tick's (table, date) runs as runs of consecutive dates of one table, at most `limit` dates each.

    A batch becomes one Dagster run over its partition range (one Spark session, one run record), each
    date still its own request, claim, proof, audit record and materialization. Batches are ordered by their
    best-ranked run (the tick's order); a run without a date (a table compacted per partition) stands alone,
    and a run listed twice runs once.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int of at least 1, got {limit!r}")
    rank: dict[tuple[str, str | None], int] = {}
    for i, run in enumerate(runs):
        rank.setdefault(run, i)
    batches: list[list[tuple[str, str | None]]] = []
    dated: dict[str, list[str]] = {}
    for table, date in rank:
        if date is None:
            batches.append([(table, None)])
        else:
            dated.setdefault(table, []).append(date)
    for table, dates in dated.items():
        batch: list[tuple[str, str | None]] = []
        for date in sorted(dates):
            last = batch[-1][1] if batch else None
            follows = (last is not None
                       and dt.date.fromisoformat(last) + dt.timedelta(days=1) == dt.date.fromisoformat(date))
            if follows and len(batch) < limit:
                batch.append((table, date))
            else:
                batch = [(table, date)]
                batches.append(batch)
    return sorted(batches, key=lambda b: min(rank[r] for r in b))


def table_lanes(batches: Sequence[list[tuple[str, str | None]]]) -> list[list[list[tuple[str, str | None]]]]:
    """The batches grouped by table, in the order of each table's first batch: one lane per table, run one
    batch after the other, so lanes can run at once without two runs of one table at the same time. (A batch of
    several tables, from `table_batches`, is a lane of its own: none of its tables has another batch.)"""
    lanes: dict[str, list[list[tuple[str, str | None]]]] = {}
    for batch in batches:
        lanes.setdefault(batch[0][0], []).append(batch)
    return list(lanes.values())


def table_batches(batches: Sequence[list[tuple[str, str | None]]], order: Sequence[str], limit: int,
                  spread: int = 1, slot: Callable[[str], int] | None = None) -> list[list[tuple[str, str | None]]]:
    """`date_batches`' output with the batches of different tables that have the same dates joined: one batch
    over tables next to each other in `order` (the `table` partitions' order) and their common dates, at most
    `limit` table-dates each (so at most `limit` // dates tables).

    A Dagster run over a `table` x `date` range covers every table between its first and last in the
    partitions' order and every date between its first and last, so only neighbours with the same dates can
    share a run (never a table or date the tick did not choose). A table with more than one batch this tick
    (dates that are not consecutive, or more than one run of them) keeps its own batches, so it is never in
    two runs at once. A long stretch of neighbours is cut into at least `spread` batches (the tick's
    workers). With `slot` (the run queue's slot of a table), a stretch is also cut before a table whose slot a
    table already in the batch has: a run carries one slot tag per table. Batches are ordered by their
    best-ranked member; a joined batch lists table by table.
    """
    for name, value in (("limit", limit), ("spread", spread)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
    position = {table: i for i, table in enumerate(order)}
    per_table = Counter(batch[0][0] for batch in batches)
    rank = {id(batch): i for i, batch in enumerate(batches)}
    kept: list[list[tuple[str, str | None]]] = []
    joinable: dict[tuple[str | None, ...], list[list[tuple[str, str | None]]]] = {}
    for batch in batches:
        table = batch[0][0]
        dates = tuple(date for _, date in batch)
        if None not in dates and per_table[table] == 1 and table in position and len(dates) < limit:
            joinable.setdefault(dates, []).append(batch)
        else:
            kept.append(batch)
    joined: list[tuple[int, list[tuple[str, str | None]]]] = []
    for dates, alike in joinable.items():
        alike.sort(key=lambda b: position[b[0][0]])
        stretches: list[list[list[tuple[str, str | None]]]] = []
        for batch in alike:
            if stretches and position[batch[0][0]] == position[stretches[-1][-1][0][0]] + 1:
                stretches[-1].append(batch)
            else:
                stretches.append([batch])
        for stretch in stretches:
            size = min(limit // len(dates), -(-len(stretch) // spread))
            parts: list[list[list[tuple[str, str | None]]]] = []
            for batch in stretch:
                if not parts or len(parts[-1]) == size or (
                        slot is not None and slot(batch[0][0]) in {slot(b[0][0]) for b in parts[-1]}):
                    parts.append([])
                parts[-1].append(batch)
            for part in parts:
                joined.append((min(rank[id(b)] for b in part), [run for b in part for run in b]))
    out = [(rank[id(b)], b) for b in kept] + joined
    return [batch for _, batch in sorted(out, key=lambda pair: pair[0])]
