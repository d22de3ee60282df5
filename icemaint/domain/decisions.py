"""Pure maintenance decisions: (health, policy, claim state, now) -> run / defer / refuse / noop.

No Dagster, no Spark. Sensors, assets and the CLI call these and record what they return, in the words of
`icemaint.domain.verdicts`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from icemaint.domain.drift import drift_due
from icemaint.domain.health import PartitionHealth, TableHealth
from icemaint.domain.layout import WHOLE_TABLE, describe, describe_all
from icemaint.domain.names import is_column_path
from icemaint.domain.policy import TablePolicy
from icemaint.domain.units import counted, human_duration, human_size
from icemaint.domain.verdicts import AGENT_TRIGGER, DEFER, NOOP, REFUSE, RUN, ReasonKind
from icemaint.domain.writer_activity import (active_partitions, layout_writer_check, writer_active_reason,
                                             writer_check)

# Used for a cost estimate when a table has no measured past runs: conservative for 2 cores.
DEFAULT_REWRITE_BYTES_PER_SECOND = 20 * 2**20


@dataclass(frozen=True)
class Decision:
    table: str
    operation: str
    verdict: str
    reason: str
    date: str | None = None
    benefit: float = 0.0
    needs_approval: bool = False
    rationale: dict[str, Any] = field(default_factory=dict)
    cost_estimate: dict[str, Any] = field(default_factory=dict)
    writer_check: dict[str, Any] = field(default_factory=dict)
    kind: ReasonKind = ReasonKind.DUE

    @property
    def scope(self) -> str:
        """What the decision is about, as people read it: its date, or the table as a whole."""
        return self.date or "(table)"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"], out["kind"] = str(self.verdict), str(self.kind)
        return out


@dataclass(frozen=True)
class Gates:
    """What the decider knows besides health and policy."""

    now: dt.datetime
    identity: str
    claim_holder: str | None = None
    approved: bool = False
    bytes_per_second: float | None = None  # measured throughput of this table's past rewrites
    # Jobs with a run queued or running on the table (a sensor's own compaction among them): waited for, so the
    # tick neither requests the table again nor reads the claim its own run holds as someone else's.
    runs_in_flight: frozenset[str] = frozenset()
    # Scopes (a date; None: a table without a time column) whose published compaction an operator reverted, with
    # who reverted what and when (`safety.approvals.reverted_scopes`): held until an approval newer than the revert.
    reverted: Mapping[str | None, str] = field(default_factory=dict)
    # Scopes automation leaves alone after runs a retry would repeat (`safety.approvals.held_runs`): a failed
    # proof, or several runs in a row that failed. Held until an approval; a person's own run is not held.
    held: Mapping[str | None, "RunHold"] = field(default_factory=dict)
    # Who launched the decision's run: an agent's (AGENT_TRIGGER) is also held to the policy's agent_operations.
    trigger: str | None = None
    # Whether a date due only for its layout drift is run: the engine writes it in the table's current spec and sort
    # order (`icemaint.engine.relayout`). Off, it is reported (kind `unsupported`) and not run.
    layout_rewrite: bool = True


@dataclass(frozen=True)
class RunHold:
    """Why automation does not run a scope again: `kind` PROOF_FAILED or RUNS_FAILED, `note` which run, when, why."""

    kind: ReasonKind
    note: str


def _refusal(policy: TablePolicy, operation: str, identity: str, trigger: str | None = None) -> str | None:
    if not policy.enabled:
        return "maintenance is disabled for this table by policy (enabled: false)"
    if policy.read_only:
        return "table is read-only by policy (read_only: true): no mutating maintenance"
    if not policy.allows_operation(operation):
        return (f"operation {operation!r} is not allowed by policy "
                f"(allowed_operations: {', '.join(sorted(policy.allowed_operations or ()))})")
    if not policy.allows_identity(identity):
        return (f"identity {identity!r} is not allowed by policy "
                f"(allowed_identities: {', '.join(sorted(policy.allowed_identities or ()))})")
    if trigger == AGENT_TRIGGER and operation not in policy.agent_operations:
        return (f"operation {operation!r} is not given to agents by policy "
                f"(agent_operations: {', '.join(sorted(policy.agent_operations)) or 'none'})")
    return None


def _undated(health: TableHealth) -> str:
    # e.g. files written with column metrics off ('write.metadata.metrics.default'='none'): no bounds to date them by
    return (f"; {health.undated_files} data files of the table have no date (their {health.time_column} is NULL, or "
            "the manifests hold no bounds for it), so no date scope reaches them")


def refusal_for(policy: TablePolicy, operation: str, identity: str, trigger: str | None = None) -> str | None:
    """Why `identity` may not run `operation` on a table under `policy`, or None when it may; a run an agent
    asked for (`trigger` AGENT_TRIGGER) also needs the operation in the policy's `agent_operations`."""
    return _refusal(policy, operation, identity, trigger)


