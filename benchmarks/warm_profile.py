"""Where a warm table-date's time goes: each part of one compaction timed, in a process whose JVM has run a few
table-dates already (issue 50, item 1: "a warm table-date under 200 ms").

    python -m benchmarks.warm_profile [--tables 12] [--warm-up 4] [--files 100] [--rows 100] [--json OUT]
                                      [--against CHECKOUT] [--cprofile OUT]

The estate shape (`benchmarks.concurrent_tick.build_estate`: a Hadoop catalog, tables of one date of `--files`
small files) compacted one table-date after another by `MaintenanceRunner.compact` in this process, as `serve`'s
ticks and `tick --until-idle` run them. Each part is timed by wrapping the function that does it (no profiler, so
nothing slows the calls down); parts nest (the Spark write is inside the stage), so the table gives each part's
median and where it sits. The first `--warm-up` table-dates warm the JVM and are not counted. Each table-date's
CPU seconds (this process and its JVM, from /proc) are kept beside the wall times: on the shared machine they move
less with the load.

`--against CHECKOUT` measures two versions side by side in one run: this checkout's code and CHECKOUT's (another git
worktree), each in a warm process of its own (its own JVM) on its own copy of the estate, the two fed the same
table-dates alternately (which goes first alternates too), so both meet the same load. `--cprofile OUT` writes
cProfile's statistics of the counted table-dates' contracts (this checkout's side).

`--bare` runs Iceberg's own `CALL rewrite_data_files` on a twin of each table-date right after our compaction of
it, in the same process and JVM: the floor a proven compaction on Spark is measured against.

`--dagster-storage postgres` keeps the Dagster instance of this side (and of `--against`'s) in PostgreSQL
(`dagster.storage: postgres`, a throwaway server, a database a side) instead of SQLite, Dagster's default;
`--dagster-storage-against STORAGE` gives the other side that storage instead, and without `--against` measures
this checkout against itself: what the run around the contract costs on each storage, side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.concurrent_tick import DATE, build_estate, check_estate, write_config
from benchmarks.machine import load_average

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "warm_profile"

# (label, module, attribute path, depth): the parts, in the order a table-date meets them.
PARTS = (
    ("Dagster run (runner.compact)", "icemaint.app.runner", "MaintenanceRunner.compact", 0),
    ("contract (Compactor.run)", "icemaint.operations.compaction", "Compactor.run", 1),
    ("claim taken", "icemaint.safety.claims", "FileClaims.acquire", 2),
    ("decide (health, audit read, decision)", "icemaint.operations.compaction", "Compactor._decide", 2),
    ("plan the date's files (Java scan)", "icemaint.engine.staging", "StagingArea.plan_date_files", 2),
    ("stage", "icemaint.engine.staging", "StagingArea.stage", 2),
    ("Spark's write (with the fed digest)", "icemaint.engine.staging", "StagingArea._write_replacements", 3),
    ("staging branch commit", "icemaint.engine.staging", "StagingArea.commit_to_branch", 3),
    ("proof (prove_rows)", "icemaint.engine.validation", "prove_rows", 2),
    ("fed digest's result", "icemaint.engine.digest", "FeedDigest.result", 3),
    ("after side's read (digest)", "icemaint.engine.validation", "rows_digest", 3),
    ("GX checks (four, pandas)", "icemaint.engine.validation", "_run_suite", 3),
    ("publish", "icemaint.engine.staging", "StagingArea.publish", 2),
    ("publish: prepare (apply)", "icemaint.engine.staging", "StagingArea._prepare_publish", 3),
    ("publish: commit", "icemaint.engine.staging", "StagingArea._commit_publish", 3),
    ("publish: find it on main", "icemaint.engine.staging", "StagingArea.find_published", 3),
    ("staging branch removed", "icemaint.engine.staging", "StagingArea.discard", 2),
    ("read reads released", "icemaint.engine.staging", "StagingArea.release_reads", 2),
    ("health after (files after)", "icemaint.operations.compaction", "Compactor._fill_after", 2),
    ("audit record", "icemaint.operations.compaction", "Compactor._record", 2),
)


def log(message: str) -> None:
    print(f"[warm-profile {dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {message}", flush=True)


class Timers:
    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.mode = "in_publish"

    def wrap(self, label: str, module: str, path: str) -> None:
        owner = importlib.import_module(module)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        # a part another checkout does not have (`--against`) is left out of its side
        original = (owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None))
        if original is None:
            return
        if isinstance(original, staticmethod):
            return
        timers = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers.current[label] += time.perf_counter() - t0
                timers.calls[label] += 1

        setattr(owner, attr, timed)

    def take(self) -> dict[str, float]:
        out = dict(self.current)
        self.current.clear()
        return out


def _alternate_branch_removal(timers: Timers) -> None:
    """`--compare-branch-removal`: in "separate" mode the publish leaves the staging branch to `discard`'s own
    commit, as before the publish removed it in its swap; the two modes alternate table by table."""
    from icemaint.engine.publish import PendingPublish

    attempt = PendingPublish.attempt

    def attempt_as_mode(self):
        if timers.mode == "separate":
            self.remove_branch = None
        return attempt(self)

    PendingPublish.attempt = attempt_as_mode  # type: ignore[method-assign]


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) a live process has used, from /proc."""
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


