"""Side by side with a peer a platform team could pick: iceberg-zamboni (pyiceberg + pyarrow, no JVM).

    python -m benchmarks.peer [--quick] [--shapes files_100,commits_1000,estate_100,files_10000]
                              [--catalog postgres|sqlite] [--out benchmarks/RESULTS.md] [--note TEXT]
    python -m benchmarks.peer --from-results benchmarks/.work/peer/results.json   # re-render only

The peer is installed into a virtualenv of its own (benchmarks/.work/peer-venv): a benchmark peer, never a
dependency of the product. Both tools work on one SQL catalog named `local` (benchmarks/shared_catalog.py):
on PostgreSQL by default (a throwaway server, a fresh database per shape; icemaint opens it as a JDBC
catalog and so runs tables at once, zamboni through benchmarks/zamboni_on_sql.py), or with `--catalog
sqlite` at <work>/wh/catalog.db, which zamboni's CLI opens unpatched. Each shape is written twice by pyiceberg
with identical rows and commits, one copy per tool (namespace `ice` for icemaint, `zam` for zamboni); each
tool runs in a fresh process, the two one after the other; afterwards one independent reader (pyiceberg,
in this process) checks every row of both copies against what was written. Both tools get the same
targets: 128 MiB files, at least 2 input files.

Writes the section "Side by side with a peer" of --out (`make bench` keeps it when it rewrites the rest).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.jvm_archive import ready as ready_class_archive
from benchmarks.shared_catalog import SharedCatalog, missing_prerequisite, postgres_catalog, postgres_server, \
    pyiceberg_catalog, sqlite_catalog

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "peer"
PEER_VENV = HERE / ".work" / "peer-venv"
PEER_PACKAGES = ("iceberg-zamboni==0.7.0", "psycopg2-binary>=2.9")  # the driver: the shared PostgreSQL catalog
SECTION = "## Side by side with a peer (iceberg-zamboni)"
DAY = dt.date(2026, 1, 1)
TARGET_FILE_BYTES = 128 * 2**20
WARM_UP = 20  # tables the warm process catches up before its timed work (the estate's shape); --quick: 3


@dataclass(frozen=True)
class Shape:
    name: str
    tables: int           # tables per tool
    files: int            # small files on DAY per table
    rows_per_file: int
    commits: int          # commits that add the files (files == commits: one file per commit, by append)
    what: str


FULL = {s.name: s for s in (
    Shape("files_100", 1, 100, 1000, 100, "one date of 100 small files (100 appends, 100k rows)"),
    Shape("commits_1000", 1, 1000, 4000, 1000, "one date built by 1,000 single-file commits (4M rows)"),
    Shape("estate_100", 100, 100, 100, 1, "estate catch-up: 100 tables x 1 date of 100 small files"),
    Shape("files_10000", 1, 10000, 4000, 10, "one date of 10,000 files (40M rows)"),
)}
QUICK = {s.name: s for s in (
    Shape("files_100", 1, 20, 500, 20, "one date of 20 small files (quick)"),
    Shape("commits_1000", 1, 100, 1000, 100, "one date built by 100 single-file commits (quick)"),
    Shape("estate_100", 4, 20, 100, 1, "estate catch-up: 4 tables x 1 date of 20 small files (quick)"),
)}


def log(message: str) -> None:
    print(f"[peer {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the peer's own environment --------------------------------------------------------------------

def ensure_peer() -> Path:
    """The peer's CLI, installed into its own virtualenv on first use (with the PostgreSQL driver its
    SQL catalog needs there)."""
    zamboni, python = PEER_VENV / "bin" / "zamboni", PEER_VENV / "bin" / "python"
    ready = zamboni.exists() and subprocess.run([str(python), "-c", "import psycopg2"],
                                                capture_output=True).returncode == 0
    if not ready:
        log(f"installing {', '.join(PEER_PACKAGES)} into {PEER_VENV} (its own virtualenv)")
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([str(PEER_VENV / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)
    return zamboni


def peer_version() -> str:
    out = subprocess.run([str(PEER_VENV / "bin" / "pip"), "show", "iceberg-zamboni"], capture_output=True,
                         text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Version:")), "?")


# -- the shared catalog and the tables --------------------------------------------------------------

def catalog(wh: Path, shared: SharedCatalog | None = None):
    """pyiceberg's view of the shared catalog (SQLite at `<wh>/catalog.db` unless `shared` says otherwise)."""
    return pyiceberg_catalog(shared or sqlite_catalog(wh), wh)


