"""N dates of one table as ONE batched backfill run against N separate runs, each run its own process.

    python -m benchmarks.backfill_batch [--dates 10] [--reps 3] [--files 4] [--rows 1000] [--after REV]
                                        [--out benchmarks/BACKFILL.md] [--keep-data]

In production the daemon launches every run in its own process (DefaultRunLauncher): each pays a fresh
Python, JVM and Spark session. Since BACKFILL_DATES_PER_RUN (maint_assets/compaction.py) a backfill over
many dates of one table runs up to 31 of them in one run. This measures what that buys (issue 13 item 7).

One table of N dates x `--files` small files (the simulated streaming writer, no deletes) is built once
under benchmarks/.work/backfill/ and kept as a pristine copy; before each mode of each repetition the
copy is restored to the same path (Hadoop tables hold absolute paths), Dagster instance included, so
both modes start from identical tables. The two modes execute `compaction_job` through the same worker
(`--worker`, this module), differing only in what one process runs:

- separate: N processes one after the other (the run queue allows one run per table), each one partition
  run "<date>|<table>", as the daemon would run a backfill of one run per date;
- batched: one process, one run over the partition range of the N dates (the
  `dagster/asset_partition_range_start` / `_end` tags a multi-run backfill policy gives its runs).

Each process's wall time is taken from outside, from its start to the exit of it and its JVM; the worker
reports its own phases (imports + definitions + instance, Spark session, the run) to say where time goes.
After every mode: each date has its own `compaction` materialization with decision run and a passing
proof, the three blocking checks passed, one audit record per date, every date has fewer files, and
the rows (count and sorted ids, read with pyiceberg) are the rows before. A failure stops the benchmark.
Modes alternate which goes first from one repetition to the next. `--after HEAD` measures a commit (a
temporary git worktree, as `benchmarks.run --after` does) instead of the working tree, for when others edit
the working tree during the run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "backfill"
TABLE = "bench.backfill_events"
START_DATE = dt.date(2025, 1, 1)
MODES = ("separate", "batched")
PROOFS = ("row_count_parity", "sample_comparison", "column_aggregates")
RESULT_MARKER = "BACKFILL_BENCH_RESULT "
WORKER_TIMEOUT_SECONDS = 1800


def partition_keys(dates: int) -> list[str]:
    return [f"{START_DATE + dt.timedelta(days=i)}|{TABLE}" for i in range(dates)]


# -- the worker: one process, one run of compaction_job ---------------------------------------------------

def end_spark() -> None:
    """Stop the session and wait for its JVM to exit, so a process's wall time and CPU include the JVM's
    shutdown and the next process never overlaps it (the gateway JVM exits when its stdin closes)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    proc = getattr(SparkContext._gateway, "proc", None) if SparkContext._gateway is not None else None
    if proc is not None and proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=120)


