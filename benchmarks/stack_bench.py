"""icemaint on the local production stack (scripts/stack.py): S3 tables behind the Iceberg REST catalog
(SeaweedFS), Spark standalone with two 1-core workers, PostgreSQL for claims, audit and Dagster.

    python -m benchmarks.stack_bench [--files 3000] [--rows-per-file 10] [--orphan-objects 1000,10000]
                                     [--out benchmarks/RESULTS.md] [--keep-tables] [--note TEXT]
    python -m benchmarks.stack_bench --from-results benchmarks/.work/stack/results.json   # re-render only
    make bench-stack

One run measures, each maintenance step its own process as a deployment runs it:

1. Compaction of `--files` small files on one date. Two tables with identical rows and files (pyiceberg
   writes every file itself, a few rows each, and commits them in 3 fast appends). Then, one after the
   other: the bare `CALL lake.system.rewrite_data_files(table, where => <the date>, options)` in a fresh
   driver process (`--driver bare`, this module: `get_spark(load_config(...))`, so the config's Spark
   master, the bundled Iceberg runtime + the AWS jars and the REST catalog settings), and
   `icemaint --config <cfg> compact TABLE --date D --json` (claim, stage, GX proof, publish). Wall time of
   each whole process (start to the exit of it and its JVM), data files before/after (pyiceberg), and the
   rows of both tables read back with pyiceberg (every event_id, against the ids written).
2. Orphan listing on S3 against the number of objects under a table's location: one table per size, with
   that many dummy objects planted under `<location>/data/` (pyarrow, a thread pool). Timed: `icemaint
   orphans TABLE --dry-run --older-than 24h` (a process), the listing alone with pyarrow in this process
   and Iceberg's own `S3FileIO.listPrefix` in one driver process (`--driver list`), and, as the proof the
   listing sees the planted objects, `orphans --dry-run --older-than 1s --force`, whose candidates must be
   exactly the planted objects (the 24 h run's are none: they are minutes old).

A stack that is up is reused and left running; otherwise the pieces this run starts are stopped at the
end. The run uses its own namespace, its own state dir (benchmarks/.work/stack/) and its own Dagster
database; its tables are dropped (purged) at the end unless --keep-tables. Any failed step stops the run
with one line on stderr and a non-zero exit; nothing is written then. The results replace (or append)
the section "Production stack (S3 + REST + Spark standalone, 2 workers)" of --out.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import datetime as dt
import importlib.util
import itertools
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "stack"
DATE = dt.date(2026, 1, 1)
DAY = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
SECTION = "## Production stack (S3 + REST + Spark standalone, 2 workers)"
RESULT_MARKER = "STACK_BENCH_RESULT "
PROCESS_TIMEOUT = 1800  # seconds, per measured process
IDLE_WAIT = 300  # seconds, at most, for the cluster to hold no application before a measured process
ATTEMPTS = 3  # runs of a measured process, when another Spark application overlapped the previous one
APP_NAME = "icemaint-stackbench"  # our drivers' Spark application name: others' apps are told apart by it
COMMITS = 3  # the small files are committed in this many fast appends
# Loose enough that the date is compacted at once: no writer-idle or hot-partition wait.
POLICY = {"writer_idle": "0s", "hot_partition_age": "0s", "min_input_files": 5, "small_file_size_bytes": "8MiB",
          "target_file_size_bytes": "128MiB", "max_rewrite_bytes": "10GiB", "retry_backoff": "0s",
          "sample_fraction": 0.05}


class BenchmarkFailure(RuntimeError):
    """A step failed: the run stops, nothing is reported."""


def log(message: str, _t0=time.perf_counter()) -> None:  # noqa: B008 (the process's start, once)
    print(f"[stack-bench {time.perf_counter() - _t0:7.1f}s] {message}", file=sys.stderr, flush=True)


# -- the driver processes (`--driver bare|list|warmup CONFIG ...`) ----------------------------------------

def _executors(spark) -> int:
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().keySet().size()) - 1


def _wait_executors(spark, n: int = 2, timeout: float = 60.0) -> None:
    """The cluster's executors register a moment after the session: wait, so work spreads over both."""
    deadline = time.monotonic() + timeout
    while _executors(spark) < n and time.monotonic() < deadline:
        time.sleep(0.2)