class WarmProcess:
    """One warm process's side: the runner, the part timers and its JVM, on the estate copy at `root`."""

    def __init__(self, root: Path, compare_branch_removal: bool = False, cprofile: bool = False):
        os.environ.setdefault("ICEMAINT_IDENTITY", "benchmark")
        from icemaint.app.runner import MaintenanceRunner
        from icemaint.config import load_config
        from icemaint.engine.spark_session import get_spark

        config_path = root / "icemaint.yaml"
        config = load_config(str(config_path))
        self.timers = Timers()
        for label, module, path, _ in PARTS:
            self.timers.wrap(label, module, path)
        self.compare_branch_removal = compare_branch_removal
        if compare_branch_removal:
            _alternate_branch_removal(self.timers)
        self.profile = None
        if cprofile:
            import cProfile

            self.profile = cProfile.Profile()
            self._profile_contract()
        self.runner = MaintenanceRunner(config, str(config_path))
        self.spark, self.catalog = get_spark(config), config.catalog.name
        self.jvm_pid = int(self.spark._jvm.java.lang.ProcessHandle.current().pid())
        self.counted = False

    def _profile_contract(self) -> None:
        from icemaint.operations.compaction import Compactor

        run, side = Compactor.run, self

        def profiled(*args, **kwargs):
            if not side.counted:
                return run(*args, **kwargs)
            side.profile.enable()
            try:
                return run(*args, **kwargs)
            finally:
                side.profile.disable()

        Compactor.run = profiled  # type: ignore[method-assign]

    def compact(self, table: str, index: int, counted: bool) -> dict:
        self.counted = counted
        self.timers.take()
        self.timers.mode = "separate" if self.compare_branch_removal and index % 2 else "in_publish"
        py0, jvm0, t0 = time.process_time(), _cpu_seconds(self.jvm_pid), time.perf_counter()
        report = self.runner.compact(table, DATE)
        wall = time.perf_counter() - t0
        cpu = {"cpu_python": time.process_time() - py0, "cpu_jvm": _cpu_seconds(self.jvm_pid) - jvm0}
        return {"table": table, "published": bool(report.outcome.get("published")), "load1": os.getloadavg()[0],
                "parts": self.timers.take(), "wall": wall, **cpu, "branch_removal": self.timers.mode}

    def bare(self, table: str, files: int) -> dict:
        """Iceberg's own rewrite of `table`'s date (its default options, the date's bounds as the filter): it must
        rewrite every file of the date."""
        day = dt.date.fromisoformat(str(DATE))
        where = f"ts >= TIMESTAMP_NTZ '{day} 00:00:00' AND ts < TIMESTAMP_NTZ '{day + dt.timedelta(days=1)} 00:00:00'"
        py0, jvm0, t0 = time.process_time(), _cpu_seconds(self.jvm_pid), time.perf_counter()
        done = self.spark.sql(f"CALL `{self.catalog}`.system.rewrite_data_files(table => '{table}', "
                              f"where => \"{where}\")").collect()[0].asDict()
        out = {"table": table, "wall": time.perf_counter() - t0, "cpu_python": time.process_time() - py0,
               "cpu_jvm": _cpu_seconds(self.jvm_pid) - jvm0, "rewritten": done["rewritten_data_files_count"]}
        if out["rewritten"] != files:  # a CALL that skipped the date is no floor
            raise RuntimeError(f"the bare CALL rewrote {out['rewritten']} files of {table}, not {files}")
        return out