def estimate_cost(rewrite_bytes: int, files: int, bytes_per_second: float | None) -> dict[str, Any]:
    rate = bytes_per_second or DEFAULT_REWRITE_BYTES_PER_SECOND
    return {"rewrite_bytes": rewrite_bytes, "files": files, "bytes_per_second": rate,
            "throughput_source": "measured" if bytes_per_second else "default",
            "seconds": round(rewrite_bytes / rate, 3)}


def _held_by_revert(base: Decision, gates: Gates) -> Decision | None:
    """The deferral of a scope an operator reverted (not approved again since), else None."""
    note = gates.reverted.get(base.date)
    if note is None or gates.approved:
        return None
    approve = f"icemaint approve {base.table}" + (f" --date {base.date}" if base.date else "")
    return replace(base, verdict=DEFER, needs_approval=True, kind=ReasonKind.REVERTED,
                   reason=f"held after a revert: {note}; to compact it again: {approve}")


def _held_by_runs(base: Decision, gates: Gates) -> Decision | None:
    """The deferral of a scope whose last runs a retry would repeat (a failed proof, runs that kept failing), else
    None. The hold is read from the runs since the scope's latest approval, so an approval lifts it (for one more
    run): `needs_approval` only makes the tick look again for one."""
    hold = gates.held.get(base.date)
    if hold is None:
        return None
    approve = f"icemaint approve {base.table}" + (f" --date {base.date}" if base.date else "")
    return replace(base, verdict=DEFER, needs_approval=True, kind=hold.kind,
                   reason=f"held: {hold.note}; to let automation run it again: {approve}")


def _writer_active(base: Decision, policy: TablePolicy) -> Decision | None:
    """The deferral when a writer committed where the decision would rewrite within `writer_idle`, else None."""
    wc = base.writer_check
    if wc["idle"]:
        return None
    return replace(base, verdict=DEFER, kind=ReasonKind.WRITER_ACTIVE, reason=writer_active_reason(wc, policy))


def _busy(base: Decision, policy: TablePolicy, gates: Gates) -> Decision | None:
    """The deferral when a writer is still active, a run is in flight on the table or someone holds the claim,
    else None."""
    active = _writer_active(base, policy)
    if active is not None:
        return active
    if gates.runs_in_flight:
        return replace(base, verdict=DEFER, kind=ReasonKind.RUNS_IN_FLIGHT,
                       reason=f"waiting for runs in flight on the table: {', '.join(sorted(gates.runs_in_flight))}")
    if gates.claim_holder:
        return replace(base, verdict=DEFER, kind=ReasonKind.CLAIM_BUSY, reason=f"claim busy: held by {gates.claim_holder}")
    return None