def arrow_rows(first: int, n: int):
    """Rows whose every column is a function of event_id: the reader can check each row on its own."""
    import numpy as np
    import pyarrow as pa

    ids = np.arange(first, first + n, dtype=np.int64)
    base = np.datetime64(DAY.isoformat(), "us")
    return pa.table({
        "event_id": ids, "device_id": (ids % 97).astype(np.int32),
        "ts": base + ((ids * 37) % 86400) * np.timedelta64(1, "s"), "reading": ids * 0.5,
        "status": pa.array(np.array(["ok", "warn", "err"])[ids % 3]),
    })


def create_table(cat, name: str):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform
    from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType, TimestampType

    schema = Schema(NestedField(1, "event_id", LongType()), NestedField(2, "device_id", IntegerType()),
                    NestedField(3, "ts", TimestampType()), NestedField(4, "reading", DoubleType()),
                    NestedField(5, "status", StringType()))
    spec = PartitionSpec(PartitionField(source_id=3, field_id=1000, transform=DayTransform(), name="ts_day"))
    return cat.create_table(name, schema=schema, partition_spec=spec)


def write_copies(cat, names: list[str], shape: Shape) -> None:
    """The same files and commits into every table of `names`: one file per append when files == commits,
    else pyarrow-written files added in `commits` commits."""
    import pyarrow.parquet as pq

    tables = [create_table(cat, name) for name in names]
    per_commit = shape.files // shape.commits
    for c in range(shape.commits):
        first = c * per_commit * shape.rows_per_file
        for tbl in tables:
            if per_commit == 1:
                tbl.append(arrow_rows(first, shape.rows_per_file))
                continue
            paths = []
            for f in range(per_commit):
                path = f"{tbl.location().removeprefix('file://')}/data/ts_day={DAY}/c{c:05d}-f{f:05d}.parquet"
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(arrow_rows(first + f * shape.rows_per_file, shape.rows_per_file), path)
                paths.append(f"file://{path}")
            tbl.add_files(paths)