def _estate(args, sides: list[str]) -> dict[str, Path]:
    """The estate built once (or `--seed`), copied for each side."""
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    total = (args.tables + args.warm_up) * (2 if args.bare else 1)  # --bare: a twin each
    if args.seed:  # an estate of the same shape another benchmark built (its `wh`), copied
        seed = Path(args.seed)
    else:
        seed = work / "seed"
        seed.mkdir(parents=True)
        log(f"estate: {total} tables of one date of {args.files} files, {args.rows} rows each")
        build_estate(seed, total, args.files, args.rows)
    roots = {}
    for side in sides:
        root = work / ("run" if side == "this" else f"run_{side}")
        root.mkdir(parents=True)
        shutil.copytree(seed / "wh", root / "wh")
        write_config(root, 1)
        roots[side] = root
    return roots


def measure(args, dsn: str | None = None) -> dict:
    """One warm process, this one (its Dagster instance in PostgreSQL at `dsn` when given)."""
    total = args.tables + args.warm_up
    root = _estate(args, ["this"])["this"]
    if dsn is not None:
        os.environ.update(_on_postgres(root, dsn))
    side = WarmProcess(root, args.compare_branch_removal, cprofile=bool(args.cprofile))
    tables = [f"ice.t{i:03d}" for i in range(total)]
    rows = []
    load_before = load_average()
    for i, table in enumerate(tables):
        row = side.compact(table, i, counted=i >= args.warm_up)
        if args.bare:
            row["bare"] = side.bare(f"ice.t{total + i:03d}", args.files)
        if i >= args.warm_up:
            rows.append(row)
        log(f"{table}{' (warm-up)' if i < args.warm_up else ''}: {row['parts'].get(PARTS[1][0], 0) * 1000:.0f} ms "
            f"in the contract, {row['wall'] * 1000:.0f} ms the run ({row['cpu_python'] + row['cpu_jvm']:.2f} CPU-s); "
            f"published {row['published']}")
    if side.profile is not None:
        side.profile.dump_stats(args.cprofile)
    check_estate(root, total * (2 if args.bare else 1), args.files, args.rows)
    return {"rows": rows, "tables": args.tables, "warm_up": args.warm_up, "files": args.files,
            "rows_per_file": args.rows, "load_before": load_before, "load_after": load_average(),
            "dagster_storage": args.dagster_storage,
            "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes")}


def _worker(args) -> int:
    """`--worker ROOT`: one side of `--against`, fed `index table` lines, answering a JSON line each."""
    side = WarmProcess(Path(args.worker), cprofile=bool(args.cprofile))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        index, table = line.split()
        print(json.dumps(side.compact(table, int(index), counted=int(index) >= args.warm_up)), flush=True)
    if side.profile is not None:
        side.profile.dump_stats(args.cprofile)
    return 0


def _start_worker(checkout: Path, root: Path, args, cprofile: str | None,
                  env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    # the script by path, with the checkout first on the path: its `icemaint` is the one measured
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(root), "--warm-up", str(args.warm_up)]
    if cprofile:
        cmd += ["--cprofile", cprofile]
    env = {**os.environ, "PYTHONPATH": str(checkout), "ICEMAINT_IDENTITY": "benchmark", **(env_extra or {})}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc


def _ask(proc: subprocess.Popen, index: int, table: str) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{index} {table}\n")
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker exited (code {proc.wait()}) at {table}")
        if line.startswith("{"):
            return json.loads(line)


def _on_postgres(root: Path, dsn: str) -> dict[str, str]:
    """The side at `root` keeps its Dagster instance in PostgreSQL at `dsn`; the worker's environment for it."""
    import yaml

    path = root / "icemaint.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["dagster"] = {"storage": "postgres", "dsn_env": "ICEMAINT_BENCH_DAGSTER_DSN"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return {"ICEMAINT_BENCH_DAGSTER_DSN": dsn}