def driver(mode: str, config_path: str, args: list[str]) -> dict:
    from benchmarks.backfill_batch import end_spark
    from icemaint.config import load_config
    from icemaint.domain.names import TableName
    from icemaint.engine.spark_session import get_spark, iceberg_table

    t0 = time.perf_counter()
    config = load_config(config_path)
    spark = get_spark(config)
    t_session = time.perf_counter()
    jvm = spark.sparkContext._jvm
    out = {"mode": mode, "master": spark.sparkContext.master, "app_id": spark.sparkContext.applicationId,
           "spark": spark.version, "iceberg": str(jvm.org.apache.iceberg.IcebergBuild.version()),
           "java": f"{jvm.java.lang.System.getProperty('java.version')} "
                   f"({jvm.java.lang.System.getProperty('java.vm.name')})",
           "session_seconds": t_session - t0}
    if mode == "warmup":
        spark.sql(f"SHOW NAMESPACES IN `{config.catalog.name}`").collect()
        _wait_executors(spark)
    elif mode == "bare":
        from benchmarks.baseline import rewrite_options, rewrite_sql
        from icemaint.domain.scope import DateScope

        table, date, column_type = args
        name = TableName.parse(table)
        sql = rewrite_sql(config.catalog.name, name,
                          DateScope("ts", column_type, dt.date.fromisoformat(date)).predicate(),
                          rewrite_options(config.policy(table)))
        t1 = time.perf_counter()
        [row] = spark.sql(sql).collect()
        out.update(sql=sql, result=row.asDict(), call_seconds=time.perf_counter() - t1)
    elif mode == "list":
        # Iceberg's own listing of a table location (what orphan removal uses on S3), counted inside the JVM.
        iterables = jvm.org.apache.iceberg.relocated.com.google.common.collect.Iterables
        out["listings"] = {}
        for table in args:
            jtable = iceberg_table(spark, config.catalog.name, TableName.parse(table))
            io, location = jtable.io(), str(jtable.location())
            runs = []
            for _ in range(3):
                t1 = time.perf_counter()
                count = int(iterables.size(io.listPrefix(location.rstrip("/") + "/")))
                runs.append({"objects": count, "seconds": time.perf_counter() - t1})
            out["listings"][table] = {"io": io.getClass().getName(), "location": location, "runs": runs}
    else:
        raise SystemExit(f"unknown driver mode {mode!r}")
    out["executors"] = _executors(spark)
    t_end = time.perf_counter()
    end_spark()
    out["stop_seconds"] = time.perf_counter() - t_end
    return out


# -- processes timed from outside --------------------------------------------------------------------------

def _become_subreaper() -> None:
    """Orphaned descendants (a driver's JVM outliving its Python) become our children: we reap them, so a
    process's wall time runs to the exit of its JVM too, and their CPU is counted with ours."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def run_process(argv: list[str], env: dict, log_path: Path, stack_pids: list[int]) -> dict:
    """Runs one process to the exit of it and every descendant; wall, CPU (user+sys of the whole tree)
    and the machine's load around it (machine busy CPU, the stack's, and others')."""
    from benchmarks.machine import _busy_cpu_seconds, tree_cpu_seconds

    stack_before = sum(tree_cpu_seconds(p) or 0.0 for p in stack_pids)
    busy_before = _busy_cpu_seconds()
    t0 = time.perf_counter()
    with open(log_path, "w") as err, open(log_path.with_suffix(".out"), "w") as out:
        # Its own process group: its JVM inherits it, and is reaped below once its Python has exited.
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=REPO, start_new_session=True)
    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)

    watchdog = threading.Timer(PROCESS_TIMEOUT, kill)
    watchdog.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        kill()
        raise
    finally:
        watchdog.cancel()
    if not watchdog.is_alive() and time.perf_counter() - t0 >= PROCESS_TIMEOUT:
        raise BenchmarkFailure(f"{shlex.join(argv[:4])} ran over {PROCESS_TIMEOUT} s and was killed")
    returncode = proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    while True:  # descendants orphaned by its exit are ours now (subreaper): wait for them too
        try:
            _, _, usage = os.wait4(-proc.pid, 0)
        except ChildProcessError:
            break
        cpu += usage.ru_utime + usage.ru_stime
    wall = time.perf_counter() - t0
    busy = _busy_cpu_seconds() - busy_before
    stack_cpu = sum(tree_cpu_seconds(p) or 0.0 for p in stack_pids) - stack_before
    return {"returncode": returncode, "wall_seconds": wall, "cpu_seconds": cpu, "stack_cpu_seconds": stack_cpu,
            "others_cpu_seconds": max(0.0, busy - cpu - stack_cpu),
            "others_average_cores": max(0.0, busy - cpu - stack_cpu) / wall if wall > 0 else None,
            "stdout": log_path.with_suffix(".out").read_text(), "log": str(log_path)}


