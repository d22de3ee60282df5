"""Estate catch-up versus the nightly habit: icemaint's ranked, date-scoped maintenance against a nightly
whole-table `rewrite_data_files` per table, on the same estate; wall time and write amplification.

    python -m benchmarks.nightly [--tables 100] [--quick] [--out benchmarks/RESULTS.md] [--note TEXT]
    python -m benchmarks.nightly --from-results benchmarks/.work/nightly/results.json   # re-render only

The estate (one SQLite SQL catalog `local`, written by pyiceberg with the peer benchmark's helpers): every
table is partitioned by days(ts) and holds four older dates that are already healthy (files compacted to
icemaint's target, one of them a quiet day with three files) and three recent dates of many small files,
the catch-up work. Sizes are scaled down 512x so that 100 tables fit a run of minutes on 2 cores, and every
threshold with them (`SCALE`): the tables carry `write.target-file-size-bytes` = 1 MiB, the stand-in for
Iceberg's 512 MiB default, and Parquet pages and row groups of 2 KiB and 256 KiB (1 MiB and 128 MiB);
icemaint's policy targets 256 KiB files (128 MiB) and calls a file small under 64 KiB (32 MiB). The estate
is written once and copied aside; each contender runs on a restored copy in a fresh process, timed from its
start to its exit:

- icemaint: `icemaint tick --until-idle --json` (ticks in one process until nothing is launched; each due
  table-date has its own claim, staging branch, Great Expectations proof and publish; a table's consecutive
  due dates of one tick run as one Dagster run over their partition range);
- the nightly habit: one Spark process (`--driver`, this module) that calls
  `CALL local.system.rewrite_data_files(table => '<table>')` for each table in turn, default options, as a
  cron job does. Iceberg's bin-pack then takes every file below 75% of the table's target as a candidate and
  rewrites a partition's candidates when there are at least 5 of them (min-input-files), or they hold more
  than the target, or a file is over 180% of it, or files carry deletes: the healthy older dates with six
  files are rewritten, the quiet day is not.

Measured from the table metadata (pyiceberg) before and after: data files removed (bytes rewritten), added
(bytes written), the dates they belong to, and the snapshot summaries' `removed-files-size` as a cross-check.
Write amplification = bytes rewritten / bytes that were in small files (under the policy's
small_file_size_bytes) before the run. Afterwards one independent reader (pyiceberg) checks every row of
each contender's estate: every id once, every column as written.

Writes the section "Estate catch-up versus the nightly habit" of --out; --quick writes its section to
benchmarks/.work/nightly/quick/RESULTS.md unless --out is given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "nightly"
SECTION = "## Estate catch-up versus the nightly habit"
NAMESPACE = "estate"
KiB, MiB = 2**10, 2**20
SCALE = 512  # every size below stands for SCALE times itself on a real estate
TABLE_TARGET_BYTES = 1 * MiB      # write.target-file-size-bytes: Iceberg's default of 512 MiB, scaled
POLICY_TARGET_BYTES = 256 * KiB   # icemaint's default target_file_size_bytes of 128 MiB, scaled
POLICY_SMALL_BYTES = 64 * KiB     # icemaint's default small_file_size_bytes of 32 MiB, scaled
ICEBERG_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
# Parquet's page and row group sizes scaled with the rest (1 MiB and 128 MiB by default): a writer rolls to
# a new file when its written bytes plus the pages it still buffers, counted uncompressed, reach the target.
# With 1 MiB pages against a 256 KiB target, files rolled at a quarter of it (~55 KiB, below the small
# threshold: icemaint then rewrote its own output, 14 files into 14, tick after tick); with the pages
# scaled the files come out at the target, as they do at full size.
TABLE_PROPERTIES = {"write.target-file-size-bytes": str(TABLE_TARGET_BYTES),
                    "write.parquet.page-size-bytes": str(1 * MiB // SCALE),
                    "write.parquet.row-group-size-bytes": str(128 * MiB // SCALE)}


@dataclass(frozen=True)
class Estate:
    tables: int
    healthy_files: tuple[int, ...] = (6, 6, 3, 6)  # files on each older, healthy date, oldest first
    recent_dates: int = 3
    small_files_per_date: int = 54
    commits_per_recent_date: int = 2
    rows_per_healthy_file: int = 18_000  # ~235 KiB zstd Parquet: above 64 KiB, below 75% of 1 MiB
    rows_per_small_file: int = 2_000     # ~20 KiB: small


FULL = Estate(tables=100)
QUICK = Estate(tables=4)


@dataclass(frozen=True)
class FileSpec:
    date: dt.date
    first: int   # the file holds ids first .. first + rows - 1
    rows: int
    commit: int  # files of one commit are added together
    healthy: bool


def log(message: str) -> None:
    print(f"[nightly {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- units ------------------------------------------------------------------------------------------

def human_size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"
    return f"{n:,.0f} B"


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 120:
        return f"{s / 60:.1f} min ({s:,.0f} s)"
    return f"{s:.1f} s"


# -- the estate ---------------------------------------------------------------------------------------

def layout(estate: Estate, anchor: dt.date) -> list[FileSpec]:
    """Every file of one table: the healthy dates two weeks before `anchor` in one earlier commit, then the
    small files of the recent dates (anchor - recent_dates .. anchor - 1), each date in a few commits."""
    specs, first = [], 0
    for i, files in enumerate(estate.healthy_files):
        day = anchor - dt.timedelta(days=14 - i)
        for _ in range(files):
            specs.append(FileSpec(day, first, estate.rows_per_healthy_file, 0, True))
            first += estate.rows_per_healthy_file
    commit = 1
    for k in range(estate.recent_dates, 0, -1):
        day = anchor - dt.timedelta(days=k)
        per_commit = -(-estate.small_files_per_date // estate.commits_per_recent_date)
        for f in range(estate.small_files_per_date):
            specs.append(FileSpec(day, first, estate.rows_per_small_file, commit + f // per_commit, False))
            first += estate.rows_per_small_file
        commit += estate.commits_per_recent_date
    return specs


def file_rows(spec: FileSpec):
    """The peer benchmark's rows (every column a function of event_id), moved onto the file's date."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from benchmarks.peer import DAY, arrow_rows

    rows = arrow_rows(spec.first, spec.rows)
    shift = pa.scalar(dt.timedelta(days=(spec.date - DAY).days), pa.duration("us"))
    return rows.set_column(rows.schema.get_field_index("ts"), "ts", pc.add(rows.column("ts"), shift))


