"""Layout drift: the files a filtered scan opens before and after the layout rewrite of three evolved tables.

    python -m benchmarks.layout_drift [--scale 1.0] [--out benchmarks/RESULTS.md] [--note TEXT]

Three tables (Hadoop catalog, one warm Spark session, local[2]), each left by an evolution the way real tables are:

- days -> hours: `--dates` dates of two day files each, then the spec replaced by `hours(ts)`; the query reads one
  hour of a date;
- an added sort order: one date of four files whose ids interleave, then `WRITE ORDERED BY id`; the query reads one
  id;
- a backfill: one date of two files above 1.8 x the policy's target; the query reads twenty minutes.

Each table is found by the default tick's plan (its compaction sensor's decisions, no cursor) and rewritten by the
runs it requests (stage, prove, publish, as a sensor's run). The files and bytes a filtered scan opens are counted by
pyiceberg's scan planning (partition and column-bound pruning), before and after, over several queries.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics as stats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "layout_drift"
SECTION = "## Layout drift: files a filtered scan opens before and after"
DATES = ["2026-01-02", "2026-01-03", "2026-01-04"]
PAYLOAD = "concat(" + ", ".join(["md5(CAST(rand() AS STRING))"] * 6) + ")"
MiB = 2**20


def log(message: str) -> None:
    print(f"[layout-drift {dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def insert_day(spark, target: str, day: str, rows: int, first_id: int, stride: int = 1) -> None:
    """One file of `rows` rows over the day's 24 hours, ids `first_id` + k x `stride`, in random order."""
    spark.range(first_id, first_id + rows * stride, stride).selectExpr(
        "id", f"TIMESTAMP '{day} 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, (id * 7919 % 86400)) AS ts",
        f"{PAYLOAD} AS v").orderBy("v").coalesce(1).writeTo(target).append()


def build(spark, sql: dict[str, str], rows: int) -> None:
    for target in sql.values():
        spark.sql(f"CREATE TABLE {target} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (days(ts))")
    for i, day in enumerate(DATES):
        for half in range(2):
            insert_day(spark, sql["hours"], day, rows, (2 * i + half) * rows)
    spark.sql(f"ALTER TABLE {sql['hours']} REPLACE PARTITION FIELD days(ts) WITH hours(ts)")
    for i in range(4):
        insert_day(spark, sql["sorted"], DATES[0], rows, i, stride=4)
    spark.sql(f"ALTER TABLE {sql['sorted']} WRITE ORDERED BY id")
    for half in range(2):
        insert_day(spark, sql["backfill"], DATES[0], 2 * rows, half * 2 * rows)


def queries(rows: int) -> dict[str, list[str]]:
    """The filtered scans of each table (pyiceberg row filters)."""
    hours = [f"ts >= '{d}T{h:02d}:00:00+00:00' and ts < '{d}T{h + 1:02d}:00:00+00:00'" for d in DATES for h in (3, 14)]
    ids = [f"id = {k}" for k in (17, rows, 2 * rows + 5, 4 * rows - 3)]
    windows = [f"ts >= '{DATES[0]}T{h:02d}:00:00+00:00' and ts < '{DATES[0]}T{h:02d}:20:00+00:00'" for h in (2, 9, 20)]
    return {"hours": hours, "sorted": ids, "backfill": windows}


def opened(config, table: str, row_filter: str) -> tuple[int, int]:
    """(files, bytes) a filtered scan opens, as pyiceberg plans it."""
    from icemaint.observe.catalog import CatalogReader

    tasks = list(CatalogReader(config).load(table).scan(row_filter=row_filter).plan_files())
    return len(tasks), sum(t.file.file_size_in_bytes for t in tasks)


def tick_runs(config, table: str) -> list:
    """The compaction runs the default tick requests for `table` (its sensor's plan, no cursor)."""
    from icemaint.app.explain import compaction_plan

    return [d for d, _ in compaction_plan(config, [table]).runs]


