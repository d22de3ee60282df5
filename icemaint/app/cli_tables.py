"""The CLI's commands on one table: `health`, `compact`, `ingest`, `maintain`, `revert`, `approve`, `explain`.

Each handler takes the loaded config and the parsed arguments and returns the exit status; the parser that
routes to them is built in `cli`. Mutating commands run the code location's jobs in process (`MaintenanceRunner`),
so their materializations appear in the Dagster UI.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Sequence

from icemaint.app.cli_output import EXIT_FAILED, EXIT_OK, print_json, save_trace
from icemaint.config import MaintenanceConfig
from icemaint.domain.drift import drift_line
from icemaint.domain.hints import decision_hint
from icemaint.domain.layout import describe
from icemaint.domain.names import TableName
from icemaint.domain.scope import parse_date
from icemaint.domain.units import human_duration, human_size, printable
from icemaint.errors import UsageError, one_line


def _dates(args, runner) -> Sequence[str | None]:
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
        print_json(health)
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
        print_json(results)
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
        print_json(outcome)
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
        print_json(report.to_dict())
    else:
        print(f"{report.table}: one pass under claim {report.holder}")
        for step in report.steps:
            print(f"  {step.line}")
            if step.hint:
                print(f"      hint: {step.hint}")
        if report.stopped:
            print(f"  stopped: {report.stopped}")
    return EXIT_OK if report.success else EXIT_FAILED


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
              f"(trace in {save_trace(config)})", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print_json(outcome.to_dict())
    else:
        done = outcome.decision == "run"
        print(f"{outcome.table} revert {outcome.snapshot_id}: {outcome.decision}: {outcome.reason}",
              file=sys.stdout if done else sys.stderr)
    return EXIT_OK if outcome.decision == "run" else EXIT_FAILED


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


def cmd_explain(config: MaintenanceConfig, args) -> int:
    from icemaint.app.explain import explain, explanation_lines

    date = parse_date(args.date, config.dates_start).isoformat() if args.date else None
    result = explain(config, args.table, date)
    if args.json:
        print_json(result.to_dict())
    else:
        print("\n".join(printable(line) for line in explanation_lines(result)))  # audit text quoted: one line each
    return EXIT_OK
