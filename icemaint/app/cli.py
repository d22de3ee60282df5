"""`icemaint`: the operators' command line, a thin front over the Dagster definitions.

Every mutating command runs the code location's jobs in process against the instance under the
state dir, so its materializations, checks and observations appear in the Dagster UI.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Sequence

from icemaint.app import cli_retention
from icemaint.app import metrics_server
from icemaint.app import serve
from icemaint.app.cli_types import port, positive_int, whole_number
from icemaint.app.cli_help import DRY_RUN_HELP, JSON_HELP, MAIN_DESCRIPTION, MAIN_EPILOG, add_command
from icemaint.config import MaintenanceConfig, load_config
from icemaint.config.parse import ConfigError
from icemaint.domain.drift import drift_line
from icemaint.domain.hints import decision_hint
from icemaint.domain.layout import describe
from icemaint.domain.names import TableName
from icemaint.domain.scope import parse_date
from icemaint.domain.units import human_duration, human_size, printable, shown
from icemaint.errors import UsageError, is_operational, is_user_error, one_line

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_MAX_TICKS = 50  # `tick --until-idle`: a catch-up still publishing after this many ticks stops, failing


def _print_json(value) -> None:
    print(json.dumps(value, indent=2, default=str))


def _dates(args, runner) -> list[str]:
    dates = [runner.check_date(d) for d in args.date or []]
    if args.date_from or args.date_to:
        if not (args.date_from and args.date_to):
            raise UsageError("--from and --to go together")
        start = dt.date.fromisoformat(runner.check_date(args.date_from))
        end = dt.date.fromisoformat(runner.check_date(args.date_to))
        if end < start:
            raise UsageError(f"--to {end} is before --from {start}")
        return _range_with_data(runner.reader.health(runner.check_table(args.table)), dates, start, end)
    if not dates:
        health = runner.reader.health(runner.check_table(args.table))
        if not health.dated:
            return [None]  # a table without a time column: its due partitions, in one run
        raise UsageError(f"{health.table} is maintained per date ({health.time_column} by {health.time_transform}): "
                         "give at least one --date YYYY-MM-DD (or --from/--to)")
    return list(dict.fromkeys(dates))  # a date named twice runs once


def _range_with_data(health, named: list[str], start: dt.date, end: dt.date) -> list[str]:
    """The dates to run for a range: the named ones, then each period of [start, end] that holds data files of
    the table (read from its metadata: a range of years runs the dates with data, not a Dagster run per day),
    one date per period (a month or year partition runs once; a period that began before `start` runs as
    `start`, which maps to it). Says on standard error how many periods of the range hold none."""
    from icemaint.domain.scope import period_start, span_of

    if not health.dated:
        raise UsageError(f"{health.table} has no dates ({health.maintained_as}): compact it without --from/--to")
    span = span_of(health.time_transform)
    first, last = period_start(start, span).isoformat(), end.isoformat()
    periods = {period_start(start + dt.timedelta(days=i), span) for i in range((end - start).days + 1)}
    keys = sorted(p.key for p in health.partitions if p.data_files and first <= p.key <= last)
    if len(keys) < len(periods):
        unit = {"day": "dates", "month": "months", "year": "years"}[span]
        print(f"{len(periods) - len(keys)} of the {len(periods)} {unit} from {start} to {end} hold no data files of "
              f"{health.table}: no run for them", file=sys.stderr)
    by_period: dict[dt.date, str] = {}
    for date in [*named, *(max(k, start.isoformat()) for k in keys)]:
        by_period.setdefault(period_start(dt.date.fromisoformat(date), span), date)  # each period runs once
    return list(by_period.values())


def cmd_health(config: MaintenanceConfig, args) -> int:
    from icemaint.app.runner import MaintenanceRunner

    runner = MaintenanceRunner(config, args.config)
    report = runner.health(args.table)
    if not report.success:
        print(f"error: health of {args.table} failed: {report.failure_line}", file=sys.stderr)
        return EXIT_FAILED
    health = report.outcome
    if args.json:
        _print_json(health)
        return EXIT_OK
    print(f"{health['table']}  snapshot {health['snapshot_id']}  maintained {health['maintained_as']}")
    print(f"  data files {health['data_files']} ({health['small_files']} small), {human_size(health['total_bytes'])}, "
          f"avg {human_size(health['avg_file_bytes'])}, median {human_size(health['median_file_bytes'])}")
    print(f"  delete files {health['delete_files']} ({health['delete_records']} deleted rows, "
          f"ratio {health['deleted_row_ratio']:.3f}); manifests {health['manifests']}; snapshots {health['snapshots']}; "
          f"metadata files {health['metadata_files']}"
          + (f" ({human_size(health['metadata_bytes'])})" if health.get("metadata_bytes") is not None else ""))
    limit = health.get("max_file_size_bytes")
    specs = {str(k): v for k, v in (health.get("specs") or {}).items()}  # JSON keys are text
    spec = specs.get(str(health["spec_id"]))
    print(f"  layout drift {drift_line(health)}; table spec {health['spec_id']}{f' ({spec})' if spec else ''}, "
          f"sort order {health.get('sort_order_id', 0)}, oversized above {human_size(limit) if limit else '-'}")
    print(f"  last commit {health['last_commit_at']} ({health['last_commit_operation']}, by {health['last_commit_by']})")
    print(f"  compaction now: {health.get('compaction_now', '-')}")
    width = max([12] + [len(describe(p["key"])) + 2 for p in health["partitions"]])
    print(f"  {'date' if health['scope'] == 'date' else 'partition':<{width}}{'files':>7}{'small':>7}{'size':>11}"
          f"{'deletes':>9}{'drifted':>11}  last writer commit")
    for p in health["partitions"]:
        since = p.get("seconds_since_writer_commit")
        print(f"  {describe(p['key']):<{width}}{p['data_files']:>7}{p['small_files']:>7}"
              f"{human_size(p['total_bytes']):>11}{p['delete_files']:>9}"
              f"{human_size(p['drift_bytes']) if p.get('drift_files') else '-':>11}  "
              f"{'-' if since is None else human_duration(max(since, 0.0)) + ' ago'}")
    return EXIT_OK


def _outcome_line(o: dict) -> str:
    line = f"{o.get('table')} {o.get('date') or '(table)'}: {o.get('decision')}: {o.get('reason')}"
    if o.get("decision") in ("run", "not_published") and not o.get("dry_run"):
        files = (f"delete files {o.get('delete_files_before')} -> {o.get('delete_files_after')}"
                 if (o.get("decision_detail") or {}).get("kind") == "position_deletes_due"
                 else f"files {o.get('files_before')} -> {o.get('files_after')}")
        line += (f"\n    {files}, snapshot {o.get('before_snapshot_id')} -> "
                 f"{o.get('after_snapshot_id')}, validation {'passed' if o.get('validation', {}).get('passed') else 'FAILED'}"
                 f"{'' if o.get('published') else ', NOT PUBLISHED (main unchanged)'}")
    return line


def cmd_compact(config: MaintenanceConfig, args) -> int:
    if not args.dry_run:
        from icemaint.engine.spark_session import start_in_background

        start_in_background(config)  # the JVM starts while Dagster loads and the run decides
    from icemaint.app.runner import MaintenanceRunner

    runner = MaintenanceRunner(config, args.config, reap=not args.dry_run)
    table = runner.check_table(args.table)
    results, status = [], EXIT_OK
    for date in _dates(args, runner):
        report = runner.compact(table, date, dry_run=args.dry_run, approved=args.approved)
        outcome = dict(report.outcome) or {"table": table, "date": date, "decision": "failed",
                                           "reason": report.failure_line}
        outcome.setdefault("validation", {"passed": None})
        outcome["run_id"] = report.run_id
        detail = outcome.get("decision_detail") or {}
        outcome["hint"] = decision_hint(str(outcome.get("decision")), detail.get("kind", ""), table,
                                        outcome.get("date"), detail.get("writer_check"))
        if report.error and not report.outcome.get("reason"):
            outcome["reason"] = report.failure_line
        failed = not report.success or outcome.get("decision") == "refuse" or outcome["validation"].get("passed") is False
        status = EXIT_FAILED if failed else status
        results.append(outcome)
        if not args.json:
            print(_outcome_line(outcome), file=sys.stderr if failed else sys.stdout)
            if outcome["hint"]:
                print(f"    hint: {outcome['hint']}", file=sys.stderr if failed else sys.stdout)
    if args.json:
        _print_json(results)
    return status


def cmd_ingest(config: MaintenanceConfig, args) -> int:
    if not args.dry_run:
        from icemaint.engine.spark_session import start_in_background

        start_in_background(config)
    from icemaint.app.runner import MaintenanceRunner

    report = MaintenanceRunner(config, args.config, reap=not args.dry_run).ingest(
        args.source, force=args.force, dry_run=args.dry_run)
    outcome = dict(report.outcome) or {"source": args.source, "decision": "failed", "reason": report.failure_line}
    outcome["run_id"] = report.run_id
    failed = not report.success or outcome.get("decision") in ("refuse", "not_published", "failed")
    if args.json:
        _print_json(outcome)
    else:
        line = f"{outcome.get('source')}: {outcome.get('decision')}: {printable(str(outcome.get('reason')))}"
        print(line, file=sys.stderr if failed else sys.stdout)
        for rejected in outcome.get("rejected") or []:
            print(f"    set aside: {printable(rejected['name'])}: {printable(rejected['reason'])}",
                  file=sys.stderr if failed else sys.stdout)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_maintain(config: MaintenanceConfig, args) -> int:
    from icemaint.app.maintain import MaintenancePass
    from icemaint.app.runner import MaintenanceRunner
    from icemaint.safety.claims import ClaimBusy

    if args.date and args.all_due:
        raise UsageError("--date and --all-due exclude each other: give dates, or let the pass find the due ones")
    if not args.dry_run:
        from icemaint.engine.spark_session import start_in_background

        start_in_background(config)  # the JVM starts while Dagster loads and the pass decides
    runner = MaintenanceRunner(config, args.config, reap=not args.dry_run)
    dates = [runner.check_date(d) for d in args.date or []]
    try:
        report = MaintenancePass(runner).run(args.table, dates=dates, expire=args.expire_snapshots,
                                             orphans=args.orphans, statistics=args.statistics or None,
                                             dry_run=args.dry_run)
    except ClaimBusy as exc:
        print(f"error: {args.table}: nothing done: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        _print_json(report.to_dict())
    else:
        print(f"{report.table}: one pass under claim {report.holder}")
        for step in report.steps:
            print(f"  {step.line}")
            if step.hint:
                print(f"      hint: {step.hint}")
        if report.stopped:
            print(f"  stopped: {report.stopped}")
    return EXIT_OK if report.success else EXIT_FAILED


def _save_trace(config: MaintenanceConfig | None) -> str:
    """Appends the current exception's stack trace to <state_dir>/logs/cli.log (without a config: the temporary
    directory's icemaint-cli.log); returns the path."""
    import tempfile
    import traceback
    from pathlib import Path

    path = Path(config.state_dir, "logs", "cli.log") if config else Path(tempfile.gettempdir(), "icemaint-cli.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(traceback.format_exc() + "\n")
    return str(path)


def cmd_revert(config: MaintenanceConfig, args) -> int:
    """Run directly (like purge-quarantine), not as a Dagster job: a rare operator action, audited."""
    from icemaint.engine.spark_session import get_spark
    from icemaint.observe.catalog import CatalogReader
    from icemaint.operations.revert import RevertRequest, RevertRunner
    from icemaint.safety.audit import open_audit
    from icemaint.safety.claims import open_claims

    if not -2**63 <= args.snapshot < 2**63:
        raise UsageError(f"--snapshot {args.snapshot} is not a snapshot id: Iceberg's are 64-bit signed integers")
    reader = CatalogReader(config)
    table = TableName.parse(args.table).key
    reader.metadata_location(table)  # TableNotFound before Spark starts
    runner = RevertRunner(config, get_spark(config), reader, open_claims(config), open_audit(config))
    try:
        outcome = runner.run(RevertRequest(table, args.snapshot, dry_run=args.dry_run))
    except Exception as exc:  # recorded as failed by the contract; the trace goes to a file, not the terminal
        print(f"error: {table} revert {args.snapshot}: failed: {type(exc).__name__}: {one_line(exc, 400)} "
              f"(trace in {_save_trace(config)})", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        _print_json(outcome.to_dict())
    else:
        done = outcome.decision == "run"
        print(f"{outcome.table} revert {outcome.snapshot_id}: {outcome.decision}: {outcome.reason}",
              file=sys.stdout if done else sys.stderr)
    return EXIT_OK if outcome.decision == "run" else EXIT_FAILED




MAX_NOTE_CHARS = 1000


def _note(text: str) -> str:
    """An approval's note: stored in the audit log, so bounded."""
    if len(text) > MAX_NOTE_CHARS:
        raise argparse.ArgumentTypeError(f"a note is at most {MAX_NOTE_CHARS} characters (this one has {len(text)})")
    return text


def cmd_approve(config: MaintenanceConfig, args) -> int:
    from icemaint.safety.approvals import approve
    from icemaint.safety.audit import open_audit

    from icemaint.domain.scope import period_start, span_of
    from icemaint.observe.catalog import CatalogReader
    from icemaint.safety.approvals import ApprovalRefused

    key = TableName.parse(args.table).key
    health = CatalogReader(config).health(key)  # TableNotFound: nothing to approve
    date = args.date
    if health.dated and date is None:
        raise UsageError(f"{key} is maintained per date ({health.time_column} by {health.time_transform}): "
                         "give the date to approve (--date YYYY-MM-DD)")
    if not health.dated and date is not None:
        raise UsageError(f"{key} has no time column: it is compacted per partition; approve it without --date")
    if date is not None:  # a month or year partition is approved as a whole, keyed as its runs are
        last = dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1)  # the last date a run can target
        date = period_start(parse_date(date, config.dates_start, last), span_of(health.time_transform)).isoformat()
    try:
        record = approve(config, open_audit(config), key, date, args.note)
    except ApprovalRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"approved compaction of {record.table} {record.date or '(its partitions)'} by {printable(record.identity)}")
    return EXIT_OK