def check_rows(cat, name: str, expected: int) -> dict:
    """Every row of the table read by pyiceberg: ids exactly 0..expected-1, each once, every other column
    the function of its id it was written as. Returns the table's figures."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    tbl = cat.load_table(name)
    seen = np.zeros(expected, dtype=np.int8)
    bad = rows = 0
    for batch in tbl.scan().to_arrow_batch_reader():
        ids = batch.column("event_id").to_numpy()
        rows += len(ids)
        inside = (ids >= 0) & (ids < expected)
        bad += int((~inside).sum())
        np.add.at(seen, ids[inside], 1)
        bad += int((batch.column("device_id").to_numpy() != (ids % 97)).sum())
        bad += int((batch.column("reading").to_numpy() != ids * 0.5).sum())
        codes = pc.index_in(batch.column("status"), value_set=pa.array(["ok", "warn", "err"])).to_numpy(
            zero_copy_only=False)
        bad += int((codes != ids % 3).sum())
        seconds = pc.cast(batch.column("ts"), "int64").to_numpy() // 1_000_000
        day0 = int(dt.datetime.combine(DAY, dt.time(), dt.timezone.utc).timestamp())
        bad += int((seconds - day0 != (ids * 37) % 86400).sum())
    files = len(tbl.inspect.files().column("file_path"))
    return {"rows": rows, "missing": int((seen == 0).sum()), "duplicated": int((seen > 1).sum()),
            "wrong_values": bad, "data_files": files, "ok": rows == expected and not bad and seen.min() == 1
            and seen.max() == 1}


# -- the two tools -------------------------------------------------------------------------------------

def icemaint_config(root: Path, wh: Path, shared: SharedCatalog | None = None, namespace: str = "ice") -> Path:
    import yaml

    shared = shared or sqlite_catalog(wh)
    jars = {"spark.jars": shared.spark_jars} if shared.spark_jars else {}
    doc = {
        "catalog": {"name": "local", "type": "jdbc", "uri": shared.jdbc_uri, "warehouse": str(wh),
                    "properties": dict(shared.jdbc_properties)},
        "spark": {"master": "local[2]", "conf": {**jars, "spark.ui.enabled": "false",
                                                 "spark.sql.shuffle.partitions": "4", "spark.driver.memory": "3g"}},
        "state_dir": str(root / ("icemaint-state" if namespace == "ice" else f"icemaint-state-{namespace}")),
        "claims": {"backend": "file"},
        "audit": {"sink": "file"}, "scope": {"include": [f"{namespace}.*"], "exclude": []},
        # Like for like with the peer's `--operations compact`: our tick would also rewrite the manifests the
        # appends left (the retention sensor), which the peer does not do.
        "defaults": {"writer_idle": "0s", "hot_partition_age": "0s", "claim_wait": "0s",
                     "target_file_size_bytes": "128MiB", "min_input_files": 2, "max_rewrite_bytes": "100GiB",
                     "allowed_operations": ["compact"]},
    }
    path = root / ("icemaint.yaml" if namespace == "ice" else f"icemaint-{namespace}.yaml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def zamboni_table_config(root: Path, names: list[str]) -> Path:
    """zamboni's table config for `names` (compaction as ours: no time hold, no partition evolution)."""
    tables = {name.split(".", 1)[1]: {"partition": [{"column": "ts", "transform": "day"}]} for name in names}
    doc = {"version": 2, "warehouse": "local",
           "defaults": {"partition": [], "partition_evolution": {"enabled": False, "rules": []},
                        "ordering": {"mode": "none"}, "target_file_size_bytes": TARGET_FILE_BYTES,
                        "min_input_files": 2, "skip_partitions_newer_than_windows": None},
           "namespaces": {"zam": {"tables": tables}}}
    path = root / "zamboni-tables.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def timed(argv: list[str], env: dict, log_path: Path) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=log_path.parent)
    seconds = time.perf_counter() - started
    log_path.write_text(f"$ {' '.join(argv)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n"
                        f"{proc.stderr}")
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]} "
                           f"(log: {log_path})")
    return seconds, proc


def run_icemaint(root: Path, config: Path, shape: Shape, names: list[str], shared: SharedCatalog) -> dict:
    env = {**os.environ, **shared.env, "DAGSTER_HOME": str(root / "dagster"), "ICEMAINT_IDENTITY": "benchmark"}
    Path(env["DAGSTER_HOME"]).mkdir(exist_ok=True)
    icemaint = str(Path(sys.executable).parent / "icemaint")
    if shape.tables == 1:
        seconds, proc = timed([icemaint, "--config", str(config), "compact", names[0], "--date", DAY.isoformat(),
                               "--json"], env, root / f"{shape.name}-icemaint.log")
        [outcome] = json.loads(proc.stdout)
        assert outcome["decision"] == "run" and outcome["published"], outcome["reason"]
        return {"seconds": seconds, "runs": 1, "durations": outcome.get("durations", {})}
    # A tick launches at most the sensor's budget of runs (20): the catch-up ticks in one process until idle.
    seconds, proc = timed([icemaint, "--config", str(config), "tick", "--until-idle", "--json"], env,
                          root / f"{shape.name}-icemaint.log")
    reports = json.loads(proc.stdout)
    runs = [d for r in reports for d in r["decisions"] if d.get("run_id")]
    return {"seconds": seconds, "runs": sum(1 for d in runs if d.get("published")), "ticks": len(reports)}


