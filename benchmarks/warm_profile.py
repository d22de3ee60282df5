"""Where a warm table-date's time goes: each part of one compaction timed, in a process whose JVM has run a few
table-dates already (issue 50, item 1: "a warm table-date under 200 ms").

    python -m benchmarks.warm_profile [--tables 12] [--warm-up 4] [--files 100] [--rows 100] [--json OUT]

The estate shape (`benchmarks.concurrent_tick.build_estate`: a Hadoop catalog, tables of one date of `--files`
small files) compacted one table-date after another by `MaintenanceRunner.compact` in this process, as `serve`'s
ticks and `tick --until-idle` run them. Each part is timed by wrapping the function that does it (no profiler, so
nothing slows the calls down); parts nest (the Spark write is inside the stage), so the table gives each part's
median and where it sits. The first `--warm-up` table-dates warm the JVM and are not counted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib
import json
import os
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.concurrent_tick import DATE, build_estate, check_estate, write_config
from benchmarks.machine import load_average

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "warm_profile"

# (label, module, attribute path, depth): the parts, in the order a table-date meets them.
PARTS = (
    ("Dagster run (runner.compact)", "icemaint.app.runner", "MaintenanceRunner.compact", 0),
    ("contract (Compactor.run)", "icemaint.operations.compaction", "Compactor.run", 1),
    ("claim taken", "icemaint.safety.claims", "FileClaims.acquire", 2),
    ("decide (health, audit read, decision)", "icemaint.operations.compaction", "Compactor._decide", 2),
    ("plan the date's files (Java scan)", "icemaint.engine.staging", "StagingArea.plan_date_files", 2),
    ("stage", "icemaint.engine.staging", "StagingArea.stage", 2),
    ("Spark's write (with the fed digest)", "icemaint.engine.staging", "StagingArea._write_replacements", 3),
    ("staging branch commit", "icemaint.engine.staging", "StagingArea.commit_to_branch", 3),
    ("proof (prove_rows)", "icemaint.engine.validation", "prove_rows", 2),
    ("fed digest's result", "icemaint.engine.digest", "FeedDigest.result", 3),
    ("after side's read (digest)", "icemaint.engine.validation", "rows_digest", 3),
    ("GX checks (four, pandas)", "icemaint.engine.validation", "_run_suite", 3),
    ("publish", "icemaint.engine.staging", "StagingArea.publish", 2),
    ("publish: prepare (apply)", "icemaint.engine.staging", "StagingArea._prepare_publish", 3),
    ("publish: commit", "icemaint.engine.staging", "StagingArea._commit_publish", 3),
    ("publish: find it on main", "icemaint.engine.staging", "StagingArea.find_published", 3),
    ("staging branch removed", "icemaint.engine.staging", "StagingArea.discard", 2),
    ("read reads released", "icemaint.engine.staging", "StagingArea.release_reads", 2),
    ("health after (files after)", "icemaint.operations.compaction", "Compactor._fill_after", 2),
    ("audit record", "icemaint.operations.compaction", "Compactor._record", 2),
)


def log(message: str) -> None:
    print(f"[warm-profile {dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {message}", flush=True)


class Timers:
    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.mode = "in_publish"

    def wrap(self, label: str, module: str, path: str) -> None:
        owner = importlib.import_module(module)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        if isinstance(original, staticmethod):
            return
        timers = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers.current[label] += time.perf_counter() - t0
                timers.calls[label] += 1

        setattr(owner, attr, timed)

    def take(self) -> dict[str, float]:
        out = dict(self.current)
        self.current.clear()
        return out


def _alternate_branch_removal(timers: Timers) -> None:
    """`--compare-branch-removal`: in "separate" mode the publish leaves the staging branch to `discard`'s own
    commit, as before the publish removed it in its swap; the two modes alternate table by table."""
    from icemaint.engine.publish import PendingPublish

    attempt = PendingPublish.attempt

    def attempt_as_mode(self):
        if timers.mode == "separate":
            self.remove_branch = None
        return attempt(self)

    PendingPublish.attempt = attempt_as_mode  # type: ignore[method-assign]


def measure(args) -> dict:
    shutil.rmtree(WORK, ignore_errors=True)
    total = args.tables + args.warm_up
    if args.seed:  # an estate of the same shape another benchmark built (its `wh`), copied
        seed = Path(args.seed)
    else:
        seed = WORK / "seed"
        seed.mkdir(parents=True)
        log(f"estate: {total} tables of one date of {args.files} files, {args.rows} rows each")
        build_estate(seed, total, args.files, args.rows)
    root = WORK / "run"
    root.mkdir(parents=True)
    shutil.copytree(seed / "wh", root / "wh")
    config_path = write_config(root, 1)
    os.environ.setdefault("ICEMAINT_IDENTITY", "benchmark")

    from icemaint.app.runner import MaintenanceRunner
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark

    config = load_config(str(config_path))
    timers = Timers()
    for label, module, path, _ in PARTS:
        timers.wrap(label, module, path)
    if args.compare_branch_removal:
        _alternate_branch_removal(timers)
    runner = MaintenanceRunner(config, str(config_path))
    get_spark(config)
    tables = [f"ice.t{i:03d}" for i in range(total)]
    rows = []
    load_before = load_average()
    for i, table in enumerate(tables):
        timers.take()
        timers.mode = "separate" if args.compare_branch_removal and i % 2 else "in_publish"
        report = runner.compact(table, DATE)
        parts = timers.take()
        published = bool(report.outcome.get("published"))
        if i >= args.warm_up:
            rows.append({"table": table, "published": published, "load1": os.getloadavg()[0], "parts": parts,
                         "branch_removal": timers.mode})
        log(f"{table}{' (warm-up)' if i < args.warm_up else ''}: {parts.get(PARTS[1][0], 0) * 1000:.0f} ms in the "
            f"contract, {parts.get(PARTS[0][0], 0) * 1000:.0f} ms the run; published {published}")
    check_estate(root, total, args.files, args.rows)
    return {"rows": rows, "tables": args.tables, "warm_up": args.warm_up, "files": args.files,
            "rows_per_file": args.rows, "load_before": load_before, "load_after": load_average(),
            "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes")}


def render(result: dict) -> str:
    out = []
    modes = sorted({r.get("branch_removal", "in_publish") for r in result["rows"]})
    for mode in modes:
        rows = [r for r in result["rows"] if r.get("branch_removal", "in_publish") == mode]
        out += [f"branch removal: {mode}", *_table(result, rows), ""]
    return "\n".join(out)


def _table(result: dict, rows: list[dict]) -> list[str]:
    out = [f"warm table-dates: {len(rows)} (after {result['warm_up']} warm-up), {result['files']} files of "
           f"{result['rows_per_file']} rows each; load {result['load_before']} -> {result['load_after']}",
           "| part | median ms | min ms |", "|---|---|---|"]
    for label, _, _, depth in PARTS:
        values = sorted(r["parts"].get(label, 0.0) * 1000 for r in rows)
        if not any(values):
            continue
        out.append(f"| {'&nbsp;' * 4 * depth}{label} | {values[len(values) // 2]:.0f} | {values[0]:.0f} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=12)
    parser.add_argument("--warm-up", type=int, default=4)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--json", metavar="OUT", help="write the raw figures here (default benchmarks/results/)")
    parser.add_argument("--compare-branch-removal", action="store_true",
                        help="alternate the staging branch's removal in the publish's swap with a commit of its own")
    parser.add_argument("--from-results", metavar="JSON")
    parser.add_argument("--seed", metavar="DIR", help="copy this estate (a directory holding `wh`) instead of building")
    args = parser.parse_args(argv)
    result = json.loads(Path(args.from_results).read_text()) if args.from_results else measure(args)
    if not args.from_results:  # benchmarks.cost_summary reads the newest
        stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M}"
        out = Path(args.json) if args.json else HERE / "results" / f"warm_profile_{stamp}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