def decide_compaction(health: TableHealth, date: str, policy: TablePolicy, gates: Gates) -> Decision:
    """Whether one date partition of a table should be compacted now, and why (or why not)."""
    base = Decision(table=health.table, operation="compact", verdict=NOOP, reason="", date=date,
                    writer_check=writer_check(health, policy, date))
    refused = _refusal(policy, "compact", gates.identity, gates.trigger)
    if refused:
        return replace(base, verdict=REFUSE, reason=refused, kind=ReasonKind.POLICY)
    if health.time_column is None:
        return replace(base, verdict=REFUSE, kind=ReasonKind.NO_TIME_COLUMN, reason=(
            "table has no time column (no day/hour/month/year partition and no time_column in its policy), so it "
            "has no dates: it is compacted per partition of its layout (icemaint compact TABLE, without --date)"))
    if not is_column_path(health.time_column):
        return replace(base, verdict=REFUSE, kind=ReasonKind.NO_TIME_COLUMN, reason=(
            f"time column {health.time_column!r} is not a plain identifier (letters, digits, underscores), so no "
            "date scope is built on it: set time_column in its policy to a plainly named date or timestamp column"))
    part = health.partition(date)
    if part is None or part.data_files == 0:
        reason = f"no data files on {date}" + (_undated(health) if health.undated_files else "")
        return replace(base, reason=reason, kind=ReasonKind.NO_DATA)
    held = _held_by_revert(base, gates) or _held_by_runs(base, gates)
    if held:
        return held
    due = partition_due(part, policy, position_deletes=position_deletes_maintained(health))
    if not due.due:
        due = _with_drift(due, part, health, policy)
    if not due.due:
        return replace(base, rationale=due.rationale, kind=ReasonKind.BELOW_THRESHOLDS,
                       reason=f"below thresholds: {due.why_not}")
    if due.target != "position_deletes" and health.sort_order_problem:  # a merge of position deletes alone sorts nothing
        return replace(base, rationale=due.rationale, verdict=REFUSE, kind=ReasonKind.POLICY,
                       reason=health.sort_order_problem)
    cost = estimate_cost(due.rewrite_bytes, due.rewrite_files, gates.bytes_per_second)
    base = replace(base, rationale=due.rationale, cost_estimate=cost, benefit=due.benefit,
                   kind=_DUE_KINDS[due.target])
    rewrite_bytes = due.rewrite_bytes
    if due.target == "layout_drift" and not gates.layout_rewrite:
        return replace(base, kind=ReasonKind.UNSUPPORTED, reason=(
            f"{due.why}: due, but layout rewrites are off for this caller (Gates.layout_rewrite): reported, not run"))
    # A date a writer is still committing into says so first (today's date is usually also hot): its last commit
    # is what tells the owner when it will be compacted.
    active = _writer_active(base, policy)
    if active is not None:
        return active
    day_end = dt.datetime.combine(dt.date.fromisoformat(date) + dt.timedelta(days=1), dt.time(), dt.timezone.utc)
    age = (gates.now - day_end).total_seconds()
    if age < policy.hot_partition_age_seconds:
        # A day still in progress (or in the future) has not "ended ... ago": say so plainly.
        ended = f"ended {human_duration(age)} ago" if age >= 0 else f"has not ended yet (ends in {human_duration(-age)})"
        return replace(base, verdict=DEFER, kind=ReasonKind.HOT_PARTITION, reason=(
            f"hot partition: {date} {ended}, within hot_partition_age {human_duration(policy.hot_partition_age_seconds)}"))
    busy = _busy(base, policy, gates)
    if busy is not None:
        return busy
    if rewrite_bytes > policy.max_rewrite_bytes and not gates.approved:
        return replace(base, verdict=DEFER, needs_approval=True, kind=ReasonKind.AWAITING_APPROVAL, reason=(
            f"awaiting approval: rewrite of {human_size(rewrite_bytes)} exceeds max_rewrite_bytes "
            f"{human_size(policy.max_rewrite_bytes)} (approve with: icemaint approve {health.table} --date {date})"))
    return replace(base, verdict=RUN, reason=due.why)


def _with_drift(due: PartitionDue, part: PartitionHealth, health: TableHealth, policy: TablePolicy) -> PartitionDue:
    """A date below the small-file and delete thresholds: due for its layout drift when that passes its own
    thresholds (`icemaint.domain.drift`), else `due` with the drift's numbers beside it."""
    drift = drift_due(part, health, policy)
    if drift is None:
        return due
    rationale = {**due.rationale, **drift.rationale}
    if not drift.due:
        rationale.pop("trigger")
        return replace(due, rationale=rationale, why_not=f"{due.why_not}; {drift.why_not}")
    return PartitionDue(key=part.key, due=True, why=drift.why, why_not=due.why_not, target="layout_drift",
                        rewrite_bytes=drift.rewrite_bytes, rewrite_files=drift.rewrite_files, benefit=drift.benefit,
                        rationale=rationale)


@dataclass(frozen=True)
class PartitionDue:
    """Whether one partition (a date, or a partition of a table without a time column) needs a rewrite."""

    key: str
    due: bool
    why: str            # the trigger when due
    why_not: str        # the thresholds it stays under when not
    rewrite_bytes: int
    rewrite_files: int
    benefit: float      # small files removed and delete files applied per MiB rewritten
    rationale: dict[str, Any]
    # what is rewritten: "data" files, "position_deletes" alone, or the "layout_drift" files (and the small ones)
    target: str = "data"


_DUE_KINDS = {"data": ReasonKind.DUE, "position_deletes": ReasonKind.POSITION_DELETES_DUE,
              "layout_drift": ReasonKind.LAYOUT_DRIFT}


