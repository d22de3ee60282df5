"""Compaction at the entrance: landed files per second and the files the table gets, one ingest batch against
appending each small file as it arrives.

    python -m benchmarks.landing [--files 200] [--rows-per-file 500] [--out benchmarks/RESULTS.md] [--note TEXT]

One warm Spark session (local[2], Hadoop catalog), two tables of the same columns, the same landed parquet files:

- each file as it arrives: one Spark append (`spark.read.parquet(file).writeTo(table).append()`) per file, as a
  writer without buffering does: one commit, one snapshot and one small data file per landed file;
- ingest: `icemaint.operations.ingest` with one batch of every file (claim, per-file check, stage on a branch,
  Great Expectations proof against the landed files, one append carrying the batch id, files moved).

Both tables must hold every landed row once (counted by pyiceberg, not Spark).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "landing"
SECTION = "## Landing: one ingest batch against an append per landed file"


def log(message: str) -> None:
    print(f"[landing {dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def table_files(reader, table: str) -> tuple[int, int, int]:
    """(data files, their bytes, rows) of the table's current snapshot, read by pyiceberg."""
    tbl = reader.load(table)
    files = tbl.inspect.files()
    return files.num_rows, sum(files["file_size_in_bytes"].to_pylist()), tbl.scan().to_arrow().num_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rows-per-file", type=int, default=500)
    parser.add_argument("--out", help="append the section to this markdown file")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(HERE.parent / "tests"))
    from conftest import make_config
    from icemaint.app.demo_landing import drop_readings
    from icemaint.domain.units import human_size
    from icemaint.engine.spark_session import get_spark
    from icemaint.observe.catalog import CatalogReader
    from icemaint.operations.ingest import IngestRequest, Ingestor
    from icemaint.safety.audit import open_audit
    from icemaint.safety.claims import open_claims

    shutil.rmtree(WORK, ignore_errors=True)
    landing = WORK / "landing"
    config = make_config(WORK, landing={"bench": {"location": str(landing), "table": "bench.ingested",
                                                  "max_files": args.files, "min_files": 1}})
    os.environ.setdefault("ICEMAINT_IDENTITY", "bench")
    spark = get_spark(config)
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.bench")
    columns = "(reading_id bigint, device string, ts timestamp, value double)"
    for table in ("appended", "ingested"):
        spark.sql(f"CREATE TABLE lake.bench.{table} {columns} USING iceberg")
    drop_readings(landing, args.files, args.rows_per_file)
    landed_bytes = sum(p.stat().st_size for p in landing.glob("*.parquet"))
    spark.sql("SELECT 1").collect()  # warm
    log(f"{args.files} files of {args.rows_per_file} rows ({human_size(landed_bytes)}) landed")

    started = time.perf_counter()
    for path in sorted(landing.glob("*.parquet")):
        spark.read.parquet(f"file://{path}").writeTo("lake.bench.appended").append()
    appended_s = time.perf_counter() - started
    log(f"append per file: {appended_s:.1f}s")

    ingestor = Ingestor(config, spark, CatalogReader(config), open_claims(config), open_audit(config))
    started = time.perf_counter()
    outcome = ingestor.run(IngestRequest("bench", force=True))
    ingested_s = time.perf_counter() - started
    log(f"ingest: {ingested_s:.1f}s: {outcome.reason}")

    reader = CatalogReader(config)
    rows_expected = args.files * args.rows_per_file
    results = []
    for label, table, seconds in (("append per landed file", "bench.appended", appended_s),
                                  ("icemaint ingest, one batch", "bench.ingested", ingested_s)):
        files, size, rows = table_files(reader, table)
        snapshots = len(reader.load(table).metadata.snapshots)
        results.append((label, seconds, files, size, rows, snapshots))
        if rows != rows_expected:
            log(f"{label}: {rows} rows, expected {rows_expected}")
            return 1
    load = os.getloadavg()
    lines = [SECTION, "", f"{dt.date.today()}, {args.files} landed parquet files of {args.rows_per_file} rows "
             f"({human_size(landed_bytes)}), local[2], load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}. "
             + args.note, "",
             "| way | seconds | landed files/s | data files | average file | snapshots | rows |",
             "|---|---|---|---|---|---|---|"]
    for label, seconds, files, size, rows, snapshots in results:
        lines.append(f"| {label} | {seconds:.1f} | {args.files / seconds:.1f} | {files} | "
                     f"{human_size(size / max(files, 1))} | {snapshots} | {rows} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as out:
            out.write("\n" + text)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