class Processes:
    def __init__(self, config_path: Path, env: dict, logs: Path, stack_pids: list[int], master_json: str):
        self.config_path, self.env, self.logs, self.stack_pids = config_path, env, logs, stack_pids
        self.master_json = master_json
        self.count = 0

    def _apps(self) -> dict[str, dict]:
        with urllib.request.urlopen(self.master_json, timeout=10) as resp:
            state = json.load(resp)
        return {a["id"]: a for a in state.get("activeapps", []) + state.get("completedapps", [])}

    def _wait_idle(self) -> tuple[float, list[str]]:
        """Waits (up to IDLE_WAIT s) until no application holds the cluster: the previous process's app
        is marked finished a moment after its driver exits, and others may be running theirs."""
        t0 = time.perf_counter()
        while True:
            active = sorted(a for a, info in self._apps().items() if info.get("state") not in ("FINISHED", "KILLED",
                                                                                             "FAILED"))
            if not active or time.perf_counter() - t0 > IDLE_WAIT:
                return time.perf_counter() - t0, active
            time.sleep(0.5)

    def run(self, label: str, argv: list[str]) -> dict:
        self.count += 1
        waited, active = self._wait_idle()
        apps_before = self._apps()
        result = run_process(argv, self.env, self.logs / f"{self.count:02d}-{label}.log", self.stack_pids)
        new_apps = [{"id": a, "name": i.get("name"), "cores": i.get("cores"), "ours": i.get("name") == APP_NAME}
                    for a, i in self._apps().items() if a not in apps_before]
        result.update(label=label, argv=argv, waited_for_idle_cluster=waited, apps_active_at_start=active,
                      new_apps=new_apps, others_apps=[a["id"] for a in new_apps if not a["ours"]] + active)
        if result["returncode"] != 0:
            tail = " | ".join(Path(result["log"]).read_text(errors="replace").strip().splitlines()[-3:])
            raise BenchmarkFailure(f"{label}: exit {result['returncode']} ({tail[-400:]}; log {result['log']})")
        ours = [a for a in new_apps if a["ours"]]
        if len(ours) != 1 or not ours[0]["cores"]:
            raise BenchmarkFailure(f"{label}: expected one Spark application {APP_NAME!r} with cores on the cluster, "
                                   f"the master lists {ours}")
        log(f"{label}: {result['wall_seconds']:.1f} s wall, {result['cpu_seconds']:.1f} CPU s, "
            f"others {result['others_average_cores']:.2f} cores"
            + (f"; other Spark apps on the cluster: {result['others_apps']}" if result["others_apps"] else ""))
        return result

    def clean(self, label: str, measure, reset=None) -> dict:
        """`measure()` until no other Spark application shared the cluster with it (at most ATTEMPTS runs;
        `reset()` before each retry); the last run is kept, flagged, when none was clean."""
        for attempt in range(1, ATTEMPTS + 1):
            result = measure()
            result["attempt"] = attempt
            if not result["others_apps"] or attempt == ATTEMPTS:
                return result
            log(f"{label}: another Spark application shared the cluster: measuring again ({attempt + 1}/{ATTEMPTS})")
            if reset is not None:
                reset()
        raise AssertionError("unreachable")

    def driver(self, label: str, mode: str, *args: str) -> dict:
        result = self.run(label, [sys.executable, "-m", "benchmarks.stack_bench", "--driver", mode,
                                  str(self.config_path), *args])
        lines = [ln for ln in result["stdout"].splitlines() if ln.startswith(RESULT_MARKER)]
        if not lines:
            raise BenchmarkFailure(f"{label}: the driver printed no result (log {result['log']})")
        result["report"] = json.loads(lines[-1][len(RESULT_MARKER):])
        return result

    def icemaint(self, label: str, *argv: str) -> dict:
        result = self.run(label, [str(Path(sys.executable).parent / "icemaint"), "--config", str(self.config_path),
                                  *argv])
        try:
            result["report"] = json.loads(result["stdout"])
        except ValueError:
            raise BenchmarkFailure(f"{label}: no JSON on stdout (log {result['log']})") from None
        return result


# -- the stack, the config, the tables --------------------------------------------------------------------

def stack_module():
    name = "icemaint_stack_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "stack.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@contextlib.contextmanager
def production_stack():
    """The stack's state (stack.json) and secrets; started if down, and then stopped again at the end."""
    stack = stack_module()
    stack_dir = Path(os.environ.get("ICEMAINT_STACK_DIR") or stack.DEFAULT_DIR).resolve()
    offset = stack.read_state(stack.Layout(stack_dir)).get("port_offset", 0)
    layout = stack.Layout(stack_dir, offset, stack.default_yaml(stack_dir, offset))
    started: list[str] = []
    all_up, lines = stack.status(layout)
    if not all_up:
        log("the stack is not (all) up: starting it (it will be stopped at the end)")
        subprocess.run(["bash", str(REPO / "scripts" / "ensure_postgres.sh")], check=False, cwd=REPO)
        try:
            started = stack.up(layout).started
        except stack.StackError as exc:
            raise BenchmarkFailure("the production stack did not start: " + "; ".join(exc.lines())) from None
    else:
        log("reusing the running stack (left running)")
    try:
        yield {"state": stack.read_state(layout), "secrets": stack.load_secrets(layout), "started": started,
               "reused": not started}
    finally:
        if started:
            log(f"stopping what this run started: {', '.join(started)}")
            stack.down(layout, pieces=started)


def write_config(stack: dict, namespace: str, dagster_env: str) -> Path:
    import yaml

    state = stack["state"]
    doc = yaml.safe_load(Path(state["yaml"]).read_text())
    doc["state_dir"] = str(WORK / "state")
    doc["spark"]["conf"]["spark.jars"] = ",".join(state["jars"])  # absolute: the file lives elsewhere
    doc["dagster"] = {"storage": "postgres", "dsn_env": dagster_env}
    doc["scope"] = {"include": [f"{namespace}.*"]}  # the stack holds others' tables
    doc["spark"]["conf"]["spark.app.name"] = APP_NAME
    doc["defaults"].update(POLICY)
    path = WORK / "stack-bench.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@contextlib.contextmanager
def dagster_database(dsn: str):
    """A fresh PostgreSQL database for this run's Dagster instance (runs, event logs); dropped at the end."""
    import psycopg2

    name = f"stackbench_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        yield dsn.rsplit("/", 1)[0] + "/" + name
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def create_table(catalog, key: str):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    schema = Schema(NestedField(1, "event_id", LongType(), required=False),
                    NestedField(2, "ts", TimestamptzType(), required=False),
                    NestedField(3, "payload", StringType(), required=False))
    return catalog.create_table(key, schema, partition_spec=PartitionSpec(PartitionField(2, 1000, DayTransform(),
                                                                                         "ts_day")),
                                properties={"format-version": "2"})


def rows(first: int, count: int):
    import pyarrow as pa

    ids = list(range(first, first + count))
    return pa.table({"event_id": pa.array(ids, pa.int64()),
                     "ts": pa.array([DAY + dt.timedelta(seconds=(i * 7) % 86400) for i in ids], pa.timestamp("us", "UTC")),
                     "payload": pa.array([f"payload-{i:012d}" for i in ids])})