def storages(args) -> dict[str, str]:
    """Each side's Dagster storage: `--dagster-storage` for this side, `--dagster-storage-against` (else the same)
    for the other."""
    return {"this": args.dagster_storage, "against": args.dagster_storage_against or args.dagster_storage}


def measure_against(args, dsns: dict[str, str] | None = None) -> dict:
    """Two warm processes fed the same table-dates alternately: this checkout against `--against`'s (or against
    itself on another Dagster storage), a side's instance in PostgreSQL at `dsns[side]` where given."""
    total = args.tables + args.warm_up
    dsns = dsns or {}
    checkouts = {"this": HERE.parent, "against": Path(args.against).resolve() if args.against else HERE.parent}
    roots = _estate(args, list(checkouts))
    env = {side: _on_postgres(roots[side], dsns[side]) if side in dsns else None for side in checkouts}
    procs = {side: _start_worker(checkouts[side], roots[side], args, args.cprofile if side == "this" else None,
                                 env[side])
             for side in checkouts}
    for side, proc in procs.items():
        _ask_ready(proc, side)
    tables = [f"ice.t{i:03d}" for i in range(total)]
    rows: dict[str, list[dict]] = {side: [] for side in checkouts}
    load_before = load_average()
    try:
        for i, table in enumerate(tables):
            order = list(checkouts) if i % 2 == 0 else list(reversed(checkouts))
            for side in order:
                row = _ask(procs[side], i, table)
                row["side"] = side
                if i >= args.warm_up:
                    rows[side].append(row)
                log(f"{side} {table}{' (warm-up)' if i < args.warm_up else ''}: "
                    f"{row['parts'].get(PARTS[1][0], 0) * 1000:.0f} ms in the contract, "
                    f"{row['cpu_python'] + row['cpu_jvm']:.2f} CPU-s the run; published {row['published']}")
    finally:
        for proc in procs.values():
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=300)
    for root in roots.values():
        check_estate(root, total, args.files, args.rows)
    return {"rows": rows["this"], "against_rows": rows["against"], "against": str(checkouts["against"]),
            "commits": {side: _commit_of(path) for side, path in checkouts.items()},
            "dagster_storage": storages(args),
            "tables": args.tables, "warm_up": args.warm_up, "files": args.files, "rows_per_file": args.rows,
            "load_before": load_before, "load_after": load_average(),
            "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes")}


def _measure_on_postgres(args) -> dict:
    """A throwaway PostgreSQL server, a database for each side whose instance is kept there."""
    from benchmarks.shared_catalog import postgres_server
    from tests.pg_server import fresh_database

    sides = [side for side, storage in storages(args).items() if storage == "postgres"]
    with postgres_server() as server, contextlib.ExitStack() as stack:
        dsns = {side: stack.enter_context(fresh_database(server.dsn, f"warm_profile_dagster_{side}"))
                for side in sides}
        return measure_against(args, dsns) if args.against or args.dagster_storage_against else \
            measure(args, dsns.get("this"))


def _ask_ready(proc: subprocess.Popen, side: str) -> None:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {side} worker exited (code {proc.wait()}) before it was ready")
        if line.startswith("{") and json.loads(line).get("ready"):
            return


