"""The CLI's commands over the whole estate: `audit`, `plan`, `tick`, `ui`, `mcp`, `demo`, `doctor`.

Each handler takes the loaded config and the parsed arguments and returns the exit status; the parser that
routes to them is built in `cli`.
"""

from __future__ import annotations

import sys

from icemaint.app.cli_output import EXIT_FAILED, EXIT_OK, print_json
from icemaint.config import MaintenanceConfig
from icemaint.config.parse import ConfigError
from icemaint.domain.names import TableName
from icemaint.domain.units import printable, shown
from icemaint.errors import UsageError


def cmd_audit(config: MaintenanceConfig, args) -> int:
    from icemaint.safety.audit import open_audit

    from icemaint.domain.verdicts import Operation

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
        print_json([r.to_dict() for r in records])
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


def cmd_plan(config: MaintenanceConfig, args) -> int:
    from icemaint.app.explain import plan, plan_lines

    result = plan(config)
    if args.json:
        print_json(result)
    else:
        print("\n".join(printable(line) for line in plan_lines(result)))
    return EXIT_FAILED if result["errors"] else EXIT_OK


DEFAULT_MAX_TICKS = 50  # `tick --until-idle`: a catch-up still publishing after this many ticks stops, failing


def _print_ticks(reports: list[dict], args) -> None:
    if args.json:
        print_json(reports if args.until_idle else reports[-1])
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
        print_json([c.to_dict() for c in checks])
    else:
        for check in checks:
            print(check.line())
    return EXIT_FAILED if any(c.status is Status.FAIL for c in checks) else EXIT_OK