def write_small_files(table, files: int, rows_per_file: int, pool) -> None:
    """`files` parquet files of `rows_per_file` rows each on DATE, written by pyiceberg (one file per call,
    in parallel) and committed in COMMITS fast appends."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    per_commit = -(-files // COMMITS)
    for start in range(0, files, per_commit):
        table.refresh()
        meta, io = table.metadata, table.io

        def one(i: int):
            return list(_dataframe_to_data_files(meta, rows(i * rows_per_file, rows_per_file), io,
                                                 write_uuid=uuid.uuid4(), counter=itertools.count(0)))

        batch = range(start, min(files, start + per_commit))
        data_files = [f for written in pool.map(one, batch) for f in written]
        if len(data_files) != len(batch):
            raise BenchmarkFailure(f"pyiceberg wrote {len(data_files)} files for {len(batch)} small tables")
        with table.transaction() as tx:
            with tx.update_snapshot().fast_append() as append:
                for f in data_files:
                    append.append_data_file(f)


def table_state(table) -> dict:
    """Data files (per date and in all) and the sorted event_ids, read with pyiceberg."""
    table.refresh()
    tasks = list(table.scan().plan_files())
    ids = sorted(table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist())
    return {"snapshot_id": table.current_snapshot().snapshot_id, "data_files": len(tasks),
            "bytes": sum(t.file.file_size_in_bytes for t in tasks), "rows": len(ids), "ids": ids}


def list_objects(fs, location: str) -> int:
    from pyarrow.fs import FileSelector

    infos = fs.get_file_info(FileSelector(location.split("://", 1)[1].rstrip("/") + "/", recursive=True,
                                          allow_not_found=True))
    return sum(1 for info in infos if info.type.name == "File")


def plant(fs, location: str, count: int, pool) -> list[str]:
    """`count` small dummy objects under <location>/data/, spread over 28 date directories."""
    base = location.split("://", 1)[1]
    paths = [f"{base}/data/ts_day=2026-01-{(i % 28) + 1:02d}/dummy-{uuid.uuid4().hex[:12]}-{i:06d}.parquet"
             for i in range(count)]

    def put(path: str) -> None:
        with fs.open_output_stream(path) as out:
            out.write(b"not a table file, planted by benchmarks/stack_bench.py" + b"." * 40)

    list(pool.map(put, paths))
    return [f"s3://{p}" for p in paths]


# -- the measurement --------------------------------------------------------------------------------------

def measure(args, command: str) -> dict:
    from benchmarks.machine import describe_machine, load_average

    started_at = dt.datetime.now(dt.timezone.utc)
    load_start = load_average()
    t_start = time.perf_counter()
    if WORK.exists():
        shutil.rmtree(WORK)
    (WORK / "logs").mkdir(parents=True)
    _become_subreaper()
    namespace = f"stackbench_{started_at:%Y%m%d%H%M%S}_{uuid.uuid4().hex[:4]}"
    timing: dict[str, float] = {}
    with contextlib.ExitStack() as stack_ctx:
        stack = stack_ctx.enter_context(production_stack())
        os.environ.update(stack["secrets"])
        os.environ.setdefault("ICEMAINT_IDENTITY", "stack-benchmark")
        dagster_env = "ICEMAINT_STACKBENCH_DAGSTER_DSN"
        os.environ[dagster_env] = stack_ctx.enter_context(dagster_database(stack["secrets"]["ICEMAINT_PG_DSN"]))
        config_path = write_config(stack, namespace, dagster_env)
        env = {**os.environ}
        env.pop("DAGSTER_HOME", None)
        state = stack["state"]
        stack_pids = [p["pid"] for p in state.get("pieces", {}).values() if p.get("pid")]
        procs = Processes(config_path, env, WORK / "logs", stack_pids, state["spark_master_json"])

        from icemaint.config import load_config
        from icemaint.observe.catalog import CatalogReader

        config = load_config(config_path)
        catalog = CatalogReader(config)._pyiceberg_catalog()
        fs = stack_module().s3_filesystem(config)
        catalog.create_namespace(namespace)
        tables: dict[str, object] = {}
        if not args.keep_tables:
            stack_ctx.callback(drop_tables, catalog, namespace, tables)
        pool = stack_ctx.enter_context(concurrent.futures.ThreadPoolExecutor(16))

        # 1. compaction
        t0 = time.perf_counter()
        for variant in ("bare", "icemaint"):
            key = f"{namespace}.compact_{variant}"
            tables[key] = create_table(catalog, key)
            write_small_files(tables[key], args.files, args.rows_per_file, pool)
        timing["write_tables"] = time.perf_counter() - t0
        log(f"wrote 2 x {args.files} files of {args.rows_per_file} rows in {timing['write_tables']:.1f} s")
        keys = {v: f"{namespace}.compact_{v}" for v in ("bare", "icemaint")}
        expected = list(range(args.files * args.rows_per_file))
        t0 = time.perf_counter()
        before = {v: table_state(tables[k]) for v, k in keys.items()}
        timing["check_before"] = time.perf_counter() - t0
        for v, s in before.items():
            if s["data_files"] != args.files or s["ids"] != expected:
                raise BenchmarkFailure(f"{keys[v]} as written: {s['data_files']} files, {s['rows']} rows; expected "
                                       f"{args.files} files holding ids 0..{len(expected) - 1}")
        if before["bare"]["bytes"] != before["icemaint"]["bytes"]:
            log(f"note: the copies differ in bytes: {before['bare']['bytes']} vs {before['icemaint']['bytes']}")

        t0 = time.perf_counter()
        warm = procs.driver("warm-up driver (not reported)", "warmup")
        timing["warmup"] = time.perf_counter() - t0
        column_type = str(tables[keys["bare"]].schema().find_field("ts").field_type)
        t0 = time.perf_counter()
        def reset(variant: str):
            def rollback() -> None:  # back to the snapshot as written; its files were never removed
                table = tables[keys[variant]]
                table.refresh()
                table.manage_snapshots().rollback_to_snapshot(before[variant]["snapshot_id"]).commit()
                state = table_state(table)
                if state["data_files"] != args.files or state["ids"] != expected:
                    raise BenchmarkFailure(f"{keys[variant]}: the rollback did not restore the written table")
            return rollback

        bare = procs.clean("bare rewrite_data_files", lambda: procs.driver(
            "bare rewrite_data_files", "bare", keys["bare"], DATE.isoformat(), column_type), reset("bare"))
        ours = procs.clean("icemaint compact", lambda: procs.icemaint(
            "icemaint compact", "compact", keys["icemaint"], "--date", DATE.isoformat(), "--json"), reset("icemaint"))
        timing["compaction"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        after = {v: table_state(tables[k]) for v, k in keys.items()}
        timing["check_after"] = time.perf_counter() - t0
        compaction = check_compaction(args, keys, before, after, bare, ours, expected)

        # 2. orphan listing
        orphans = []
        for count in args.orphan_objects:
            key = f"{namespace}.orphans_{count}_objects"  # no table name a prefix of another's
            tables[key] = create_table(catalog, key)
            tables[key].append(rows(0, 10))
            tables[key].refresh()
            location = tables[key].metadata.location
            own = list_objects(fs, location)
            t0 = time.perf_counter()
            planted = plant(fs, location, count, pool)
            plant_seconds = time.perf_counter() - t0
            log(f"{key}: planted {count} objects in {plant_seconds:.1f} s ({own} of the table's own)")
            orphans.append({"table": key, "planted": count, "table_objects": own, "plant_seconds": plant_seconds,
                            "planted_paths": planted, "location": location})
        t0 = time.perf_counter()
        for o in orphans:
            runs = []
            for _ in range(3):
                t1 = time.perf_counter()
                n = list_objects(fs, o["location"])
                runs.append({"objects": n, "seconds": time.perf_counter() - t1})
            o["pyarrow_listing"] = runs
            label = f"orphans 24h dry-run, {o['planted']} objects"
            o["dry_24h"] = procs.clean(label, lambda: procs.icemaint(label, "orphans", o["table"], "--dry-run",
                                                                     "--older-than", "24h", "--json"))
            label = f"orphans 1s forced dry-run, {o['planted']} objects"
            o["dry_forced"] = procs.clean(label, lambda: procs.icemaint(label, "orphans", o["table"], "--dry-run",
                                                                        "--older-than", "1s", "--force", "--json"))
        java = procs.clean("S3FileIO.listPrefix", lambda: procs.driver("S3FileIO.listPrefix", "list",
                                                                       *[o["table"] for o in orphans]))
        timing["orphans"] = time.perf_counter() - t0
        check_orphans(orphans, java)

        machine = describe_machine()
        machine.update(java=warm["report"]["java"], iceberg=warm["report"]["iceberg"],
                       spark=warm["report"]["spark"], spark_master=warm["report"]["master"],
                       executors=warm["report"]["executors"])
        reused = stack["reused"]
    timing["total"] = time.perf_counter() - t_start
    for o in orphans:
        o.pop("planted_paths")
    return {"command": command, "date": started_at.isoformat(timespec="seconds"), "note": args.note,
            "namespace": namespace, "machine": machine, "stack_reused": reused,
            "load_average": {"start": load_start, "end": load_average()}, "files": args.files,
            "rows_per_file": args.rows_per_file, "policy": POLICY, "compaction": compaction,
            "orphans": orphans, "java_listing": java, "timing": timing, "dropped": not args.keep_tables}


def drop_tables(catalog, namespace: str, tables: dict) -> None:
    for key in list(tables):
        try:
            catalog.purge_table(key)
        except Exception as exc:  # the run's result stands; say what is left behind
            log(f"could not purge {key}: {type(exc).__name__}: {str(exc)[:200]}")
    try:
        catalog.drop_namespace(namespace)
    except Exception as exc:
        log(f"could not drop namespace {namespace}: {type(exc).__name__}: {str(exc)[:200]}")


def check_compaction(args, keys, before, after, bare, ours, expected) -> dict:
    [outcome] = ours["report"]
    if (outcome.get("decision") != "run" or not outcome.get("published")
            or (outcome.get("validation") or {}).get("passed") is not True):
        raise BenchmarkFailure(f"icemaint compact did not compact and publish with a passing proof: "
                               f"{outcome.get('decision')}: {outcome.get('reason')}")
    result = bare["report"]["result"]
    if int(result.get("rewritten_data_files_count", 0)) != args.files:
        raise BenchmarkFailure(f"the bare CALL rewrote {result.get('rewritten_data_files_count')} files, "
                               f"not {args.files}: {result}")
    for v, s in after.items():
        if s["ids"] != expected:
            raise BenchmarkFailure(f"{keys[v]} after compaction holds {s['rows']} rows, not the {len(expected)} "
                                   "written (or other ids)")
        if s["data_files"] >= before[v]["data_files"] or s["snapshot_id"] == before[v]["snapshot_id"]:
            raise BenchmarkFailure(f"{keys[v]}: {before[v]['data_files']} -> {s['data_files']} files: not compacted")
    for r in (bare, ours):
        r.pop("stdout", None)
    for v in after:
        before[v].pop("ids")
        after[v].pop("ids")
    return {"tables": keys, "before": before, "after": after, "bare": bare, "icemaint": ours,
            "icemaint_outcome": {k: outcome.get(k) for k in ("decision", "reason", "files_before", "files_after",
                                                             "published", "durations", "rewrite_seconds",
                                                             "validation_seconds", "publish_seconds")},
            "ratio_wall": ours["wall_seconds"] / bare["wall_seconds"],
            "ratio_cpu": ours["cpu_seconds"] / bare["cpu_seconds"] if bare["cpu_seconds"] else None,
            "rows": len(expected)}


def _candidates(report: dict) -> tuple[int | None, list[str]]:
    """The run's candidate count (its metrics) and the candidates its evidence lists (possibly a prefix)."""
    count = (report.get("metrics") or {}).get("candidates")
    listed = (report.get("evidence") or {}).get("candidates") or []
    # The evidence names the first candidates, then "... and N more".
    return (count if isinstance(count, int) else None), [c for c in listed if not c.startswith("... and ")]