def write_estate(cat, names: list[str], specs: list[FileSpec]) -> None:
    """Each table: its files written by pyarrow (a thread pool), added commit by commit with add_files."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from benchmarks.peer import create_table

    def write(job):
        path, spec = job
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(file_rows(spec), path, compression="zstd")

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for n, name in enumerate(names):
            tbl = create_table(cat, name)
            with tbl.transaction() as tx:
                tx.set_properties(TABLE_PROPERTIES)
            root = tbl.location().removeprefix("file://")
            jobs = [(f"{root}/data/ts_day={s.date}/c{s.commit:03d}-{s.first:09d}.parquet", s) for s in specs]
            list(pool.map(write, jobs))
            for commit in sorted({s.commit for s in specs}):
                tbl = cat.load_table(name)
                tbl.add_files([f"file://{path}" for path, s in jobs if s.commit == commit])
            if n % 10 == 9:
                log(f"  {n + 1} of {len(names)} tables written")


# -- reading the tables --------------------------------------------------------------------------------

def _partition_date(value) -> str:
    if isinstance(value, dt.date):
        return value.isoformat()
    return (dt.date(1970, 1, 1) + dt.timedelta(days=int(value))).isoformat()


def data_files(tbl) -> dict[str, tuple[int, str]]:
    """path -> (size in bytes, partition date) of the table's live data files."""
    files = tbl.inspect.files()
    paths = files.column("file_path").to_pylist()
    sizes = files.column("file_size_in_bytes").to_pylist()
    content = files.column("content").to_pylist()
    days = [p["ts_day"] for p in files.column("partition").to_pylist()]
    return {p: (s, _partition_date(d)) for p, s, c, d in zip(paths, sizes, content, days) if c == 0}


def summary_removed_bytes(tbl, after_snapshot_id: int | None) -> int:
    """Sum of `removed-files-size` of the snapshots committed after `after_snapshot_id` (the run's)."""
    snapshots = sorted(tbl.snapshots(), key=lambda s: s.sequence_number)
    seq = next((s.sequence_number for s in snapshots if s.snapshot_id == after_snapshot_id), 0)
    return sum(int(s.summary.get("removed-files-size") or 0) for s in snapshots if s.sequence_number > seq)


def rewrite_figures(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]],
                    small_file_size_bytes: int, healthy_dates: set[str]) -> dict:
    """What a run did to one table, from its data files before and after (path -> (size, date))."""
    removed = {p: v for p, v in before.items() if p not in after}
    added = {p: v for p, v in after.items() if p not in before}
    touched = sorted({d for _, d in removed.values()} | {d for _, d in added.values()})
    return {
        "files_before": len(before), "files_after": len(after),
        "bytes_before": sum(s for s, _ in before.values()),
        "small_files_before": sum(1 for s, _ in before.values() if s < small_file_size_bytes),
        "small_bytes_before": sum(s for s, _ in before.values() if s < small_file_size_bytes),
        "small_files_after": sum(1 for s, _ in after.values() if s < small_file_size_bytes),
        "files_rewritten": len(removed), "bytes_rewritten": sum(s for s, _ in removed.values()),
        "bytes_rewritten_not_small": sum(s for s, _ in removed.values() if s >= small_file_size_bytes),
        "files_written": len(added), "bytes_written": sum(s for s, _ in added.values()),
        "dates_touched": touched, "healthy_dates_touched": [d for d in touched if d in healthy_dates],
    }


def write_amplification(bytes_rewritten: int, small_bytes: int) -> float | None:
    """Bytes rewritten per byte that was in a small file; None when nothing was small."""
    return round(bytes_rewritten / small_bytes, 3) if small_bytes else None


