"""What `icemaint <command> --help` says: each command's description and examples, as `gh` and `kubectl` show them.

The parsers (cli.py, cli_retention.py) take their words from here, so every command has a description and an example
(tests/test_cli_help.py fails otherwise) and the docs site's CLI reference (scripts/gen_reference.py) reads the same
parser.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

# Flags many commands share: one wording each.
JSON_HELP = "print JSON instead of text (raw numbers: bytes, seconds, snapshot ids) for scripts"
DRY_RUN_HELP = "decide and report what would be done; change nothing (no claim, no commit)"


@dataclass(frozen=True)
class CommandHelp:
    summary: str               # the one line `icemaint --help` lists
    description: str           # what the command does, when to use it, what it never does
    examples: tuple[str, ...]   # command lines, each optionally followed by `  # what it does`


COMMANDS: dict[str, CommandHelp] = {
    "health": CommandHelp(
        "materialize and print a table's health",
        "Read a table's metadata (pyiceberg, no Spark) and print its health: data and delete files, small files,\n"
        "manifests, snapshots, and per date (or partition) the files, sizes and the last writer commit.\n"
        "It is recorded as the table_health asset, so it also shows in the Dagster UI.",
        ("icemaint health demo.events",
         "icemaint health demo.events --json | jq '.partitions[] | {key, small_files}'")),
    "compact": CommandHelp(
        "compact dates of a table, or the partitions of a table without a time column (claim, stage, GX proof, "
        "publish only if proven)",
        "Compact the small files of the given dates under the operating contract: take the table's claim, decide\n"
        "again on the current snapshot, stage the rewrite on a branch, prove it with Great Expectations, and publish\n"
        "one forward commit only if the proof passed. A failed proof publishes nothing and exits 1.\n"
        "A date that is not due is reported with its reason (and a hint of what would let it run).",
        ("icemaint compact demo.events --date 2026-11-27",
         "icemaint compact demo.events --from 2026-11-01 --to 2026-11-27   # the dates of the range that hold data",
         "icemaint compact demo.events --date 2026-11-27 --dry-run          # the plan, without a JVM",
         "icemaint compact db.dim_customers                                 # a table without a time column",
         "icemaint compact demo.events --date 2026-11-27 --approved         # over max_rewrite_bytes, audited")),
    "ingest": CommandHelp(
        "append one batch of a landing source's small files to its table as a few large files, exactly once",
        "List the files landed in a landing source (config key `landing`), and when a threshold passed (or with\n"
        "--force) append the oldest of them to the source's table under its claim: bad files are set aside in\n"
        "_rejected/ with their reason, the rows are staged on a branch, proven with Great Expectations against the\n"
        "landed files, appended in one commit carrying the batch id, and only then moved to _processed/. A retry\n"
        "after a crash finds the batch on main and never appends it twice. Runs as the landed_batches asset.",
        ("icemaint ingest sensor_events",
         "icemaint ingest sensor_events --force           # whatever has landed, below the thresholds too",
         "icemaint ingest sensor_events --dry-run --json  # what would go into the batch")),
    "maintain": CommandHelp(
        "one pass over one table under one claim: compaction of what is due, then manifests, then (if kept or "
        "asked) column statistics, then (if asked) expiry and orphan removal",
        "One pass over one table under one claim, taken once: compaction of every due date (or the --date ones),\n"
        "the manifest rewrite when due, column statistics when stale, then snapshot expiry and orphan removal if\n"
        "asked. The pass stops at the first step that did not do its work and says why; exit 1 then.",
        ("icemaint maintain demo.events",
         "icemaint maintain demo.events --expire-snapshots --orphans",
         "icemaint maintain demo.events --date 2026-11-27 --dry-run")),
    "revert": CommandHelp(
        "undo a published rewrite with a forward commit (proven first; main is never rewound)",
        "Undo a published icemaint rewrite P: one more forward `replace` commit puts P's replaced files back, after\n"
        "the same proofs show they hold exactly the rows main reads from P's files now. Refused, nothing changed,\n"
        "when P is not a proven icemaint rewrite on main or its files changed since. Automation then holds the\n"
        "date until `icemaint approve`.",
        ("icemaint revert demo.events --snapshot 5712094316254093473 --dry-run   # the id: icemaint audit, before->after",
         "icemaint revert demo.events --snapshot 5712094316254093473")),
    "approve": CommandHelp(
        "approve a compaction over the table's cost ceiling, or one held after a revert or failed runs",
        "Record an approval (audited, with who approved and your note) that lets the next run of a date go: one\n"
        "over max_rewrite_bytes, or one automation holds after a revert, a failed proof or runs that kept failing.\n"
        "The sensors, `icemaint tick`, `compact` and `maintain` all honour it.",
        ("icemaint approve demo.events --date 2026-11-27 --note 'month-end backfill, 40 GiB ok'",
         "icemaint approve db.dim_customers                                 # a table without a time column")),
    "audit": CommandHelp(
        "print the audit trail, newest first",
        "Print the append-only audit trail: one record per decision (run, defer, refuse, noop, not_published,\n"
        "...), with the table, date, operation, snapshots before -> after and the reason. Newest first under a\n"
        "header; --oldest-first for the order the records were written. Decisions and reason kinds:\n"
        "the docs site's reference/audit page.",
        ("icemaint audit --limit 20",
         "icemaint audit --table demo.events --operation compact",
         "icemaint audit --table demo.events --json | jq '.[0].validation'")),
    "tick": CommandHelp(
        "evaluate the sensors once and run what they request, in process",
        "Evaluate the sensors once, as the Dagster daemon would (discovery, compaction, retention), and run what\n"
        "they request in this process: for cron or a headless host without the daemon. Deferrals and refusals are\n"
        "printed with their reasons and recorded in the audit trail.",
        ("icemaint tick --dry-run                 # what would run, and why the rest waits",
         "icemaint tick",
         "icemaint tick --until-idle --max-ticks 20   # an estate catch-up in one process")),
    "explain": CommandHelp(
        "why a table is (not) maintained: every gate of its decisions with the numbers compared, and the audit "
        "records that led here (read-only)",
        "Show every gate of a table's compaction and retention decisions with the numbers compared (policy and\n"
        "where each key came from, thresholds, hot partition, writer idle, claim, cost), then the audit records\n"
        "that led here. Read-only: no claim, no audit record, no run.",
        ("icemaint explain demo.events",
         "icemaint explain demo.events --date 2026-11-27 --json")),
    "plan": CommandHelp(
        "what the next tick would do across the estate, ranked, with cost and benefit (read-only: no claim, no "
        "audit record, no run)",
        "What the next tick would request across the estate, ranked by benefit, with its cost estimate, and what\n"
        "it would hold back and why. Calls the sensors' own decision code and writes nothing.",
        ("icemaint plan", "icemaint plan --json")),
    "ui": CommandHelp(
        "open this instance in the Dagster UI (dagster dev on 127.0.0.1)",
        "Open this configuration's Dagster instance (<state_dir>/dagster) in the Dagster UI, with its daemon:\n"
        "assets, partitions, checks, runs and backfills. Serves on 127.0.0.1 only; the daemon starts the sensors\n"
        "that are switched on (docs: Operations, the daemon).",
        ("icemaint ui", "icemaint ui --port 3001")),
    "mcp": CommandHelp(
        "serve AI agents over the Model Context Protocol: read-only views, and maintenance requests decided by "
        "the same policy (stdio, or --http)",
        "Serve AI agents over the Model Context Protocol: health, explain, plan and audit to read, and\n"
        "maintenance requests decided by the same policy, identity, approval and claim as a sensor's (trigger\n"
        "`agent`). An agent never approves, never removes orphans and never reverts.",
        ("icemaint mcp --agent ops-bot                 # stdio, for an MCP client's mcpServers entry",
         "icemaint mcp --http 127.0.0.1:8765           # streamable HTTP, bearer token per agent")),
    "metrics": CommandHelp(
        "serve Prometheus metrics over the tick's last health read and the audit trail (/metrics)",
        "Serve Prometheus metrics on /metrics: per-table health as the last tick read it (no table's metadata is\n"
        "read per scrape), counters and durations from the audit trail read incrementally. Run it where the\n"
        "sensors or `icemaint tick` run (it reads their state dir). Alert rules: deploy/prometheus/; a Grafana\n"
        "dashboard: deploy/grafana/ (docs: Metrics).",
        ("icemaint metrics                      # http://127.0.0.1:9464/metrics",
         "icemaint metrics --host 0.0.0.0 --port 9464   # for a Prometheus on another host")),
    "serve": CommandHelp(
        "tick on an interval in one long-lived process on one warm Spark session, with health probes for a "
        "supervisor",
        "Tick as `icemaint tick` does, again and again in one process: the JVM starts once and every run of every\n"
        "tick uses it. --health-port serves GET /healthz (the loop beats) and /readyz (Spark started, the last tick\n"
        "did not fail on an outage or a bug) as JSON for systemd or Kubernetes. SIGTERM or Ctrl-C: the run in\n"
        "flight stops at its next step boundary (main unchanged) or finishes, no tick starts, exit 0. Each tick's\n"
        "line carries the process's and its JVM's resident memory (docs: Operations, serve).",
        ("icemaint serve --interval 60s --health-port 8080",
         "icemaint serve --interval 5m --json              # one JSON object per tick, for a log pipeline",
         "icemaint serve --interval 10s --max-ticks 3      # a smoke test")),
    "demo": CommandHelp(
        "build the demo warehouse and run the maintenance loop on it",
        "Build a demo warehouse under the state dir: a simulated streaming writer commits small files into\n"
        "demo.events; a tick during the writes defers (writer active), the next ones compact each due date with a\n"
        "passing proof; then the before/after report, the rows checked against the writer's ledger, and the audit.",
        ("icemaint demo", "icemaint demo --batches 4   # a quicker run")),
    "doctor": CommandHelp(
        "check Java, the Iceberg runtime, the catalog, the configured tables, the state dir, PostgreSQL and the "
        "Dagster instance, one line each",
        "Check what a new deployment gets wrong, one ok / warn / FAIL line per check, exit 1 on any FAIL: Java,\n"
        "the Iceberg runtime and its version, the JVM class archive, ICEMAINT_CATALOG_* variables (names only),\n"
        "the catalog answering, every `tables:` entry of the config naming a table the catalog has, the state\n"
        "dir, PostgreSQL, and the Dagster instance.",
        ("icemaint doctor", "icemaint --config prod.yaml doctor --spark   # also start Spark")),
    "expire": CommandHelp(
        "expire old snapshots by policy (never inside the owner's window, never a branch, tag or in-flight run's "
        "snapshot)",
        "Expire snapshots older than the policy's snapshot_older_than (or --older-than), keeping the newest\n"
        "retain_last, every branch and tag head, each streaming writer's checkpoint snapshot and anything younger\n"
        "than snapshot_min_age; their unreferenced files are deleted unless --keep-files.",
        ("icemaint expire demo.events --dry-run",
         "icemaint expire demo.events --older-than 3d --retain-last 10")),
    "orphans": CommandHelp(
        "remove (or quarantine) files no snapshot references",
        "Remove files under the table's location that no snapshot references and that are older than the cutoff\n"
        "(policy orphan_older_than, at least 24h unless --force). --quarantine moves them aside instead;\n"
        "`icemaint purge-quarantine` deletes them later.",
        ("icemaint orphans demo.events --dry-run",
         "icemaint orphans demo.events --quarantine",
         "icemaint orphans demo.events --older-than 1h --force   # a one-off young cutoff, audited")),
    "manifests": CommandHelp(
        "rewrite small manifests when the policy says they are due",
        "Rewrite the table's manifests into fewer, larger ones when manifest_min_count and manifest_small_bytes\n"
        "say they are due (--force: anyway). No data file changes.",
        ("icemaint manifests demo.events --dry-run", "icemaint manifests demo.events --force")),
    "statistics": CommandHelp(
        "compute the column statistics (Puffin NDV sketches) of the current snapshot when stale by policy",
        "Write a Puffin file of per-column distinct-value sketches for the snapshot main points at, when none\n"
        "exists or the rows changed since reach statistics_stale_fraction (--force: anyway). Query engines' cost\n"
        "based optimisers read it.",
        ("icemaint statistics demo.events", "icemaint statistics demo.events --columns id,ts --force")),
    "purge-quarantine": CommandHelp(
        "delete files that `orphans --quarantine` moved aside longer ago than a cutoff",
        "Delete the batches `icemaint orphans --quarantine` moved into quarantine_dir longer ago than the cutoff.\n"
        "No table is touched; each batch is audited.",
        ("icemaint purge-quarantine --older-than 7d --dry-run", "icemaint purge-quarantine --older-than 7d")),
}

MAIN_DESCRIPTION = ("Event-driven maintenance of Apache Iceberg tables: observe, decide, claim, stage, prove, "
                    "publish, record.")
MAIN_EPILOG = """\
Start here:
  icemaint doctor                 check the set-up against your config
  icemaint plan                   what the next tick would do, and why the rest waits
  icemaint tick --dry-run         decide once, run nothing
  icemaint <command> --help       a command's description, flags and examples

Config: --config PATH, else $ICEMAINT_CONFIG, else ./maintenance.yaml.
Exit codes: 0 done, 1 refused / deferred / proof failed / operational failure, 2 bad input (nothing touched).
Documentation: `make docs` builds the site (docs/); the reference pages list every command, flag and key."""


def epilog(command: CommandHelp) -> str:
    """The `Examples:` block argparse prints after the flags."""
    return "Examples:\n" + "\n".join(f"  {line}" for line in command.examples)


def add_command(subparsers, name: str, func: Callable) -> argparse.ArgumentParser:
    """A subcommand with its summary, description and examples from COMMANDS (KeyError: a command without help)."""
    words = COMMANDS[name]
    parser = subparsers.add_parser(name, help=words.summary, description=words.description, epilog=epilog(words),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=func)
    return parser
