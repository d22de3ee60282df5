"""`icemaint explain TABLE [--date D]` and `icemaint plan`: the decisions, read-only.

Both call the same pure decision code the sensors call (`icemaint.domain.decisions`, `.tick`,
`.retention_tick`); neither takes a claim, writes the audit log, creates the Dagster instance or
touches a table. `explain` lists every gate of one table's compaction and retention decisions with the
numbers compared; `plan` ranks what the next tick would do across the estate.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from icemaint.config import MaintenanceConfig
from icemaint.domain.decisions import (Decision, Gates, decide_table_compactions, measured_throughput, partition_due,
                                       position_deletes_maintained, refusal_for)
from icemaint.domain.verdicts import DEFER, REFUSE, ReasonKind
from icemaint.domain.hints import hint
from icemaint.domain.health import TableHealth
from icemaint.domain.names import TableName
from icemaint.domain.units import counted, human_duration, human_size
from icemaint.domain.writer_activity import writer_check

log = logging.getLogger(__name__)

# The tick's own bound on runs requested at once (sensors/compaction.py MAX_RUNS_PER_TICK); a run is a
# table's consecutive due dates, so the bound counts tables, as the sensor and `icemaint tick` count them.
MAX_RUNS_PER_TICK = 20


@dataclass
class Gate:
    name: str
    status: str     # "pass" | "blocks" | "n/a"
    detail: str


@dataclass
class Explanation:
    table: str
    maintained_as: str
    policy_source: str
    compaction: list[dict] = field(default_factory=list)  # per decision: its gates and verdict
    retention: list[dict] = field(default_factory=list)
    audit: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class ReadOnlyEstate:
    """The reads the decisions need, none of them a write: catalog, claim holders, the audit log and
    (only when it exists already) the Dagster instance for retention's ordering marks."""

    def __init__(self, config: MaintenanceConfig, instance=None):
        """`instance`: a Dagster instance the caller holds open already (else opened here when it exists)."""
        from icemaint.observe.catalog import CatalogReader
        from icemaint.safety.audit import open_audit
        from icemaint.safety.claims import open_claims

        self.config = config
        self.reader = CatalogReader(config)
        self.claims = open_claims(config)
        self.audit = open_audit(config)
        self._records = None
        self._instance = instance if instance is not None else False

    def holder(self, table: str) -> str | None:
        info = self.claims.holder_of(table)
        return info.holder if info else None

    def records(self, table: str) -> list:
        if self._records is None:
            self._records = {}
            for r in self.audit.records():
                self._records.setdefault(r.table, []).append(r)
        return self._records.get(table, [])

    def past_runs(self, table: str) -> list[dict]:
        return [r.details for r in self.records(table) if r.operation == "compact" and r.decision == "run"]

    def reverted(self, table: str) -> dict:
        from icemaint.safety.approvals import reverted_scopes

        return reverted_scopes(self.records(table))

    def held(self, table: str) -> dict:
        from icemaint.safety.approvals import held_runs

        return held_runs(self.records(table))

    def approved(self, table: str, date: str | None) -> bool:
        from icemaint.safety.approvals import is_approved

        return is_approved([r for r in self.records(table) if r.operation in ("compact", "approve")], date)

    def instance(self):
        """The Dagster instance if it exists (opened, never created), else None."""
        if self._instance is False:
            home = Path(self.config.dagster_home).resolve()
            self._instance = None
            if (home / "dagster.yaml").exists():
                from dagster import DagsterInstance

                try:
                    self._instance = DagsterInstance.from_config(str(home))
                except Exception as exc:  # read-only: an instance it cannot open (a read-only state dir) is none
                    log.warning("the Dagster instance at %s cannot be opened (%s): runs in flight are not known",
                                home, type(exc).__name__)
        return self._instance

    def latest_mark(self, operation: str, table: str) -> int | None:
        import dagster as dg

        from maint_assets.retention import RETENTION_ASSET_OF

        instance = self.instance()
        if instance is None:
            return None
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(RETENTION_ASSET_OF[operation]), asset_partitions=[table]),
            limit=1).records
        return records[0].storage_id if records else None

    def in_flight(self) -> dict:
        from maint_assets.retention import in_flight_jobs_by_table

        instance = self.instance()
        return in_flight_jobs_by_table(instance) if instance is not None else {}

    def tables(self) -> list[str]:
        return [t for t in self.reader.list_tables() if self.config.scope.admits(t)]