def totals(tables: dict[str, dict]) -> dict:
    keys = ("files_before", "files_after", "bytes_before", "small_files_before", "small_bytes_before",
            "small_files_after", "files_rewritten", "bytes_rewritten", "bytes_rewritten_not_small",
            "files_written", "bytes_written", "summary_removed_bytes")
    out = {k: sum(t.get(k) or 0 for t in tables.values()) for k in keys}
    out["dates_touched"] = sum(len(t["dates_touched"]) for t in tables.values())
    out["healthy_dates_touched"] = sum(len(t["healthy_dates_touched"]) for t in tables.values())
    out["write_amplification"] = write_amplification(out["bytes_rewritten"], out["small_bytes_before"])
    return out


def check_rows(cat, name: str, specs: list[FileSpec]) -> dict:
    """Every row of the table read by pyiceberg: each id written exactly once, every column the function of
    its id (and of its file's date) it was written as."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    expected = sum(s.rows for s in specs)
    epoch = dt.date(1970, 1, 1)
    day0 = np.repeat(np.array([(s.date - epoch).days * 86400 for s in specs], dtype=np.int64),
                     [s.rows for s in specs])
    seen = np.zeros(expected, dtype=np.int8)
    bad = rows = 0
    for batch in cat.load_table(name).scan().to_arrow_batch_reader():
        ids = batch.column("event_id").to_numpy()
        rows += len(ids)
        inside = (ids >= 0) & (ids < expected)
        bad += int((~inside).sum())
        ids = ids[inside]
        np.add.at(seen, ids, 1)
        batch = batch.filter(pa.array(inside))
        bad += int((batch.column("device_id").to_numpy() != (ids % 97)).sum())
        bad += int((batch.column("reading").to_numpy() != ids * 0.5).sum())
        codes = pc.index_in(batch.column("status"), value_set=pa.array(["ok", "warn", "err"])).to_numpy(
            zero_copy_only=False)
        bad += int((codes != ids % 3).sum())
        seconds = pc.cast(batch.column("ts"), "int64").to_numpy() // 1_000_000
        bad += int((seconds - day0[ids] != (ids * 37) % 86400).sum())
    missing, duplicated = int((seen == 0).sum()), int((seen > 1).sum())
    return {"rows": rows, "missing": missing, "duplicated": duplicated, "wrong_values": bad,
            "ok": rows == expected and not (missing or duplicated or bad)}


# -- the nightly habit: one Spark process ------------------------------------------------------------

def nightly_driver(warehouse: str, tables: list[str]) -> None:
    """What a cron job runs: one session, `rewrite_data_files` on each whole table with default options.
    Prints one JSON line for the session's start and one per table."""
    started = time.perf_counter()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import snowpark_connect_deps_iceberg
    from pyspark.sql import SparkSession

    from benchmarks.shared_catalog import SQLITE_JAR
    from icemaint.engine.local_fs import local_fs_conf

    jar = snowpark_connect_deps_iceberg.get_jar_path(ICEBERG_JAR)
    cat = "spark.sql.catalog.local"
    conf = {"spark.jars": f"{jar},{SQLITE_JAR}",
            "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
            cat: "org.apache.iceberg.spark.SparkCatalog", f"{cat}.type": "jdbc",
            f"{cat}.uri": f"jdbc:sqlite:{warehouse}/catalog.db", f"{cat}.warehouse": warehouse,
            # the same session settings as icemaint's (benchmarks.peer.icemaint_config)
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "3g", "spark.sql.shuffle.partitions": "4"}
    conf.update(local_fs_conf("local[2]", conf))  # icemaint's local file system too (no chmod process per file)
    builder = SparkSession.builder.master("local[2]").appName("nightly-rewrite")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(json.dumps({"session_seconds": round(time.perf_counter() - started, 3)}), flush=True)
    for table in tables:
        t0 = time.perf_counter()
        row = spark.sql(f"CALL local.system.rewrite_data_files(table => '{table}')").collect()[0].asDict()
        print(json.dumps({"table": table, "seconds": round(time.perf_counter() - t0, 3), **row}), flush=True)
    spark.stop()


# -- the two contenders ---------------------------------------------------------------------------------

