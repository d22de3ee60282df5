"""A maintenance run in a process of its own (Dagster's default launcher: a fresh process and JVM per run) against
the same run in a warm long-lived process (`icemaint serve`'s way: every run in one process, one JVM), side by side
on identical copies of one estate (issue 50, item 3: "say and measure what a deployment gets").

    python -m benchmarks.warm_vs_per_run [--tables 8] [--warm-up 3] [--files 100] [--rows 100]
                                         [--out benchmarks/RESULTS.md] [--from-results JSON]

The estate (`benchmarks.concurrent_tick.build_estate`: a Hadoop catalog, tables of one date of `--files` small
files) is built once and copied twice. *Per run*: `icemaint compact TABLE --date D --json` in a fresh process for
each table-date, which executes the same Dagster job in its own process as Dagster's DefaultRunLauncher's `dagster
api execute_run` does (the launcher adds its own code-location load, so this is the cheaper side of a real
launch). *Warm*: one Python process holding a `MaintenanceRunner` (the Dagster instance and definitions) and a Spark
session, as `serve` does, warmed on `--warm-up` tables that are not counted, then compacting the same table-dates
with `runner.compact` (`job.execute_in_process`, as a tick's runs). The two alternate table by table (which goes
first alternates too), so both meet the same machine load. Per table-date: wall time, and CPU time of the Python
process and of its JVM, read from /proc (a fresh process's JVM is followed until it exits). Every table afterwards
holds one file and exactly its rows (pyiceberg).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.concurrent_tick import DATE, build_estate, check_estate, write_config
from benchmarks.jvm_archive import ready as ready_class_archive
from benchmarks.machine import describe_machine, load_average
from benchmarks.stack_bench import write_section

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "warm_vs_per_run"
SECTION = "## A run per process against runs in one warm process (Dagster's default launcher against `serve`)"
TICK = os.sysconf("SC_CLK_TCK")

WARM = """
import json, os, sys, time
from icemaint.app.runner import MaintenanceRunner
from icemaint.config import load_config
from icemaint.engine.spark_session import get_spark

def cpu(pid):
    text = open(f"/proc/{pid}/stat").read()
    rest = text[text.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")

config = load_config(sys.argv[1])
runner = MaintenanceRunner(config, sys.argv[1])
spark = get_spark(config)
jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())
print(json.dumps({"ready": True, "jvm_pid": jvm}), flush=True)
for line in sys.stdin:
    table, date = line.split()
    py0, jvm0, t0 = cpu(os.getpid()), cpu(jvm), time.perf_counter()
    report = runner.compact(table, date)
    wall = time.perf_counter() - t0
    outcome = dict(report.outcome)
    print(json.dumps({"table": table, "wall": wall, "cpu_python": cpu(os.getpid()) - py0, "cpu_jvm": cpu(jvm) - jvm0,
                      "published": bool(outcome.get("published")), "durations": outcome.get("durations", {}),
                      "error": report.error}), flush=True)
"""


def log(message: str) -> None:
    print(f"[warm-vs-run {dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {message}", flush=True)


def _cpu(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _children() -> dict[int, list[int]]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _cpu(int(entry))):
            parents.setdefault(found[0], []).append(int(entry))
    return parents


def run_followed(cmd: list[str], env: dict) -> tuple[subprocess.CompletedProcess, float, dict[str, float]]:
    """Runs `cmd`; its wall time and the CPU seconds of it and every process under it (its JVM followed after the
    Python process exits, until the JVM does: nobody reaps it, so its time never reaches rusage)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, float] = {}
    names: dict[int, str] = {}
    rescan = 0.0
    while proc.poll() is None:
        if time.monotonic() >= rescan:
            rescan, todo, tree = time.monotonic() + 0.5, [proc.pid], _children()
            while todo:
                pid = todo.pop()
                try:  # read again each time: spark-submit's shell becomes the JVM by exec, under the same pid
                    names[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    names.setdefault(pid, "?")
                todo.extend(tree.get(pid, []))
        for pid in list(names):
            if (found := _cpu(pid)) is not None:
                seen[pid] = found[1]
        time.sleep(0.1)
    wall = time.perf_counter() - started
    out, err = proc.communicate()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the JVM outlives its Python process by a moment
        alive = False
        for pid in names:
            if pid != proc.pid and (found := _cpu(pid)) is not None:
                seen[pid], alive = found[1], True
        if not alive:
            break
        time.sleep(0.1)
    cpu = {"cpu_jvm": sum(s for pid, s in seen.items() if names.get(pid) == "java"),
           "cpu_python": sum(s for pid, s in seen.items() if names.get(pid) != "java")}
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), wall, cpu