def run_icemaint_warm(root: Path, wh: Path, shape: Shape, names: list[str], shared: SharedCatalog,
                      warm_up: int) -> dict:
    """The same work on the warm copy, in a process that has first caught up `warm_up` other tables
    (benchmarks/peer_warm.py): `serve`'s engine after its first ticks."""
    env = {**os.environ, **shared.env, "DAGSTER_HOME": str(root / "dagster-warm"), "ICEMAINT_IDENTITY": "benchmark"}
    Path(env["DAGSTER_HOME"]).mkdir(exist_ok=True)
    what = ["--estate"] if shape.tables > 1 else ["--table", names[0]]
    config = icemaint_config(root, wh, shared, "icw")
    _, proc = timed([sys.executable, "-m", "benchmarks.peer_warm", str(config), "--date", DAY.isoformat(),
                     "--warm-up", str(warm_up), *what], {**env, "PYTHONPATH": str(REPO)},
                    root / f"{shape.name}-icemaint-warm.log")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["runs"] != shape.tables:
        raise RuntimeError(f"[{shape.name}] the warm process published {result['runs']} of {shape.tables} tables")
    return result


def run_zamboni(root: Path, zamboni: Path, wh: Path, shape: Shape, names: list[str], shared: SharedCatalog) -> dict:
    env = {**os.environ, "ZAMBONI_LOCAL_WAREHOUSE": str(wh), "ZAMBONI_ROOT": str(root / "zamboni-root"),
           "ZAMBONI_CACHE_DIR": str(root / "zamboni-cache")}
    env.pop("VIRTUAL_ENV", None)
    command = [str(zamboni)]
    if shared.kind != "sqlite":  # zamboni's own entry, its local catalog on the shared database
        env["ZAMBONI_CATALOG_URI"] = shared.sqlalchemy_uri
        command = [str(zamboni.parent / "python"), str(HERE / "zamboni_on_sql.py")]
    if shape.tables == 1:
        seconds, _ = timed([*command, "compact", names[0], "--yes", "--target-file-size-bytes",
                            str(TARGET_FILE_BYTES), "--min-input-files", "2"], env, root / f"{shape.name}-zamboni.log")
        return {"seconds": seconds, "runs": 1}
    config = zamboni_table_config(root, names)
    seconds, _ = timed([*command, "maintenance", "--table-config", str(config), "--operations", "compact",
                        "--yes", "--json", str(root / "zamboni-maintenance.jsonl")], env,
                       root / f"{shape.name}-zamboni.log")
    return {"seconds": seconds, "runs": shape.tables}


# -- one shape ------------------------------------------------------------------------------------------

def run_shape(shape: Shape, zamboni: Path, server=None, warm_up: int = WARM_UP) -> dict:
    """One shape on a fresh shared catalog: a database of its own on `server` (PostgreSQL), else SQLite."""
    root = WORK / shape.name
    if root.exists():
        shutil.rmtree(root)
    wh = root / "wh"
    wh.mkdir(parents=True)
    with (postgres_catalog(server, f"peer_{shape.name}") if server is not None
          else contextlib.nullcontext(sqlite_catalog(wh))) as shared:
        return _run_shape(shape, zamboni, root, wh, shared, warm_up)