def cmd_audit(config: MaintenanceConfig, args) -> int:
    from icemaint.safety.audit import open_audit

    from icemaint.domain.decisions import Operation

    if args.table is not None:
        args.table = TableName.parse(args.table).key
    known = sorted({str(o) for o in Operation} | {"approve", "alert", "lineage"})
    if args.operation is not None:  # the command's spelling (purge-quarantine) names the stored operation too
        args.operation = args.operation.replace("-", "_")
    if args.operation is not None and args.operation not in known:
        raise UsageError(f"--operation {shown(args.operation)} is not an operation; one of: {', '.join(known)}")
    records = open_audit(config).records(table=args.table, operation=args.operation, limit=args.limit)
    if not args.oldest_first:
        records = records[::-1]  # the log reads oldest first; people look for what just happened
    if args.json:
        _print_json([r.to_dict() for r in records])
        return EXIT_OK
    if not records:
        print("no audit records" + (f" for {args.table}" if args.table else "")
              + (f" of operation {args.operation}" if args.operation else ""), file=sys.stderr)
        return EXIT_OK
    print(audit_header())
    for r in records:
        print(audit_line(r))
    return EXIT_OK


AUDIT_COLUMNS = (("TIME (UTC)", 19), ("TABLE", 20), ("DATE", 10), ("OPERATION", 9), ("DECISION", 8))