def position_deletes_maintained(health: TableHealth) -> bool:
    """Whether a date's position-delete files alone can be rewritten: a time-partitioned table (each date's
    delete files in the date's partitions) of format v2 (a v3 table takes deletion vectors only, which are
    one per data file already)."""
    return health.time_partitioned and health.format_version == 2


def partition_due(part: PartitionHealth, policy: TablePolicy, *, position_deletes: bool = False) -> PartitionDue:
    """The thresholds of one partition: many small files, or too many deleted rows; with `position_deletes`
    (a date of a time-partitioned table) also many position-delete files over data files that are fine."""
    with_deletes = part.delete_files > 0
    rationale: dict[str, Any] = {
        "small_files": part.small_files, "min_input_files": policy.min_input_files,
        "data_files": part.data_files, "delete_files": part.delete_files,
        "deleted_row_ratio": round(part.deleted_row_ratio, 6), "max_delete_ratio": policy.max_delete_ratio,
        "small_file_size_bytes": policy.small_file_size_bytes,
    }
    many_small = part.small_files >= policy.min_input_files
    too_many_deletes = with_deletes and part.deleted_row_ratio > policy.max_delete_ratio
    why_not = (f"{counted(part.small_files, 'small file')} < min_input_files {policy.min_input_files}"
               f" and deleted-row ratio {part.deleted_row_ratio:.3f} <= {policy.max_delete_ratio}")
    if position_deletes:
        rationale.update(position_delete_files=part.position_delete_files,
                         min_position_delete_files=policy.min_position_delete_files)
        why_not += (f" and {part.position_delete_files} position-delete files < min_position_delete_files "
                    f"{policy.min_position_delete_files}")
        if not (many_small or too_many_deletes) and part.position_delete_files >= policy.min_position_delete_files:
            rationale["trigger"] = "position_deletes"
            return PartitionDue(
                key=part.key, due=True, why_not=why_not, target="position_deletes",
                why=(f"{part.position_delete_files} position-delete files >= min_position_delete_files "
                     f"{policy.min_position_delete_files} (the data files are fine: only the deletes are rewritten)"),
                # the cost gate weighs what the proof reads (the date's data files, before and after), the
                # benefit what is merged (delete files per MiB of deletes)
                rewrite_bytes=part.total_bytes, rewrite_files=part.position_delete_files,
                benefit=(part.position_delete_files - 1) / max(part.delete_bytes, 1) * 2**20, rationale=rationale)
    # Files carrying deletes are rewritten whole; small files are rewritten in any case.
    rewrite_bytes = part.total_bytes if too_many_deletes else part.small_bytes
    rewrite_files = part.data_files if too_many_deletes else part.small_files
    if many_small or too_many_deletes:
        rationale["trigger"] = "small_files" if many_small else "delete_ratio"
    return PartitionDue(
        key=part.key, due=many_small or too_many_deletes,
        why=(f"{counted(part.small_files, 'small file')} >= {policy.min_input_files}" if many_small
             else f"deleted-row ratio {part.deleted_row_ratio:.3f} > {policy.max_delete_ratio}"),
        why_not=why_not, rewrite_bytes=rewrite_bytes, rewrite_files=rewrite_files,
        benefit=(max(part.small_files - 1, 0) + part.delete_files) / max(rewrite_bytes, 1) * 2**20,
        rationale=rationale)


@dataclass(frozen=True)
class PartitionChoice:
    """The partitions of a table without a time column that one run rewrites, best first."""

    chosen: tuple[PartitionDue, ...]
    waiting: tuple[PartitionDue, ...]   # due, but past the run's cost ceiling: the next run takes them
    over_ceiling: PartitionDue | None   # the best partition alone exceeds the ceiling: needs approval

    @property
    def rewrite_bytes(self) -> int:
        return sum(p.rewrite_bytes for p in self.chosen)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.chosen)


def choose_partitions(parts: Sequence[PartitionHealth], policy: TablePolicy, approved: bool = False
                      ) -> PartitionChoice:
    """The due partitions ranked by benefit, taken while their rewrite fits `max_rewrite_bytes`.

    The ceiling bounds what one run rewrites and proves; an approved run takes every due partition.
    """
    due = sorted((d for d in (partition_due(p, policy) for p in parts if p.data_files) if d.due),
                 key=lambda d: (-d.benefit, d.key))
    if approved:
        return PartitionChoice(tuple(due), (), None)
    chosen, used = [], 0
    for d in due:
        if used + d.rewrite_bytes > policy.max_rewrite_bytes:
            break
        chosen.append(d)
        used += d.rewrite_bytes
    over = due[0] if due and not chosen else None
    return PartitionChoice(tuple(chosen), tuple(due[len(chosen):]), over)


