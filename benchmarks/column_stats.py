"""Column statistics: icemaint's against Iceberg's `compute_table_stats` procedure, quiet and under a writer.

    python -m benchmarks.column_stats [--reps 3] [--files 40] [--rows-per-file 125000] [--out benchmarks/RESULTS.md]
                                      [--note TEXT]

Both write one Puffin file of theta sketches (Iceberg's own `ThetaSketchAgg`, one Spark job over the snapshot's
columns) and commit it to the table's metadata. The difference is the commit: the procedure commits once against
the table as it loaded it before its job; icemaint commits against the table as it is then, again after a writer's
commit (`icemaint/engine/statistics.py`). Measured in one warm Spark session (local[2], Hadoop catalog) on one
table of the simulator's five columns:

- quiet: the two interleaved, `--reps` each, on the same snapshot (each replaces the other's file for it);
- the estimates: each column's `ndv` from both files against Spark's exact `count(DISTINCT)`;
- under a writer: a thread appending one small file every 0.5 s (an INSERT through the same session, no claim)
  while each computes the statistics of the snapshot `main` points at, `--reps` times each: how many commit, the
  writer's commits during each, and every writer row in the table afterwards (Spark's count against its ledger);
- the CLI: one `icemaint statistics TABLE --force` in a fresh process (Python, Dagster, the JVM), quiet.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics as stats
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "column_stats"
SECTION = "## Column statistics: against Iceberg's compute_table_stats"
WRITER_INTERVAL_S = 0.5
WRITER_ID_BASE = 10**13  # far above every written id


def log(message: str) -> None:
    print(f"[column-stats {dt.datetime.now():%H:%M:%S}] {message}", flush=True)


class Writer(threading.Thread):
    """Appends one row group (one small file) every `interval` seconds through `spark` until stopped; a ledger of
    how many rows it committed."""

    def __init__(self, spark, table_sql: str, interval: float = WRITER_INTERVAL_S, rows: int = 100):
        super().__init__(name="bench-writer", daemon=True)
        self.spark, self.table_sql, self.interval, self.rows = spark, table_sql, interval, rows
        self.stop = threading.Event()
        self.commits, self.committed_rows, self.failures = 0, 0, []
        self._next = WRITER_ID_BASE

    def run(self) -> None:
        while not self.stop.is_set():
            start = self._next
            try:
                self.spark.sql(
                    f"INSERT INTO {self.table_sql} SELECT id AS event_id, CAST(id % 1000 AS INT) AS device_id, "
                    f"TIMESTAMP '2026-01-02 12:00:00' AS ts, CAST(id AS DOUBLE) AS reading, 'late' AS status "
                    f"FROM range({start}, {start + self.rows}, 1, 1)")
                self._next += self.rows
                self.commits += 1
                self.committed_rows += self.rows
            except Exception as exc:  # a conflict is retried by the next append with new ids
                self.failures.append(str(exc).splitlines()[0][:200])
            self.stop.wait(self.interval)


def _ndv_of(jtable, snapshot_id: int) -> dict[str, int]:
    schema = jtable.schema()
    for f in jtable.statisticsFiles():
        if int(f.snapshotId()) == int(snapshot_id):
            return {str(schema.findColumnName(int(b.fields().get(0)))): int(b.properties().get("ndv"))
                    for b in f.blobMetadata()}
    return {}


def measure(reps: int, files: int, rows_per_file: int) -> dict:
    import yaml

    from benchmarks.lake import SmallFileLayout, build_small_file_table, current_snapshot_id
    from benchmarks.machine import CpuShare, describe_machine, load_average
    from benchmarks.run import DATE, config_doc, make_config
    from icemaint.domain.names import TableName
    from icemaint.engine.retention import RetentionConflict
    from icemaint.engine.spark_session import get_spark, iceberg_table
    from icemaint.engine.statistics import compute_statistics

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    config_path = WORK / "icemaint.yaml"
    config_path.write_text(yaml.safe_dump(config_doc(WORK, "local[2]"), sort_keys=False))
    started_load = load_average()
    spark = get_spark(make_config(WORK, "local[2]"))
    machine = describe_machine(spark)
    table = TableName(("bench",), "column_stats")
    table_sql = table.sql("lake")
    layout = SmallFileLayout(files=files, rows_per_file=rows_per_file, commits=4, date=DATE)
    built = build_small_file_table(spark, "lake", table, layout)
    snapshot = built["snapshot_id"]
    rows = int(spark.sql(f"SELECT count(*) AS n FROM {table_sql}").first()["n"])
    log(f"built {rows:,} rows in {built['table_files']} files ({built['seconds']:.1f} s)")

    def ours(snapshot_id: int) -> dict:
        result = compute_statistics(spark, "lake", table, snapshot_id, max_attempts=4)
        return {"attempts": result.attempts, "ndv": result.ndv}

    def procedure(snapshot_id: int) -> dict:
        spark.sql(f"CALL `lake`.system.compute_table_stats(table => {table.procedure_arg()}, "
                  f"snapshot_id => {int(snapshot_id)})").collect()
        return {"attempts": 1, "ndv": _ndv_of(iceberg_table(spark, "lake", table), snapshot_id)}

    contenders = {"icemaint": ours, "procedure": procedure}
    for fn in contenders.values():  # warm-up: the JIT and the sketch classes, once each
        fn(snapshot)
    quiet: dict[str, list[float]] = {name: [] for name in contenders}
    estimates: dict[str, dict] = {}
    with CpuShare() as quiet_cpu:
        for rep in range(reps):
            for name in (("icemaint", "procedure") if rep % 2 == 0 else ("procedure", "icemaint")):
                started = time.perf_counter()
                done = contenders[name](snapshot)
                quiet[name].append(time.perf_counter() - started)
                estimates[name] = done["ndv"]
                log(f"quiet {rep + 1}/{reps} {name}: {quiet[name][-1]:.2f} s")
    exact_row = spark.sql(f"SELECT {', '.join(f'count(DISTINCT {c}) AS {c}' for c in estimates['icemaint'])} "
                          f"FROM {table_sql} VERSION AS OF {int(snapshot)}").first()
    exact = {c: int(exact_row[c]) for c in estimates["icemaint"]}

    busy: dict[str, list[dict]] = {name: [] for name in contenders}
    writer = Writer(spark, table_sql)
    before_rows = rows
    with CpuShare() as busy_cpu:
        writer.start()
        try:
            time.sleep(2 * WRITER_INTERVAL_S)
            for rep in range(reps):
                for name in (("icemaint", "procedure") if rep % 2 == 0 else ("procedure", "icemaint")):
                    at = current_snapshot_id(spark, "lake", table)
                    commits_before, started = writer.commits, time.perf_counter()
                    try:
                        done = contenders[name](at)
                        outcome = {"committed": True, "attempts": done["attempts"]}
                    except RetentionConflict as exc:
                        outcome = {"committed": False, "error": str(exc).splitlines()[0][:200]}
                    except Exception as exc:  # the procedure's commit failure comes back as a Py4J error
                        outcome = {"committed": False, "error": _java_line(exc)}
                    outcome.update(seconds=round(time.perf_counter() - started, 2),
                                   writer_commits=writer.commits - commits_before)
                    busy[name].append(outcome)
                    log(f"under the writer {rep + 1}/{reps} {name}: {outcome}")
        finally:
            writer.stop.set()
            writer.join(timeout=60)
    after_rows = int(spark.sql(f"SELECT count(*) AS n FROM {table_sql}").first()["n"])
    spark.stop()

    icemaint = str(Path(sys.executable).parent / "icemaint")
    started = time.perf_counter()
    proc = subprocess.run([icemaint, "--config", str(config_path), "statistics", table.key, "--force", "--json"],
                          capture_output=True, text=True)
    cli_seconds = time.perf_counter() - started
    cli = json.loads(proc.stdout) if proc.returncode == 0 else {"error": (proc.stdout + proc.stderr)[-400:]}
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "reps": reps,
            "machine": machine, "load_start": started_load, "load_end": load_average(),
            "rows": rows, "files": built["table_files"], "columns": list(estimates["icemaint"]),
            "quiet": quiet, "quiet_cpu": quiet_cpu.result, "estimates": estimates, "exact": exact,
            "busy": busy, "busy_cpu": busy_cpu.result, "writer": {
                "commits": writer.commits, "rows": writer.committed_rows, "failures": writer.failures[:5],
                "failed": len(writer.failures)},
            "rows_after": after_rows, "rows_expected_after": before_rows + writer.committed_rows,
            "cli": {"seconds": round(cli_seconds, 2), "returncode": proc.returncode, "outcome": cli}}


def _java_line(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    if java is not None:  # the message up to the metadata file's path
        message = str(java.getMessage() or "").splitlines()[0].split(": /")[0].split(": file:")[0]
        return f"{java.getClass().getName().rsplit('.', 1)[-1]}: {message[:200]}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def render(r: dict, note: str = "") -> str:
    m = r["machine"]
    ours, theirs = stats.median(r["quiet"]["icemaint"]), stats.median(r["quiet"]["procedure"])
    lines = [SECTION, "",
             f"- Date: {r['date']}; command: `python -m benchmarks.column_stats`; machine: {m.get('cores')} cores, "
             f"{m.get('cpu_model')}, Spark {m.get('spark')}, Iceberg {m.get('iceberg')}; load average at the start "
             f"{r['load_start']}, at the end {r['load_end']}; other processes used "
             f"{r['quiet_cpu'].get('others_average_cores', '?')} cores on average while the quiet runs ran, "
             f"{r['busy_cpu'].get('others_average_cores', '?')} under the writer.",
             f"- One table (Hadoop catalog, `days(ts)`), {r['rows']:,} rows in {r['files']} files, the simulator's "
             f"columns ({', '.join(r['columns'])}); one warm Spark session (local[2]), each contender warmed up "
             "once. Both write one Puffin file of Iceberg's theta sketches in one Spark job and commit it; the "
             "procedure commits against the table it loaded before its job, icemaint against the table as it is at "
             "the commit, again after a writer's commit (up to 4 attempts).", "",
             "| contender | quiet: wall (median) | each run | under a writer: committed | its commits during each run |",
             "|---|---|---|---|---|"]
    for name, label in (("icemaint", "icemaint (`compute_statistics`)"),
                        ("procedure", "`CALL system.compute_table_stats`")):
        runs = r["busy"][name]
        committed = sum(1 for x in runs if x["committed"])
        lines.append(f"| {label} | {stats.median(r['quiet'][name]):.2f} s | "
                     f"{', '.join(f'{s:.2f}' for s in r['quiet'][name])} | {committed} of {len(runs)} | "
                     f"{', '.join(str(x['writer_commits']) for x in runs)} |")
    lines += ["", "| column | exact distinct | icemaint's ndv | the procedure's ndv |", "|---|---|---|---|"]
    for column in r["columns"]:
        e = r["exact"][column]
        cells = []
        for name in ("icemaint", "procedure"):
            v = r["estimates"].get(name, {}).get(column)
            cells.append("-" if v is None else f"{v:,} ({(v - e) / e * 100:+.1f}%)" if e else f"{v:,}")
        lines.append(f"| {column} | {e:,} | {cells[0]} | {cells[1]} |")
    failures = sorted({x["error"] for x in r["busy"]["procedure"] if not x["committed"]})
    ours_failed = [x for x in r["busy"]["icemaint"] if not x["committed"]]
    attempts = [x.get("attempts", 0) for x in r["busy"]["icemaint"] if x["committed"]]
    lines += ["",
              f"- Quiet: icemaint {ours:.2f} s against the procedure's {theirs:.2f} s ({ours / theirs:.2f}x): the "
              "same job and file; icemaint also loads the table once more to commit on top of it.",
              f"- Under a writer appending every {WRITER_INTERVAL_S:g} s (no claim; {r['writer']['commits']} commits, "
              f"{r['writer']['failed']} of its appends failed): icemaint committed "
              f"{len(r['busy']['icemaint']) - len(ours_failed)} of {len(r['busy']['icemaint'])}"
              + (f" (commit attempts {', '.join(map(str, attempts))})" if attempts else "")
              + f", the procedure {sum(1 for x in r['busy']['procedure'] if x['committed'])} of "
              f"{len(r['busy']['procedure'])}" + (f": {'; '.join(failures)}" if failures else "") + ".",
              f"- Rows after the writer: {r['rows_after']:,} of {r['rows_expected_after']:,} (the table's "
              f"{r['rows']:,} and the writer's {r['writer']['rows']:,}), Spark's count.",
              f"- The CLI, `icemaint statistics TABLE --force` in a fresh process (quiet, on the table as the writer "
              f"left it): {r['cli']['seconds']:.2f} s, exit {r['cli']['returncode']}.", ""]
    if note:
        lines += [f"> {note}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.stack_bench import write_section

    parser = argparse.ArgumentParser(prog="python -m benchmarks.column_stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--rows-per-file", type=int, default=125_000)
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    results = measure(args.reps, args.files, args.rows_per_file)
    (WORK / "results.json").write_text(json.dumps(results, indent=1))
    if results["rows_after"] != results["rows_expected_after"]:
        raise SystemExit(f"rows afterwards {results['rows_after']} != {results['rows_expected_after']} expected")
    if results["cli"]["returncode"] != 0:
        raise SystemExit(f"icemaint statistics failed: {results['cli']['outcome']}")
    write_section(Path(args.out), render(results, args.note), SECTION)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