def answer(warm: subprocess.Popen) -> dict:
    """The warm process's next JSON line (anything else it prints is passed over)."""
    assert warm.stdout is not None
    while line := warm.stdout.readline():
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"the warm process exited ({warm.wait()})")


def measure(args) -> dict:
    shutil.rmtree(WORK, ignore_errors=True)
    seed = WORK / "seed"
    seed.mkdir(parents=True)
    total = args.tables + args.warm_up
    log(f"estate: {total} tables of one date of {args.files} files, {args.rows} rows each")
    build_estate(seed, total, args.files, args.rows)
    roots = {}
    for side in ("per_run", "warm"):
        roots[side] = WORK / side
        roots[side].mkdir()
        shutil.copytree(seed / "wh", roots[side] / "wh")
        write_config(roots[side], 1)
    env = {**os.environ, "ICEMAINT_IDENTITY": "benchmark"}
    archive = ready_class_archive(roots["per_run"] / "icemaint.yaml", env)
    log(f"class archive: {archive}")
    icemaint = str(Path(sys.executable).parent / "icemaint")
    warm = subprocess.Popen([sys.executable, "-c", WARM, str(roots["warm"] / "icemaint.yaml")], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert warm.stdin is not None and warm.stdout is not None
    hello = answer(warm)
    tables = [f"ice.t{i:03d}" for i in range(total)]
    for table in tables[args.tables:]:
        warm.stdin.write(f"{table} {DATE}\n")
        warm.stdin.flush()
        log(f"warm-up {table}: {answer(warm)['wall']:.2f}s")
    load_before, rows = load_average(), []
    for i, table in enumerate(tables[:args.tables]):
        entry: dict = {"table": table, "load1": os.getloadavg()[0], "first": "per_run" if i % 2 == 0 else "warm"}
        for side in (("per_run", "warm") if i % 2 == 0 else ("warm", "per_run")):
            if side == "warm":
                warm.stdin.write(f"{table} {DATE}\n")
                warm.stdin.flush()
                entry["warm"] = answer(warm)
            else:
                done, wall, cpu = run_followed([icemaint, "--config", str(roots["per_run"] / "icemaint.yaml"),
                                                "compact", table, "--date", DATE, "--json"], env)
                try:
                    outcome = json.loads(done.stdout)[0]
                except (ValueError, IndexError):
                    raise SystemExit(f"icemaint compact {table} failed ({done.returncode}): {done.stderr[-1500:]}") from None
                entry["per_run"] = {"wall": wall, **cpu, "published": bool(outcome.get("published")),
                                    "durations": outcome.get("durations", {}), "returncode": done.returncode}
        log(f"{table}: per run {entry['per_run']['wall']:.2f}s wall, "
            f"{entry['per_run']['cpu_python'] + entry['per_run']['cpu_jvm']:.1f} CPU s; warm "
            f"{entry['warm']['wall']:.2f}s, {entry['warm']['cpu_python'] + entry['warm']['cpu_jvm']:.2f} CPU s; "
            f"load {entry['load1']:.2f}")
        rows.append(entry)
    warm.stdin.close()
    warm.wait(timeout=120)
    for side in ("per_run", "warm"):
        check_estate(roots[side], total if side == "warm" else args.tables, args.files, args.rows)
    return {"rows": rows, "tables": args.tables, "warm_up": args.warm_up, "files": args.files, "rows_per_file":
            args.rows, "warm_jvm_pid": hello["jvm_pid"], "class_archive": archive, "load_before": load_before,
            "load_after": load_average(), "machine": describe_machine(),
            "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes")}