def _gates(health: TableHealth, decision: Decision, policy, gates: Gates, approved: bool) -> list[Gate]:
    """Every gate of one compaction decision, each with the numbers it compares (the same functions
    the decision used; the decision itself stays authoritative for the verdict)."""
    out = []
    refused = refusal_for(policy, "compact", gates.identity) or (
        decision.reason if decision.reason == health.sort_order_problem else None)
    out.append(Gate("policy", "blocks" if refused else "pass", refused or (
        f"enabled, compaction allowed for {gates.identity}")))
    scope_problem = health.time_column_problem or (None if decision.kind.value != "unsupported" else decision.reason)
    unused = (f"; the policy's time_column {policy.time_column!r} is not used: the table is dated by its partition"
              if policy.time_column and health.time_column not in (None, policy.time_column)
              and health.time_transform != "bounds" else "")
    out.append(Gate("scope", "blocks" if scope_problem else "pass",
                    scope_problem or f"maintained {health.maintained_as}{unused}"))
    part = health.partition(decision.date) if decision.date else None
    if decision.date and part is not None:
        due = partition_due(part, policy, position_deletes=position_deletes_maintained(health))
        out.append(Gate("thresholds", "pass" if due.due else "blocks", due.why if due.due else due.why_not))
        day_end = dt.datetime.combine(dt.date.fromisoformat(decision.date) + dt.timedelta(days=1), dt.time(),
                                      dt.timezone.utc)
        age = (gates.now - day_end).total_seconds()
        when = f"date ended {human_duration(age)} ago" if age >= 0 else f"date ends in {human_duration(-age)}"
        out.append(Gate("hot partition", "pass" if age >= policy.hot_partition_age_seconds else "blocks",
                        f"{when} (hot_partition_age {human_duration(policy.hot_partition_age_seconds)})"))
    elif not decision.date and decision.rationale.get("partitions") is not None:
        chosen = decision.rationale.get("partitions", [])
        out.append(Gate("thresholds", "pass", f"{len(chosen)} due partitions chosen by benefit: "
                                             f"{', '.join(chosen[:5]) or '-'}"))
    wc = decision.writer_check if "idle" in decision.writer_check else writer_check(health, policy, decision.date)
    since = wc["seconds_since_writer_commit"]
    where = f" on {wc['partition']}" if wc.get("scope") == "partition" and wc.get("partition") else ""
    written = wc.get("partitions_written") or decision.rationale.get("partitions_written") or []
    blocks = not wc["idle"] or decision.kind == ReasonKind.WRITER_ACTIVE
    out.append(Gate("writer idle", "blocks" if blocks else "pass",
                    (f"last writer commit{where} {human_duration(max(since, 0.0))} ago" if since is not None
                     else f"no writer commit{where or ' on main'} in view")
                    + (f"; being written, left out: {', '.join(written[:5])}" if written else "")
                    + f" (writer_idle {human_duration(policy.writer_idle_seconds)}, writer_scope {wc.get('scope')})"))
    if decision.date in gates.reverted:
        out.append(Gate("revert", "pass" if approved else "blocks",
                        gates.reverted[decision.date] + ("; approved since" if approved else "")))
    if decision.date in gates.held:
        out.append(Gate("past runs", "blocks", f"{gates.held[decision.date].note} (automation's runs; a person's "
                                                "own run is not held)"))
    if gates.runs_in_flight:
        out.append(Gate("runs in flight", "blocks", f"queued or running: {', '.join(sorted(gates.runs_in_flight))}"))
    out.append(Gate("claim", "blocks" if gates.claim_holder else "pass",
                    f"held by {gates.claim_holder}" if gates.claim_holder else "free"))
    cost = decision.cost_estimate or {}
    if cost:
        over = cost["rewrite_bytes"] > policy.max_rewrite_bytes
        out.append(Gate("cost", "blocks" if over and not approved else "pass",
                        f"rewrite {human_size(cost['rewrite_bytes'])} of {cost['files']} files, about "
                        f"{human_duration(cost['seconds'])} at {human_size(cost['bytes_per_second'])}/s "
                        f"({cost['throughput_source']} throughput); max_rewrite_bytes "
                        f"{human_size(policy.max_rewrite_bytes)}{'; approved' if approved else ''}"))
    return out