def decide_layout_compaction(health: TableHealth, policy: TablePolicy, gates: Gates) -> Decision:
    """Whether a table without a time column should be compacted now: its due partitions, best first,
    within the cost ceiling (`Decision.date` is None; `rationale["partitions"]` names them)."""
    active = active_partitions(health, policy)
    base = Decision(table=health.table, operation="compact", verdict=NOOP, reason="",
                    writer_check=layout_writer_check(health, policy, active))
    refused = _refusal(policy, "compact", gates.identity, gates.trigger) or health.sort_order_problem
    if refused:
        return replace(base, verdict=REFUSE, reason=refused, kind=ReasonKind.POLICY)
    if health.time_column_problem:
        return replace(base, verdict=REFUSE, kind=ReasonKind.NO_TIME_COLUMN, reason=health.time_column_problem)
    if not any(p.data_files for p in health.partitions):
        return replace(base, reason="no data files", kind=ReasonKind.NO_DATA)
    held = _held_by_revert(base, gates) or _held_by_runs(base, gates)
    if held:
        return held
    choice = choose_partitions([p for p in health.partitions if p.key not in active], policy, gates.approved)
    scope = "the whole table" if [p.key for p in health.partitions] == [WHOLE_TABLE] else \
        f"{len(health.partitions)} partitions"
    written = [p for p in health.partitions if p.key in active and partition_due(p, policy).due]
    if not choice.chosen and choice.over_ceiling is None and written:
        newest = min(written, key=lambda p: (p.seconds_since_writer_commit or 0.0, p.key))
        return replace(base, verdict=DEFER, kind=ReasonKind.WRITER_ACTIVE,
                       rationale={"partitions_written": sorted(p.key for p in written)},
                       reason=writer_active_reason(writer_check(health, policy, newest.key), policy)
                       + (f" (and {len(written) - 1} more due partitions being written)" if len(written) > 1 else ""))
    if not choice.chosen and choice.over_ceiling is None:
        best = max(health.partitions, key=lambda p: (p.small_files, p.key))
        return replace(base, kind=ReasonKind.BELOW_THRESHOLDS, rationale={"partitions_checked": len(health.partitions)},
                       reason=f"below thresholds in {scope}: at most {partition_due(best, policy).why_not}")
    if choice.over_ceiling is not None:
        over = choice.over_ceiling
        return replace(base, verdict=DEFER, needs_approval=True, kind=ReasonKind.AWAITING_APPROVAL, benefit=over.benefit,
                       rationale={**over.rationale, "partitions": [over.key]},
                       cost_estimate=estimate_cost(over.rewrite_bytes, over.rewrite_files, gates.bytes_per_second),
                       reason=(f"awaiting approval: the rewrite of partition {describe(over.key)} "
                               f"({human_size(over.rewrite_bytes)}) exceeds max_rewrite_bytes "
                               f"{human_size(policy.max_rewrite_bytes)} (approve with: icemaint approve "
                               f"{health.table})"))
    chosen = choice.chosen
    rationale = {"partitions": list(choice.keys), "partitions_waiting": [p.key for p in choice.waiting],
                 "small_files": sum(p.rationale["small_files"] for p in chosen),
                 "delete_files": sum(p.rationale["delete_files"] for p in chosen),
                 "min_input_files": policy.min_input_files, "max_delete_ratio": policy.max_delete_ratio,
                 "small_file_size_bytes": policy.small_file_size_bytes}
    base = replace(base, rationale=rationale, benefit=chosen[0].benefit, cost_estimate=estimate_cost(
        choice.rewrite_bytes, sum(p.rewrite_files for p in chosen), gates.bytes_per_second))
    busy = _busy(base, policy, gates)
    if busy is not None:
        return busy
    if written:
        waiting_writers = (f"; {len(written)} due partitions wait for their writer "
                           f"({describe_all(tuple(p.key for p in written), 3)})")
    else:
        waiting_writers = ""
    waiting = f"; {len(choice.waiting)} more due partitions wait for the next run (max_rewrite_bytes " \
              f"{human_size(policy.max_rewrite_bytes)})" if choice.waiting else ""
    if scope == "the whole table":
        return replace(base, verdict=RUN, reason=f"the whole table is due: {chosen[0].why}")
    return replace(base, verdict=RUN, reason=(
        f"{len(chosen)} of {scope} due ({describe_all(choice.keys, 3)}; best: {chosen[0].why}){waiting}"
        f"{waiting_writers}"))