def _run_shape(shape: Shape, zamboni: Path, root: Path, wh: Path, shared: SharedCatalog, warm_up: int) -> dict:
    cat = catalog(wh, shared)
    cat.create_namespace("ice")
    cat.create_namespace("zam")
    cat.create_namespace("icw")
    ours = [f"ice.t{i:03d}" for i in range(shape.tables)]
    warm = [f"icw.t{i:03d}" for i in range(shape.tables)]
    theirs = [f"zam.t{i:03d}" for i in range(shape.tables)]
    expected = shape.files * shape.rows_per_file
    log(f"[{shape.name}] writing {3 * shape.tables} tables: {shape.what}")
    started = time.perf_counter()
    for copies in zip(ours, warm, theirs):
        write_copies(cat, list(copies), shape)
    write_seconds = time.perf_counter() - started
    config = icemaint_config(root, wh, shared)
    log(f"[{shape.name}] {ready_class_archive(config, {**os.environ, **shared.env})}")
    log(f"[{shape.name}] icemaint")
    ice = run_icemaint(root, config, shape, ours, shared)
    log(f"[{shape.name}] icemaint, warm (after {warm_up} other tables in the same process)")
    ice_warm = run_icemaint_warm(root, wh, shape, warm, shared, warm_up)
    log(f"[{shape.name}] zamboni")
    zam = run_zamboni(root, zamboni, wh, shape, theirs, shared)
    log(f"[{shape.name}] checking every row of the three copies with pyiceberg")
    checks = {"icemaint": [check_rows(cat, n, expected) for n in ours],
              "icemaint_warm": [check_rows(cat, n, expected) for n in warm],
              "zamboni": [check_rows(cat, n, expected) for n in theirs]}
    for tool, results in checks.items():
        bad = [r for r in results if not r["ok"]]
        if bad:
            raise RuntimeError(f"[{shape.name}] {tool}: rows differ from what was written: {bad[:2]}")
    result = {"shape": shape.__dict__, "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "catalog": shared.kind, "write_seconds": round(write_seconds, 1), "icemaint": ice,
              "icemaint_warm": ice_warm, "zamboni": zam,
              "files_after": {tool: sorted({r["data_files"] for r in results}) for tool, results in checks.items()},
              "rows_checked": expected * shape.tables * 3,
              "ratio": round(ice["seconds"] / zam["seconds"], 2) if zam["seconds"] else None,
              "warm_ratio": round(ice_warm["seconds"] / zam["seconds"], 2) if zam["seconds"] else None}
    log(f"[{shape.name}] icemaint {ice['seconds']:.1f} s (warm {ice_warm['seconds']:.1f} s), zamboni "
        f"{zam['seconds']:.1f} s: {result['ratio']}x (warm {result['warm_ratio']}x)")
    return result


# -- the report --------------------------------------------------------------------------------------