def explain(config: MaintenanceConfig, table: str, date: str | None = None, estate: ReadOnlyEstate | None = None,
            audit_limit: int = 10) -> Explanation:
    from icemaint.domain.retention_tick import decide_retention
    from icemaint.observe.manifests import read_retention_signals

    estate = estate or ReadOnlyEstate(config)
    key = TableName.parse(table).key
    tbl = estate.reader.load(key)
    health = estate.reader.health(key, loaded=tbl)
    policy = config.policy(key)
    now = dt.datetime.now(dt.timezone.utc)
    holder = estate.holder(key)
    running = frozenset(estate.in_flight().get(key, set()))
    gates = Gates(now=now, identity=config.identity(), claim_holder=holder,
                  bytes_per_second=measured_throughput(estate.past_runs(key)), runs_in_flight=running,
                  reverted=estate.reverted(key), held=estate.held(key))
    overridden = key in config.policies.tables
    out = Explanation(key, health.maintained_as, "per-table policy (tables: in the config)" if overridden
                      else "the defaults (no per-table policy)")
    dates = [date] if date else None
    for d in decide_table_compactions(health, policy, gates, dates):
        approved = estate.approved(key, d.date) if d.needs_approval else False
        if approved:
            d = decide_table_compactions(health, policy, replace(gates, approved=True), [d.date] if d.date else None)[0]
        out.compaction.append({"scope": d.scope, "verdict": str(d.verdict), "kind": str(d.kind), "reason": d.reason,
                               "hint": hint(d),
                               "gates": [asdict(g) for g in _gates(health, d, policy, gates, approved)],
                               "cost_estimate": d.cost_estimate, "benefit": d.benefit})
    signals = read_retention_signals(tbl, key, policy)
    for r in decide_retention(signals, policy, config.identity(), now, claim_holder=holder, in_flight_jobs=set(running),
                              expiry_mark=estate.latest_mark("expire", key),
                              orphans_mark=estate.latest_mark("orphans", key),
                              orphan_removal=config.automation.orphan_removal):
        out.retention.append({"operation": str(r.operation), "verdict": str(r.verdict), "reason": r.reason,
                              "hint": hint(r)})
    records = [r for r in estate.records(key) if date is None or r.date in (date, None)]
    out.audit = [{"ts": r.ts.isoformat(), "operation": r.operation, "decision": r.decision, "date": r.date,
                  "reason": r.reason, "before": r.before_snapshot_id, "after": r.after_snapshot_id}
                 for r in records[-audit_limit:]]
    return out


def compaction_plan(config: MaintenanceConfig, tables: list[str], estate: ReadOnlyEstate | None = None,
                    now: dt.datetime | None = None):
    """The compaction half of what the next tick would decide for `tables`, without a cursor (each evaluated):
    a `domain.tick` plan, whose `runs` are the runs the tick would request."""
    from icemaint.domain.tick import plan_compaction_tick

    estate = estate or ReadOnlyEstate(config)
    now = now or dt.datetime.now(dt.timezone.utc)
    tomorrow = (now.date() + dt.timedelta(days=1)).isoformat()
    return plan_compaction_tick(
        config, tables, metadata_location=estate.reader.metadata_location, health=estate.reader.tick_health,
        read=estate.reader.read_many,
        claim_holder=estate.holder, approved=estate.approved, past_runs=estate.past_runs, cursor={}, now=now,
        max_runs=MAX_RUNS_PER_TICK, valid_dates=lambda d: config.dates_start.isoformat() <= d <= tomorrow,
        run_of=lambda d: d.table, in_flight=estate.in_flight, reverted=estate.reverted, held=estate.held)


