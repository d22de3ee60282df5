"""Runs every benchmark section in one process and writes benchmarks/RESULTS.md.

    python -m benchmarks.run [--quick] [--out benchmarks/RESULTS.md] [--note TEXT] [--keep-data]
                             [--before REV] [--skip-sensor] [--sizes large]
    python -m benchmarks.run --from-results benchmarks/.work/results.json   # re-render only

Compaction is measured for two versions in the same run: the working tree ("after") and REV
("before", default 4b85ad6: the commit before stage-prove-publish), checked out as a temporary
git worktree and run in its own worker process (see compaction_cost.py).

Full mode: 300 and 3,000 small files (~20 and ~200 MB), sensor ticks over 10 / 100 / 1,000 / 10,000 tables,
3 repetitions (--reps to change). --quick: 60 and 200 files, 10 and 50 tables, 1 repetition (a smoke run: it proves
the harness works, its figures are not the project's). Work data goes to benchmarks/.work/.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from icemaint.config import MaintenanceConfig, parse_config

from benchmarks.compaction_cost import CompactionCase, run_case
from benchmarks.lake import SmallFileLayout
from benchmarks.machine import CpuShare, describe_machine, load_average
from benchmarks.measure import Stopwatch
from benchmarks.report import render_report
from benchmarks.sensor_tick import SENSOR_TARGET_TABLES, measure_sensor_scale
from benchmarks.versions import BEFORE_STAGING, REPO, checkout, describe_source, start_workers

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
DATE = dt.date(2024, 1, 2)


@dataclass(frozen=True)
class Mode:
    name: str
    reps: int
    cases: tuple[CompactionCase, ...]
    sensor_tables: tuple[int, ...]


FULL = Mode("full", 3, (
    CompactionCase("small", SmallFileLayout(files=300, rows_per_file=5000, commits=3, date=DATE)),
    CompactionCase("large", SmallFileLayout(files=3000, rows_per_file=5000, commits=3, date=DATE)),
), (10, 100, 1000, 10_000))
QUICK = Mode("quick", 1, (
    CompactionCase("small", SmallFileLayout(files=60, rows_per_file=1000, commits=2, date=DATE)),
    CompactionCase("large", SmallFileLayout(files=200, rows_per_file=1000, commits=2, date=DATE)),
), (10, 50))
# Big enough that the JVM compiles the read/write/hash loops before the first measured case.
WARMUP = CompactionCase("warmup", SmallFileLayout(files=30, rows_per_file=1000, commits=1, date=DATE,
                                                  neighbour_files=1))

# The policy every benchmark table gets: no writer-idle or hot-partition wait (the data is
# written seconds before it is compacted), small files < 1 MiB, 128 MiB targets.
POLICY = {"writer_idle": "0s", "hot_partition_age": "0s", "small_file_size_bytes": "1MiB",
          "target_file_size_bytes": "128MiB", "min_input_files": 5, "retry_backoff": "0s",
          "max_rewrite_bytes": "10GiB", "sample_fraction": 0.05}


def config_doc(root: Path, master: str, state: str = "state") -> dict:
    return {
        "catalog": {"name": "lake", "type": "hadoop", "warehouse": str(root / "warehouse")},
        "spark": {"master": master, "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
                                             "spark.driver.memory": "2g"}},
        "state_dir": str(root / state),
        "claims": {"backend": "file"},
        "audit": {"sink": "file"},
        "defaults": dict(POLICY),
    }


def make_config(root: Path, master: str) -> MaintenanceConfig:
    return parse_config(config_doc(root, master), root, source="benchmarks")


class Log:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[bench {time.perf_counter() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True)


def write_report(out: Path, report: str) -> None:
    """Writes the report; every section of the old file that the report has no heading for is kept: the other
    benchmarks own those (`make bench-stack`, the peer, the streaming shape, the nightly habit, tables at once,
    each module naming its heading) and write them one at a time."""
    from benchmarks.stack_bench import own_section, write_section

    text = out.read_text() if out.exists() else ""
    ours = set(re.findall(r"^## .*$", report, flags=re.M))
    kept = [(heading, own_section(text, heading)) for heading in re.findall(r"^## .*$", text, flags=re.M)
            if heading not in ours]
    out.write_text(report)
    for heading, section in kept:
        if section:
            write_section(out, section, heading)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition: a smoke run")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"), help="where to write the report")
    parser.add_argument("--master", default="local[2]", help="Spark master (the targets assume local[2])")
    parser.add_argument("--note", default="", help="a line for the report's header (e.g. machine conditions)")
    parser.add_argument("--keep-data", action="store_true", help="keep benchmarks/.work/run after the run")
    parser.add_argument("--before", default=BEFORE_STAGING,
                        help="the commit compaction is compared with (default: the one before stage-prove-publish)")
    parser.add_argument("--after", default=None,
                        help="measure this commit (a second temporary worktree) as the new version instead of the "
                             "working tree (e.g. HEAD, when others edit the working tree during the run)")
    parser.add_argument("--reps", type=int, default=None,
                        help="repetitions per figure (default: 3 in full mode, 1 with --quick)")
    parser.add_argument("--skip-sensor", action="store_true", help="leave out section 5 (the sensor tick)")
    parser.add_argument("--sizes", nargs="+", choices=[c.label for c in FULL.cases], default=None,
                        help="measure only these table sizes (e.g. `--sizes large`; default: every size)")
    parser.add_argument("--from-results", metavar="JSON",
                        help="only render --out from a previous run's raw figures (benchmarks/.work/results.json)")
    args = parser.parse_args(argv)
    if args.from_results:
        results = json.loads(Path(args.from_results).read_text())
        if args.note:
            results["note"] = args.note
        write_report(Path(args.out), render_report(results))
        return 0
    mode = QUICK if args.quick else FULL
    if args.reps is not None:
        if args.reps < 1:
            parser.error("--reps must be >= 1")
        mode = Mode(mode.name, args.reps, mode.cases, mode.sensor_tables)
    if args.sizes:
        mode = Mode(mode.name, mode.reps, tuple(c for c in mode.cases if c.label in args.sizes), mode.sensor_tables)
    log = Log()
    os.environ.setdefault("ICEMAINT_IDENTITY", "benchmark")

    run_dir = WORK / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    config = make_config(run_dir / "lake", args.master)
    started_at = dt.datetime.now(dt.timezone.utc)
    load_start = load_average()
    timing: dict[str, float] = {}

    from icemaint.engine.spark_session import get_spark

    with Stopwatch() as sw:
        spark = get_spark(config)
    timing["spark_session"] = sw.seconds
    machine = describe_machine(spark)
    log(f"mode {mode.name}: {machine['cores']} cores, {machine['cpu_model']}, load {load_start}")

    lake = run_dir / "lake"
    with contextlib.ExitStack() as sources:
        before_src = sources.enter_context(checkout(args.before))
        after_src = sources.enter_context(checkout(args.after)) if args.after else REPO
        versions = {"old": describe_source(before_src), "new": describe_source(after_src)}
        versions["new"]["working_tree"] = not args.after
        log(f"before: {versions['old']['commit'][:9]} in {before_src}; after: "
            + (f"{args.after} = {versions['new']['commit'][:9]} in {after_src}" if args.after else
               f"the working tree at {versions['new']['commit'][:9]}"
               + (" with uncommitted changes" if versions["new"]["uncommitted_changes"] else "")))
        with Stopwatch() as sw:
            workers = start_workers([("old", before_src), ("new", after_src)],
                                    lambda label: config_doc(lake, args.master, f"state_{label}"), lake, run_dir)
        timing["worker_sessions"] = sw.seconds
        try:
            for label, w in workers.items():
                versions[label]["worker"] = w.info
            with Stopwatch() as sw:
                log("warm-up: every variant, floor and probes on a tiny table (not reported)")
                run_case(spark, config, WARMUP, 1, run_dir, log, workers)
            timing["warmup"] = sw.seconds

            cases = []
            for case in mode.cases:
                with Stopwatch() as sw:
                    cases.append(run_case(spark, config, case, mode.reps, run_dir, log, workers))
                timing[f"compaction_{case.label}"] = sw.seconds
                log(f"[{case.label}] cost: " + ", ".join(f"{k} {v:.2f}" for k, v in cases[-1]["cost"].items()
                                                         if v is not None))
        finally:
            for w in workers.values():
                w.close()
    sensor = None
    if not args.skip_sensor:
        with Stopwatch() as sw, CpuShare() as cpu:
            sensor = measure_sensor_scale(spark, config, mode.sensor_tables, mode.reps, run_dir,
                                          lambda root: config_doc(root, args.master), log, profile=args.quick,
                                          history_config=parse_config(config_doc(lake, args.master, "state_new"),
                                                                      lake, source="benchmarks"))
        sensor["cpu_share"] = cpu.result
        timing["sensor"] = sw.seconds
    timing["total"] = time.perf_counter() - log.started

    given = argv if argv is not None else sys.argv[1:]
    command = "python -m benchmarks.run" + (" " + shlex.join(given) if given else "")
    results = {
        "mode": mode.name, "reps": mode.reps, "date": started_at.isoformat(timespec="seconds"),
        "command": command, "cwd": os.getcwd(), "note": args.note,
        "machine": machine, "load_average_start": load_start, "load_average_end": load_average(),
        "cases": cases, "sensor": sensor, "timing": timing, "versions": versions,
        "policy": POLICY, "sensor_target_tables": SENSOR_TARGET_TABLES,
    }
    raw = WORK / "results.json"
    raw.write_text(json.dumps(results, indent=2, default=str))
    out = Path(args.out)
    write_report(out, render_report(results))
    log(f"wrote {out} (raw figures: {raw}); total {timing['total']:.0f} s")
    spark.stop()
    if not args.keep_data:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