def icemaint_yaml(root: Path, wh: Path) -> Path:
    """The peer benchmark's icemaint config with this estate's scope and scaled policy: every date is due
    at once (no writer-idle or hot-partition wait); min_input_files stays at its default (5, as Iceberg's)."""
    import yaml

    from benchmarks.peer import icemaint_config

    path = icemaint_config(root, wh)
    doc = yaml.safe_load(path.read_text())
    doc["scope"] = {"include": [f"{NAMESPACE}.*"], "exclude": []}
    doc["defaults"] = {"writer_idle": "0s", "hot_partition_age": "0s", "claim_wait": "0s",
                       "target_file_size_bytes": f"{POLICY_TARGET_BYTES // KiB}KiB",
                       "small_file_size_bytes": f"{POLICY_SMALL_BYTES // KiB}KiB", "max_rewrite_bytes": "100GiB"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_icemaint(root: Path, wh: Path, due_dates: int) -> dict:
    """`tick --until-idle`, bounded: twice the ticks the sensor's budget of runs a tick needs for the due
    dates, and one idle tick; a catch-up that keeps publishing past that fails the benchmark (exit 1)."""
    from benchmarks.machine import CpuShare
    from benchmarks.jvm_archive import ready as ready_class_archive
    from benchmarks.peer import timed

    from sensors.compaction import MAX_RUNS_PER_TICK

    config = icemaint_yaml(root, wh)
    max_ticks = 2 * -(-due_dates // MAX_RUNS_PER_TICK) + 1
    env = {**os.environ, "ICEMAINT_IDENTITY": "benchmark"}
    ready_class_archive(config, env)  # the timed tick is not the one that records the JVM class archive
    icemaint = str(Path(sys.executable).parent / "icemaint")
    launched = time.time()
    with CpuShare() as cpu:
        seconds, proc = timed([icemaint, "--config", str(config), "tick", "--until-idle", "--max-ticks",
                               str(max_ticks), "--json"], env, root / "icemaint.log")
    reports = json.loads(proc.stdout)
    runs = [d for r in reports for d in r["decisions"] if d.get("run_id")]
    by_operation: dict[str, int] = {}
    for d in runs:
        by_operation[d["operation"]] = by_operation.get(d["operation"], 0) + 1
    state = root / "icemaint-state"
    # the code that ran: PYTHONPATH may point the CLI at a clean export of a commit instead of the work tree
    where = subprocess.run([sys.executable, "-c", "import icemaint; print(icemaint.__file__)"], env=env, cwd=root,
                           capture_output=True, text=True).stdout.strip()
    return {"seconds": round(seconds, 2), "launched_at": launched, "ticks": len(reports),
            "code": str(Path(where).parent.parent) if where else None,
            "runs": len({d["run_id"] for d in runs}), "table_dates": len(runs), "runs_by_operation": by_operation,
            "published": sum(1 for d in runs if d.get("published")),
            "runs_per_tick": [sum(1 for d in r["decisions"] if d.get("run_id")) for r in reports],
            "cpu": cpu.result, "audit": audit_steps(state / "audit" / "audit.jsonl"),
            "dagster_runs": dagster_run_spans(state / "dagster")}


def run_nightly(root: Path, wh: Path, names: list[str]) -> dict:
    from benchmarks.machine import CpuShare
    from benchmarks.peer import timed

    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with CpuShare() as cpu:
        seconds, proc = timed([sys.executable, "-m", "benchmarks.nightly", "--driver", str(wh), *names], env,
                              root / "nightly.log")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    calls = [line for line in lines if "table" in line]
    return {"seconds": round(seconds, 2), "cpu": cpu.result,
            "session_seconds": next((line["session_seconds"] for line in lines if "session_seconds" in line), None),
            "calls_seconds": round(sum(c["seconds"] for c in calls), 2), "calls": len(calls),
            "slowest_call_seconds": max((c["seconds"] for c in calls), default=None),
            "procedure_rewritten_bytes": sum(int(c.get("rewritten_bytes_count") or 0) for c in calls),
            "procedure_rewritten_files": sum(int(c.get("rewritten_data_files_count") or 0) for c in calls),
            "procedure_added_files": sum(int(c.get("added_data_files_count") or 0) for c in calls)}


# -- icemaint's own timings: where its time goes ------------------------------------------------------

STEPS = ("plan_seconds", "rewrite_seconds", "validation_seconds", "publish_seconds")


def audit_steps(path: Path) -> dict:
    """Sums of the step timings icemaint's audit records carry, per operation that ran."""
    out: dict[str, dict] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("decision") != "run":
            continue
        entry = out.setdefault(record["operation"], {"records": 0})
        entry["records"] += 1
        for key, value in (record.get("durations") or {}).items():
            if isinstance(value, (int, float)):
                entry[key] = round(entry.get(key, 0.0) + value, 3)
    return out


def dagster_run_spans(home: Path) -> dict:
    """Start and end (epoch seconds) of every Dagster run the ticks launched, from the instance's run storage."""
    from dagster import DagsterInstance

    instance = DagsterInstance.from_config(str(home))
    try:
        spans = sorted((r.start_time, r.end_time) for r in instance.get_run_records()
                       if r.start_time and r.end_time)
    finally:
        instance.dispose()
    return {"count": len(spans), "first_start": spans[0][0] if spans else None,
            "last_end": max(e for _, e in spans) if spans else None,
            "seconds": round(sum(e - s for s, e in spans), 2)}


def time_profile(ice: dict) -> list[tuple[str, float]]:
    """icemaint's wall time split into what the process did, in seconds, largest parts first within runs."""
    wall, runs, compact = ice["seconds"], ice.get("dagster_runs") or {}, (ice.get("audit") or {}).get("compact", {})
    if not runs.get("count"):
        return [("the whole process (no Dagster run recorded)", wall)]
    before = runs["first_start"] - ice["launched_at"]
    after = ice["launched_at"] + wall - runs["last_end"]
    between = wall - before - after - runs["seconds"]
    steps = [(k.removesuffix("_seconds"), compact.get(k, 0.0)) for k in STEPS]
    other_ops = sum(v.get("duration_seconds", 0.0) for op, v in (ice.get("audit") or {}).items() if op != "compact")
    contract = compact.get("total_seconds", 0.0)
    parts = [("start: Python imports, Dagster instance, discovery and the first tick's evaluation", before)]
    parts += [(f"compaction {name} (audit records' step timings)", seconds) for name, seconds in steps]
    parts.append(("compaction runs, the rest of the contract (claim, health reads, audit records, the first "
                  "run's JVM and Spark session start)", contract - sum(s for _, s in steps)))
    if other_ops:
        parts.append(("other operations' runs (manifests, expiry, orphans)", other_ops))
    parts.append(("Dagster's run machinery around each run (run and event records, asset materializations)",
                  runs["seconds"] - contract - other_ops))
    parts.append(("between runs: each tick's sensor evaluation (compaction and retention) and its report", between))
    parts.append(("after the last run: the idle tick that ends the loop, shutdown", after))
    return [(name, round(seconds, 2)) for name, seconds in parts]


# -- the report ---------------------------------------------------------------------------------------

def verdicts(results: dict) -> list[dict]:
    """One verdict per figure; `miss` when icemaint comes out worse."""
    ice, nightly = results["icemaint"], results["nightly"]
    out = []
    ratio = ice["seconds"] / nightly["seconds"] if nightly["seconds"] else None
    if ratio is not None:
        faster = ratio <= 1
        out.append({"figure": "wall time", "miss": not faster,
                    "text": (f"icemaint {human_seconds(ice['seconds'])} against the nightly habit's "
                             f"{human_seconds(nightly['seconds'])}: "
                             + (f"icemaint wins, {1 / ratio:.2f}x faster" if faster else
                                f"the nightly habit wins, icemaint takes {ratio:.2f}x as long"))})
    wa_ice, wa_night = ice["totals"]["write_amplification"], nightly["totals"]["write_amplification"]
    if wa_ice is not None and wa_night is not None:
        better = wa_ice <= wa_night
        out.append({"figure": "write amplification", "miss": not better,
                    "text": (f"icemaint {wa_ice:.2f} against the nightly habit's {wa_night:.2f} "
                             f"({human_size(ice['totals']['bytes_rewritten'])} against "
                             f"{human_size(nightly['totals']['bytes_rewritten'])} rewritten for "
                             f"{human_size(ice['totals']['small_bytes_before'])} in small files): "
                             + ("icemaint wins" + (f", the nightly habit rewrites {wa_night / wa_ice:.1f}x the bytes"
                                                  if wa_ice else "") if better else "the nightly habit wins"))})
    rows_ok = {who: results[who]["rows"]["ok"] for who in ("icemaint", "nightly")}
    out.append({"figure": "rows", "miss": not rows_ok["icemaint"],
                "text": "; ".join(f"{who}: {'every row once, as written' if ok else '**rows differ**'}"
                                  for who, ok in rows_ok.items())})
    return out


def busy_machine(results: dict) -> bool:
    """Whether other processes held more than half the machine's cores while either contender ran."""
    cores = (results.get("machine") or {}).get("cores") or 1
    shares = [(results[who].get("cpu") or {}).get("others_average_cores") for who in ("icemaint", "nightly")]
    return any(s is not None and s > cores / 2 for s in shares)


def shown_command(command: str) -> str:
    """The command as run, its --note's text left out (the note is quoted at the end of the section)."""
    words = shlex.split(command)
    if "--note" in words:
        i = words.index("--note")
        words[i + 1:i + 2] = ["..."]
    return shlex.join(words)


def _dirty(dirty) -> str:
    if isinstance(dirty, list):
        return f" with uncommitted changes to {', '.join(f'`{f}`' for f in dirty)}" if dirty else ""
    return " (with uncommitted changes)" if dirty else ""


def _load(values) -> str:
    return " / ".join(f"{v:.2f}" for v in values) if values else "unknown"


def _row(name: str, ice, night) -> str:
    return f"| {name} | {ice} | {night} |"


def render(results: dict) -> str:
    ice, nightly = results["icemaint"], results["nightly"]
    it, nt = ice["totals"], nightly["totals"]
    e = results["estate"]
    machine = results["machine"]
    load = (f"load average (1, 5, 15 min) at the start {_load(results.get('load_start'))}, at the end "
            f"{_load(results.get('load_end'))}")
    others = [f"{who} {r['cpu']['others_average_cores']:.2f}" for who, r in (("icemaint", ice), ("nightly", nightly))
              if (r.get("cpu") or {}).get("others_average_cores") is not None]
    per_table = e["files_per_table"]
    lines = [
        SECTION, "",
        f"- Date: {results['date']}; command: `{shown_command(results['command'])}`; commit measured: "
        f"`{results['commit']}`"
        + _dirty(results.get("dirty"))
        + (f" (icemaint ran from `{ice['code']}`)" if ice.get("code") and ice["code"] != str(REPO) else "")
        + f"; machine: {machine['cores']} cores, "
        f"{machine['cpu_model']}, {machine['memory_gib']} GiB, Spark {machine['spark']}, Iceberg 1.10.2, "
        f"pyiceberg {machine['pyiceberg']}, Dagster {machine['dagster']}; {load}"
        + (f"; cores busy with other processes while each contender ran: {', '.join(others)}" if others else "")
        + ". One run each, icemaint first, each on a fresh copy of the same estate."
        + (" The machine was shared: other processes kept more than half of its cores busy, so both contenders "
           "ran slower than on a quiet machine; read the ratio, not the seconds." if busy_machine(results) else ""),
        f"- The estate: {e['tables']} tables partitioned by days(ts), {per_table} data files and "
        f"{human_size(it['bytes_before'] / e['tables'])} each ({it['files_before']:,} files, "
        f"{human_size(it['bytes_before'])} in all). Each table: {len(e['healthy_files'])} older dates already "
        f"healthy ({', '.join(str(n) for n in e['healthy_files'])} files of ~{human_size(e['healthy_file_bytes'])}, "
        f"one earlier commit) and {e['recent_dates']} recent dates of {e['small_files_per_date']} small files "
        f"(~{human_size(e['small_file_bytes'])}) each, added in {e['commits_per_recent_date']} commits a date: "
        f"{human_size(it['small_bytes_before'])} in small files, the catch-up work.",
        f"- Scaled down {SCALE}x, every threshold with the data: the tables' `write.target-file-size-bytes` is "
        f"{human_size(TABLE_TARGET_BYTES)} (for Iceberg's default 512 MiB), icemaint's policy targets "
        f"{human_size(POLICY_TARGET_BYTES)} (128 MiB) and calls a file small under {human_size(POLICY_SMALL_BYTES)} "
        f"(32 MiB), and Parquet's page and row group sizes are {human_size(1 * MiB // SCALE)} and "
        f"{human_size(128 * MiB // SCALE)} (1 MiB and 128 MiB; unscaled pages made Spark's writers roll files at a "
        "quarter of a small target). The healthy files stand for files of "
        f"~{human_size(e['healthy_file_bytes'] * SCALE)}, what a 128 MiB compaction target or a batch writer "
        "leaves. Iceberg's bin-pack takes every file under 75% of the target as a candidate and rewrites a "
        "partition's candidates when there are 5 or more (min-input-files), or more than the target in bytes, "
        "or a file over 180% of it, or deletes: so the nightly habit rewrites the healthy dates of 6 files once "
        "(into files of its own 512 MiB target), and leaves the quiet day of 3. This is the first night: once a "
        "date sits at 512 MiB files, later nights leave it, so the amplification below is the price of turning "
        "on the habit (or of catching up with it), not of every night; a real table with more history of "
        "medium files pays it for each such date.",
        "- icemaint: `icemaint tick --until-idle` (scope the estate, writer_idle and hot_partition_age 0 s, "
        "min_input_files 5): each due table-date has its own claim, staging branch, Great Expectations proof, "
        "publish, audit record and materialization; a table's consecutive due dates of one tick run as one "
        "Dagster run over their partition range; ticks in one process until a tick publishes nothing. The nightly "
        "habit: one Spark process (local[2], the same session settings) calling "
        "`CALL local.system.rewrite_data_files(table => ...)` on each whole table in turn, default options. "
        "Wall time is each process from its start to its exit (with its JVM).",
        "- Bytes rewritten: data files live before and gone after (pyiceberg, both contenders measured the same "
        "way; the snapshot summaries' `removed-files-size` "
        + ("agree to the byte" if it["summary_removed_bytes"] == it["bytes_rewritten"] and
           nt["summary_removed_bytes"] == nt["bytes_rewritten"] else
           f"say {human_size(it['summary_removed_bytes'])} / {human_size(nt['summary_removed_bytes'])}")
        + "). Write "
        "amplification = bytes rewritten / bytes that were in small files before the run. Rows: pyiceberg read "
        f"every row of both estates ({ice['rows']['rows'] + nightly['rows']['rows']:,} rows) against what was "
        "written.",
        "",
        "| figure | icemaint | nightly habit |", "|---|---|---|",
        _row("wall time (process start to exit)", f"**{human_seconds(ice['seconds'])}**",
             f"**{human_seconds(nightly['seconds'])}**"),
        _row("bytes rewritten", human_size(it["bytes_rewritten"]), human_size(nt["bytes_rewritten"])),
        _row("of which not small (healthy files rewritten)", human_size(it["bytes_rewritten_not_small"]),
             human_size(nt["bytes_rewritten_not_small"])),
        _row("bytes that were small", human_size(it["small_bytes_before"]), human_size(nt["small_bytes_before"])),
        _row("write amplification (rewritten / small)",
             f"**{it['write_amplification']:.2f}**" if it["write_amplification"] is not None else "-",
             f"**{nt['write_amplification']:.2f}**" if nt["write_amplification"] is not None else "-"),
        _row("bytes written", human_size(it["bytes_written"]), human_size(nt["bytes_written"])),
        _row("data files before -> after", f"{it['files_before']:,} -> {it['files_after']:,}",
             f"{nt['files_before']:,} -> {nt['files_after']:,}"),
        _row("small files left", f"{it['small_files_after']:,}", f"{nt['small_files_after']:,}"),
        _row("dates touched (of them healthy)", f"{it['dates_touched']} ({it['healthy_dates_touched']})",
             f"{nt['dates_touched']} ({nt['healthy_dates_touched']})"),
        _row("work units", f"{ice.get('table_dates', ice['runs'])} table-dates in {ice['runs']} Dagster runs in "
             f"{ice['ticks']} ticks ("
             + ", ".join(f"{k} {v}" for k, v in sorted(ice["runs_by_operation"].items())) + ")",
             f"{nightly['calls']} procedure calls"),
        _row("rows", "every id once, as written" if ice["rows"]["ok"] else "**differ**",
             "every id once, as written" if nightly["rows"]["ok"] else "**differ**"),
        "", "Verdicts:", "",
    ]
    marks = verdicts(results)
    lines += [f"- **{v['figure']}**: {v['text']}." + (" **Miss** (profile below)." if v["miss"] else "")
              for v in marks]
    missed = {v["figure"] for v in marks if v["miss"]}
    if "wall time" in missed:
        lines += ["", "### Where icemaint's time goes (wall-time miss)", "",
                  "From the Dagster run records (each run's start and end) and icemaint's audit records "
                  "(each compaction's step timings), against the process's wall time:", "",
                  "| part | time | share |", "|---|---|---|"]
        lines += [f"| {name} | {human_seconds(s)} | {100 * s / ice['seconds']:.0f}% |" for name, s in time_profile(ice)]
        per_run = (ice.get("dagster_runs") or {}).get("seconds", 0) / max(ice["runs"], 1)
        lines += ["", f"- {ice['runs']} runs, {per_run:.2f} s each on average inside Dagster; the nightly habit "
                  f"spends {human_seconds(nightly['session_seconds'])} starting its session and "
                  f"{human_seconds(nightly['calls_seconds'])} in {nightly['calls']} procedure calls "
                  f"({nightly['calls_seconds'] / max(nightly['calls'], 1):.2f} s each, the slowest "
                  f"{human_seconds(nightly['slowest_call_seconds'])}), rewriting "
                  f"{human_size(nt['bytes_rewritten'])} to icemaint's {human_size(it['bytes_rewritten'])}.",
                  "- Why: the nightly habit pays one plan-and-commit per table, with no proof; icemaint pays a "
                  "claim, a staging branch, a proof (the replaced files digested while they are rewritten, the "
                  "staged files read again), a publish and Dagster's bookkeeping per table-date, one after the "
                  "other on one session."]
    if "write amplification" in missed:
        lines += ["", "### Write amplification miss", "",
                  f"- icemaint rewrote {human_size(it['bytes_rewritten_not_small'])} of files that were not small "
                  "(see the table above); its plan takes only files under small_file_size_bytes."]
    if "rows" in missed:
        lines += ["", f"- icemaint's rows: {ice['rows']}"]
    if results.get("note"):
        lines += ["", f"> {results['note']}"]
    return "\n".join(lines) + "\n"


# -- one run ----------------------------------------------------------------------------------------------

def restore(pristine: Path, wh: Path) -> None:
    import shutil

    if wh.exists():
        shutil.rmtree(wh)
    subprocess.run(["cp", "-a", str(pristine), str(wh)], check=True)


def measure_contender(root: Path, wh: Path, names: list[str], specs: list[FileSpec], before: dict, snapshot_ids: dict,
                      healthy_dates: set[str]) -> dict:
    from benchmarks.peer import catalog

    cat = catalog(wh)
    try:
        tables, rows = {}, {"rows": 0, "missing": 0, "duplicated": 0, "wrong_values": 0, "ok": True, "bad_tables": []}
        for name in names:
            tbl = cat.load_table(name)
            figures = rewrite_figures(before[name], data_files(tbl), POLICY_SMALL_BYTES, healthy_dates)
            figures["summary_removed_bytes"] = summary_removed_bytes(tbl, snapshot_ids[name])
            tables[name] = figures
            check = check_rows(cat, name, specs)
            for k in ("rows", "missing", "duplicated", "wrong_values"):
                rows[k] += check[k]
            if not check["ok"]:
                rows["ok"] = False
                rows["bad_tables"].append({"table": name, **check})
    finally:
        cat.engine.dispose()
    return {"tables": tables, "totals": totals(tables), "rows": rows}


def run(estate: Estate, root: Path) -> dict:
    import shutil

    from benchmarks.peer import catalog

    if root.exists():
        shutil.rmtree(root)
    wh, pristine = root / "wh", root / "pristine"
    wh.mkdir(parents=True)
    anchor = dt.datetime.now(dt.timezone.utc).date()
    specs = layout(estate, anchor)
    healthy_dates = {s.date.isoformat() for s in specs if s.healthy}
    names = [f"{NAMESPACE}.t{i:03d}" for i in range(estate.tables)]
    cat = catalog(wh)
    cat.create_namespace(NAMESPACE)
    log(f"writing {estate.tables} tables, {len(specs)} files each")
    t0 = time.perf_counter()
    write_estate(cat, names, specs)
    write_seconds = time.perf_counter() - t0
    before = {n: data_files(cat.load_table(n)) for n in names}
    snapshot_ids = {n: cat.load_table(n).metadata.current_snapshot_id for n in names}
    cat.engine.dispose()
    subprocess.run(["cp", "-a", str(wh), str(pristine)], check=True)
    sizes = [s for files in before.values() for s, _ in files.values()]
    small = [s for s in sizes if s < POLICY_SMALL_BYTES]
    healthy = [s for s in sizes if s >= POLICY_SMALL_BYTES]
    result = {"estate": {**asdict(estate), "anchor": anchor.isoformat(), "files_per_table": len(specs),
                         "healthy_file_bytes": sum(healthy) / max(len(healthy), 1),
                         "small_file_bytes": sum(small) / max(len(small), 1),
                         "largest_healthy_file_bytes": max(healthy, default=0),
                         "largest_small_file_bytes": max(small, default=0)},
              "write_seconds": round(write_seconds, 1)}
    if healthy and max(healthy) >= 0.75 * TABLE_TARGET_BYTES:
        raise RuntimeError(f"a healthy file of {max(healthy)} bytes is not a bin-pack candidate: the estate is "
                           "not the one described")
    log(f"estate written in {write_seconds:.0f} s: {len(sizes):,} files, {human_size(sum(sizes))}")

    log("icemaint: tick --until-idle")
    ice = run_icemaint(root, wh, due_dates=estate.tables * estate.recent_dates)
    log(f"icemaint: {ice['seconds']:.1f} s, {ice['runs']} runs in {ice['ticks']} ticks; measuring")
    ice.update(measure_contender(root, wh, names, specs, before, snapshot_ids, healthy_dates))
    shutil.move(str(wh), str(root / "wh-icemaint"))  # kept for a look; the nightly habit gets a fresh copy
    restore(pristine, wh)
    restored = catalog(wh)
    if any(restored.load_table(n).metadata.current_snapshot_id != snapshot_ids[n] for n in names):
        raise RuntimeError("the restored estate is not the one written")
    restored.engine.dispose()
    log("nightly habit: rewrite_data_files on each table")
    nightly = run_nightly(root, wh, names)
    log(f"nightly: {nightly['seconds']:.1f} s; measuring")
    nightly.update(measure_contender(root, wh, names, specs, before, snapshot_ids, healthy_dates))
    for who, r in (("icemaint", ice), ("nightly", nightly)):
        if not r["rows"]["ok"]:
            log(f"{who}: ROWS DIFFER from what was written: {r['rows']['bad_tables'][:2]}")
    return {**result, "icemaint": ice, "nightly": nightly}


def git_commit() -> tuple[str, list[str]]:
    """HEAD, and the tracked files with uncommitted changes (the code measured is HEAD plus those)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout
    return head or "unknown", sorted(line[3:] for line in dirty.splitlines() if line.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nightly", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=None, help="tables in the estate (default 100; --quick 4)")
    parser.add_argument("--quick", action="store_true",
                        help="a small estate: proves the harness, not the figures; its section goes to "
                             "benchmarks/.work/nightly/quick/RESULTS.md unless --out is given")
    parser.add_argument("--out", default=None, help="the file whose section is written (default benchmarks/RESULTS.md)")
    parser.add_argument("--note", default="", help="a line for the section (e.g. machine conditions)")
    parser.add_argument("--from-results", metavar="JSON",
                        help="only render the section from a previous run's figures "
                             "(benchmarks/.work/nightly/results.json)")
    parser.add_argument("--driver", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.driver:
        nightly_driver(args.driver[0], args.driver[1:])
        return 0
    from benchmarks.machine import describe_machine, load_average
    from benchmarks.stack_bench import write_section

    out = Path(args.out) if args.out else (WORK / "quick" / "RESULTS.md" if args.quick else HERE / "RESULTS.md")
    if args.from_results:
        write_section(out, render(json.loads(Path(args.from_results).read_text())), SECTION)
        log(f"wrote {out} ({SECTION[3:]})")
        return 0
    from benchmarks.shared_catalog import SQLITE_JAR

    if not Path(SQLITE_JAR).exists():
        print(f"error: {SQLITE_JAR} is missing: run scripts/ensure_debian_packages.sh libxerial-sqlite-jdbc-java",
              file=sys.stderr)
        return 2
    estate = QUICK if args.quick else FULL
    if args.tables is not None:
        if args.tables < 1:
            parser.error("--tables must be at least 1")
        estate = Estate(**{**asdict(estate), "tables": args.tables,
                           "healthy_files": tuple(estate.healthy_files)})
    commit, dirty = git_commit()
    started = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "command": shlex.join(["python", "-m", "benchmarks.nightly",
                                      *(argv if argv is not None else sys.argv[1:])]),
               "commit": commit, "dirty": dirty, "machine": describe_machine(), "load_start": load_average(),
               "note": args.note}
    root = WORK / ("quick" if args.quick else "full")
    results = {**started, **run(estate, root / "run"), "load_end": load_average()}
    saved = WORK / ("quick-results.json" if args.quick else "results.json")
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(results, indent=1, default=str))
    section = render(results)
    write_section(out, section, SECTION)
    if args.quick:
        print(section)
    log(f"wrote {saved} and {out} ({SECTION[3:]})")
    return 0 if results["icemaint"]["rows"]["ok"] and results["nightly"]["rows"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
