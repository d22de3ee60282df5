"""The warm side of the peer benchmark: one process that has already run other table-dates (as `icemaint serve`
keeps running), timed on a shape's copy.

    python -m benchmarks.peer_warm CONFIG --date D --warm-up N (--estate | --table NAME)

Run by benchmarks/peer.py in a process of its own, after the cold run. The process first creates `N` warm-up
tables in namespace `wup` of the config's catalog (the estate's shape: one date of 100 files of 100 rows, written
by this process's Spark) and catches them up with the tick, as `serve`'s earlier ticks would have; none of that is
timed. Then, on the same JVM and Dagster instance, it times the shape's copy: `--estate` ticks the config's scope
until a tick publishes nothing (`tick --until-idle`'s loop), `--table` compacts one table-date (`icemaint
compact`'s run). It prints one JSON object on its last line: seconds, runs published, ticks, the compaction's step
durations (`--table`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

WARM_NAMESPACE = "wup"
WARM_FILES, WARM_ROWS = 100, 100


def warm_config(path: Path) -> Path:
    """The same deployment scoped to the warm-up tables, with a state directory of their own (a file beside
    `path`: the runs load their config from it)."""
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["scope"] = {"include": [f"{WARM_NAMESPACE}.*"], "exclude": []}
    doc["state_dir"] = str(path.parent / "icemaint-state-warm-up")
    out = path.with_name(f"icemaint-{WARM_NAMESPACE}.yaml")
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def write_warm_up(spark, catalog: str, tables: int, date: str) -> None:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.{WARM_NAMESPACE}")
    for i in range(tables):
        name = f"{catalog}.{WARM_NAMESPACE}.t{i:03d}"
        spark.sql(f"CREATE TABLE {name} (event_id BIGINT, device_id INT, ts TIMESTAMP_NTZ, reading DOUBLE, "
                  "status STRING) USING iceberg PARTITIONED BY (days(ts)) "
                  "TBLPROPERTIES ('write.distribution-mode'='none')")
        spark.range(0, WARM_FILES * WARM_ROWS, 1, WARM_FILES).selectExpr(
            "id AS event_id", "CAST(id % 97 AS INT) AS device_id",
            f"TIMESTAMP_NTZ '{date} 00:00:00' + make_dt_interval(0, 0, 0, (id * 37) % 86400) AS ts",
            "id * 0.5 AS reading", "element_at(array('ok', 'warn', 'err'), CAST(id % 3 AS INT) + 1) AS status",
        ).writeTo(name).append()


def until_idle(ticker) -> tuple[int, int, int]:
    """Ticks until one publishes nothing: (ticks, runs published, ticks that failed)."""
    ticks = published = failed = 0
    while True:
        report = ticker.tick()
        ticks += 1
        done = sum(1 for d in report["decisions"] if d.get("published"))
        failed += bool(report["failed"])
        published += done
        if not done or ticks >= 50:
            return ticks, published, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_warm", description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--date", required=True)
    parser.add_argument("--warm-up", type=int, default=20, help="warm-up tables caught up before the timed work")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--estate", action="store_true", help="tick the config's scope until idle")
    what.add_argument("--table", help="compact this table's date")
    args = parser.parse_args(argv)

    from icemaint.app.runner import MaintenanceRunner
    from icemaint.app.ticker import Ticker
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark

    config = load_config(args.config)
    warm_path = str(warm_config(Path(args.config)))
    warm = load_config(warm_path)
    started = time.perf_counter()
    write_warm_up(get_spark(warm), config.catalog.name, args.warm_up, args.date)
    ticks, published, failed = until_idle(Ticker(warm, warm_path))
    if published != args.warm_up or failed:
        print(f"error: the warm-up published {published} of {args.warm_up} table-dates ({failed} failed)",
              file=sys.stderr)
        return 1
    warm_up_seconds = time.perf_counter() - started
    result: dict = {"warm_up_tables": args.warm_up, "warm_up_seconds": round(warm_up_seconds, 2)}
    started = time.perf_counter()
    if args.estate:
        ticks, published, failed = until_idle(Ticker(config, args.config))
        result.update(seconds=time.perf_counter() - started, runs=published, ticks=ticks, failed=failed)
    else:
        report = MaintenanceRunner(config, args.config).compact(args.table, args.date)
        outcome = report.outcome or {}
        result.update(seconds=time.perf_counter() - started, runs=int(bool(outcome.get("published"))),
                      durations=outcome.get("durations", {}))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