def decide_table_compactions(health: TableHealth, policy: TablePolicy, gates: Gates,
                             dates: Iterable[str] | None = None) -> list[Decision]:
    """Decisions for every dated partition of a table (or the given dates); a table without a time
    column has one decision for its layout's partitions, and a table with nothing to decide one NOOP
    that says so (every table appears in every tick with a decision)."""
    if health.time_column_problem:
        return [Decision(table=health.table, operation="compact", verdict=REFUSE, kind=ReasonKind.NO_TIME_COLUMN,
                         reason=health.time_column_problem, writer_check=writer_check(health, policy))]
    if not health.dated:
        return [decide_layout_compaction(health, policy, gates)]
    wanted = list(dates) if dates is not None else [p.date for p in health.partitions]
    out = [decide_compaction(health, d, policy, gates) for d in wanted]
    if not out:
        reason = "no data files on any date" if not health.partitions else "no date in the maintained range"
        if not health.partitions and health.undated_files:
            reason += _undated(health)
        out = [Decision(table=health.table, operation="compact", verdict=NOOP, reason=reason, kind=ReasonKind.NO_DATA,
                        writer_check=writer_check(health, policy))]
    return out


def decide_with_approvals(health: TableHealth, policy: TablePolicy, gates: Gates,
                          approved: Callable[[str | None], bool], dates: Iterable[str] | None = None) -> list[Decision]:
    """`decide_table_compactions`, where a decision that waits for approval is decided again as approved when
    `approved(its date)` says an operator approved it (the tick, `maintain` and `explain` count approvals alike)."""
    out = []
    for d in decide_table_compactions(health, policy, gates, dates):
        if d.needs_approval and approved(d.date):
            d = decide_table_compactions(health, policy, replace(gates, approved=True),
                                         [d.date] if d.date else None)[0]
        out.append(d)
    return out


def rank_within_budget(decisions: Sequence[Decision], max_runs: int | None = None,
                       max_bytes: int | None = None, run_of: Callable[[Decision], object] | None = None
                       ) -> list[Decision]:
    """Runs ordered by benefit (small files removed per MiB rewritten); runs past the tick's budget
    become defers. Non-run decisions pass through unchanged, after the runs.

    `run_of` names the run a decision is executed in when several share one (`icemaint tick` runs a
    table's dates as one Dagster run: `lambda d: d.table`): `max_runs` then counts those runs, and a
    decision joining a run already kept costs no run of the budget (its bytes still count)."""
    runs = sorted((d for d in decisions if d.verdict == RUN), key=lambda d: (-d.benefit, d.table, d.date or ""))
    out, used_bytes, kept, units = [], 0, 0, set()
    for d in runs:
        cost = d.cost_estimate.get("rewrite_bytes", 0)
        unit = run_of(d) if run_of is not None else None
        joins = run_of is not None and unit in units
        if max_runs is not None and kept >= max_runs and not joins:
            out.append(replace(d, verdict=DEFER, kind=ReasonKind.TICK_BUDGET,
                               reason=f"tick budget: at most {counted(max_runs, 'run')} per tick; ranked lower"))
            continue
        if max_bytes is not None and used_bytes + cost > max_bytes and used_bytes > 0:
            out.append(replace(d, verdict=DEFER, kind=ReasonKind.TICK_BUDGET,
                               reason=f"tick budget: {human_size(max_bytes)} per tick used; ranked lower"))
            continue
        used_bytes += cost
        if not joins:
            kept += 1
            units.add(unit)
        out.append(d)
    placed = [d for d in out if d.verdict == RUN] + [d for d in out if d.verdict != RUN]
    return placed + [d for d in decisions if d.verdict != RUN]


def measured_throughput(past_runs: Iterable[dict[str, Any]]) -> float | None:
    """Bytes per second over a table's past successful data rewrites (audit `details` of compact runs; a
    rewrite of position-delete files alone moves few bytes in mostly fixed time and would skew it)."""
    total_bytes = total_seconds = 0.0
    for run in past_runs:
        if run.get("rewritten_delete_files"):
            continue
        b, s = run.get("rewritten_bytes"), run.get("rewrite_seconds")
        if b and s and s > 0:
            total_bytes += b
            total_seconds += s
    return total_bytes / total_seconds if total_seconds > 0 else None
