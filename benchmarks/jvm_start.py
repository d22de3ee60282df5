"""One `icemaint compact` process with the JVM class archive against one without, interleaved on one table.

    python -m benchmarks.jvm_start [--reps 5] [--out benchmarks/RESULTS.md] [--note TEXT]

Every CLI command and Dagster run worker is a process that starts a JVM before its first table. The archive
(`spark.class_archive`, icemaint/engine/class_archive.py) maps Spark's and Iceberg's classes instead of loading
them one by one. The table (Hadoop catalog, one date of 100 small files of 1,000 rows) is rolled back to its
written snapshot before every run; the two settings alternate, each run a fresh process from its start to its
exit; the archive is recorded before the first timed run (`benchmarks.jvm_archive.ready`). Every run must
publish, and the table afterwards holds as many rows as were written (Spark's count).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.jvm_archive import ready

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "jvm_start"
SECTION = "## Starting a process: the JVM class archive"


def log(message: str) -> None:
    print(f"[jvm-start {dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def measure(reps: int) -> dict:
    import yaml

    from benchmarks.lake import SmallFileLayout, build_small_file_table, rollback
    from benchmarks.machine import describe_machine, load_average
    from benchmarks.run import DATE, config_doc, make_config
    from icemaint.domain.names import TableName
    from icemaint.engine.spark_session import get_spark

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    configs = {}
    for archive in (True, False):
        doc = config_doc(WORK, "local[2]")
        doc["spark"]["class_archive"] = archive
        configs[archive] = WORK / f"icemaint-{'archive' if archive else 'none'}.yaml"
        configs[archive].write_text(yaml.safe_dump(doc, sort_keys=False))
    started_load = load_average()
    spark = get_spark(make_config(WORK, "local[2]"))
    table = TableName(("bench",), "jvm_start")
    layout = SmallFileLayout(files=100, rows_per_file=1000, commits=4, date=DATE)
    written = build_small_file_table(spark, "lake", table, layout)["snapshot_id"]
    prepared = ready(configs[True])
    log(prepared)
    icemaint = str(Path(sys.executable).parent / "icemaint")
    runs: dict[bool, list[float]] = {True: [], False: []}
    for rep in range(reps):
        for archive in ((True, False) if rep % 2 == 0 else (False, True)):
            rollback(spark, "lake", table, written)
            started = time.perf_counter()
            proc = subprocess.run([icemaint, "--config", str(configs[archive]), "compact", table.key, "--date",
                                   DATE.isoformat(), "--json"], capture_output=True, text=True)
            seconds = time.perf_counter() - started
            [outcome] = json.loads(proc.stdout) if proc.returncode == 0 else [{"decision": proc.stderr[-400:]}]
            if outcome.get("decision") != "run" or not outcome.get("published"):
                raise RuntimeError(f"the compaction did not publish: {outcome}")
            runs[archive].append(seconds)
            log(f"repetition {rep + 1}/{reps}, archive {archive}: {seconds:.2f} s")
    rows = spark.sql(f"SELECT count(*) AS n, sum(event_id) AS s FROM {table.sql('lake')}").first()
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "reps": reps,
            "machine": describe_machine(spark), "load_start": started_load, "load_end": load_average(),
            "prepared": prepared, "with": runs[True], "without": runs[False], "rows": int(rows["n"]),
            "expected_rows": layout.rows + 2 * layout.neighbour_files * layout.rows_per_file}


def render(r: dict, note: str = "") -> str:
    with_s, without_s = statistics.median(r["with"]), statistics.median(r["without"])
    m = r["machine"]
    lines = [SECTION, "",
             f"- Date: {r['date']}; command: `python -m benchmarks.jvm_start`; machine: {m.get('cores')} cores, "
             f"{m.get('cpu_model')}, Java {m.get('java')}; load average at the start {r['load_start']}, at the end "
             f"{r['load_end']}. {r['prepared'].capitalize()}.",
             "- One table (Hadoop catalog), one date of 100 small files (1,000 rows each); `icemaint compact --date` "
             "in a fresh process (Python, Dagster, the JVM and its Spark session, the claim, stage, proof and "
             "publish), the table rolled back to its written snapshot before each run; the two settings alternate.",
             "", "| `spark.class_archive` | wall (median) | each run |", "|---|---|---|",
             f"| true | {with_s:.2f} s | {', '.join(f'{s:.2f}' for s in r['with'])} |",
             f"| false | {without_s:.2f} s | {', '.join(f'{s:.2f}' for s in r['without'])} |", "",
             f"- With the archive a process took {without_s - with_s:.2f} s less ({with_s / without_s:.2f}x). "
             f"Rows afterwards: {r['rows']:,} of {r['expected_rows']:,} written.", ""]
    if note:
        lines += [f"> {note}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.stack_bench import write_section

    parser = argparse.ArgumentParser(prog="python -m benchmarks.jvm_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    results = measure(args.reps)
    (WORK / "results.json").write_text(json.dumps(results, indent=1))
    if results["rows"] != results["expected_rows"]:
        raise SystemExit(f"rows afterwards {results['rows']} != {results['expected_rows']} written")
    write_section(Path(args.out), render(results, args.note), SECTION)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