def median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return (values[n // 2] + values[(n - 1) // 2]) / 2


def render(result: dict) -> str:
    rows, m = result["rows"], result["machine"]

    def med(side: str, key: str) -> float:
        if key == "cpu":
            return median([r[side]["cpu_python"] + r[side]["cpu_jvm"] for r in rows])
        if key.endswith("_seconds"):
            return median([r[side]["durations"].get(key, 0.0) for r in rows])
        return median([r[side][key] for r in rows])

    def pair_ratio(key: str) -> str:
        def value(r: dict, side: str) -> float:
            return r[side]["cpu_python"] + r[side]["cpu_jvm"] if key == "cpu" else r[side][key]

        return f"{median([value(r, 'per_run') / value(r, 'warm') for r in rows]):.1f}x"

    lines = [f"| wall time | {med('per_run', 'wall'):.2f} s | {med('warm', 'wall'):.2f} s | "
             f"{med('per_run', 'wall') / med('warm', 'wall'):.1f}x (pairs: {pair_ratio('wall')}) |",
             f"| CPU (the Python process and its JVM) | {med('per_run', 'cpu'):.2f} s | {med('warm', 'cpu'):.2f} s | "
             f"{med('per_run', 'cpu') / med('warm', 'cpu'):.1f}x (pairs: {pair_ratio('cpu')}) |"]
    for label, key in (("of the wall: the contract's run (audit total)", "total_seconds"),
                       ("of which plan", "plan_seconds"), ("of which rewrite (stage)", "rewrite_seconds"),
                       ("of which proof", "validation_seconds"), ("of which publish", "publish_seconds")):
        cold, warm = med("per_run", key), med("warm", key)
        lines.append(f"| {label} | {cold:.2f} s | {warm:.2f} s | {cold / warm:.1f}x |" if warm else
                     f"| {label} | {cold:.2f} s | {warm:.2f} s | - |")
    loads = [r["load1"] for r in rows]
    published = {side: sum(1 for r in rows if r[side]["published"]) for side in ("per_run", "warm")}
    return "\n".join([
        SECTION, "",
        f"- Date: {result['when']}; command: `make bench-warm-vs-run` (`python -m benchmarks.warm_vs_per_run`); "
        f"machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu_model']}; Spark {m['spark']} local[2], "
        f"`spark.driver.memory` 3g; load average {result['load_before']} at the start, {result['load_after']} at the "
        f"end, the 1-minute load {min(loads):.2f}-{max(loads):.2f} at the table-dates' starts (the two sides' own "
        "processes count in it). Read the ratios, each from a pair run back to back.",
        f"- Estate: {result['tables']} tables (Hadoop catalog) of one date of {result['files']} small files "
        f"({result['rows_per_file']} rows each), two identical copies. *Per run*: `icemaint compact TABLE --date D` "
        "in a fresh process per table-date (the same Dagster job, executed in its own process with its own JVM, as "
        "Dagster's default run launcher does; the launcher's own code-location load comes on top). *Warm*: one "
        "process with the Dagster instance, the definitions and a Spark session, warmed on "
        f"{result['warm_up']} other tables, running the same jobs in process (`serve`'s ticks). The two alternate "
        f"table by table; JVM class archive: {result['class_archive']}. Published: {published['per_run']} / "
        f"{published['warm']} of {len(rows)}; every table afterwards one file holding exactly its rows (pyiceberg).",
        "",
        "| per table-date (median) | a process per run | warm process | per run / warm (the median of each pair's "
        "ratio) |",
        "|---|---|---|---|", *lines, "",
        "- What a deployment gets from each: docs/operations/serve.md (`serve` or a process per run), with the "
        "trade-offs (isolation and a crash's blast radius against the per-run start).", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_vs_per_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=8, help="table-dates measured on each side (default 8)")
    parser.add_argument("--warm-up", type=int, default=3, help="table-dates the warm process runs first, uncounted")
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--from-results", metavar="JSON", help="only render the section from a previous run's JSON")
    args = parser.parse_args(argv)
    if args.from_results:
        result = json.loads(Path(args.from_results).read_text())
    else:
        result = measure(args)
        out = HERE / "results" / f"warm_vs_per_run_{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    section = render(result)
    write_section(Path(args.out), section, SECTION)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
