"""An estate catch-up with tables' runs at once against one at a time: `icemaint tick --until-idle` with
`max_runs_total` 1 and N, on identical copies of one estate (issue 20, item 2).

    python -m benchmarks.concurrent_tick [--tables 20] [--files 100] [--rows 100] [--runs 1,2,4] [--reps 2]
                                         [--out benchmarks/RESULTS.md] [--note TEXT] [--from-results JSON]

The estate (a Hadoop catalog, the embedded default): `--tables` tables, each one date of `--files` small
files written by Spark in one commit, is built once under benchmarks/.work/concurrent/ and copied afresh
before every measured tick, so each starts from the same tables. Each setting runs `icemaint tick
--until-idle` in a fresh process (its JVM included), settings interleaved and alternated from repetition to
repetition. Afterwards every table must hold one file on the date and exactly its rows (count and sum of
ids, read by pyiceberg, an independent reader); a failure stops the benchmark.

The peer and nightly benchmarks run on one SQLite catalog, which takes one writer at a time, so their ticks
run one table at a time (`CatalogConfig.concurrent_commits`): this is where the concurrent tick is measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.jvm_archive import ready as ready_class_archive

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "concurrent"
SECTION = "## Tables at once: the tick's runs of different tables on one Spark session"
DATE = "2026-01-01"


def log(message: str) -> None:
    print(f"[concurrent {dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def config_doc(root: Path, runs: int) -> dict:
    return {"catalog": {"name": "local", "type": "hadoop", "warehouse": str(root / "wh")},
            "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
                                                     "spark.driver.memory": "3g"}},
            "state_dir": str(root / "state"), "claims": {"backend": "file"}, "audit": {"sink": "file"},
            "scope": {"include": ["ice.*"], "exclude": []}, "max_runs_total": runs,
            "defaults": {"writer_idle": "0s", "hot_partition_age": "0s", "claim_wait": "0s",
                         "target_file_size_bytes": "128MiB", "min_input_files": 2, "max_rewrite_bytes": "100GiB",
                         "allowed_operations": ["compact"]}}


def write_config(root: Path, runs: int) -> Path:
    import yaml

    path = root / "icemaint.yaml"
    path.write_text(yaml.safe_dump(config_doc(root, runs), sort_keys=False))
    return path


def build_estate(seed: Path, tables: int, files: int, rows: int) -> None:
    """`tables` tables of one date of `files` files (one Spark write each: no shuffle, one file a task)."""
    code = f"""
from icemaint.config import load_config
from icemaint.engine.spark_session import get_spark
spark = get_spark(load_config({str(write_config(seed, 1))!r}))
for i in range({tables}):
    t = f"local.ice.t{{i:03d}}"
    spark.sql(f"CREATE TABLE {{t}} (event_id BIGINT, device_id INT, ts TIMESTAMP_NTZ, reading DOUBLE, status STRING) "
              "USING iceberg PARTITIONED BY (days(ts)) TBLPROPERTIES ('write.distribution-mode'='none')")
    spark.range(0, {files * rows}, 1, {files}).selectExpr(
        "id AS event_id", "CAST(id % 97 AS INT) AS device_id",
        "TIMESTAMP_NTZ '{DATE} 00:00:00' + make_dt_interval(0, 0, 0, (id * 37) % 86400) AS ts",
        "id * 0.5 AS reading", "element_at(array('ok', 'warn', 'err'), CAST(id % 3 AS INT) + 1) AS status"
    ).writeTo(t).append()
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True)


def check_estate(root: Path, tables: int, files: int, rows: int) -> None:
    """Every table: one data file, ids 0..n-1 each once (count and sum), read by pyiceberg."""
    from icemaint.config import load_config
    from icemaint.observe.catalog import CatalogReader

    reader = CatalogReader(load_config(str(root / "icemaint.yaml")))
    n = files * rows
    for i in range(tables):
        table = reader.load(f"ice.t{i:03d}")
        ids = table.scan().to_arrow().column("event_id")
        data_files = len(table.inspect.files())
        if len(ids) != n or sum(ids.to_pylist()) != n * (n - 1) // 2 or data_files != 1:
            raise RuntimeError(f"ice.t{i:03d}: {len(ids)} rows, {data_files} files after the tick (want {n}, 1)")