def check_orphans(orphans: list[dict], java: dict) -> None:
    listings = java["report"]["listings"]
    for o in orphans:
        total = o["planted"] + o["table_objects"]
        seen = {r["objects"] for r in o["pyarrow_listing"]} | {r["objects"] for r in listings[o["table"]]["runs"]}
        if seen != {total}:
            raise BenchmarkFailure(f"{o['table']}: the listings counted {sorted(seen)} objects, expected {total}")
        for run in ("dry_24h", "dry_forced"):
            report = o[run]["report"]
            if report.get("decision") in ("refuse", "failed") or report.get("success") is False:
                raise BenchmarkFailure(f"{o['table']} {run}: {report.get('decision')}: {report.get('reason')}")
            o[run].pop("stdout", None)
        young, _ = _candidates(o["dry_24h"]["report"])
        forced_count, listed = _candidates(o["dry_forced"]["report"])
        if young != 0:
            raise BenchmarkFailure(f"{o['table']}: the 24 h dry run found {young} candidates, expected none")
        if not listed or not set(listed) <= set(o["planted_paths"]):
            raise BenchmarkFailure(f"{o['table']}: the forced dry run lists candidates that were not planted "
                                   f"(or none): {sorted(set(listed) - set(o['planted_paths']))[:3]}")
        if forced_count != o["planted"]:
            raise BenchmarkFailure(f"{o['table']}: the forced dry run found {forced_count} candidates, "
                                   f"expected the {o['planted']} planted")
        o["forced_candidates"] = forced_count


