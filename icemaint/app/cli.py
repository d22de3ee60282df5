"""`icemaint`: the operators' command line, a thin front over the Dagster definitions.

This module builds the argument parser (every command and its flags) and runs one command, mapping its error to
an exit status; the commands' handlers live beside it: `cli_tables` (one table), `cli_estate` (the estate),
`cli_retention`, `metrics_server` and `serve`. Every mutating command runs the code location's jobs in process
against the instance under the state dir, so its materializations, checks and observations appear in the Dagster UI.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from icemaint.app import cli_retention
from icemaint.app import metrics_server
from icemaint.app import serve
from icemaint.app.cli_estate import (DEFAULT_MAX_TICKS, cmd_audit, cmd_demo, cmd_doctor, cmd_mcp, cmd_plan, cmd_tick,
                                     cmd_ui)
from icemaint.app.cli_help import DRY_RUN_HELP, JSON_HELP, MAIN_DESCRIPTION, MAIN_EPILOG, add_command
from icemaint.app.cli_output import EXIT_FAILED, EXIT_USAGE, save_trace
from icemaint.app.cli_tables import (cmd_approve, cmd_compact, cmd_explain, cmd_health, cmd_ingest, cmd_maintain,
                                     cmd_revert)
from icemaint.app.cli_types import MAX_NOTE_CHARS, note, port, positive_int, whole_number
from icemaint.config import MaintenanceConfig, load_config
from icemaint.errors import is_operational, is_user_error, one_line


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
    s.add_argument("--note", type=note, metavar="TEXT",
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
        where = f"its trace is in {save_trace(config)} (please report it with that file)"
    except OSError as log_error:
        where = f"its trace could not be saved ({one_line(log_error)})"
    print(f"error: icemaint {args.command} failed on a bug: {type(exc).__name__}: {one_line(exc)}; {where}",
          file=sys.stderr)
    return EXIT_FAILED

if __name__ == "__main__":
    sys.exit(main())
