"""`icemaint tick`: evaluate the sensors' logic once and execute the runs they request, in process.

This is how cron/headless users and the end-to-end tests drive the system without the daemon. The
tick keeps its own cursor under the state dir (the daemon's sensors keep theirs in the instance).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from icemaint.app.instance import allow_runs_in_threads
from icemaint.config import MaintenanceConfig
from icemaint.domain.verdicts import DEFER, FAILED, NOOP, NOT_PUBLISHED, REFUSE, RUN
from icemaint.domain.hints import hint
from icemaint.domain.units import counted
from icemaint.domain.tick import KeptHealths, date_batches, encode_cursor, table_batches, table_lanes
from icemaint.safety import interrupts
from icemaint.errors import one_line


def date_done(outcome: dict) -> bool:
    """Whether one date of a batched run was done, by its own outcome alone: it has one, it was neither
    refused nor failed, and its proof, if it ran one, passed (as a run of that date alone would end)."""
    return bool(outcome) and outcome.get("decision") not in (REFUSE, NOT_PUBLISHED, FAILED) \
        and (outcome.get("validation") or {}).get("passed") is not False


class Ticker:
    def __init__(self, config: MaintenanceConfig, config_path: str | None = None):
        from icemaint.app.runner import MaintenanceRunner
        from resources.catalog import IcebergCatalogResource
        from resources.claims import AuditResource, TableClaimResource
        from resources.settings import MaintenanceSettings

        self.config = config
        self.runner = MaintenanceRunner(config, config_path, reap=False)  # each tick reaps, honouring its dry run
        settings = MaintenanceSettings(config_path=str(config_path or config.source or ""))
        self.catalog = IcebergCatalogResource(settings=settings)
        self.claims = TableClaimResource(settings=settings)
        self.audit = AuditResource(settings=settings)
        self.cursor_path = Path(config.state_dir, "tick_cursor.json")
        self.kept = KeptHealths()  # the budget deferrals' healths, for this process's next tick (`--until-idle`)

    def _cursors(self) -> dict:
        """The saved cursors; a damaged file (a tick killed mid-write before writes were atomic) is
        treated as none: the next tick evaluates every table once, which is always safe."""
        try:
            data = json.loads(self.cursor_path.read_text())
        except FileNotFoundError:
            return {}
        except (ValueError, UnicodeDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def _cursor(self, name: str) -> str | None:
        return self._cursors().get(name)

    def _save_cursor(self, name: str, value: str) -> None:
        data = self._cursors()
        data[name] = value
        self.cursor_path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.cursor_path.with_suffix(".json.partial")
        partial.write_text(json.dumps(data))
        os.replace(partial, self.cursor_path)  # atomic: a kill leaves the old cursor or the new one

    @staticmethod
    def _launch(run, *args, **kwargs):
        """One requested run; a table that cannot even be launched (gone, its catalog down) fails alone,
        reported in its entry, and never ends the tick for every other table."""
        from icemaint.app.runner import RunReport

        try:
            return run(*args, **kwargs)
        except Exception as exc:
            return RunReport(run_id="-", success=False, error=f"{type(exc).__name__}: {one_line(exc)}")

    def tick(self, dry_run: bool = False) -> dict:
        """One tick: discovery, compaction and retention decisions, requested runs. Returns a JSON-able report."""
        from maint_assets.partitions import date_partitions, table_partitions
        from sensors.compaction import evaluate_compaction
        from sensors.discovery import discover_tables

        from sensors.reaper import reap_dead_runs

        interrupts.before_run()  # `--until-idle`: no tick after an operator's Ctrl-C
        instance = self.runner.instance
        # First: a run left STARTED by a dead process would hold its table's slot in the run queue.
        reaped = [d for d in reap_dead_runs(instance, dry_run=dry_run) if d.reap]
        now = dt.datetime.now(dt.timezone.utc)
        lines, failed = [d.line().replace(" marked failed:", " would be marked failed:") if dry_run else d.line()
                         for d in reaped], False
        notes: list[str] = []
        added, removed = discover_tables(instance, self.catalog, notes)
        lines += [f"discovery: {note}" for note in notes]
        if added and not dry_run:
            instance.add_dynamic_partitions(table_partitions.name, added)
        for table in removed if not dry_run else []:
            instance.delete_dynamic_partition(table_partitions.name, table)
        if added or removed:
            lines.append(f"discovery: added {added or '[]'}, removed {removed or '[]'}")
        date_keys = set(date_partitions(self.config.dates_start).get_partition_keys(current_time=now))
        # A dry run writes nothing (no partition, audit record or cursor) and decides what a real tick would.
        tables = sorted((set(instance.get_dynamic_partitions(table_partitions.name)) | set(added)) - set(removed)) \
            if dry_run else None
        plan = evaluate_compaction(instance, self.catalog, self.claims, self.audit, self._cursor("compaction"),
                                   now, date_keys, batch_dates=True, kept=self.kept, tables=tables,
                                   record=not dry_run)
        decisions, quiet = [], {}
        launched = {} if dry_run else self._compact_in_batches([(d.table, d.date) for d in plan.decisions
                                                                if d.verdict == RUN])
        for d in plan.decisions:
            entry = {"table": d.table, "date": d.date, "operation": d.operation, "decision": d.verdict,
                     "reason": d.reason, "kind": str(d.kind), "hint": hint(d)}
            if d.verdict == RUN and not dry_run:
                report, outcome, success = launched[(d.table, d.date)]
                entry.update({"run_id": report.run_id, "success": success,
                              "result": outcome.get("decision", "failed"),
                              "result_reason": outcome.get("reason") or report.failure_line,
                              "before_snapshot_id": outcome.get("before_snapshot_id"),
                              "after_snapshot_id": outcome.get("after_snapshot_id"),
                              "files_before": outcome.get("files_before"), "files_after": outcome.get("files_after"),
                              "partitions": outcome.get("partitions"),
                              "validation": outcome.get("validation", {}).get("passed"),
                              "published": outcome.get("published")})
                failed |= not success
            decisions.append(entry)
            if d.verdict == NOOP:
                quiet.setdefault(d.table, []).append(d)
                continue
            line = f"{d.table} {d.scope}: {d.verdict}: {d.reason}"
            if "result" in entry:
                line += f" -> {entry['result']}" + (
                    f": files {entry['files_before']} -> {entry['files_after']}, validation "
                    f"{'passed' if entry['validation'] else 'FAILED' if entry['validation'] is False else 'n/a'}"
                    if entry["files_after"] is not None else f": {entry['result_reason']}")
            lines.append(line)
            if entry["hint"]:
                lines.append(f"    hint: {entry['hint']}")
        # Never silent: a table whose every decision is "nothing to do" still gets its line.
        loud = {d.table for d in plan.decisions if d.verdict != NOOP}
        for table, noops in sorted(quiet.items()):
            if table not in loud:
                more = f" ({len(noops)} dates)" if len(noops) > 1 else ""
                lines.append(f"{table} {noops[0].scope}: noop: {noops[0].reason}{more}")
        if not dry_run:
            from sensors.compaction import decision_observation

            self._save_cursor("compaction", encode_cursor(plan.cursor))
            # as the sensor does: each recorded deferral or refusal also lands on its partition
            for d in plan.to_record:
                if d.verdict in (DEFER, REFUSE) and (d.date is None or d.date in date_keys):
                    instance.report_runless_asset_event(decision_observation(d))
        for table in plan.unchanged:
            lines.append(f"{table}: unchanged since the last tick, {plan.cursor[table].said or 'no decision yet'}")
        lines.append(f"tick: {counted(len(plan.evaluated), 'table')} evaluated, {len(plan.unchanged)} unchanged, "
                     + _ran(decisions, dry_run) + (f", errors: {plan.errors}" if plan.errors else ""))
        retention, retention_lines, retention_failed, retention_errors = self._tick_retention(dry_run, tables)
        decisions += retention
        lines += retention_lines
        errors = {**plan.errors, **retention_errors}
        landing, landing_lines, landing_failed = self._tick_landing(dry_run, now)
        lines += landing_lines
        return {"decisions": decisions, "discovered": added, "removed": removed, "errors": errors,
                "reaped": [d.run_id for d in reaped], "landing": landing,
                "lines": lines, "failed": failed or retention_failed or landing_failed or bool(errors)}

    def _tick_landing(self, dry_run: bool, now: dt.datetime) -> tuple[list, list, bool]:
        """The landing sensor's decision for each landing source, and an ingest run of each due one (not in a dry
        run); (entries, lines, whether a run failed)."""
        if not self.config.landing:
            return [], [], False
        from sensors.landing import evaluate_landing

        plan = evaluate_landing(self.config, self._cursor("landing"), now)
        entries, lines, failed = [], [f"landing {note}" for note in plan.notes], False
        for name, source, verdict in plan.due:
            entry = {"source": name, "table": source.table, "operation": "ingest", "due": verdict.reason}
            if not dry_run:
                report = self._launch(self.runner.ingest, name, trigger="tick")
                entry.update({"run_id": report.run_id, "success": report.success,
                              "result": report.outcome.get("decision", "failed"),
                              "result_reason": report.outcome.get("reason") or report.failure_line})
                failed |= not report.success
            entries.append(entry)
            lines.append(f"landing {name}: due ({verdict.reason})"
                         + (f" -> {entry['result']}: {entry['result_reason']}" if "result" in entry else ""))
        if not dry_run:
            self._save_cursor("landing", plan.cursor)
        return entries, lines, failed

    def _compact_in_batches(self, runs: list[tuple[str, str | None]]) -> dict:
        """Executes the tick's compaction runs, consecutive dates of a table as one run over their partition
        range (`date_batches`), and the same dates of neighbouring tables as one run over theirs (`table_batches`:
        a catch-up of many tables pays Dagster's per-run work once per batch); (table, date) -> (its run's
        report, its outcome, whether it was done).

        Runs of different tables execute at once, up to `max_runs_total` (the instance's run queue bound),
        on this process's one Spark session: each table's runs go to one worker in order, so a table never
        has two runs at once and its claim is never contended by this tick.

        A date of a batch counts as done only by its own outcome: it has one, it was neither refused nor
        failed, and its proof, if it ran one, passed (as a run of that date alone would have ended); another
        date's failure, which fails the batch's run, does not make it undone."""
        from maint_assets.compaction import BACKFILL_DATES_PER_RUN, PARTITIONS_PER_RUN
        from maint_assets.partitions import TABLE_DIMENSION, table_slot

        workers = self.config.max_runs_total if self.config.catalog.concurrent_commits else 1
        order = self.runner.instance.get_dynamic_partitions(TABLE_DIMENSION) if runs else []
        lanes = table_lanes(table_batches(date_batches(runs, BACKFILL_DATES_PER_RUN), order, PARTITIONS_PER_RUN,
                                          spread=workers, slot=table_slot))
        workers = min(workers, len(lanes))
        if workers <= 1 or not allow_runs_in_threads(self.runner.instance):
            return {key: done for lane in lanes for key, done in self._run_lane(lane).items()}
        from concurrent.futures import ThreadPoolExecutor

        out = {}
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="icemaint-tick-run") as pool:
            for done in pool.map(self._run_lane, lanes):
                out.update(done)
        return out

    def _run_lane(self, batches: list[list[tuple[str, str | None]]]) -> dict:
        """One table's batches (or one batch of several tables), one run after the other."""
        out = {}
        for batch in batches:
            table, dates = batch[0][0], [date for _, date in batch]
            if len(batch) == 1:
                report = self._launch(self.runner.compact, table, dates[0], trigger="tick")
                out[batch[0]] = (report, report.outcome, report.success)
                continue
            tables = list(dict.fromkeys(t for t, _ in batch))
            if len(tables) > 1:  # the same dates of neighbouring tables (`table_batches`)
                report = self._launch(self.runner.compact_tables, tables,
                                      [d for t, d in batch if t == table], trigger="tick")
            else:
                report = self._launch(self.runner.compact_dates, table, dates, trigger="tick")
            for table, date in batch:
                outcome = report.outcomes.get(f"{date}|{table}", {})
                out[(table, date)] = (report, outcome, date_done(outcome))
        return out

    def _retention_in_batches(self, runs: list) -> dict:
        """Executes the tick's retention runs, neighbouring tables due for the same operation as one run (as the
        retention sensor requests them); (table, operation) -> (its run's report, its outcome, whether it was
        done). A table of a batch counts as done only by its own outcome (ran or had nothing to do)."""
        from maint_assets.partitions import TABLE_DIMENSION
        from sensors.retention import retention_batches

        order = self.runner.instance.get_dynamic_partitions(TABLE_DIMENSION) if len(runs) > 1 else []
        out = {}
        for batch in retention_batches(runs, order):
            operation, tables = batch[0][1], [table for table, _ in batch]
            report = self._launch(self.runner.retention_tables, operation, tables, trigger="tick")
            for table in tables:
                outcome = report.outcome if len(tables) == 1 else report.outcomes.get(table, {})
                ok = report.success if len(tables) == 1 else outcome.get("decision") in (RUN, NOOP)
                out[(table, operation)] = (report, outcome, ok)
        return out

    def _tick_retention(self, dry_run: bool, tables: list[str] | None = None
                        ) -> tuple[list[dict], list[str], bool, dict]:
        """Retention after compaction (which may just have superseded files): expiry, orphans, manifests."""
        from icemaint.domain.retention_tick import encode_cursor
        from sensors.retention import evaluate_retention

        plan = evaluate_retention(self.runner.instance, self.catalog, self.claims, self.audit,
                                  self._cursor("retention"), dt.datetime.now(dt.timezone.utc), tables=tables,
                                  record=not dry_run)
        done = {} if dry_run else self._retention_in_batches(plan.runs)
        entries, lines, failed = [], [], False
        for d in plan.decisions:
            entry = {"table": d.table, "date": None, "operation": d.operation, "decision": d.verdict,
                     "reason": d.reason, "kind": str(d.kind), "hint": hint(d)}
            line = f"{d.table} {d.operation}: {d.verdict}: {d.reason}"
            if (d.table, str(d.operation)) in done:
                report, outcome, success = done[(d.table, str(d.operation))]
                entry.update({"run_id": report.run_id, "success": success,
                              "result": outcome.get("decision", "failed"),
                              "result_reason": outcome.get("reason") or report.failure_line,
                              "metrics": outcome.get("metrics", {})})
                line += f" -> {entry['result']}: {entry['result_reason']}"
                failed |= not success
            entries.append(entry)
            if d.verdict != "noop":
                lines.append(line)
            if entry["hint"]:
                lines.append(f"    hint: {entry['hint']}")
        if not dry_run:
            self._save_cursor("retention", encode_cursor(plan.cursor))
        lines.append(f"retention: {counted(len(plan.evaluated), 'table')} evaluated, {len(plan.unchanged)} unchanged, "
                     + _ran(entries, dry_run, "operation") + (f", errors: {plan.errors}" if plan.errors else ""))
        return entries, lines, failed, plan.errors


def _ran(entries: list[dict], dry_run: bool, unit: str = "table-date") -> str:
    """How many decisions ran and in how many Dagster runs (a run covers several dates or tables)."""
    due = [e for e in entries if e["decision"] == RUN]
    if dry_run:
        return f"{counted(len(due), unit)} due (dry run: nothing launched)"
    runs = {e["run_id"] for e in due if e.get("run_id")}
    return f"{counted(len(due), unit)} in {counted(len(runs), 'Dagster run')}"