# -- the report -------------------------------------------------------------------------------------------

def _run_act(p: dict) -> str:
    d = p["report"].get("durations") or {}
    return f"{d.get('duration_seconds', float('nan')):.1f} s; {d.get('act_seconds', float('nan')):.1f} s"


def render(r: dict) -> str:
    m, c = r["machine"], r["compaction"]
    load = r["load_average"]
    procs = [c["bare"], c["icemaint"]] + [o[k] for o in r["orphans"] for k in ("dry_24h", "dry_forced")] \
        + [r["java_listing"]]
    others = [p["others_average_cores"] for p in procs if p.get("others_average_cores") is not None]
    shared = [p for p in procs if p["others_apps"]]
    busy = (load["start"] and load["start"][0] > 0.5 * (m["cores"] or 1)) or (others and max(others) > 0.25)
    t = r["timing"]

    def proc_row(name: str, p: dict, files: str, extra: str = "") -> str:
        return (f"| {name} | {p['wall_seconds']:.1f} s | {p['cpu_seconds']:.1f} s | {p['stack_cpu_seconds']:.1f} s | "
                f"{files} | {p['others_average_cores']:.2f} | {extra} |")

    bare_rep, out = c["bare"]["report"], c["icemaint_outcome"]
    b0, b1, i0, i1 = c["before"]["bare"], c["after"]["bare"], c["before"]["icemaint"], c["after"]["icemaint"]
    durations = out.get("durations") or {}
    phases = ", ".join(f"{k.replace('_seconds', '')} {v:.1f} s" for k, v in durations.items()
                       if isinstance(v, (int, float))) or ", ".join(
        f"{k.replace('_seconds', '')} {out[k]:.1f} s" for k in ("rewrite_seconds", "validation_seconds",
                                                                 "publish_seconds") if isinstance(out.get(k), (int, float)))
    lines = [
        SECTION,
        "",
        (f"> The machine was shared: load average {load['start'][0]} on {m['cores']} cores at the start, "
         f"{load['end'][0]} at the end; other processes used {min(others):.2f} - {max(others):.2f} cores on "
         "average while the measured processes ran. Absolute seconds are slower than on an idle machine; the "
         "ratio compares two processes of the same minutes, one run each (no repetitions), so a burst can "
         "move it." if busy else
         f"> Load average {load['start'][0]} at the start, {load['end'][0]} at the end on {m['cores']} cores; other "
         f"processes used at most {max(others):.2f} cores on average while the measured processes ran."),
        "",
    ]
    if r.get("note"):
        lines += [f"> Note: {r['note']}", ""]
    repeated = [p for p in procs if p.get("attempt", 1) > 1]
    if repeated:
        lines += ["> Measured again because another Spark application overlapped the earlier run: "
                  + ", ".join(f"{p['label']} (kept run {p['attempt']})" for p in repeated) + ".", ""]
    if shared:
        lines += ["> **Another Spark application shared the cluster** during: "
                  + ", ".join(f"{p['label']} ({', '.join(p['others_apps'])})" for p in shared)
                  + " (those figures include sharing or waiting for its cores).", ""]
    lines += [
        f"- Date: {r['date']} (UTC); command: `{r['command']}` (`make bench-stack`), from `{REPO}`; harness wall "
        f"time {t['total']:.0f} s (writing the tables {t['write_tables']:.0f} s, row checks "
        f"{t['check_before'] + t['check_after']:.0f} s, warm-up driver {t['warmup']:.0f} s, compaction "
        f"{t['compaction']:.0f} s, orphan section {t['orphans']:.0f} s).",
        f"- Stack: `scripts/stack.py` "
        f"({'reused, already up' if r['stack_reused'] else 'started by this run and stopped after it'}): "
        f"SeaweedFS S3 + Iceberg REST catalog (table bucket `warehouse`), Spark standalone master `{m['spark_master']}` "
        f"with 2 workers of 1 core (each driver got {m['executors']} executors), PostgreSQL for claims, audit and "
        f"this run's own Dagster database. Namespace `{r['namespace']}`"
        + (", its tables purged at the end." if r["dropped"] else ", tables kept (--keep-tables)."),
        f"- Machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu_model']}; Python {m['python']}, Java {m['java']}, "
        f"Spark {m['spark']}, Iceberg {m['iceberg']}, pyiceberg {m['pyiceberg']}, pyarrow {m['pyarrow']}, "
        f"Dagster {m['dagster']}. Load average (1/5/15 min) {tuple(load['start'])} at the start, "
        f"{tuple(load['end'])} at the end.",
        "",
        f"### Compaction of {r['files']:,} small files on one date (S3, one run)",
        "",
        f"Two tables with identical rows: {r['files']:,} parquet files of {r['rows_per_file']} rows on {DATE} "
        f"({c['rows']:,} rows, {b0['bytes'] / 2**20:.1f} MiB), written by pyiceberg and committed in {COMMITS} appends. "
        "Each variant is a fresh process on the cluster, timed from its start to the exit of it and its JVM; "
        "*CPU* is that process tree's (Python + driver JVM), *stack CPU* the stack's processes' during it "
        "(the executors on the workers, SeaweedFS, PostgreSQL), *others* the rest of the machine's busy CPU. "
        "Before each process the harness waits until the cluster holds no application. A warm-up driver ran "
        "first (not reported). Rows: every event_id of both tables read with pyiceberg "
        "before and after, equal to the ids written.",
        "",
        "| process | wall | CPU | stack CPU | data files before -> after | others (cores) | inside the process |",
        "|---|---|---|---|---|---|---|",
        proc_row("bare `CALL rewrite_data_files` (fresh driver)", c["bare"], f"{b0['data_files']:,} -> {b1['data_files']}",
                 f"session {bare_rep['session_seconds']:.1f} s, CALL {bare_rep['call_seconds']:.1f} s"),
        proc_row("`icemaint compact --date` (claim, stage, GX proof, publish)", c["icemaint"],
                 f"{i0['data_files']:,} -> {i1['data_files']}", phases),
        f"| **icemaint / bare** | **{c['ratio_wall']:.2f}x** | {c['ratio_cpu']:.2f}x | | | | |",
        "",
        f"Rows before / after: bare {b0['rows']:,} / {b1['rows']:,}, icemaint {i0['rows']:,} / {i1['rows']:,} "
        f"(the same ids). The bare CALL ran with the options icemaint's policy gives the procedure "
        f"(`benchmarks/baseline.py`: target {POLICY['target_file_size_bytes']}, min-input-files 2, ...) and "
        f"`where` = the date; icemaint with the policy {', '.join(f'{k}: {v}' for k, v in POLICY.items())}.",
        "",
        "### Orphan listing on S3 against the number of objects under the table location",
        "",
        "One table per size (one 10-row append), with that many dummy objects planted under `<location>/data/` "
        "(28 date directories). *orphans 24h* is `icemaint orphans TABLE --dry-run --older-than 24h --json` "
        "(its candidates: none, the objects are minutes old); *forced 1s* is the same with `--older-than 1s "
        "--force`, whose candidate count was checked to equal the planted objects and every candidate it names "
        "(the first 100) to be one of them, and which also reads each "
        "candidate's size (one `exists` + `getLength` per candidate through the table's FileIO). *Listing "
        "alone*: pyarrow's recursive `get_file_info` in the harness process, and Iceberg's "
        "`S3FileIO.listPrefix(location)` (the listing orphan removal uses on S3), counted inside the JVM of one "
        "driver process; medians of 3 listings (the first listing of a process in brackets). Both list "
        "`<location>/`: a raw prefix without the slash also lists sibling tables whose names extend this one's.",
        "",
        "| objects under the location | orphans 24h: process wall (run; its act) | forced 1s: process wall "
        "(run; its act), candidates | listing alone: S3FileIO.listPrefix | listing alone: pyarrow | planting them |",
        "|---|---|---|---|---|---|",
    ]
    listings = r["java_listing"]["report"]["listings"]
    for o in r["orphans"]:
        jl = [x["seconds"] for x in listings[o["table"]]["runs"]]
        pa_ = [x["seconds"] for x in o["pyarrow_listing"]]
        total = o["planted"] + o["table_objects"]
        lines.append(f"| {total:,} ({o['planted']:,} planted + {o['table_objects']} the table's) | "
                     f"{o['dry_24h']['wall_seconds']:.1f} s ({_run_act(o['dry_24h'])}) | "
                     f"{o['dry_forced']['wall_seconds']:.1f} s ({_run_act(o['dry_forced'])}), "
                     f"{o['forced_candidates']:,} | {statistics.median(jl):.2f} s ({jl[0]:.2f}) | "
                     f"{statistics.median(pa_):.2f} s ({pa_[0]:.2f}) | {o['plant_seconds']:.1f} s |")
    if len(r["orphans"]) >= 2:
        lo, hi = r["orphans"][0], r["orphans"][-1]
        d_obj = hi["planted"] - lo["planted"]
        slope = (hi["dry_24h"]["wall_seconds"] - lo["dry_24h"]["wall_seconds"]) / d_obj * 1000
        slope_f = (hi["dry_forced"]["wall_seconds"] - lo["dry_forced"]["wall_seconds"]) / d_obj * 1000
        jl = {o["table"]: statistics.median(x["seconds"] for x in listings[o["table"]]["runs"]) for o in r["orphans"]}
        slope_j = (jl[hi["table"]] - jl[lo["table"]]) / d_obj * 1000
        lines += ["", f"Per 1,000 more objects: orphans 24h {slope:+.2f} s, forced 1s {slope_f:+.2f} s (with one size "
                      f"read per candidate), S3FileIO.listPrefix {slope_j:+.3f} s. CPU of the orphans processes: "
                  + ", ".join(f"{o['planted']:,}: {o['dry_24h']['cpu_seconds']:.0f} s / {o['dry_forced']['cpu_seconds']:.0f} s"
                              for o in r["orphans"]) + " (24h / forced)."]
    lines.append("")
    return "\n".join(lines)


