"""`icemaint expire | orphans | manifests | statistics | purge-quarantine`: retention from the command line.

expire, orphans, manifests and statistics run through the Dagster jobs; purge-quarantine only deletes files in
<state_dir>/quarantine (no table is touched) and runs directly.

Settings are validated before anything runs (a bad one exits 2 naming it); a refusal or a failed
run exits 1; a run, a dry run, a deferral or nothing to do exits 0.
"""

from __future__ import annotations

import sys

from icemaint.app.cli_help import JSON_HELP, add_command
from icemaint.app.cli_output import EXIT_FAILED, EXIT_OK, print_json
from icemaint.config import MaintenanceConfig
from icemaint.domain.retention import check_retain_last
from icemaint.operations.retention_outcome import check_age
from icemaint.domain.units import human_size, parse_duration
from icemaint.errors import UsageError


def _duration(value: str | None, option: str) -> str | None:
    """The option's duration, checked now (UsageError naming the option) and passed on as written."""
    if value is None:
        return None
    try:
        check_age(parse_duration(value), option)
    except ValueError as exc:
        raise UsageError(f"{option} {value!r}: {exc}") from None
    return value


def _retain_last(value: int | None) -> int | None:
    if value is None:
        return None
    try:
        return check_retain_last(value)
    except ValueError as exc:
        raise UsageError(f"--retain-last: {exc}") from None


def _report(args, operation: str, report) -> int:
    outcome = dict(report.outcome) or {"table": args.table, "operation": operation, "decision": "failed",
                                       "reason": report.failure_line}
    outcome["run_id"] = report.run_id
    outcome["success"] = report.success
    if report.error and not outcome.get("reason"):
        outcome["reason"] = report.failure_line
    status = EXIT_OK if report.success and outcome.get("decision") not in ("refuse", "failed") else EXIT_FAILED
    if args.json:
        print_json(outcome)
    else:
        stream = sys.stdout if status == EXIT_OK else sys.stderr
        print(f"{outcome.get('table')} {operation}: {outcome.get('decision')}: {outcome.get('reason')}", file=stream)
        metrics = outcome.get("metrics") or {}
        if metrics:
            print("    " + ", ".join(f"{k} {_shown_metric(k, v)}" for k, v in metrics.items()), file=stream)
    return status


def _shown_metric(key: str, value) -> str:
    """A metric as people read it: byte counts as sizes, whole numbers with separators (raw numbers: --json)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return str(value)
    return human_size(value) if "bytes" in key else f"{value:,}"


def _runner(config: MaintenanceConfig, args):
    from icemaint.app.runner import MaintenanceRunner

    runner = MaintenanceRunner(config, args.config, reap=not getattr(args, "dry_run", False))
    runner.check_table(args.table)  # TableNotFound / InvalidTableName before any run
    return runner


def cmd_expire(config: MaintenanceConfig, args) -> int:
    older_than = _duration(args.older_than, "--older-than")
    retain_last = _retain_last(args.retain_last)
    report = _runner(config, args).expire(args.table, older_than=older_than, retain_last=retain_last,
                                          keep_files=True if args.keep_files else None, dry_run=args.dry_run)
    return _report(args, "expire", report)


def cmd_orphans(config: MaintenanceConfig, args) -> int:
    older_than = _duration(args.older_than, "--older-than")
    report = _runner(config, args).orphans(args.table, older_than=older_than, force=args.force,
                                           quarantine=args.quarantine, dry_run=args.dry_run)
    return _report(args, "orphans", report)


def cmd_manifests(config: MaintenanceConfig, args) -> int:
    report = _runner(config, args).manifests(args.table, force=args.force, dry_run=args.dry_run)
    return _report(args, "manifests", report)


def _columns(value: str | None) -> list[str] | None:
    """`--columns a,b`: the names, checked for form now (their existence by the run, against the table's schema)."""
    if value is None:
        return None
    names = [c.strip() for c in value.split(",")]
    if not all(names) or any(len(c) > 200 for c in names):
        raise UsageError(f"--columns {value!r}: give column names separated by commas, e.g. --columns id,ts")
    return list(dict.fromkeys(names))


def cmd_statistics(config: MaintenanceConfig, args) -> int:
    columns = _columns(args.columns)
    report = _runner(config, args).statistics(args.table, force=args.force, dry_run=args.dry_run, columns=columns)
    return _report(args, "statistics", report)


def cmd_purge_quarantine(config: MaintenanceConfig, args) -> int:
    from icemaint.safety.audit import open_audit
    from icemaint.operations.quarantine import purge
    from icemaint.engine.spark_session import get_spark

    older_than = parse_duration(_duration(args.older_than, "--older-than"))
    outcomes = purge(config, get_spark(config), open_audit(config), older_than_seconds=older_than,
                     dry_run=args.dry_run)
    if args.json:
        print_json([o.to_dict() for o in outcomes])
    elif not outcomes:
        print("quarantine: nothing older than the cutoff")
    for o in [] if args.json else outcomes:
        print(f"{o.table} purge_quarantine: {o.decision}: {o.reason}",
              file=sys.stderr if o.decision == "refuse" else sys.stdout)
    return EXIT_FAILED if any(o.decision == "refuse" for o in outcomes) else EXIT_OK


def register(subparsers) -> None:
    """Add the `expire`, `orphans`, `manifests`, `statistics` and `purge-quarantine` subcommands to `icemaint`'s parser."""
    s = add_command(subparsers, "expire", cmd_expire)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--older-than", metavar="DURATION",
                   help="expire snapshots older than this, e.g. 7d, 72h (default: the policy's snapshot_older_than)")
    s.add_argument("--retain-last", type=int, metavar="N", help="always keep the newest N snapshots (N >= 1)")
    s.add_argument("--keep-files", action="store_true",
                   help="expire the snapshots but leave their files for orphan removal")
    s.add_argument("--dry-run", action="store_true", help="report what would expire, change nothing")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(subparsers, "orphans", cmd_orphans)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--older-than", metavar="DURATION",
                   help="only files older than this, e.g. 72h (default: the policy's orphan_older_than; "
                        "under 24h needs --force)")
    s.add_argument("--force", action="store_true", help="allow a cutoff under 24 h (audited)")
    s.add_argument("--quarantine", action="store_true",
                   help="move the files to the quarantine (quarantine_dir, default <state_dir>/quarantine) instead of "
                        "deleting them")
    s.add_argument("--dry-run", action="store_true", help="list the candidates, change nothing")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(subparsers, "manifests", cmd_manifests)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--force", action="store_true", help="rewrite even when not due")
    s.add_argument("--dry-run", action="store_true", help="report the estimate, change nothing")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(subparsers, "statistics", cmd_statistics)
    s.add_argument("table", help="namespace.table")
    s.add_argument("--columns", metavar="A,B",
                   help="only these columns (default: the policy's statistics_columns, else every primitive column)")
    s.add_argument("--force", action="store_true", help="compute even when not stale")
    s.add_argument("--dry-run", action="store_true", help="report what would be computed, change nothing")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = add_command(subparsers, "purge-quarantine", cmd_purge_quarantine)
    s.add_argument("--older-than", metavar="DURATION", required=True,
                   help="purge batches quarantined longer ago than this, e.g. 7d")
    s.add_argument("--dry-run", action="store_true", help="list the batches, delete nothing")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