def plan(config: MaintenanceConfig, estate: ReadOnlyEstate | None = None) -> dict:
    """What the next tick would do across the estate, ranked, without a cursor (every table evaluated)."""
    from icemaint.domain.retention_tick import plan_retention_tick
    from icemaint.domain.tick import policy_fingerprint
    from icemaint.observe.manifests import read_retention_signals

    estate = estate or ReadOnlyEstate(config)
    now = dt.datetime.now(dt.timezone.utc)
    tables = estate.tables()
    compaction = compaction_plan(config, tables, estate, now)
    retention = plan_retention_tick(
        tables, policy_of=config.policy, policy_fingerprint=policy_fingerprint, identity=config.identity(),
        metadata_location=estate.reader.metadata_location,
        read_signals=lambda t, p: read_retention_signals(estate.reader.load(t), t, p),
        claim_holder=estate.holder, in_flight_jobs=estate.in_flight, latest_mark=estate.latest_mark,
        cursor={}, now=now, orphan_removal=config.automation.orphan_removal)
    runs = [{"rank": i + 1, "table": d.table, "scope": d.scope, "operation": "compact", "reason": d.reason,
             "benefit": round(d.benefit, 3), "rewrite_bytes": d.cost_estimate.get("rewrite_bytes"),
             "seconds": d.cost_estimate.get("seconds")} for i, d in enumerate(r for r, _ in compaction.runs)]
    runs += [{"rank": len(runs) + i + 1, "table": d.table, "scope": "(table)", "operation": str(d.operation),
              "reason": d.reason} for i, d in enumerate(retention.runs)]
    held = [{"table": d.table, "scope": d.scope, "operation": "compact", "verdict": str(d.verdict), "reason": d.reason,
             "hint": hint(d)} for d in compaction.decisions if d.verdict in (DEFER, REFUSE)]
    held += [{"table": d.table, "scope": "(table)", "operation": str(d.operation), "verdict": str(d.verdict),
              "reason": d.reason, "hint": hint(d)} for d in retention.decisions if d.verdict in (DEFER, REFUSE)]
    quiet = sorted({d.table for d in compaction.decisions} - {r["table"] for r in runs + held})
    return {"tables": len(tables), "runs": runs, "held": held, "nothing_to_do": quiet,
            "errors": {**compaction.errors, **retention.errors}}


def plan_lines(result: dict) -> list[str]:
    compact = sum(1 for r in result["runs"] if r["operation"] == "compact")
    lines = [f"{counted(result['tables'], 'table')}; due at the next tick: {counted(compact, 'compaction')} "
             f"and {counted(len(result['runs']) - compact, 'retention operation')} (neighbours share a Dagster run)"]
    for r in result["runs"]:
        cost = (f" ({human_size(r['rewrite_bytes'])}, about {human_duration(r['seconds'])}, benefit {r['benefit']})"
                if r.get("rewrite_bytes") is not None else "")
        lines.append(f"  {r['rank']:>3}. {r['table']} {r['scope']} {r['operation']}: {r['reason']}{cost}")
    for h in result["held"]:
        lines.append(f"  -    {h['table']} {h['scope']} {h['operation']}: {h['verdict']}: {h['reason']}")
        if h.get("hint"):
            lines.append(f"         hint: {h['hint']}")
    if result["nothing_to_do"]:
        lines.append(f"  nothing to do: {', '.join(result['nothing_to_do'])}")
    for table, error in result["errors"].items():
        lines.append(f"  ERROR {table}: {error}")
    return lines


def explanation_lines(e: Explanation) -> list[str]:
    lines = [f"{e.table}: maintained {e.maintained_as}; policy from {e.policy_source}"]
    for c in e.compaction:
        lines.append(f"  compact {c['scope']}: {c['verdict']}: {c['reason']}")
        if c.get("hint"):
            lines.append(f"      hint: {c['hint']}")
        for g in c["gates"]:
            lines.append(f"      {g['status']:<7}{g['name']:<14}{g['detail']}")
    for r in e.retention:
        lines.append(f"  {r['operation']}: {r['verdict']}: {r['reason']}")
        if r.get("hint"):
            lines.append(f"      hint: {r['hint']}")
    if e.audit:
        lines.append("  audit (latest first):")
        for a in reversed(e.audit):
            snaps = f" {a['before']}->{a['after']}" if a["after"] else ""
            lines.append(f"    {a['ts'][:19]} {a['operation']:<9} {a['date'] or '':<10} {a['decision']:<13}{snaps} "
                         f"{a['reason'][:160]}")
    return lines