TARGETS = {"files_100": None, "commits_1000": 1.5, "estate_100": 2.0, "files_10000": 1.0}
WHY = {
    "files_100": "a JVM, Dagster and a Spark session per process against a Python process; the data work "
                 "itself is small either way",
    "commits_1000": "the same fixed cost, plus the proof: icemaint digests the replaced rows as they are "
                    "rewritten, reads the staged files again and compares the whole-row hash sums of every "
                    "row and the fingerprints of a content-hashed sample, where the peer compares one row count. "
                    "Of the rest, starting the JVM and the session takes ~2.3 s and Iceberg's Java planning of the "
                    "date's 1,000 manifests ~1.5 s cold (3.7 s before 96d63b2, when Iceberg's worker pool had 2 "
                    "threads on this machine and its parallel planning mostly slept: 2.5 s warm then, 0.5-0.7 s "
                    "now); the rewrite runs one task, as one output file needs, with the JIT still cold (the same "
                    "stage takes 3.1 s in a warm JVM). Until 4da86c4 that task also wrote gzip, Iceberg's Java "
                    "fallback for a table that names no codec (pyiceberg's tables): 23.3 s then",
    "estate_100": "every table-date has its own claim, plan, staging branch, proof, publish and audit record "
                  "(`tick --until-idle`: one process and JVM, 20 tables a tick, two lanes on a PostgreSQL catalog, "
                  "neighbouring tables due on the same dates in one Dagster run), where the peer rewrites each table "
                  "without a proof. A profile of the same 100 tables on one lane (cProfile, 94.7 s): the compaction contract "
                  "78 s (staging 23.5 s of which Spark's write 15.6 s, proof 24.7 s of which Great Expectations' "
                  "four checks 13.7 s with its Spark row count, planning 12.2 s, publish 6.5 s), Dagster ~7 s for "
                  "5 runs. In the JVM, warming up dominates: over the first 30 tables its JIT compilers used 22 "
                  "of its 40 CPU-seconds (27,700 methods compiled); compiling with C1 alone halves the JVM's CPU "
                  "but cut the wall time by only 7% on one lane, and by 13% on the two lanes of this shape (2026-11-25, "
                  "interleaved, 2 runs each: 51.4 and 60.2 s against 59.9 and 68.6 s); not adopted, since the "
                  "same flag makes a large date's rewrite slower (1,000 commits: +2-3 s) and a JVM's compilers are "
                  "chosen before it knows its work. A warm table on one lane now (each call timed, no "
                  "profiler) costs ~460 ms in the contract: Spark's write 124 ms, the proof's read of the staged "
                  "files 69 ms and Great Expectations' own Spark count 52 ms plus 26 ms for its three other checks, "
                  "publish 58 ms, the staging branch's commit 27 ms, planning 16 ms: a handful of Spark jobs and "
                  "catalog commits on tiny inputs, each mostly the driver's own overhead (running the count beside "
                  "the read was tried: both slowed to the same total, the driver is the bottleneck)."
                  "Where the two cores go (2026-11-25, 60 tables of this shape in one `tick --until-idle` on one "
                  "lane, a Hadoop catalog, CPU per thread from /proc, Python's GIL-held time from a sampler): 135 "
                  "CPU-seconds in 79-90 s of wall time, so both cores are busy and a second lane gains little. The "
                  "JVM used 100 s: its JIT compilers 54 s (the methods compiled still rising at 30,800 after 80 s "
                  "while the classes loaded stayed at 20,300 after the first 20 s: the code base warming up, not "
                  "generated code churning), the driver's calls 21 s and Spark's tasks 13 s. Python used 35 s: "
                  "importing Great Expectations 4.8 s of CPU on its own (scipy.stats and every expectation module), "
                  "its four validations ~100 ms a table, Dagster's event and log records ~75 ms a table (three "
                  "progress lines and ~10 asset and check events, each a SQLite write of its own). The JIT's share "
                  "is a fixed cost of every fresh process, which the peer's Python process does not pay",
    "files_10000": "the data work itself: Spark's Parquet read and write of 40M rows on 2 local cores against "
                   "the peer's vectorised duckdb/arrow in one process, the digest of the replaced rows in the rewrite's pass and "
                   "the proof reading the staged files again. Until 4da86c4 our files were gzip, Iceberg's Java "
                   "fallback for a table that names no codec (pyiceberg's tables): deflate was 47% of the executor's "
                   "samples and the process took 61.7 s. In zstd now (JFR, the executor's threads): Iceberg's "
                   "row-at-a-time Parquet writer 36%, the read 19%, the proof's read of the staged files 16%, the row "
                   "hashes ~17% (before bb41981 packed their NULL and sign flags), the day transform per row ~5%, a "
                   "Hadoop Configuration copy per file ~3%; Hadoop's local checksum file system is not the cost "
                   "(verification on or off: 4.8 vs 4.7 s to read the 10,000 files warm). A third of the cold run is "
                   "the JIT warming up: in a warm JVM the same compaction takes 21-22 s. Since 93139c5 the 6 output "
                   "files are 6 even read tasks on 2 cores (7 before, 4 waves with the last on one core)",
}


CATALOGS = {"postgres": "a PostgreSQL SQL catalog `local`, a fresh database per shape: icemaint's tick runs tables "
                        "at once through it, zamboni opens it through `benchmarks/zamboni_on_sql.py` (its own CLI, "
                        "given the catalog's URI)",
            "sqlite": "a SQLite SQL catalog `local`, which takes one writer at a time: icemaint's tick runs one "
                      "table at a time through it"}