def _commit_of(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return done.stdout.strip()[:80]


def render(result: dict) -> str:
    if "against_rows" in result:
        return _render_against(result)
    out = []
    modes = sorted({r.get("branch_removal", "in_publish") for r in result["rows"]})
    for mode in modes:
        rows = [r for r in result["rows"] if r.get("branch_removal", "in_publish") == mode]
        out += [f"branch removal: {mode}", *_table(result, rows), ""]
    return "\n".join(out)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def _render_against(result: dict) -> str:
    sides = {"this": result["rows"], "against": result["against_rows"]}
    out = [f"warm table-dates: {len(result['rows'])} a side (after {result['warm_up']} warm-up), {result['files']} "
           f"files of {result['rows_per_file']} rows each; load {result['load_before']} -> {result['load_after']}",
           f"this: {result['commits']['this']}; against: {result['commits']['against']}"
           + ("; Dagster storage: this {this}, against {against}".format(**result["dagster_storage"])
              if "dagster_storage" in result else ""),
           "| part (median ms; CPU-s) | this | against |", "|---|---|---|"]
    for label, _, _, depth in PARTS:
        values = {side: [r["parts"].get(label, 0.0) * 1000 for r in rows] for side, rows in sides.items()}
        if not any(any(v) for v in values.values()):
            continue
        out.append(f"| {'&nbsp;' * 4 * depth}{label} | {_median(values['this']):.0f} | "
                   f"{_median(values['against']):.0f} |")
    for key, what in (("cpu_python", "CPU, Python"), ("cpu_jvm", "CPU, JVM")):
        out.append(f"| {what} (the run) | {_median([r[key] for r in sides['this']]):.2f} | "
                   f"{_median([r[key] for r in sides['against']]):.2f} |")
    return "\n".join(out)


def _table(result: dict, rows: list[dict]) -> list[str]:
    out = [f"warm table-dates: {len(rows)} (after {result['warm_up']} warm-up), {result['files']} files of "
           f"{result['rows_per_file']} rows each; load {result['load_before']} -> {result['load_after']}",
           "| part | median ms | min ms |", "|---|---|---|"]
    for label, _, _, depth in PARTS:
        values = sorted(r["parts"].get(label, 0.0) * 1000 for r in rows)
        if not any(values):
            continue
        out.append(f"| {'&nbsp;' * 4 * depth}{label} | {values[len(values) // 2]:.0f} | {values[0]:.0f} |")
    for key, what in (("cpu_python", "CPU, Python (the run; ms)"), ("cpu_jvm", "CPU, JVM (the run; ms)")):
        values = sorted(r[key] * 1000 for r in rows)
        out.append(f"| {what} | {values[len(values) // 2]:.0f} | {values[0]:.0f} |")
    bare = [r["bare"] for r in rows if "bare" in r]
    if bare:
        for key, what in (("wall", "wall"), ("cpu_python", "CPU, Python"), ("cpu_jvm", "CPU, JVM")):
            values = sorted(b[key] * 1000 for b in bare)
            out.append(f"| Iceberg's bare CALL rewrite_data_files on the twin table, same JVM: {what} | "
                       f"{values[len(values) // 2]:.0f} | {values[0]:.0f} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=12)
    parser.add_argument("--warm-up", type=int, default=4)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--json", metavar="OUT", help="write the raw figures here (default benchmarks/results/)")
    parser.add_argument("--compare-branch-removal", action="store_true",
                        help="alternate the staging branch's removal in the publish's swap with a commit of its own")
    parser.add_argument("--from-results", metavar="JSON")
    parser.add_argument("--seed", metavar="DIR", help="copy this estate (a directory holding `wh`) instead of building")
    parser.add_argument("--against", metavar="CHECKOUT", help="measure CHECKOUT's code side by side with this one's")
    parser.add_argument("--cprofile", metavar="OUT", help="cProfile statistics of the counted contracts, written here")
    parser.add_argument("--work", metavar="DIR", default=str(WORK), help="where the estate is built and copied")
    parser.add_argument("--bare", action="store_true",
                        help="also time Iceberg's bare CALL rewrite_data_files on a twin of each table-date")
    parser.add_argument("--dagster-storage", choices=("sqlite", "postgres"), default="sqlite",
                        help="this side's (and --against's) Dagster storage (postgres: a throwaway server)")
    parser.add_argument("--dagster-storage-against", choices=("sqlite", "postgres"),
                        help="the other side's Dagster storage; without --against, this checkout against itself")
    parser.add_argument("--worker", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare and (args.against or args.dagster_storage_against or args.seed):
        parser.error("--bare builds its own estate with a twin of each table, in this process: "
                     "not with --against, --dagster-storage-against or --seed")
    if args.worker:
        return _worker(args)
    if args.from_results:
        result = json.loads(Path(args.from_results).read_text())
    else:
        if "postgres" in storages(args).values():
            result = _measure_on_postgres(args)
        else:
            result = measure_against(args) if args.against or args.dagster_storage_against else measure(args)
    if not args.from_results:  # benchmarks.cost_summary reads the newest
        stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M}"
        out = Path(args.json) if args.json else HERE / "results" / f"warm_profile_{stamp}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