def audit_header() -> str:
    return " ".join(f"{name:<{width}}" for name, width in AUDIT_COLUMNS) + " SNAPSHOTS / REASON"


def audit_line(r) -> str:
    """One record, one line: a reason (an approval's note) cannot start a line of its own or drive the terminal."""
    snap = f" {r.before_snapshot_id}->{r.after_snapshot_id}" if r.after_snapshot_id else ""
    return (f"{r.ts:%Y-%m-%d %H:%M:%S} {r.table:<20} {r.date or '':<10} {r.operation:<9} {r.decision:<8}{snap} "
            f"{printable(r.reason)}")


def cmd_explain(config: MaintenanceConfig, args) -> int:
    from icemaint.app.explain import explain, explanation_lines

    date = parse_date(args.date, config.dates_start).isoformat() if args.date else None
    result = explain(config, args.table, date)
    if args.json:
        _print_json(result.to_dict())
    else:
        print("\n".join(printable(line) for line in explanation_lines(result)))  # audit text quoted: one line each
    return EXIT_OK


def cmd_plan(config: MaintenanceConfig, args) -> int:
    from icemaint.app.explain import plan, plan_lines

    result = plan(config)
    if args.json:
        _print_json(result)
    else:
        print("\n".join(printable(line) for line in plan_lines(result)))
    return EXIT_FAILED if result["errors"] else EXIT_OK