def _catalogs(shapes: list[dict]) -> str:
    """The catalogs the shapes were measured on, as the report says them (results before the shared
    PostgreSQL catalog were on SQLite)."""
    kinds = {r.get("catalog", "sqlite"): [] for r in shapes}
    for r in shapes:
        kinds[r.get("catalog", "sqlite")].append(r["shape"]["name"])
    if len(kinds) == 1:
        return CATALOGS[next(iter(kinds))]
    return "; ".join(f"{', '.join(names)}: {CATALOGS[kind]}" for kind, names in kinds.items())


def _warm_ups(shapes: list[dict]) -> str:
    counts = sorted({r["icemaint_warm"]["warm_up_tables"] for r in shapes if r.get("icemaint_warm")})
    return " or ".join(str(n) for n in counts) or str(WARM_UP)


def render(results: dict) -> str:
    order = list(FULL)
    shapes = sorted(results["shapes"], key=lambda r: order.index(r["shape"]["name"]) if r["shape"]["name"] in order
                    else len(order))
    rows = []
    for r in shapes:
        shape, target = r["shape"], TARGETS.get(r["shape"]["name"])
        warm = r.get("icemaint_warm")  # results from before the warm process carry none

        def verdict(ratio: float | None) -> str:
            return "-" if target is None or ratio is None else ("met" if ratio <= target else "**missed**")

        warm_seconds = f"{warm['seconds']:.1f} s" if warm else "-"
        warm_ratio = f"{r['warm_ratio']:.2f}x" if warm else "-"
        rows.append(f"| {shape['what']} | {r['icemaint']['seconds']:.1f} s | {warm_seconds} | "
                    f"{r['zamboni']['seconds']:.1f} s | {r['ratio']:.2f}x | {warm_ratio} | "
                    f"{'-' if target is None else f'<= {target}x'} | {verdict(r['ratio'])} / "
                    f"{verdict(r.get('warm_ratio'))} | {r['files_after']['icemaint']} / "
                    f"{r['files_after']['zamboni']} |")
    lines = [SECTION, "", f"- Date: {results['date']}; command: `{results['command']}` (a shape measured by an "
             "earlier command of the same kind says when, in its line); machine: "
             f"{results['machine']}; load average at the start {results['load_start']}, at the end "
             f"{results['load_end']}.",
             f"- Peer: iceberg-zamboni {results['peer_version']} in its own virtualenv (pyiceberg + pyarrow, no JVM; "
             "its row check is one row count). Ours: `icemaint compact --date` (claim, staging branch, Great "
             "Expectations proof, publish) in a fresh process; the estate with `icemaint tick --until-idle` (ticks "
             "in one process until nothing is launched; policy `allowed_operations: [compact]`, so it compacts and does not "
             "also rewrite manifests), against `zamboni maintenance --operations compact`. Since 65bff89 our processes' "
             "JVM maps Spark's classes from the archive this machine records for them (`spark.class_archive`); it is "
             "recorded before the first timed run, as a deployment's is by its second session.",
             f"- One catalog for both ({_catalogs(shapes)}); identical copies written by pyiceberg; after the "
             f"runs pyiceberg read every row of every copy ({sum(r['rows_checked'] for r in results['shapes']):,} "
             "rows): every id once, every column as written. One run each, the two tools one after the other.",
             f"- *Warm*: the same work on a third copy, in a process that first caught up {_warm_ups(shapes)} other tables of "
             "the estate's shape (benchmarks/peer_warm.py, untimed): `icemaint serve`'s engine after its first "
             "ticks, one JVM and Dagster instance for all its runs (docs/operations/serve.md). The estate warm is "
             "the tick's loop in that process; a single date warm is `icemaint compact`'s run in it.",
             "", "| shape | icemaint, a fresh process | icemaint, warm | zamboni | fresh / zamboni | warm / zamboni "
             "| target | verdict (fresh / warm) | data files after (ours / theirs) |",
             "|---|---|---|---|---|---|---|---|---|", *rows, ""]
    for r in shapes:
        name = r["shape"]["name"]
        target = TARGETS.get(name)
        if target is not None and r["ratio"] > target or name == "files_100":
            detail = dict(r["icemaint"].get("durations") or {})
            inside = detail.pop("total_seconds", None)
            parts = ", ".join(f"{k.removesuffix('_seconds')} {v:.1f} s" for k, v in detail.items()
                              if isinstance(v, (int, float)))
            steps = sum(v for v in detail.values() if isinstance(v, (int, float)))
            start = (f" {r['icemaint']['seconds'] - inside:.1f} s of the process went before and after the "
                     f"compaction run (Python imports, the Dagster instance and job), {inside:.1f} s in it:"
                     if inside is not None else "")
            rest = (f", and {inside - steps:.1f} s for the rest (claim, health, audit, starting the JVM and the "
                    "Spark session)" if inside is not None else "")
            lines.append(f"- **{name}**: behind by {r['ratio']:.1f}x. Why: {WHY.get(name) or 'see the log'}."
                         + (f"{start} {parts}{rest}." if parts else "")
                         + (f" {r['icemaint']['ticks']} ticks." if r["icemaint"].get("ticks") else "")
                         + (f" Measured {r['measured_at']}." if r.get("measured_at") else ""))
    if results.get("note"):
        lines += ["", f"> {results['note']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes: proves the harness, not the figures")
    parser.add_argument("--shapes", default=None, help="comma-separated shape names (default: all of the mode)")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the file whose section is written")
    parser.add_argument("--note", default="", help="a line for the section (e.g. machine conditions)")
    parser.add_argument("--catalog", choices=("postgres", "sqlite"), default="postgres",
                        help="the shared catalog's database (default postgres: a throwaway server)")
    parser.add_argument("--from-results", metavar="JSON",
                        help="only render the section from a previous run's figures (benchmarks/.work/peer/results.json)")
    args = parser.parse_args(argv)
    from benchmarks.machine import describe_machine, load_average
    from benchmarks.stack_bench import write_section

    if args.from_results:
        result = json.loads(Path(args.from_results).read_text())
        result["note"] = args.note or result.get("note", "")  # a new note replaces the stored one
        write_section(Path(args.out), render(result), SECTION)
        return 0
    missing = missing_prerequisite(args.catalog)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    mode = QUICK if args.quick else FULL
    names = args.shapes.split(",") if args.shapes else list(mode)
    unknown = [n for n in names if n not in mode]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; this mode has {sorted(mode)}")
    zamboni = ensure_peer()
    machine = describe_machine()
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "command": shlex.join(["python", "-m", "benchmarks.peer",
                                      *(argv if argv is not None else sys.argv[1:])]),
               "machine": f"{machine['cores']} cores, {machine['cpu_model']}", "load_start": load_average(),
               "peer_version": peer_version(), "note": args.note, "shapes": []}
    WORK.mkdir(parents=True, exist_ok=True)
    saved = WORK / "results.json"
    if args.shapes and saved.exists():  # some shapes again: the others keep their last figures
        previous = json.loads(saved.read_text())
        results["shapes"] = [r for r in previous["shapes"] if r["shape"]["name"] not in names]
    with postgres_server() if args.catalog == "postgres" else contextlib.nullcontext() as server:
        for n in names:  # the figures so far are saved after each shape: a long run stopped early keeps them
            results["shapes"] = [r for r in results["shapes"] if r["shape"]["name"] != n] + [
                run_shape(mode[n], zamboni, server, 3 if args.quick else WARM_UP)]
            results["load_end"] = load_average()
            (WORK / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_section(Path(args.out), render(results), SECTION)
    log(f"wrote {args.out} ({SECTION[3:]})")
    kept = HERE / "results" / f"peer_{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M}.json"  # benchmarks.cost_summary
    kept.parent.mkdir(exist_ok=True)
    kept.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