def run_worker(config_path: str, keys: list[str], backfill_id: str, warmup: bool = False) -> dict:
    """Execute `compaction_job` for `keys` in this process, as a daemon-launched run worker would."""
    started = time.perf_counter()
    import dagster as dg
    import icemaint
    from dagster._core.events import DagsterEventType
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG, BACKFILL_ID_TAG

    from icemaint.app.instance import get_instance
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark
    from maint_assets.definitions import build_definitions
    from maint_assets.partitions import TABLE_TAG

    config = load_config(config_path)
    instance = get_instance(config)
    job = build_definitions(config_path).resolve_job_def("compaction_job")
    loaded = time.perf_counter()
    # The run's first Spark step would start the session; started here only to time it apart.
    spark = get_spark(config)
    session = time.perf_counter()
    phases = {"load_seconds": loaded - started, "spark_session_seconds": session - loaded}
    if warmup:  # caches warm for the measured processes: imports, jars, one read of the table
        spark.sql(f"SELECT count(*) FROM lake.{TABLE}").collect()
        end_spark()
        return {"phases": phases, "icemaint": icemaint.__file__}

    tags = {TABLE_TAG: TABLE, BACKFILL_ID_TAG: backfill_id}
    partition_key = None
    if len(keys) == 1:
        partition_key = keys[0]
    else:
        tags.update({ASSET_PARTITION_RANGE_START_TAG: keys[0], ASSET_PARTITION_RANGE_END_TAG: keys[-1]})
    result = job.execute_in_process(
        instance=instance, partition_key=partition_key, tags=tags, raise_on_error=False,
        run_config={"ops": {"compaction": {"config": {"dry_run": False, "approved": False}}},
                    "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}})
    ran = time.perf_counter()
    phases["run_seconds"] = ran - session

    materialized, checks = {}, []
    for event in result.all_events:
        if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            m = event.event_specific_data.materialization
            if m.asset_key == dg.AssetKey("compaction"):
                outcome = m.metadata["outcome"].value
                materialized[str(m.partition)] = {
                    "decision": outcome.get("decision"), "passed": outcome.get("validation", {}).get("passed"),
                    "files_before": outcome.get("files_before"), "files_after": outcome.get("files_after")}
        elif event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            c = event.event_specific_data
            checks.append({"name": c.check_name, "passed": c.passed})
    end_spark()
    phases["stop_seconds"] = time.perf_counter() - ran
    return {"run_id": result.run_id, "success": result.success, "keys": keys, "materialized": materialized,
            "checks": checks, "phases": phases, "icemaint": icemaint.__file__}


# -- the harness ----------------------------------------------------------------------------------------

class BenchmarkFailure(RuntimeError):
    """A mode did not do what it must (a run failed, a date not compacted, rows changed): no figure counts."""


def log(message: str) -> None:
    print(f"[backfill {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def launch(source: Path, config_path: Path, keys: list[str], backfill_id: str, log_path: Path,
           warmup: bool = False) -> dict:
    """One worker process on `source`'s code; its wall time from outside and the CPU of it and its JVM (both
    reaped)."""
    command = [sys.executable, "-m", "benchmarks.backfill_batch", "--worker", str(config_path),
               "--backfill-id", backfill_id, *(["--warmup"] if warmup else []), "--keys", *keys]
    # The source first, before the editable install's finder (which points at the working tree).
    env = {**os.environ, "PYTHONPATH": str(source)}
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(log_path, "ab") as err:
        done = subprocess.run(command, cwd=source, env=env, stdout=subprocess.PIPE, stderr=err,
                              timeout=WORKER_TIMEOUT_SECONDS)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith(RESULT_MARKER)]
    if done.returncode != 0 or not lines:
        raise BenchmarkFailure(f"worker for {keys[0]}..{keys[-1]} exited {done.returncode}; see {log_path}")
    report = json.loads(lines[-1][len(RESULT_MARKER):])
    if not Path(report["icemaint"]).is_relative_to(source):
        raise BenchmarkFailure(f"the worker ran {report['icemaint']}, not the code in {source}")
    report["wall_seconds"] = wall
    report["cpu_seconds"] = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    return report


def table_state(config) -> dict:
    """Rows and files per date as pyiceberg reads them (no Spark, no Dagster): the independent reader."""
    from icemaint.observe.catalog import CatalogReader

    reader = CatalogReader(config)
    ids = reader.load(TABLE).scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()
    files = {p.key: p.data_files for p in reader.health(TABLE).partitions}
    return {"rows": len(ids), "ids": sorted(ids), "files": files}


def verify_mode(mode: str, config, keys: list[str], before: dict, reports: list[dict], since: dt.datetime) -> dict:
    """Every date done with its own proof, materialization and audit record; rows unchanged; fewer files."""
    from icemaint.safety.audit import open_audit

    problems = []
    if len(reports) != (len(keys) if mode == "separate" else 1):
        problems.append(f"{len(reports)} runs")
    materialized = {}
    for r in reports:
        if not r["success"]:
            problems.append(f"run {r['run_id']} failed")
        if sorted(c["name"] for c in r["checks"]) != sorted(PROOFS) or not all(c["passed"] for c in r["checks"]):
            problems.append(f"run {r['run_id']}: checks {r['checks']}")
        materialized.update(r["materialized"])
    if sorted(materialized) != sorted(keys):
        problems.append(f"materialized {sorted(materialized)}, expected {keys}")
    for key, m in materialized.items():
        if m["decision"] != "run" or m["passed"] is not True:
            problems.append(f"{key}: decision {m['decision']}, proof passed {m['passed']}")
    audit = [a for a in open_audit(config).records(table=TABLE, operation="compact", since=since)
             if a.decision == "run"]
    if sorted(a.date for a in audit) != sorted(k.split("|")[0] for k in keys) or \
            not all(a.validation.get("passed") is True for a in audit):
        problems.append(f"audit: {[(a.date, a.decision) for a in audit]}")
    after = table_state(config)
    if after["rows"] != before["rows"] or after["ids"] != before["ids"]:
        problems.append(f"rows: {after['rows']} after, {before['rows']} before (or other ids)")
    dates = [k.split("|")[0] for k in keys]
    not_fewer = [d for d in dates if after["files"].get(d, 0) >= before["files"][d]]
    if not_fewer:
        problems.append(f"dates not compacted to fewer files: {not_fewer}")
    if problems:
        raise BenchmarkFailure(f"{mode}: " + "; ".join(problems))
    return {"rows": after["rows"], "files_before": sum(before["files"][d] for d in dates),
            "files_after": sum(after["files"].get(d, 0) for d in dates), "audit_records": len(audit),
            "runs": len({a.run_id for a in audit})}


def build_table(root: Path, dates: int, files: int, rows_per_day: int):
    """The table, and a Dagster instance that already knows it (the discovery sensor's job in production)."""
    import yaml

    from icemaint.app.demo import local_estate_doc
    from icemaint.app.instance import get_instance
    from icemaint.app.simulator import StreamingWriter, WorkloadSpec
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark
    from benchmarks.machine import describe_machine

    root.mkdir(parents=True)
    config_path = root / "maintenance.yaml"
    config_path.write_text(yaml.safe_dump(local_estate_doc(root), sort_keys=False))
    config = load_config(str(config_path))
    spark = get_spark(config)
    writer = StreamingWriter(spark, config.catalog.name, WorkloadSpec(
        table=TABLE, days=dates, start_date=START_DATE, rows_per_day=rows_per_day, delete_every=0, seed=13))
    writer.create_table()
    writer.run(files)  # one small file per date per batch
    machine = describe_machine(spark)
    end_spark()
    instance = get_instance(config)
    instance.add_dynamic_partitions("table", [TABLE])
    instance.dispose()
    return config_path, config, writer.ledger, machine


def restore(pristine: Path, root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(pristine, root, symlinks=True)


def spread(values: list[float]) -> dict:
    from benchmarks.measure import median

    return {"min": min(values), "median": median(values), "max": max(values)}


def render(results: dict) -> str:
    m, s, b = results["machine"], results["modes"]["separate"], results["modes"]["batched"]
    n, reps = results["dates"], results["reps"]

    def cell(figure: dict) -> str:
        return f"{figure['median']:.1f} ({figure['min']:.1f} - {figure['max']:.1f})"

    def phase(mode: dict, name: str) -> str:
        return f"{mode['phases'][name]['median']:.1f}"

    ratio = results["ratio_wall"]
    src = results["source"]
    subject = src["subject"] if len(src["subject"]) <= 80 else src["subject"][:80].rsplit(" ", 1)[0] + " ..."
    code = (f"commit `{src['commit'][:9]}` ({subject})" + (", a temporary git worktree" if not src["working_tree"]
            else ", the working tree" + (" with uncommitted changes" if src["uncommitted_changes"] else "")))
    lines = [
        "# Backfill: N dates as one batched run vs N separate runs",
        "",
        f"Generated by `{results['command']}` on {results['date']} (UTC); code measured: {code}.",
        "",
        f"**Method.** One Iceberg table (Hadoop catalog, Spark `local[2]`) with {n} dates x {results['files']} "
        f"small files ({results['rows_per_day']} rows per date per file, {results['rows']:,} rows in all), written "
        "by the simulated streaming writer with no deletes, is restored from one pristine copy before each "
        "mode of each repetition, Dagster instance included. *separate*: "
        f"{n} processes one after the other, each executing `compaction_job` for one partition "
        "`<date>|<table>`, as the daemon's DefaultRunLauncher runs a backfill of one run per date (a fresh "
        "Python, JVM and Spark session each). *batched*: one process executing `compaction_job` over the "
        f"partition range of the {n} dates (`dagster/asset_partition_range_start`/`_end`), the run a "
        "multi-run backfill policy (`BACKFILL_DATES_PER_RUN`) launches. Both go through the same worker "
        "(`benchmarks/backfill_batch.py --worker`); wall time is taken around each whole process, from its "
        "start to its and its JVM's exit, and CPU is the processes' own (user + sys, JVM included). Not "
        "counted: the daemon's queue and launch latency between runs (the backfill daemon's and run "
        "coordinator's loops), which the separate runs would pay once per date on top. Every mode was "
        "checked: each date has its own `compaction` materialization with decision `run` and a passing "
        "proof, the three blocking GX checks passed, one audit record per date, every date has fewer files, "
        "and the table's rows (count and sorted ids, read with pyiceberg) are the rows before. The modes "
        f"alternate which runs first; {reps} repetitions, medians with (min - max).",
        "",
        f"| mode | processes | wall s, all {n} dates | wall s per date | CPU s (all processes) |",
        "|---|---|---|---|---|",
        f"| separate | {n} | {cell(s['wall'])} | {s['wall']['median'] / n:.1f} | {cell(s['cpu'])} |",
        f"| batched | 1 | {cell(b['wall'])} | {b['wall']['median'] / n:.1f} | {cell(b['cpu'])} |",
        f"| **separate / batched** | | **{ratio:.2f}x** | | {results['ratio_cpu']:.2f}x |",
        "",
        "Where a process's time goes (medians, seconds; *load*: imports, definitions and instance; *outside*: "
        "interpreter start and exit, measured wall minus the worker's own clock):",
        "",
        "| mode | per process: outside | load | Spark session | run | stop | run per date |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, mode, per in (("separate", s, 1), ("batched", b, n)):
        lines.append(f"| {name} | {mode['phases']['outside_seconds']['median']:.1f} | {phase(mode, 'load_seconds')} | "
                     f"{phase(mode, 'spark_session_seconds')} | {phase(mode, 'run_seconds')} | "
                     f"{phase(mode, 'stop_seconds')} | {mode['phases']['run_seconds']['median'] / per:.1f} |")
    load = results["load_average"]
    others = [c.get("others_average_cores") for c in results["cpu_share"] if c.get("others_average_cores") is not None]
    lines += [
        "",
        f"Machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu_model']}; Python {m['python']}, Java {m['java']}, "
        f"Spark {m['spark']}, Iceberg {m['iceberg']}, Dagster {m['dagster']}, pyiceberg {m['pyiceberg']}. "
        f"Load average {load['start']} at the start, {load['end']} at the end"
        + (f"; other processes used {min(others):.2f} - {max(others):.2f} cores on average during the modes"
           if others else "") + " (a shared machine: quote the ratio, which compares runs of the same minutes).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backfill_batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dates", type=int, default=10, help="dates of the table, all in the backfill (default 10)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each mode (default 3)")
    parser.add_argument("--files", type=int, default=4, help="small files per date (default 4; compaction needs 3)")
    parser.add_argument("--rows", type=int, default=1000, help="rows per date per file (default 1000)")
    parser.add_argument("--after", default=None,
                        help="measure this commit (a temporary git worktree) instead of the working tree (e.g. HEAD, "
                             "when others edit the working tree during the run)")
    parser.add_argument("--out", default=str(HERE / "BACKFILL.md"), help="where to write the report")
    parser.add_argument("--keep-data", action="store_true", help="keep benchmarks/.work/backfill after the run")
    parser.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--keys", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--backfill-id", default="", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        report = run_worker(args.worker, args.keys, args.backfill_id, args.warmup)
        print(RESULT_MARKER + json.dumps(report, default=str), flush=True)
        return 0
    if args.dates < 2 or args.dates > 31:
        parser.error("--dates must be 2..31 (one batched run holds at most BACKFILL_DATES_PER_RUN = 31 dates)")
    if args.reps < 1 or args.files < 3 or args.rows < 1:
        parser.error("--reps >= 1, --files >= 3 (min_input_files), --rows >= 1")

    from benchmarks.versions import checkout, describe_source

    os.environ.setdefault("ICEMAINT_IDENTITY", "benchmark")
    given = argv if argv is not None else sys.argv[1:]
    command = "python -m benchmarks.backfill_batch" + (" " + shlex.join(given) if given else "")
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(checkout(args.after)) if args.after else REPO
        if args.after:  # the worker is this module, which the commit may not have
            shutil.copy2(Path(__file__), source / "benchmarks" / "backfill_batch.py")
        # Nothing of icemaint is imported yet in this process: from here on it is the measured source's.
        sys.path.insert(0, str(source))
        described = {**describe_source(source), "working_tree": not args.after}
        log(f"measuring {described['commit'][:9]} in {source}")
        results = measure(args, source, command)
        results["source"] = described
    (WORK / "results.json").write_text(json.dumps(results, indent=2, default=str))
    report = render(results)
    Path(args.out).write_text(report)
    print(report)
    log(f"wrote {args.out} (raw figures: {WORK / 'results.json'})")
    if not args.keep_data:
        for path in (WORK / "lake", WORK / "pristine"):
            shutil.rmtree(path, ignore_errors=True)
    return 0


def measure(args, source: Path, command: str) -> dict:
    """Build the table once, then each mode `args.reps` times from the pristine copy; the raw figures."""
    from benchmarks.machine import CpuShare, load_average
    from benchmarks.measure import median

    import icemaint

    if not Path(icemaint.__file__).is_relative_to(source):
        raise BenchmarkFailure(f"this process imported {icemaint.__file__}, not the code in {source}")
    started_at = dt.datetime.now(dt.timezone.utc)
    load_start = load_average()
    if WORK.exists():
        shutil.rmtree(WORK)
    root, pristine, logs = WORK / "lake", WORK / "pristine", WORK / "logs"
    logs.mkdir(parents=True)
    log(f"building {TABLE}: {args.dates} dates x {args.files} files x {args.rows} rows in {root}")
    config_path, config, ledger, machine = build_table(root, args.dates, args.files, args.rows)
    keys = partition_keys(args.dates)
    before = table_state(config)
    if before["ids"] != sorted(ledger.expected_ids()) or any(before["files"][k.split("|")[0]] != args.files for k in keys):
        raise BenchmarkFailure(f"the built table is not what the writer wrote: {before['rows']} rows, {before['files']}")
    shutil.copytree(root, pristine, symlinks=True)
    log("warm-up process (not counted)")
    launch(source, config_path, keys[:1], "warmup", logs / "warmup.log", warmup=True)

    samples = {mode: {"wall": [], "cpu": [], "phases": []} for mode in MODES}
    cpu_share, checked = [], {}
    for rep in range(args.reps):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            restore(pristine, root)
            if table_state(config) != before:
                raise BenchmarkFailure("the restored copy differs from the pristine table")
            backfill_id = f"{mode[:3]}{rep}{uuid.uuid4().hex[:6]}"
            since = dt.datetime.now(dt.timezone.utc)
            batches = [[k] for k in keys] if mode == "separate" else [keys]
            with CpuShare() as share:
                reports = [launch(source, config_path, batch, backfill_id, logs / f"{mode}-{rep}.log") for batch in batches]
            checked[mode] = verify_mode(mode, config, keys, before, reports, since)
            wall = sum(r["wall_seconds"] for r in reports)
            samples[mode]["wall"].append(wall)
            samples[mode]["cpu"].append(sum(r["cpu_seconds"] for r in reports))
            for r in reports:
                outside = r["wall_seconds"] - sum(r["phases"].values())
                samples[mode]["phases"].append({**r["phases"], "outside_seconds": outside})
            cpu_share.append({"mode": mode, "rep": rep, **share.result})
            log(f"rep {rep + 1}/{args.reps} {mode}: {wall:.1f} s wall, {len(reports)} process(es), "
                f"{checked[mode]['files_before']} -> {checked[mode]['files_after']} files, rows unchanged "
                f"({checked[mode]['rows']:,}); others used {share.result.get('others_average_cores', '?')} cores")

    modes = {}
    for mode, s in samples.items():
        per_process = {name: spread([p[name] for p in s["phases"]]) for name in s["phases"][0]}
        modes[mode] = {"wall": spread(s["wall"]), "cpu": spread(s["cpu"]), "phases": per_process,
                       "walls": s["wall"], "verified": checked[mode]}
    return {
        "command": command,
        "date": started_at.isoformat(timespec="seconds"), "dates": args.dates, "reps": args.reps,
        "files": args.files, "rows_per_day": args.rows, "rows": before["rows"], "machine": machine,
        "load_average": {"start": load_start, "end": load_average()}, "cpu_share": cpu_share, "modes": modes,
        "ratio_wall": median(samples["separate"]["wall"]) / median(samples["batched"]["wall"]),
        "ratio_cpu": median(samples["separate"]["cpu"]) / median(samples["batched"]["cpu"]),
    }


if __name__ == "__main__":
    sys.exit(main())