def _print_ticks(reports: list[dict], args) -> None:
    if args.json:
        _print_json(reports if args.until_idle else reports[-1])
        return
    for n, r in enumerate(reports, 1):
        if args.until_idle:
            print(f"-- tick {n}")
        for line in r["lines"]:
            print(printable(line))


def cmd_tick(config: MaintenanceConfig, args) -> int:
    """One tick; with --until-idle, ticks in this one process (one JVM) until a tick publishes nothing (an
    estate catch-up: a tick launches at most the sensor's budget of runs). A run that keeps failing, or
    finds nothing to do, publishes nothing, so it never keeps the loop going."""
    from icemaint.app.ticker import Ticker

    if args.max_ticks is not None and not args.until_idle:
        raise UsageError("--max-ticks bounds --until-idle: give both, or neither (one tick)")
    max_ticks = args.max_ticks or DEFAULT_MAX_TICKS
    ticker, reports = Ticker(config, args.config), []
    try:
        while True:
            report = ticker.tick(dry_run=args.dry_run)
            reports.append(report)
            progressed = any(d.get("published") for d in report["decisions"])
            if not args.until_idle or args.dry_run or not progressed or len(reports) >= max_ticks:
                break
    except KeyboardInterrupt:  # the ticks that finished are still reported; the one interrupted is in the audit
        if reports:
            _print_ticks(reports, args)
        raise
    unfinished = args.until_idle and progressed and len(reports) >= max_ticks
    _print_ticks(reports, args)
    if unfinished:
        print(f"error: stopped after --max-ticks {max_ticks} while runs were still publishing: the catch-up "
              "is not finished", file=sys.stderr)
    return EXIT_FAILED if unfinished or any(r["failed"] for r in reports) else EXIT_OK


