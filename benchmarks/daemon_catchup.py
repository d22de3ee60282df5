"""An estate catch-up under the Dagster daemon: the compaction sensor's runs, one per table (before) against
neighbouring tables due on the same date joined into one run (after), on identical copies of one estate.

    python -m benchmarks.daemon_catchup [--tables 12] [--before REV] [--out benchmarks/RESULTS.md] [--note TEXT]
    python -m benchmarks.daemon_catchup --from-results benchmarks/.work/daemon/results.json   # re-render only

Under the daemon every run is a process of its own with its own JVM: a run's start costs seconds before any
table is touched. The estate (`benchmarks.concurrent_tick.build_estate`: a Hadoop catalog, `--tables` tables
of one date of 100 small files, one Spark write each) is built once and copied afresh for each version. Each
version runs `dagster-daemon run` on its own code (the version before from a temporary `git worktree`,
PYTHONPATH at its source) with the project's own instance settings (`max_runs_total` 2, the default) and
nobody calling anything: the discovery sensor registers the tables, the compaction sensor requests runs, the
queue launches them. Measured from the instance's run records: the compaction runs, their span (first
start to last end) and their summed wall time; and from the daemon's start until every table holds one file
on the date. Afterwards every table holds exactly its rows (count and sum of ids, read by pyiceberg).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.concurrent_tick import build_estate, check_estate, config_doc
from benchmarks.jvm_archive import ready as ready_class_archive

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "daemon"
SECTION = "## Catch-up under the daemon: the sensor's runs, per table against joined"
BEFORE = "2042333"  # the last commit whose compaction sensor requested one run per table
FILES, ROWS = 100, 100
TIMEOUT_S = 1200


def log(message: str) -> None:
    print(f"[daemon {dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def daemon_executable() -> str:
    return str(Path(sys.executable).parent / "dagster-daemon")


def prepare(label: str, source: Path, seed: Path) -> tuple[Path, dict]:
    """A fresh copy of the estate, the config, the version's own dagster.yaml and a workspace on its code."""
    import yaml

    root = WORK / label
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copytree(seed / "wh", root / "wh")
    config = root / "icemaint.yaml"
    config.write_text(yaml.safe_dump(config_doc(root, 2), sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(source), "ICEMAINT_CONFIG": str(config), "ICEMAINT_IDENTITY": "benchmark"}
    home = subprocess.run(
        [sys.executable, "-c", "from icemaint.config import load_config; from icemaint.app.instance import "
         f"ensure_dagster_home; print(ensure_dagster_home(load_config({str(config)!r})))"],
        cwd=source, env=env, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    (root / "workspace.yaml").write_text(yaml.safe_dump({"load_from": [{"python_module": {
        "module_name": "maint_assets.definitions", "working_directory": str(source)}}]}))
    return root, {**env, "DAGSTER_HOME": home}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def all_compacted(root: Path, tables: int) -> bool:
    """Whether every table holds one data file (pyiceberg); a table being committed to reads as not yet."""
    from icemaint.config import load_config
    from icemaint.observe.catalog import CatalogReader

    reader = CatalogReader(load_config(str(root / "icemaint.yaml")))
    try:
        return all(len(reader.load(f"ice.t{i:03d}").inspect.files()) == 1 for i in range(tables))
    except Exception:
        return False


def measure(label: str, source: Path, seed: Path, tables: int) -> dict:
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    from benchmarks.versions import describe_source

    root, env = prepare(label, source, seed)
    if label == "after":  # the version with the JVM class archive: recorded before its runs, not by one of them
        log(f"{label}: {ready_class_archive(root / 'icemaint.yaml', env)}")
    started = time.time()
    with open(root / "daemon.log", "w") as out:
        proc = subprocess.Popen([daemon_executable(), "run", "-w", "workspace.yaml"], cwd=root, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            done_at = None
            while time.time() - started < TIMEOUT_S:
                if proc.poll() is not None:
                    raise RuntimeError(f"{label}: dagster-daemon exited {proc.returncode} (see {root / 'daemon.log'})")
                runs = instance.get_run_records(RunsFilter(job_name="compaction_job"))
                failed = [r for r in runs if r.dagster_run.status in (DagsterRunStatus.FAILURE,
                                                                       DagsterRunStatus.CANCELED)]
                if failed:
                    raise RuntimeError(f"{label}: compaction run {failed[0].dagster_run.run_id} "
                                       f"{failed[0].dagster_run.status.value} (see {root / 'daemon.log'})")
                finished = runs and all(r.dagster_run.status == DagsterRunStatus.SUCCESS for r in runs)
                if finished and all_compacted(root, tables):
                    done_at = time.time()
                    break
                time.sleep(1.0)
            if done_at is None:
                raise RuntimeError(f"{label}: not every table compacted within {TIMEOUT_S} s")
            runs = instance.get_run_records(RunsFilter(job_name="compaction_job"))
    finally:
        stop(proc)
    check_estate(root, tables, FILES, ROWS)
    spans = [(r.start_time, r.end_time) for r in runs]
    return {"label": label, "source": describe_source(source), "runs": len(runs),
            "tables_per_run": sorted(len((r.dagster_run.tags.get("icemaint/tables") or "x").split(",")) for r in runs),
            "runs_span_seconds": round(max(e for _, e in spans) - min(s for s, _ in spans), 2),
            "run_seconds_sum": round(sum(e - s for s, e in spans), 2),
            "first_run_created_seconds": round(min(r.create_timestamp.timestamp() for r in runs) - started, 2),
            "catch_up_seconds": round(done_at - started, 2)}


def render(result: dict) -> str:
    by = {m["label"]: m for m in result["measurements"]}
    before, after = by["before"], by["after"]
    lines = [SECTION, "",
             f"- Date: {result['date']}; command: `{result['command']}`; machine: {result['machine']}; load average "
             f"at the start {result['load_start']}, at the end {result['load_end']}.",
             f"- Estate: {result['tables']} tables (Hadoop catalog), each one date of {FILES} small files ({ROWS} rows "
             "each, one Spark write), a fresh copy per version. Each version: `dagster-daemon run` on its own code "
             "with the project's instance settings (`max_runs_total` 2) and nobody calling anything; the figures "
             "come from the instance's run records. Every table afterwards holds one file on the date and exactly "
             "its rows (pyiceberg).",
             f"- Before: commit `{before['source']['commit'][:9]}` ({before['source']['subject']}), a temporary git "
             f"worktree. After: commit `{after['source']['commit'][:9]}`"
             + (" with uncommitted changes" if after["source"]["uncommitted_changes"] else "") + ".", "",
             "| version | compaction runs | tables per run | runs' span (first start to last end) | runs' wall summed "
             "| first run requested | daemon start to all compacted |", "|---|---|---|---|---|---|---|"]
    for m in (before, after):
        lines.append(f"| {m['label']} | {m['runs']} | {', '.join(map(str, m['tables_per_run']))} | "
                     f"{m['runs_span_seconds']:.1f} s | {m['run_seconds_sum']:.1f} s | "
                     f"{m['first_run_created_seconds']:.0f} s | {m['catch_up_seconds']:.1f} s |")
    lines += ["", f"- The runs' span: {before['runs_span_seconds'] / after['runs_span_seconds']:.2f}x shorter after; "
              f"the catch-up {before['catch_up_seconds'] / after['catch_up_seconds']:.2f}x. The catch-up also holds "
              "what both versions share: the discovery sensor's health run per table (each a process of its own, "
              "queued before the compactions) and the queue's polling.",
              "- Why: each run under the daemon is a process of its own (Python, Dagster, a JVM and Spark's start) "
              "before its first table; joined, that start is paid once per run, two runs at once (the queue's cap)."]
    if result.get("note"):
        lines.append(f"- {result['note']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.daemon_catchup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=12)
    parser.add_argument("--before", default=BEFORE, help="the commit measured as before (a temporary worktree)")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--note", default="", help="a line for the section (e.g. what changed since the last run)")
    parser.add_argument("--from-results", metavar="JSON",
                        help="only render the section from a previous run's figures (benchmarks/.work/daemon/results.json)")
    args = parser.parse_args(argv)
    from benchmarks.machine import describe_machine, load_average
    from benchmarks.stack_bench import write_section
    from benchmarks.versions import checkout

    if args.from_results:
        result = json.loads(Path(args.from_results).read_text())
        result["note"] = args.note or result.get("note", "")
        write_section(Path(args.out), render(result), SECTION)
        return 0

    machine = describe_machine()
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join(["python", "-m", "benchmarks.daemon_catchup",
                                     *(argv if argv is not None else sys.argv[1:])]),
              "machine": f"{machine['cores']} cores, {machine['cpu_model']}", "load_start": load_average(),
              "tables": args.tables, "note": args.note, "measurements": []}
    seed = WORK / "seed"
    shutil.rmtree(seed, ignore_errors=True)
    seed.mkdir(parents=True)
    log(f"writing {args.tables} tables x {FILES} files")
    build_estate(seed, args.tables, FILES, ROWS)
    with checkout(args.before) as before_source:
        for label, source in (("before", before_source), ("after", REPO)):
            m = measure(label, source, seed, args.tables)
            log(f"{label}: {m['runs']} runs, span {m['runs_span_seconds']:.1f} s, catch-up {m['catch_up_seconds']:.1f} s")
            result["measurements"].append(m)
    result["load_end"] = load_average()
    (WORK / "results.json").write_text(json.dumps(result, indent=1))
    write_section(Path(args.out), render(result), SECTION)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