def measure(seed: Path, runs: int, tables: int, files: int, rows: int) -> dict:
    root = WORK / f"runs_{runs}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copytree(seed / "wh", root / "wh")
    config = write_config(root, runs)
    env = {**os.environ, "ICEMAINT_IDENTITY": "benchmark"}
    ready_class_archive(config, env)  # no timed tick records the JVM class archive
    started = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "icemaint"), "--config", str(config), "tick",
                           "--until-idle", "--json"], env=env, capture_output=True, text=True, cwd=root)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"tick with max_runs_total {runs} exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
    reports = json.loads(proc.stdout)
    published = sum(1 for r in reports for d in r["decisions"] if d.get("published"))
    if published != tables:
        raise RuntimeError(f"max_runs_total {runs}: {published} of {tables} table-dates published")
    check_estate(root, tables, files, rows)
    return {"runs": runs, "seconds": round(seconds, 2), "ticks": len(reports)}


def render(result: dict) -> str:
    by = {}
    for m in result["measurements"]:
        by.setdefault(m["runs"], []).append(m["seconds"])
    base = statistics.median(by[1])
    lines = [SECTION, "",
             f"- Date: {result['date']}; command: `{result['command']}`; machine: {result['machine']}; load average "
             f"at the start {result['load_start']}, at the end {result['load_end']}.",
             f"- Estate: {result['tables']} tables (Hadoop catalog), each one date of {result['files']} small files "
             f"({result['rows']} rows each, one Spark write); `icemaint tick --until-idle` in a fresh process per "
             "measurement (JVM start included) on a fresh copy, settings interleaved; afterwards every table holds "
             "one file on the date and exactly its rows (pyiceberg).", "",
             "| max_runs_total | wall (median) | each measurement | / one at a time |", "|---|---|---|---|"]
    for runs in sorted(by):
        med = statistics.median(by[runs])
        lines.append(f"| {runs} | {med:.1f} s | {', '.join(f'{s:.1f} s' for s in by[runs])} | {med / base:.2f}x |")
    best = min(by, key=lambda r: statistics.median(by[r]))
    gain = base / statistics.median(by[best])
    fastest = (f"- Fastest: {best} at once, {gain:.2f}x the speed of one at a time. " if best != 1 and gain >= 1.05 else
               "- No setting beat one at a time by more than 5% (the measurements' noise here). ")
    lines += ["", fastest + f"On {result['machine'].split(' cores')[0]} cores the runs of small tables share the two "
              "cores Spark's local[2] already uses; what overlaps "
              "is the driver's waiting (commits, planning, Dagster's and Great Expectations' bookkeeping). "
              "Whether a machine with more cores gains more is not measured here (this one has 2).",
              "- Catalogs that take one writer at a time (SQLite JDBC: the peer and nightly benchmarks) run one "
              "table at a time whatever `max_runs_total` says."]
    if result.get("note"):
        lines.append(f"- {result['note']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.concurrent_tick", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--runs", default="1,2,4", help="max_runs_total settings (1 is always measured)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--note", default="", help="a line for the section (e.g. what changed since the last run)")
    parser.add_argument("--from-results", metavar="JSON",
                        help="only render the section from a previous run's figures (benchmarks/.work/concurrent/results.json)")
    args = parser.parse_args(argv)
    from benchmarks.machine import describe_machine, load_average
    from benchmarks.stack_bench import write_section

    if args.from_results:
        write_section(Path(args.out), render(json.loads(Path(args.from_results).read_text())), SECTION)
        return 0

    settings = sorted({1, *(int(r) for r in args.runs.split(","))})
    machine = describe_machine()
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join(["python", "-m", "benchmarks.concurrent_tick",
                                     *(argv if argv is not None else sys.argv[1:])]),
              "machine": f"{machine['cores']} cores, {machine['cpu_model']}", "load_start": load_average(),
              "tables": args.tables, "files": args.files, "rows": args.rows, "note": args.note, "measurements": []}
    seed = WORK / "seed"
    shutil.rmtree(seed, ignore_errors=True)
    seed.mkdir(parents=True)
    log(f"writing {args.tables} tables x {args.files} files")
    build_estate(seed, args.tables, args.files, args.rows)
    for rep in range(args.reps):
        for runs in settings if rep % 2 == 0 else list(reversed(settings)):
            m = measure(seed, runs, args.tables, args.files, args.rows)
            log(f"max_runs_total {runs}: {m['seconds']:.1f} s in {m['ticks']} ticks")
            result["measurements"].append(m)
    result["load_end"] = load_average()
    (WORK / "results.json").write_text(json.dumps(result, indent=1))
    write_section(Path(args.out), render(result), SECTION)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