def cmd_ui(config: MaintenanceConfig, args) -> int:
    """Open the same instance in the Dagster UI (dagster dev on loopback)."""
    import os
    import shutil
    from pathlib import Path

    from icemaint.app.instance import ensure_dagster_home

    import maint_assets

    home = ensure_dagster_home(config)
    # The project's workspace.yaml sits beside the code location's package (the project root).
    workspace = Path(maint_assets.__file__).resolve().parents[1] / "workspace.yaml"
    if not workspace.is_file():
        raise ConfigError(f"{workspace} not found: `icemaint ui` serves the project's workspace.yaml beside "
                          "maint_assets/; run it from a checkout of the project")
    import socket

    with socket.socket() as probe:  # Dagster's webserver would fail on it and leave its daemon running without a UI
        try:
            probe.bind(("127.0.0.1", args.port))
        except OSError as exc:
            raise ConfigError(f"port {args.port} on 127.0.0.1 cannot be used ({exc.strerror}): give another with "
                              "--port") from None
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent)) or "dagster"
    env = {**os.environ, "DAGSTER_HOME": str(home), "ICEMAINT_CONFIG": str(Path(config.source or "maintenance.yaml").resolve())}
    print(f"Dagster UI on http://127.0.0.1:{args.port} (instance {home}); Ctrl-C stops it", flush=True)
    from maint_assets.definitions import build_definitions
    from sensors.startup import startup_summary

    print(startup_summary(config, build_definitions(config.source)), flush=True)  # what opening the UI starts
    os.chdir(workspace.parent)
    os.execve(dagster, [dagster, "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(args.port)], env)
    return EXIT_OK  # not reached


def cmd_mcp(config: MaintenanceConfig, args) -> int:
    """The agent interface (Model Context Protocol) until its client leaves (stdio) or it is stopped (HTTP)."""
    from icemaint.app.mcp_server import serve

    serve(config, args.config, agent=args.agent, http=args.http, allow_remote=args.allow_remote)
    return EXIT_OK


def cmd_demo(config: MaintenanceConfig, args) -> int:
    from icemaint.app.demo import run_demo

    if args.batches < 1:
        raise UsageError(f"--batches {args.batches}: the demo writer needs at least 1 batch")
    return run_demo(config, args.config, batches=args.batches)


def cmd_doctor(config: MaintenanceConfig, args) -> int:
    """One line per check of what a new deployment gets wrong; exit 1 when any check fails."""
    from icemaint.app.doctor import Status, run_doctor

    checks = run_doctor(config, config.source, spark=args.spark)
    if args.json:
        _print_json([c.to_dict() for c in checks])
    else:
        for check in checks:
            print(check.line())
    return EXIT_FAILED if any(c.status is Status.FAIL for c in checks) else EXIT_OK






class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad or missing argument is one `error: ...` line (exit 2), not a usage block.

    A value that starts with '-' is read as an option: write it attached (`--older-than=-5d`).
    """

    def error(self, message: str):
        message = message.replace("\n", "\\n").replace("\r", "\\r")
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="icemaint", description=MAIN_DESCRIPTION, epilog=MAIN_EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="maintenance YAML (default: $ICEMAINT_CONFIG, else ./maintenance.yaml)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = add_command(sub, "health", cmd_health)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(sub, "compact", cmd_compact)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--date", action="append", metavar="YYYY-MM-DD",
                   help="a date to compact; repeatable. On a month- or year-partitioned table a date compacts its "
                        "whole month or year, keyed by the period's first day. Omit it for a table without a time "
                        "column: its due partitions are compacted, best first, within max_rewrite_bytes")
    s.add_argument("--from", dest="date_from", metavar="YYYY-MM-DD", help="first date of a range (with --to)")
    s.add_argument("--to", dest="date_to", metavar="YYYY-MM-DD", help="last date of a range (inclusive)")
    s.add_argument("--dry-run", action="store_true", help=DRY_RUN_HELP)
    s.add_argument("--approved", action="store_true",
                   help="approve a run over the cost ceiling (max_rewrite_bytes) or a held date; audited")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(sub, "ingest", cmd_ingest)
    s.add_argument("source", help="a landing source of the config (key `landing`)")
    s.add_argument("--force", action="store_true",
                   help="a batch of whatever has landed, even below every threshold")
    s.add_argument("--dry-run", action="store_true", help="list and check the landed files, append and move nothing")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(sub, "maintain", cmd_maintain)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--date", action="append", metavar="YYYY-MM-DD",
                   help="compact these dates (repeatable) instead of every due one")
    s.add_argument("--all-due", action="store_true", help="compact every due date (the default)")
    s.add_argument("--expire-snapshots", action="store_true", help="expire snapshots by the table's policy")
    s.add_argument("--orphans", action="store_true", help="remove orphan files by the table's policy")
    s.add_argument("--statistics", action="store_true",
                   help="compute column statistics when stale (the default when the policy says statistics: true)")
    s.add_argument("--dry-run", action="store_true", help="report what each step would do, change nothing")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(sub, "revert", cmd_revert)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--snapshot", type=int, required=True, metavar="ID",
                   help="the rewrite's snapshot id (icemaint audit shows it as before->after)")
    s.add_argument("--dry-run", action="store_true", help="check the revert can be made and proven, commit nothing")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(sub, "approve", cmd_approve)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--date", metavar="YYYY-MM-DD",
                   help="the date to approve; omit it for a table without a time column")
    s.add_argument("--note", type=_note, metavar="TEXT",
                   help=f"why (kept in the audit record; at most {MAX_NOTE_CHARS} characters)")

    s = add_command(sub, "audit", cmd_audit)
    s.add_argument("--table", metavar="NAMESPACE.TABLE", help="only this table's records")
    s.add_argument("--operation", metavar="OP",
                   help="only this operation's records: compact, expire, orphans, manifests, statistics, "
                        "purge-quarantine, cleanup, revert, ingest, approve, alert, lineage")
    s.add_argument("--limit", type=whole_number, metavar="N", help="at most N records, the newest")
    s.add_argument("--oldest-first", action="store_true",
                   help="print in the order the records were written (default: newest first)")
    s.add_argument("--json", action="store_true", help=JSON_HELP + " (newest first, as printed)")

    s = add_command(sub, "tick", cmd_tick)
    s.add_argument("--dry-run", action="store_true", help="decide and print, request nothing")
    s.add_argument("--until-idle", action="store_true",
                   help="tick again, in this process, until a tick publishes nothing (an estate catch-up)")
    s.add_argument("--max-ticks", type=positive_int, default=None, metavar="N",
                   help=f"with --until-idle: at most this many ticks (default {DEFAULT_MAX_TICKS})")
    s.add_argument("--json", action="store_true", help="the tick's report (with --until-idle: a list, one per tick)")

    s = add_command(sub, "explain", cmd_explain)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--date", metavar="YYYY-MM-DD", help="one date instead of every date of the table")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(sub, "plan", cmd_plan)
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(sub, "ui", cmd_ui)
    s.add_argument("--port", type=port, default=3000, help="the webserver's port on 127.0.0.1 (default 3000)")

    s = add_command(sub, "mcp", cmd_mcp)
    s.add_argument("--agent", help="stdio: the configured agent this server serves (default: the only one)")
    s.add_argument("--http", metavar="HOST:PORT",
                   help="serve streamable HTTP on a loopback address instead of stdio; each agent by its bearer token")
    s.add_argument("--allow-remote", action="store_true", help="with --http: allow a non-loopback address")

    s = add_command(sub, "demo", cmd_demo)
    s.add_argument("--batches", type=int, default=12, metavar="N",
                   help="commits of the simulated streaming writer (default 12)")

    s = add_command(sub, "doctor", cmd_doctor)
    s.add_argument("--spark", action="store_true", help="also start Spark and report the Iceberg version it loaded")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    cli_retention.register(sub)  # expire, orphans, manifests, statistics, purge-quarantine
    metrics_server.register(sub)  # metrics: the Prometheus endpoint
    serve.register(sub)  # serve: the long-lived engine
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; maps its error by class: the operator's input (`UserError`) exits 2, an operational
    failure (`OperationalError`, an OS error) 1, anything else is a bug: one line naming the log, exit 1."""
    args = build_parser().parse_args(argv)
    from icemaint.engine.java import handle_swallowed_interrupts
    from icemaint.observe.catalog import CatalogUnavailable
    from icemaint.safety import interrupts

    interrupts.install()  # a Ctrl-C whose exception is swallowed (in a finalizer) still stops the run
    handle_swallowed_interrupts()
    config = None
    try:
        config = load_config(args.config)
        return args.func(config, args)
    except CatalogUnavailable as exc:  # not the user's input: the catalog is down or slow; nothing was done
        print(f"error: {one_line(exc, 2000)}; nothing was done", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # the reader left (`icemaint audit | head`): no traceback, the shell's SIGPIPE status
        return _reader_left()
    except Exception as exc:
        if is_user_error(exc):
            print(f"error: {one_line(exc, 2000)}", file=sys.stderr)
            return EXIT_USAGE
        if is_operational(exc) or isinstance(exc, OSError):
            # outside any run (a run reports its own): a service, a claim, the state dir, a config path, the disk
            print(f"error: {one_line(exc, 2000)}", file=sys.stderr)
            return EXIT_FAILED
        return _bug(config, args, exc)
    except KeyboardInterrupt as exc:  # outside any run, or no further run after one (a run answers it as a failed run)
        print(f"error: {str(exc) or interrupts.described()}", file=sys.stderr)
        return 128 + interrupts.signal_number()


def _reader_left() -> int:
    import os
    import signal

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error as Python flushes at exit
    return 128 + signal.SIGPIPE


def _bug(config: MaintenanceConfig | None, args, exc: BaseException) -> int:
    """An error no class of ours names: a bug. Its trace goes to the log, the operator gets one line."""
    try:
        where = f"its trace is in {_save_trace(config)} (please report it with that file)"
    except OSError as log_error:
        where = f"its trace could not be saved ({one_line(log_error)})"
    print(f"error: icemaint {args.command} failed on a bug: {type(exc).__name__}: {one_line(exc)}; {where}",
          file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