def measure(scale: float) -> dict:
    from benchmarks.machine import CpuShare, describe_machine, load_average
    from benchmarks.run import config_doc
    from icemaint.config import parse_config
    from icemaint.engine.spark_session import get_spark
    from icemaint.observe.catalog import CatalogReader
    from icemaint.operations.compaction import CompactionRequest, Compactor
    from icemaint.safety.audit import open_audit
    from icemaint.safety.claims import open_claims

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    rows = int(100_000 * scale)
    names = {"hours": "bench.drift_hours", "sorted": "bench.drift_sorted", "backfill": "bench.drift_backfill"}
    doc = config_doc(WORK, "local[2]")
    doc["defaults"].update({"writer_idle": "0s", "hot_partition_age": "0s", "drift_min_bytes": "1MiB",
                            "drift_min_files": 1, "small_file_size_bytes": "64KiB", "target_file_size_bytes": "16MiB"})
    # targets scale with the rows: the sorted date writes ~5 files, the backfill files are ~5 x their target
    # (small files: an eighth of the target, so that the dates are due for their drift, not for small files)
    targets = {"sorted": max(64, int(8192 * scale)), "backfill": max(64, int(4096 * scale))}
    doc["tables"] = {names[k]: {"target_file_size_bytes": f"{kib}KiB", "small_file_size_bytes": f"{kib // 8}KiB"}
                     for k, kib in targets.items()}
    config = parse_config(doc, WORK, source="benchmarks")
    load_start = load_average()
    spark = get_spark(config)
    machine = describe_machine(spark)
    sql = {k: f"lake.{v}" for k, v in names.items()}
    started = time.perf_counter()
    build(spark, sql, rows)
    log(f"built three tables of {rows:,}-row files in {time.perf_counter() - started:.1f} s")
    filters = queries(rows)
    out: dict = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine,
                 "load_start": load_start, "rows_per_file": rows, "tables": {}}
    compactor = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config))
    with CpuShare() as cpu:
        for kind, table in names.items():
            health = CatalogReader(config).health(table)
            before = [opened(config, table, f) for f in filters[kind]]
            rows_before = CatalogReader(config).load(table).scan().to_arrow().num_rows
            decisions = tick_runs(config, table)
            t0 = time.perf_counter()
            outcomes = [compactor.run(CompactionRequest(table, d.date, trigger="sensor")) for d in decisions]
            seconds = time.perf_counter() - t0
            after = [opened(config, table, f) for f in filters[kind]]
            files = spark.sql(f"SELECT spec_id, file_size_in_bytes FROM {sql[kind]}.files").collect()
            out["tables"][kind] = {
                "drift_files": health.drift_files, "drift_bytes": health.drift_bytes,
                "reasons": [d.reason for d in decisions], "kinds": [str(d.kind) for d in decisions],
                "published": [o.published for o in outcomes], "outcome_reasons": [o.reason for o in outcomes],
                "rewrite_seconds": round(seconds, 2), "queries": len(filters[kind]),
                "files_before": [f for f, _ in before], "files_after": [f for f, _ in after],
                "bytes_before": [b for _, b in before], "bytes_after": [b for _, b in after],
                "table_files_before": health.data_files, "table_files_after": len(files),
                "specs_after": sorted({r["spec_id"] for r in files}),
                "max_file_after": max(r["file_size_in_bytes"] for r in files),
                "rows_before": rows_before,
                "rows_after": CatalogReader(config).load(table).scan().to_arrow().num_rows}
            log(f"{kind}: {out['tables'][kind]['files_before']} -> {out['tables'][kind]['files_after']} files, "
                f"rewrite {seconds:.1f} s")
    out["cpu"], out["load_end"] = cpu.result, load_average()
    spark.stop()
    return out


LABELS = {"hours": ("days -> hours", "one hour of a date"), "sorted": ("an added sort order (id)", "one id"),
          "backfill": ("oversized backfill files", "twenty minutes")}


def render(r: dict, note: str = "") -> str:
    m = r["machine"]
    lines = [SECTION, "",
             f"- Date: {r['date']}; command: `make bench-drift` (`python -m benchmarks.layout_drift`); machine: "
             f"{m.get('cores')} cores, {m.get('cpu_model')}, Spark {m.get('spark')}, Iceberg {m.get('iceberg')}, "
             f"pyiceberg {m.get('pyiceberg')}; load average at the start {r['load_start']}, at the end "
             f"{r['load_end']}; other processes used {r['cpu'].get('others_average_cores', '?')} cores on average "
             "while it measured.",
             f"- Three tables of {r['rows_per_file']:,}-row files (Hadoop catalog, local[2]); each found by the "
             "default tick's plan (kind `layout_drift`) and rewritten by the runs it requests (stage, prove, "
             "publish). Files and bytes a filtered scan opens: pyiceberg's scan planning, the mean over the "
             "queries.", "",
             "| table | query | drifted before | files opened before -> after | MiB opened before -> after | "
             "table files before -> after | largest file after | rewrite (all its runs) | rows before = after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind, t in r["tables"].items():
        label, query = LABELS[kind]
        lines.append(
            f"| {label} | {query} ({t['queries']} queries) | {t['drift_files']} files, "
            f"{t['drift_bytes'] / MiB:.1f} MiB | {stats.mean(t['files_before']):.2f} -> "
            f"{stats.mean(t['files_after']):.2f} | {stats.mean(t['bytes_before']) / MiB:.1f} -> "
            f"{stats.mean(t['bytes_after']) / MiB:.1f} | {t['table_files_before']} -> {t['table_files_after']} | "
            f"{t['max_file_after'] / MiB:.1f} MiB | {t['rewrite_seconds']:.1f} s | "
            f"{'yes' if t['rows_before'] == t['rows_after'] else 'NO'} |")
    lines.append("")
    for kind, t in r["tables"].items():
        lines.append(f"- {LABELS[kind][0]}: {'; '.join(sorted(set(t['reasons'])))}.")
    lines.append("")
    if note:
        lines += [f"> {note}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.stack_bench import write_section

    parser = argparse.ArgumentParser(prog="python -m benchmarks.layout_drift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="rows per file, as a multiple of 100,000")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    results = measure(args.scale)
    (WORK / "results.json").write_text(json.dumps(results, indent=1, default=str))
    bad = [k for k, t in results["tables"].items() if t["rows_before"] != t["rows_after"] or not t["published"]
           or not all(t["published"])]
    if bad:
        raise SystemExit(f"layout rewrite not published or rows changed: {bad} (see {WORK / 'results.json'})")
    write_section(Path(args.out), render(results, args.note), SECTION)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
