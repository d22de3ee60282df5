"""`icemaint maintain TABLE`: one pass over one table, what is due in the right order, under one claim.

Order: compaction (the dates asked for, or every due date; the due partitions of a table without a
time column), then manifests, then column statistics (of the compacted snapshot, when the policy keeps them or
they are asked for, and stale), then snapshot expiry, then orphan removal, one after the other (expiry
and orphan removal never overlap). When the manifests are due too, they go first: a date a streaming
writer built from one manifest per commit is planned, proven and published from a few manifests instead
of thousands (2.2x faster at 3,000 commits: benchmarks/RESULTS.md, "Streaming shape"). Position deletes are
applied by compaction's rewrite (files with deletes are rewritten whole); a separate position-delete rewrite
is not a step yet.

Each step is the same Dagster job the sensors launch, run in this process (one Spark session), so
each is audited and visible in the Dagster UI; the pass takes the table's claim once and every step
works under it (`icemaint.operations.contract.under_pass`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import asdict, dataclass, field

from icemaint.domain.decisions import Gates, decide_with_approvals
from icemaint.domain.verdicts import DEFER, REFUSE, RUN, ReasonKind
from icemaint.domain.hints import hint

# Outcomes after which the pass goes on; anything else stops it (a failed proof, a refusal, an error).
_GOOD = ("run", "noop", "defer", "dry_run")


@dataclass
class Step:
    operation: str
    scope: str                 # a date, "(table)", or "-" for table-wide housekeeping
    decision: str
    reason: str
    success: bool
    run_id: str | None = None
    details: dict = field(default_factory=dict)
    hint: str | None = None    # what would let a held-back date go (icemaint.domain.hints)

    @property
    def line(self) -> str:
        return f"{self.operation:<9} {self.scope:<12} {self.decision}: {self.reason}"


@dataclass
class PassReport:
    table: str
    holder: str
    steps: list[Step] = field(default_factory=list)
    stopped: str | None = None  # why the pass ended early

    @property
    def success(self) -> bool:
        return self.stopped is None and all(s.success for s in self.steps)

    def to_dict(self) -> dict:
        return {**asdict(self), "success": self.success}


class MaintenancePass:
    def __init__(self, runner):
        self.runner = runner
        self.config = runner.config

    def plan_dates(self, table: str) -> tuple[list[str | None], list]:
        """(the dates compaction would run on now, None for the partitions of a table without a time column; the
        decisions that hold a date back: a gate blocks it).

        An operator's approval counts as `icemaint compact` counts it. Below-threshold and empty dates are neither."""
        from icemaint.safety.approvals import is_approved, reverted_scopes
        from icemaint.safety.audit import open_audit

        health = self.runner.reader.health(table)
        if not health.dated:
            return [None], []
        records = open_audit(self.config).records(table=table)
        gates = Gates(now=dt.datetime.now(dt.timezone.utc), identity=self.config.identity(),
                      reverted=reverted_scopes(records))
        decisions = decide_with_approvals(health, self.config.policy(table), gates,
                                          lambda date: is_approved(records, date))
        return ([d.date for d in decisions if d.verdict == RUN and d.date],
                [d for d in decisions if d.verdict in (DEFER, REFUSE)])

    def manifests_due(self, table: str) -> bool:
        """Whether the manifest rewrite is due and allowed now (read from the manifest list, no Spark)."""
        from icemaint.domain.decisions import refusal_for
        from icemaint.domain.retention import manifests_due
        from icemaint.observe.manifests import read_retention_signals

        policy = self.config.policy(table)
        if refusal_for(policy, "manifests", self.config.identity()):
            return False
        signals = read_retention_signals(self.runner.reader.load(table), table, policy)
        return manifests_due(signals.manifests, signals.small_manifests, policy)[0]

    def run(self, table: str, *, dates: list[str] | None = None, expire: bool = False, orphans: bool = False,
            statistics: bool | None = None, dry_run: bool = False) -> PassReport:
        """Runs the pass. Raises ClaimBusy when the claim stays busy past the policy's claim_wait.

        `statistics`: compute column statistics when stale (None: when the table's policy keeps them)."""
        from icemaint.operations.contract import under_pass
        from icemaint.safety.claims import table_claim

        key = self.runner.check_table(table)
        holder = f"icemaint:maintain:{uuid.uuid4().hex[:12]}"
        report = PassReport(table=key, holder=holder)
        wait = self.config.policy(key).claim_wait_seconds
        with table_claim(self.config, key, holder, wait_seconds=wait, poll_seconds=1.0) as claim, under_pass(claim):
            wanted, held = (dates, []) if dates else self.plan_dates(key)
            manifests = ("manifests", lambda: self.runner.manifests(key, dry_run=dry_run, trigger="maintain"))
            first = bool(wanted) and self.manifests_due(key)
            if first and not self._step(report, manifests[0], "-", manifests[1]()):
                return report
            if not wanted and not held:
                report.steps.append(Step("compact", "-", "noop", "no date is due for compaction", True))
            for date in wanted:
                if not self._step(report, "compact", date or "(table)",
                                  self.runner.compact(key, date, dry_run=dry_run, trigger="maintain")):
                    return report
            for d in held:  # due work a gate holds back is not done: the pass says so and does not succeed
                # (the date still being written is not due yet: listed, not a failure)
                report.steps.append(Step("compact", d.date or "(table)", str(d.verdict), d.reason,
                                         d.kind == ReasonKind.HOT_PARTITION, hint=hint(d)))
            # After compaction the manifests run (again) when due: each published date added some.
            steps = [manifests] if not first or (wanted and not dry_run and self.manifests_due(key)) else []
            if statistics or (statistics is None and self.config.policy(key).statistics):
                steps.append(("statistics", lambda: self.runner.statistics(key, dry_run=dry_run, trigger="maintain")))
            if expire:
                steps.append(("expire", lambda: self.runner.expire(key, dry_run=dry_run, trigger="maintain")))
            if orphans:
                steps.append(("orphans", lambda: self.runner.orphans(key, dry_run=dry_run, trigger="maintain")))
            for operation, launch in steps:
                if not self._step(report, operation, "-", launch()):
                    return report
        return report

    @staticmethod
    def _step(report: PassReport, operation: str, scope: str, run) -> bool:
        outcome = run.outcome or {}
        decision = str(outcome.get("decision") or ("run" if run.success else "failed"))
        if outcome.get("dry_run") and decision == "run":
            decision = "dry_run"
        reason = outcome.get("reason") or (run.failure_line if not run.success else "")
        if outcome.get("validation", {}).get("passed") is False:
            decision = "not_published"
        ok = run.success and decision in _GOOD
        details = {k: outcome[k] for k in ("files_before", "files_after", "partitions", "published",
                                           "before_snapshot_id", "after_snapshot_id", "metrics") if k in outcome}
        report.steps.append(Step(operation, scope, decision, reason, ok, run.run_id, details))
        if not ok:
            report.stopped = f"{operation} {scope} ended {decision}: the pass stopped before the later steps"
        return ok
