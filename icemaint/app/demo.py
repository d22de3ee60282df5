"""`icemaint demo` / `make demo`: a high-churn table, a streaming writer, and the maintenance loop on it.

The writer appends micro-batches (and deletes now and then) under the table's claim, then keeps writing its
newest day, as a streaming job writes today's partition; a tick while it writes compacts the days it has
finished with (each proven with Great Expectations) and defers the day it writes ("writer active on ...");
once it stops, the next tick compacts that day too. Then the before/after and the audit trail.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

from icemaint.config import MaintenanceConfig
from icemaint.domain.units import human_size

DEMO_TABLE = "demo.events"


def local_estate_doc(root: Path, **overrides) -> dict:
    """The config document of a throwaway local estate: a Hadoop catalog `lake` on `<root>/warehouse`,
    Spark local[2], state in `<root>/state`, and no waits, so a table written seconds ago is compacted at once.

    The test suite's estate and the backfill benchmark's. A dict override is merged into the section of
    the same name; any other value replaces it.
    """
    doc = {
        "catalog": {"name": "lake", "type": "hadoop", "warehouse": str(root / "warehouse")},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false",
                                                  "spark.sql.shuffle.partitions": "2",
                                                  "spark.default.parallelism": "2"}},
        "state_dir": str(root / "state"),
        "defaults": {"writer_idle": "0s", "hot_partition_age": "0s", "small_file_size_bytes": "1MiB",
                     "target_file_size_bytes": "8MiB", "min_input_files": 3,
                     "retry_backoff": "0s", "claim_wait": "0s"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc


def _say(text: str = "") -> None:
    print(text, flush=True)


def _wait(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(5.0, max(deadline - time.monotonic(), 0)))
        _say(f"   ... {max(deadline - time.monotonic(), 0):.0f}s")


def _merge_before(first, later, live_day: str):
    """The 'before' of the report: each finished day as it was before the first tick, the live day as the stream
    left it (its files kept coming after the first reading)."""
    from dataclasses import replace

    parts = [p for p in first.partitions if p.key != live_day] + [p for p in later.partitions if p.key == live_day]
    return replace(first, partitions=tuple(sorted(parts, key=lambda p: p.key)),
                   data_files=sum(p.data_files for p in parts), delete_files=sum(p.delete_files for p in parts))


def _partition_rows(health) -> dict[str, tuple[int, float, int]]:
    return {p.date: (p.data_files, p.total_bytes / p.data_files if p.data_files else 0.0, p.delete_files)
            for p in health.partitions}


def run_demo(config: MaintenanceConfig, config_path: str | None = None, batches: int = 12) -> int:
    from icemaint.safety.claims import table_claim
    from icemaint.observe.catalog import CatalogReader
    from icemaint.domain.names import TableName
    from icemaint.app.simulator import Ledger, StreamingWriter, WorkloadSpec, default_ledger_path
    from icemaint.engine.spark_session import get_spark
    from icemaint.app.ticker import Ticker

    started = time.perf_counter()
    _say(f"== icemaint demo: warehouse {config.catalog.warehouse}, state {config.state_dir}")
    spark = get_spark(config)
    name = TableName.parse(DEMO_TABLE)
    ledger_path = default_ledger_path(config.state_dir, DEMO_TABLE)
    # The demo owns demo.events: start from a fresh table and ledger each time.
    spark.sql(f"DROP TABLE IF EXISTS {name.sql(config.catalog.name)} PURGE")
    ledger_path.unlink(missing_ok=True)
    # A recreated Hadoop table reuses metadata file names: forget the old tick cursor.
    (Path(config.state_dir) / "tick_cursor.json").unlink(missing_ok=True)
    since = dt.datetime.now(dt.timezone.utc)
    writer = StreamingWriter(
        spark, config.catalog.name, WorkloadSpec(table=DEMO_TABLE, days=5, rows_per_day=200, delete_every=4),
        ledger=Ledger(), claim_factory=lambda: table_claim(config, DEMO_TABLE, holder="demo-ingest", wait_seconds=600))
    writer.create_table()
    _say(f"== 1. streaming writer: {batches} micro-batches into {DEMO_TABLE} (5 days, one small file per day per "
         f"commit, a position-delete every 4th batch), taking the table's claim for each commit")
    writer.run(batches)
    ticker = Ticker(config, config_path)
    reader = CatalogReader(config)
    before = reader.health(DEMO_TABLE)
    days = sorted(p.key for p in before.partitions)
    # The stream moves on to its newest day and keeps writing it, as a streaming job writes today's partition.
    live = StreamingWriter(
        spark, config.catalog.name, WorkloadSpec(table=DEMO_TABLE, days=1, start_date=dt.date.fromisoformat(days[-1]),
                                                 rows_per_day=200, delete_every=0),
        ledger=writer.ledger)  # as most streaming jobs do, it does not take the claim: Iceberg's commits keep it safe
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_writing():
        try:
            live.run(10_000, interval_seconds=0.5, stop=stop)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=keep_writing, name="demo-writer")
    thread.start()
    try:
        idle = config.policy(DEMO_TABLE).writer_idle_seconds
        _say(f"== 2. the stream keeps writing {days[-1]} (a commit every 0.5s, without the claim, as Flink or Kafka "
             f"Connect do); the other days go quiet: waiting "
             f"for the {idle:.0f}s writer-idle window to pass on them")
        _wait(idle + 1)
        _say("== 3. sensor tick while the writer writes: compact the days it has finished with, prove each rewrite "
             f"with Great Expectations; {days[-1]} waits for its writer")
        first_report = ticker.tick()
        for line in first_report["lines"]:
            _say("   " + line)
    finally:
        stop.set()
        thread.join()
    writer.ledger.save(ledger_path)
    if errors:
        raise errors[0]
    before = _merge_before(before, reader.health(DEMO_TABLE), days[-1])
    _say(f"== 4. the stream stopped ({len(writer.ledger.written)} rows written, {len(writer.ledger.deleted)} "
         f"deleted); after its idle window, the next tick compacts {days[-1]} too")
    _wait(idle + 1)
    report = ticker.tick()
    for line in report["lines"]:
        _say("   " + line)
    _say("== 5. next tick: retention (snapshot expiry by policy; orphan removal deletes files, so it runs on its own "
         "only with automation.orphan_removal: true, and then only after an expiry finished on the table)")
    for line in ticker.tick()["lines"]:
        _say("   " + line)
    after = reader.health(DEMO_TABLE)
    from icemaint.app.demo_landing import run_landing_step

    run_landing_step(config, spark, ticker.tick, _say)

    _say("== 6. before / after")
    b, a = _partition_rows(before), _partition_rows(after)
    _say(f"   {'date':<12}{'files':>14}{'average file size':>26}{'delete files':>16}")
    for date in sorted(b):
        fb, sb, db = b[date]
        fa, sa, da = a.get(date, (0, 0.0, 0))
        _say(f"   {date:<12}{fb:>6} -> {fa:<6}{human_size(sb):>12} -> {human_size(sa):<10}{db:>6} -> {da:<6}")
    _say(f"   table: {before.data_files} -> {after.data_files} data files, {before.delete_files} -> "
         f"{after.delete_files} delete files, {before.manifests} -> {after.manifests} manifests, "
         f"{before.snapshots} -> {after.snapshots} snapshots")
    on_disk = sum(1 for p in Path(config.catalog.warehouse, *name.namespace, name.name, "data").rglob("*.parquet"))
    _say(f"   parquet files on disk: {on_disk} for {after.data_files + after.delete_files} live files (superseded "
         f"small files are deleted when the last snapshot referencing them expires)")
    rows = {r[0] for r in spark.sql(f"SELECT event_id FROM {name.sql(config.catalog.name)}").collect()}
    expected = writer.ledger.expected_ids()
    intact = rows == expected
    _say(f"   rows: {len(rows)} in the table, {len(expected)} in the writer's ledger: "
         f"{'identical' if intact else 'MISMATCH'}")

    _say("== 7. audit trail")
    from icemaint.safety.audit import open_audit

    for r in open_audit(config).records(table=DEMO_TABLE, since=since):
        snaps = f" {r.before_snapshot_id} -> {r.after_snapshot_id}" if r.after_snapshot_id else ""
        val = r.validation.get("passed")
        proof = "" if val is None else f" [validation {'passed' if val else 'FAILED'}]"
        _say(f"   {r.ts:%H:%M:%S} {r.operation:<10} {r.date or '':<10} {r.decision:<8}{snaps}{proof} {r.reason}")
    _say(f"== done in {time.perf_counter() - started:.0f}s. Browse it: make ui (http://127.0.0.1:3000)")
    ok = intact and not report["failed"] and not first_report["failed"] and after.data_files < before.data_files
    return 0 if ok else 1