def own_section(text: str, heading: str = SECTION) -> str | None:
    """A benchmark's section of a report's text (its heading to the next `## ` heading or the end), if any."""
    start = text.find(heading + "\n")
    if start < 0:
        return None
    nxt = re.search(r"^## ", text[start + len(heading):], flags=re.M)
    return text[start:start + len(heading) + nxt.start()] if nxt else text[start:]


def write_section(out: Path, section: str, heading: str = SECTION) -> None:
    """Replaces a benchmark's section of `out` (from its heading to the next `## ` heading or the end)
    or appends it."""
    text = out.read_text() if out.exists() else ""
    start = text.find(heading + "\n")
    if start >= 0:
        nxt = re.search(r"^## ", text[start + len(heading):], flags=re.M)
        end = start + len(heading) + nxt.start() if nxt else len(text)
        text = text[:start] + section.rstrip("\n") + "\n" + ("\n" + text[end:] if nxt else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    out.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stack_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000, help="small files on the date (default 3000)")
    parser.add_argument("--rows-per-file", type=int, default=10, help="rows in each small file (default 10)")
    parser.add_argument("--orphan-objects", default="1000,10000",
                        help="objects planted under a table location, one table per number (default 1000,10000)")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the file whose section is written")
    parser.add_argument("--note", default="", help="a line for the section (e.g. machine conditions)")
    parser.add_argument("--keep-tables", action="store_true", help="leave the run's tables in the catalog")
    parser.add_argument("--from-results", metavar="JSON",
                        help="only render the section from a previous run's raw figures (benchmarks/.work/stack/results.json)")
    parser.add_argument("--driver", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.from_results:
        write_section(Path(args.out), render(json.loads(Path(args.from_results).read_text())))
        return 0
    if args.driver:
        mode, config_path, *rest = args.driver
        print(RESULT_MARKER + json.dumps(driver(mode, config_path, rest), default=str), flush=True)
        return 0
    try:
        args.orphan_objects = [int(x) for x in args.orphan_objects.split(",") if x.strip()]
    except ValueError:
        parser.error("--orphan-objects: comma-separated numbers")
    if args.files < 5 or args.rows_per_file < 1 or any(n < 1 for n in args.orphan_objects):
        parser.error("--files >= 5 (min_input_files), --rows-per-file >= 1, --orphan-objects >= 1")
    given = argv if argv is not None else sys.argv[1:]
    command = "python -m benchmarks.stack_bench" + (" " + shlex.join(given) if given else "")
    try:
        results = measure(args, command)
    except BenchmarkFailure as exc:
        print(f"stack-bench failed: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line; the traceback goes to a file
        import traceback

        WORK.mkdir(parents=True, exist_ok=True)
        (WORK / "traceback.txt").write_text(traceback.format_exc())
        text = (str(exc).strip().splitlines() or [""])[0][:300]
        print(f"stack-bench failed: {type(exc).__name__}: {text} (traceback: {WORK / 'traceback.txt'})",
              file=sys.stderr)
        return 1
    (WORK / "results.json").write_text(json.dumps(results, indent=2, default=str))
    section = render(results)
    write_section(Path(args.out), section)
    print(section)
    log(f"wrote the section to {args.out} (raw figures: {WORK / 'results.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
