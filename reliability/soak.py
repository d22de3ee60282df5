"""The soak: writers with and without the claim on several tables and dates, the real `icemaint tick` loop,
random SIGKILLs of the maintenance process, then every row checked against the writers' ledgers.

    make soak MINUTES=30                      # or: python -m reliability.soak --minutes 30
    python -m reliability.soak --minutes 3 --results reliability/.work/smoke.md   # a smoke run

What runs, in a fresh warehouse and state dir under reliability/.work/<stamp>/:
- one writer process (reliability/writers.py, one Spark session) with a thread per table:
  `soak.coop` takes the table's claim for every commit (appends and merge-on-read deletes),
  `soak.rogue` ignores it (appends and deletes), `soak.appends` ignores it and only appends;
  each writes bursts of micro-batches (one small file per date per commit) with idle gaps;
- every 20-30 s `icemaint --config X tick --json` in its own process group; with probability
  `--kill-probability` it is SIGKILLed (the group: Python and Spark's JVM) at a random moment, half of
  the time a random delay after it starts and half a random delay after it stores a `started` audit
  marker (so the kill lands inside a compaction or retention act);
- between ticks, an independent reader (pyiceberg) checks each table against its ledger (no row read
  twice, no deleted row back, every ledgered row there);
- at the end the writers stop, the last ticks and `icemaint maintain T --expire-snapshots --orphans`
  run undisturbed, and the final check counts rows lost, duplicated and resurrected.

The figures come from `icemaint audit --json` (runs, defers, conflicts, proofs not published,
interrupted calls, staging branches cleaned) and the Dagster instance (runs the reaper failed). The
verdict is one line; it and the figures are appended to reliability/RESULTS.md, and the exit status is
1 when any row was lost, duplicated, resurrected or unexpected.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from reliability.figures import RowCheck, audit_figures, check_rows, check_rows_while_writing, verdict_line

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = Path(sys.executable).parent
IDENTITY = "soak-maintenance"
START_DATE = "2026-01-01"

# table -> how its writer behaves. days: dates written per batch (one small file per date per commit).
WRITERS = (
    {"name": "coop", "table": "soak.coop", "claim": True, "days": 3, "rows_per_day": 40, "delete_every": 3,
     "deletes_per_batch": 4, "burst": [2, 6], "gap_seconds": [0.5, 2.5], "idle_seconds": [8, 40]},
    {"name": "rogue", "table": "soak.rogue", "claim": False, "days": 3, "rows_per_day": 40, "delete_every": 2,
     "deletes_per_batch": 4, "burst": [2, 6], "gap_seconds": [0.5, 2.5], "idle_seconds": [8, 40]},
    {"name": "appends", "table": "soak.appends", "claim": False, "days": 2, "rows_per_day": 60, "delete_every": 0,
     "deletes_per_batch": 0, "burst": [3, 8], "gap_seconds": [0.5, 2.0], "idle_seconds": [8, 30]},
)


def config_doc(work: Path) -> dict:
    """A Hadoop catalog and state dir of the soak's own; gates short enough that ticks act in writers' gaps."""
    return {
        "catalog": {"name": "lake", "type": "hadoop", "warehouse": str(work / "warehouse")},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                                  "spark.default.parallelism": "2", "spark.driver.memory": "1g"}},
        "state_dir": str(work / "state"),
        "claims": {"backend": "file"},
        "audit": {"sink": "file"},
        "scope": {"include": ["soak.*"], "exclude": []},
        "max_runs_total": 2,
        "defaults": {
            "writer_idle": "6s", "hot_partition_age": "0s", "claim_wait": "0s",
            "small_file_size_bytes": "1MiB", "target_file_size_bytes": "8MiB", "min_input_files": 3,
            "max_commit_retries": 3, "retry_backoff": "1s", "sample_fraction": 0.2,
            # retention acts during the soak too: expiry of a few minutes' history, manifests when many
            "snapshot_older_than": "4m", "retain_last": 5, "snapshot_max_count": 80, "manifest_min_count": 16,
        },
        "tables": {
            "soak.coop": {"owner": "soak-coop"},
            "soak.rogue": {"owner": "soak-rogue"},
            # the sort strategy on one table, so a kill can land in a sorted rewrite as well
            "soak.appends": {"owner": "soak-appends", "strategy": "sort", "sort_order": "device_id, ts"},
        },
    }


def _utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def say(text: str) -> None:
    print(f"[{_utc():%H:%M:%S}] {text}", flush=True)


# -- processes ----------------------------------------------------------------------------------------

def _env() -> dict:
    return {**os.environ, "ICEMAINT_IDENTITY": IDENTITY, "PYTHONUNBUFFERED": "1"}


def start_group(args: list[str], log: Path) -> subprocess.Popen:
    """A process in its own process group (a kill of the group reaches Spark's JVM too), output to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(args, cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def icemaint(config: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "icemaint"), "--config", str(config), *args], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def started_markers(audit_path: Path, offset: int, pid: int) -> tuple[int, bool]:
    """(new offset, whether a `started` marker of process `pid` was appended since `offset`)."""
    try:
        with open(audit_path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return offset, False
    complete = data[:data.rfind(b"\n") + 1]
    found = False
    for line in complete.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("decision") == "started" and (record.get("details") or {}).get("process", {}).get("pid") == pid:
            found = True
    return offset + len(complete), found


# -- one tick -------------------------------------------------------------------------------------------

@dataclass
class TickResult:
    number: int
    seconds: float
    returncode: int
    kill: str | None = None          # the kill planned: "random", "in-act" or None
    killed: bool = False
    killed_in_act: bool = False
    killed_after_seconds: float | None = None
    report: dict | None = None
    lines: list = field(default_factory=list)
    error: str | None = None         # the last line a tick that ended without its report printed

    def summary(self) -> str:
        if self.killed:
            return (f"SIGKILL after {self.killed_after_seconds:.0f}s "
                    f"({'inside an act' if self.killed_in_act else 'outside any act'})")
        if self.report is None:
            return f"rc {self.returncode}, no report: {self.error}"
        runs = [d for d in self.report.get("decisions", []) if d.get("decision") == "run"]
        done = ", ".join(f"{d['table']} {d.get('date') or d['operation']}: {d.get('result')}" for d in runs)
        return f"rc {self.returncode}, {len(runs)} runs" + (f" ({done})" if done else "") + \
            (f", reaped {len(self.report['reaped'])}" if self.report.get("reaped") else "")


def run_tick(number: int, config: Path, work: Path, rng: random.Random, kill_probability: float,
             timeout: float) -> TickResult:
    log = work / "ticks" / f"tick-{number:03d}.log"
    out_path = work / "ticks" / f"tick-{number:03d}.json"
    audit_path = work / "state" / "audit" / "audit.jsonl"
    offset = audit_path.stat().st_size if audit_path.exists() else 0
    plan = None
    if rng.random() < kill_probability:
        plan = rng.choice(("random", "in-act"))
    random_delay = rng.uniform(2, 70)
    act_delay = rng.uniform(0, 25)
    with open(out_path, "wb") as out, open(log, "ab") as err:
        proc = subprocess.Popen([str(BIN / "icemaint"), "--config", str(config), "tick", "--json"], cwd=REPO,
                                env=_env(), stdout=out, stderr=err, start_new_session=True)
    t0 = time.monotonic()
    result = TickResult(number, 0.0, 0, kill=plan)
    act_seen_at = None
    while proc.poll() is None:
        time.sleep(0.05)
        elapsed = time.monotonic() - t0
        if act_seen_at is None:
            offset, found = started_markers(audit_path, offset, proc.pid)
            if found:
                act_seen_at = elapsed
        due = (plan == "random" and elapsed >= random_delay) or \
              (plan == "in-act" and act_seen_at is not None and elapsed >= act_seen_at + act_delay)
        if due or elapsed > timeout:
            # In an act when a started marker of this process has no outcome yet (checked after the kill).
            kill_group(proc)
            result.killed, result.killed_after_seconds = True, elapsed
            result.kill = plan if due else "timeout"
            break
    result.seconds = time.monotonic() - t0
    result.returncode = proc.wait()
    if result.killed:
        result.killed_in_act = _open_call_of(audit_path, proc.pid)
    else:
        try:
            result.report = json.loads(out_path.read_text())
            result.lines = result.report.get("lines", [])
        except ValueError:
            result.report = None
            tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            result.error = tail[-1][:300] if tail else "no output"
    return result


def log_tick(work: Path, tick: TickResult) -> None:
    """One line per tick in ticks.jsonl (what was planned, what happened), so a run can be re-read later."""
    entry = {k: v for k, v in tick.__dict__.items() if k not in ("report", "lines")}
    entry["summary"] = tick.summary()
    with open(work / "ticks.jsonl", "a") as fh:
        fh.write(json.dumps(entry, default=str) + "\n")


def _open_call_of(audit_path: Path, pid: int) -> bool:
    """Whether process `pid` left a `started` marker with no decision (it was killed inside an act)."""
    starts, ended = set(), set()
    try:
        lines = audit_path.read_bytes().splitlines()
    except FileNotFoundError:
        return False
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("decision") == "started" and (r.get("details") or {}).get("process", {}).get("pid") == pid:
            starts.add((r.get("call_id"), r.get("operation")))
        elif r.get("call_id"):
            ended.add((r.get("call_id"), r.get("operation")))
    return bool(starts - ended)


# -- checks against the ledgers ---------------------------------------------------------------------------

def ledger_sets(work: Path, table: str) -> tuple[set[int], set[int]]:
    from icemaint.app.simulator import Ledger

    path = work / "ledgers" / f"{table}.ledger.json"
    if not path.exists():
        return set(), set()
    ledger = Ledger.load(path)
    return set(ledger.written), set(ledger.deleted)


def read_ids(config, table: str, tries: int = 20) -> list[int]:
    """The table's event ids as pyiceberg reads them: an independent reader (no Spark, no icemaint engine).

    A Hadoop table's `version-hint.text` is missing for a moment in each commit (Iceberg deletes it, then
    renames the new one into place), so "not found" while writers commit is retried.
    """
    from icemaint.observe.catalog import CatalogReader, TableNotFound

    for attempt in range(tries):
        try:
            return CatalogReader(config).load(table).scan(selected_fields=("event_id",)).to_arrow() \
                .column("event_id").to_pylist()
        except (TableNotFound, FileNotFoundError):
            if attempt + 1 == tries:
                raise
            time.sleep(0.2)
    raise AssertionError("not reached")


def check_while_writing(config, work: Path, tables: list[str]) -> list[RowCheck]:
    checks = []
    for table in tables:
        before = ledger_sets(work, table)
        ids = read_ids(config, table)
        after = ledger_sets(work, table)
        check = check_rows_while_writing(table, ids, before, after)
        if check.lost:
            # A delete may have landed before the scan and be ledgered a moment later: look again.
            time.sleep(15)
            check = check_rows_while_writing(table, ids, before, ledger_sets(work, table))
        checks.append(check)
    return checks


# -- the Dagster instance -----------------------------------------------------------------------------------

IN_FLIGHT = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")  # as maint_assets.retention counts them


def dagster_runs(config) -> dict:
    """Runs the reaper failed, and runs left in flight at the end (queued, not started, starting, started or
    canceling: the retention sensor waits for any of them on its table, the run queue for some)."""
    from dagster import DagsterInstance

    from icemaint.app.instance import ensure_dagster_home

    instance = DagsterInstance.from_config(str(ensure_dagster_home(config)))
    reaped, left, statuses = [], [], {}
    for run in instance.get_runs():
        statuses[run.status.value] = statuses.get(run.status.value, 0) + 1
        if run.status.value in IN_FLIGHT:
            record = instance.get_run_record_by_id(run.run_id)
            left.append({"run_id": run.run_id, "job": run.job_name, "status": run.status.value,
                         "table": run.tags.get("icemaint/table"), "pid": run.tags.get("icemaint/pid"),
                         "created": record.create_timestamp.isoformat(timespec="seconds") if record else None})
        elif run.status.value == "FAILURE":
            failures = [e for e in instance.all_logs(run.run_id)
                        if e.dagster_event and e.dagster_event.is_run_failure]
            if any("icemaint reaper" in (e.dagster_event.message or "") for e in failures):
                reaped.append(run.run_id)
    return {"reaped": reaped, "left_in_flight": left, "by_status": statuses}


def snapshot_count(config, table: str) -> int:
    from icemaint.observe.catalog import CatalogReader

    return len(CatalogReader(config).load(table).metadata.snapshots)


def staging_branches(config, table: str) -> list[str]:
    from icemaint.engine.staging import STAGE_PREFIX
    from icemaint.observe.catalog import CatalogReader

    return sorted(n for n in CatalogReader(config).load(table).metadata.refs if n.startswith(STAGE_PREFIX))


# -- which code ran ---------------------------------------------------------------------------------------------

PRODUCT = ("icemaint", "maint_assets", "sensors", "resources")


def product_code() -> dict:
    """The commit checked out and a hash of every product source file: each tick is a new process that loads
    the working tree as it is then, so an edit during a soak changes what later ticks run."""
    import hashlib

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    files = {str(path.relative_to(REPO)): hashlib.sha1(path.read_bytes()).hexdigest()
             for package in PRODUCT for path in sorted((REPO / package).rglob("*.py"))}
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *PRODUCT], cwd=REPO, capture_output=True, text=True)
    return {"head": head.stdout.strip() or None, "dirty": bool(dirty.stdout.strip()), "files": files}


def code_changes(start: dict, end: dict) -> dict:
    changed = sorted(f for f in start["files"].keys() | end["files"].keys()
                     if start["files"].get(f) != end["files"].get(f))
    return {"head_start": start["head"], "head_end": end["head"], "dirty_start": start["dirty"],
            "changed_files": changed}


# -- the run -------------------------------------------------------------------------------------------------

def prepare(work_root: Path, seed: int, keep_old: bool) -> Path:
    work_root.mkdir(parents=True, exist_ok=True)
    if not keep_old:
        for old in work_root.iterdir():
            if old.is_dir() and old.name.startswith("soak-"):
                shutil.rmtree(old, ignore_errors=True)
    work = work_root / f"soak-{_utc():%Y%m%dT%H%M%SZ}"
    for sub in ("ticks", "ledgers", "final"):
        (work / sub).mkdir(parents=True)
    (work / "maintenance.yaml").write_text(yaml.safe_dump(config_doc(work), sort_keys=False))
    plans = [{**w, "start_date": START_DATE, "seed": seed * 100 + i, "claim_wait_seconds": 900}
             for i, w in enumerate(WRITERS)]
    (work / "writers.json").write_text(json.dumps(plans, indent=2))
    return work


def wait_for_writers(writers: subprocess.Popen, work: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not (work / "writers.ready.json").exists():
        if writers.poll() is not None:
            raise SystemExit(f"the writers exited ({writers.returncode}) before they were ready: "
                             f"see {work / 'writers.log'}")
        if time.monotonic() > deadline:
            kill_group(writers)
            raise SystemExit(f"the writers were not ready in {timeout:.0f}s: see {work / 'writers.log'}")
        time.sleep(1)


def stop_writers(writers: subprocess.Popen, work: Path, timeout: float = 900) -> dict:
    (work / "stop").touch()
    try:
        writers.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(writers)
    done = work / "writers.done.json"
    if done.exists():
        return json.loads(done.read_text())
    status = work / "writers.status.json"
    return {"incomplete": True, **(json.loads(status.read_text()) if status.exists() else {})}


def soak(args) -> int:
    from icemaint.config import load_config

    from benchmarks.machine import describe_machine, load_average

    rng = random.Random(args.seed)
    work = prepare(args.work, args.seed, args.keep_old)
    config_path = work / "maintenance.yaml"
    config = load_config(str(config_path))
    tables = [w["table"] for w in WRITERS]
    started_at, load_start, code_start = _utc(), load_average(), product_code()
    say(f"soak: {args.minutes:g} min of writing and killing, seed {args.seed}, work dir {work}")
    writers = start_group([sys.executable, "-m", "reliability.writers", "--config", str(config_path),
                           "--work", str(work)], work / "writers.log")
    ticks: list[TickResult] = []
    midrun: list[dict] = []
    try:
        wait_for_writers(writers, work)
        say(f"writers ready on {', '.join(tables)} ({time.monotonic():.0f})")
        t_end = time.monotonic() + args.minutes * 60
        while time.monotonic() < t_end:
            if writers.poll() is not None:
                say(f"the writers exited ({writers.returncode}) early: see {work / 'writers.log'}")
                break
            tick = run_tick(len(ticks) + 1, config_path, work, rng, args.kill_probability, args.tick_timeout)
            ticks.append(tick)
            say(f"tick {tick.number}: {tick.seconds:.0f}s, {tick.summary()}")
            log_tick(work, tick)
            checks = check_while_writing(config, work, tables)
            bad = [c for c in checks if c.lost or c.duplicated or c.resurrected]
            midrun.append({"after_tick": tick.number, "at": _utc().isoformat(timespec="seconds"),
                           "checks": [c.to_dict() for c in checks]})
            if bad:
                say("ROWS WRONG while writing: " + "; ".join(f"{c.table}: lost {c.lost}, duplicated {c.duplicated}, "
                                                             f"resurrected {c.resurrected} {c.samples}" for c in bad))
            pause = min(rng.uniform(*args.tick_interval), max(t_end - time.monotonic(), 0))
            time.sleep(pause)
    finally:
        writer_report = stop_writers(writers, work)
    say("writers stopped; final ticks and maintenance passes, undisturbed")

    final: dict = {"ticks": [], "maintain": {}}
    time.sleep(config.policy(tables[0]).writer_idle_seconds + 2)
    for _ in range(args.final_ticks):
        tick = run_tick(len(ticks) + 1, config_path, work, rng, 0.0, args.tick_timeout)
        ticks.append(tick)
        final["ticks"].append(tick.number)
        say(f"final tick {tick.number}: {tick.seconds:.0f}s, {tick.summary()}")
        log_tick(work, tick)
    # What the automated loop left undone once everything was idle: retention still waiting on runs in flight
    # (nothing runs any more, so those runs are stuck; an "orphans first" ordering defer only waits one tick).
    last = ticks[-1].report or {}
    final["retention_stuck"] = [f"{d['table']} {d['operation']}: {d['reason']}" for d in last.get("decisions", [])
                                if d.get("operation") in ("expire", "orphans", "manifests")
                                and d.get("decision") == "defer" and "runs in flight" in (d.get("reason") or "")]
    final["snapshots_after_ticks"] = {t: snapshot_count(config, t) for t in tables}
    for line in final["retention_stuck"]:
        say(f"after the final ticks, still waiting on runs in flight: {line}")
    for table in tables:
        done = icemaint(config_path, "maintain", table, "--expire-snapshots", "--orphans", "--json")
        (work / "final" / f"maintain-{table}.json").write_text(done.stdout + done.stderr)
        try:
            report = json.loads(done.stdout)
            steps = [f"{s['operation']} {s['scope']}: {s['decision']}: {s['reason'][:160]}" for s in report.get("steps", [])]
            if report.get("stopped"):
                steps.append(f"stopped: {report['stopped']}")
        except ValueError:
            report, steps = None, [(done.stdout + done.stderr).strip()[-300:]]
        final["maintain"][table] = {"returncode": done.returncode, "steps": steps}
        say(f"maintain {table}: rc {done.returncode}: " + " | ".join(map(str, steps)))

    rows = [check_rows(t, read_ids(config, t), *ledger_sets(work, t)) for t in tables]
    shown = icemaint(config_path, "audit", "--json")
    records = json.loads(shown.stdout) if shown.returncode == 0 else []
    audit = audit_figures(records)
    runs = dagster_runs(config)
    left = {t: staging_branches(config, t) for t in tables}
    kills = [t for t in ticks if t.killed]
    verdict = verdict_line(args.minutes, rows, audit, len(kills), len(runs["reaped"]), len(runs["left_in_flight"]))
    finished_at = _utc()
    figures = {
        "verdict": verdict, "started": started_at.isoformat(timespec="seconds"),
        "finished": finished_at.isoformat(timespec="seconds"), "minutes": args.minutes, "seed": args.seed,
        "work": str(work), "rows": [r.to_dict() for r in rows], "audit": audit, "dagster_runs": runs,
        "staging_left": left, "writers": writer_report, "final": final,
        "ticks": {"total": len(ticks), "killed": len(kills), "killed_in_act": sum(t.killed_in_act for t in kills),
                  "kills_by_plan": {p: sum(1 for t in kills if t.kill == p) for p in ("random", "in-act", "timeout")},
                  "planned_kills_missed": sum(1 for t in ticks if t.kill and not t.killed),
                  "completed_rc": {str(rc): sum(1 for t in ticks if not t.killed and t.returncode == rc)
                                   for rc in sorted({t.returncode for t in ticks if not t.killed})},
                  "aborted": [{"tick": t.number, "returncode": t.returncode, "error": t.error}
                              for t in ticks if not t.killed and t.report is None],
                  "discovery_flaps": [{"tick": t.number, "removed": t.report.get("removed")} for t in ticks
                                      if t.report and t.report.get("removed")],
                  "errors": [{"tick": t.number, "errors": t.report.get("errors")} for t in ticks
                             if t.report and t.report.get("errors")],
                  "seconds": [round(t.seconds, 1) for t in ticks]},
        "midrun": {"checks": len(midrun), "bad": [m for m in midrun if any(
            c["lost"] or c["duplicated"] or c["resurrected"] for c in m["checks"])]},
        "load_average": {"start": load_start, "end": load_average()},
        "snapshot_max_count": config.policy(tables[0]).snapshot_max_count,
        "code": code_changes(code_start, product_code()),
        "machine": describe_machine(None),
    }
    (work / "figures.json").write_text(json.dumps(figures, indent=2, default=str))
    append_results(args.results, figures, args)
    print(verdict, flush=True)
    damaged = any(r.damaged for r in rows) or figures["midrun"]["bad"]
    return 1 if damaged else 0


# -- RESULTS.md -----------------------------------------------------------------------------------------------

HEADER = """# icemaint soak results

Each section is one run of `make soak MINUTES=N` (`python -m reliability.soak`), newest last: writers with
and without the table's claim on three tables, the real `icemaint tick` loop, random SIGKILLs of the
maintenance process group, then every row checked against the writers' ledgers with pyiceberg. See the
module docstring of `reliability/soak.py` for what runs; "rollbacks" are proofs that failed (a failed proof
publishes nothing, so nothing is rolled back).
"""


def append_results(path: Path, f: dict, args) -> None:
    m, a, t, runs = f["machine"], f["audit"], f["ticks"], f["dagster_runs"]
    w = f["writers"].get("writers", [])
    lines = [
        "", f"## {f['started'][:16].replace('T', ' ')} UTC: {f['minutes']:g}-minute soak", "",
        f"`{f['verdict']}`", "",
        f"- Command: `python -m reliability.soak --minutes {f['minutes']:g} --seed {f['seed']} "
        f"--kill-probability {args.kill_probability:g}` (wall time {_minutes(f['started'], f['finished'])} min "
        "including the writers' start and the final ticks and passes)",
        f"- Machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu_model']}; load average "
        f"{f['load_average']['start']} at the start, {f['load_average']['end']} at the end (shared with other work)",
        f"- Code: {_code_line(f['code'])}",
        f"- Software: Python {m['python']}, Java {m['java']}, Spark {m['spark']} (local[2]), pyiceberg {m['pyiceberg']}, "
        f"Dagster {m['dagster']}, Great Expectations {m['great_expectations']}; Hadoop catalog, file claims and audit",
        "", "| table | writer | batches | appends | deletes (rows) | commit errors (landed / not) | claim waits "
            "(max s) | rows expected | read | lost | duplicated | resurrected | unexpected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    stats = {x["table"]: x for x in w}
    for r in f["rows"]:
        s = stats.get(r["table"], {})
        errors = str(s.get("commit_errors", 0))
        if s.get("commit_errors"):
            kinds = ", ".join(f"{k} {v}" for k, v in s.get("errors_by_kind", {}).items())
            errors += f" ({kinds}; {s.get('resolved_landed', 0)} / {s.get('resolved_not_landed', 0)})"
        lines.append(
            f"| {r['table']} | {'takes the claim' if s.get('claim') else 'ignores the claim'} | {s.get('batches', '?')} | "
            f"{s.get('appends', '?')} | {s.get('deletes', '?')} ({s.get('deleted_rows', '?')}) | {errors} | "
            f"{s.get('claim_waits', 0)} ({s.get('claim_wait_max_seconds', 0)}) | {r['expected']} | {r['read']} | "
            f"{r['lost']} | {r['duplicated']} | {r['resurrected']} | {r['unexpected']} |")
    lines += [
        "", "| maintenance | count |", "|---|---|",
        f"| ticks / SIGKILLed (at a random moment / after a `started` marker / hung) | {t['total']} / {t['killed']} "
        f"({t['kills_by_plan']['random']} / {t['kills_by_plan']['in-act']} / {t['kills_by_plan']['timeout']}) |",
        f"| kills that landed inside an act (a started call with no outcome) | {t['killed_in_act']} |",
        f"| compactions published (commits) | {a['compactions_published']} ({a['publish_commits']}) |",
        f"| compactions with nothing to rewrite | {a['compactions_noop']} |",
        f"| defers (by kind) | {a['defers']} ({_kinds(a['defers_by_kind'])}) |",
        f"| publish conflicts with writers' commits | {a['conflicts']} |",
        f"| proofs failed, nothing published (rollbacks) | {a['not_published']} |",
        f"| calls failed (by operation) | {a['failed']} ({_kinds(a['failed_by_operation'])}) |",
        f"| calls interrupted by a kill (by operation) | {a['interrupted']} ({_kinds(a['interrupted_by_operation'])}) |",
        f"| staging branches of dead runs removed (`cleanup`) | {a['cleanup']} |",
        f"| Dagster runs of dead processes failed by the reaper | {len(runs['reaped'])} |",
        f"| Dagster runs left in flight at the end (not reaped) | {len(runs['left_in_flight'])}"
        f"{' (' + _kinds(_count_by(runs['left_in_flight'], 'status')) + ')' if runs['left_in_flight'] else ''} |",
        f"| retention decisions still waiting on runs in flight after the final ticks | "
        f"{len(f['final']['retention_stuck'])} |",
        f"| snapshots per table after the final ticks (snapshot_max_count {f['snapshot_max_count']}) | "
        f"{', '.join(f'{k} {v}' for k, v in f['final']['snapshots_after_ticks'].items())} |",
        f"| expiries / manifest rewrites / orphan removals | {a['expiries']} / {a['manifest_rewrites']} / {a['orphan_runs']} |",
        f"| unproven rewrites found on main | {a['unproven_on_main']} |",
        f"| staging branches left at the end | {sum(len(v) for v in f['staging_left'].values())} |",
        f"| row checks while writing (with damage) | {f['midrun']['checks']} ({len(f['midrun']['bad'])}) |",
        f"| ticks that ended without a report (not killed) | {len(t['aborted'])} |",
        f"| ticks whose discovery dropped a live table / reported table errors | {len(t['discovery_flaps'])} / "
        f"{len(t['errors'])} |",
    ]
    if runs["left_in_flight"]:
        lines += ["", "Dagster runs left in flight at the end:"]
        lines += [f"- {r['run_id']} {r['job']} on {r['table']}: {r['status']} since {r['created']} (pid {r['pid']})"
                  for r in runs["left_in_flight"]]
    if f["final"]["retention_stuck"]:
        lines += ["", "Retention the tick still deferred for runs in flight after the writers stopped:"]
        lines += [f"- {line}" for line in f["final"]["retention_stuck"]]
    if t["aborted"]:
        lines += ["", "Ticks that ended without a report (exit status, last line):"]
        lines += [f"- tick {x['tick']}: rc {x['returncode']}: `{x['error']}`" for x in t["aborted"]]
    anomalies = [(x["table"], a_) for x in w for a_ in x.get("anomalies", [])]
    if anomalies or f["midrun"]["bad"] or f["writers"].get("incomplete"):
        lines += ["", "Anomalies:"]
        lines += [f"- {table}: {a_}" for table, a_ in anomalies]
        lines += [f"- after tick {m_['after_tick']}: " + "; ".join(
            f"{c['table']} lost {c['lost']} dup {c['duplicated']} resurrected {c['resurrected']} {c['samples']}"
            for c in m_["checks"] if c["lost"] or c["duplicated"] or c["resurrected"]) for m_ in f["midrun"]["bad"]]
        if f["writers"].get("incomplete"):
            lines.append("- the writers did not finish cleanly (no writers.done.json)")
    if args.note:
        lines += ["", f"Note: {args.note}"]
    text = "\n".join(lines) + "\n"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER)
    with open(path, "a") as fh:
        fh.write(text)
    say(f"results appended to {path}")


def _code_line(code: dict) -> str:
    if code["head_start"] == code["head_end"] and not code["changed_files"]:
        dirty = " with uncommitted product changes" if code["dirty_start"] else ""
        return f"commit {code['head_start']}{dirty}, unchanged during the run"
    files = ", ".join(f"`{f}`" for f in code["changed_files"][:12]) + (" ..." if len(code["changed_files"]) > 12 else "")
    return (f"**changed during the run**: commit {code['head_start']} at the start, {code['head_end']} at the end; "
            f"product files changed: {files or 'none'} (each tick loads the tree as it is when it starts)")


def _count_by(items: list[dict], key: str) -> dict:
    out: dict = {}
    for item in items:
        out[item[key]] = out.get(item[key], 0) + 1
    return out


def _kinds(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def _minutes(start: str, end: str) -> str:
    return f"{(dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds() / 60:.0f}"


def _pair(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    return float(lo), float(hi or lo)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reliability.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="writing and killing time (default 30)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    p.add_argument("--kill-probability", type=float, default=0.5, help="chance a tick is SIGKILLed (default 0.5)")
    p.add_argument("--tick-interval", type=_pair, default=(20.0, 30.0), help="seconds between ticks, 'lo,hi'")
    p.add_argument("--tick-timeout", type=float, default=900.0, help="a tick running longer is killed as hung")
    p.add_argument("--final-ticks", type=int, default=2, help="undisturbed ticks after the writers stop")
    p.add_argument("--work", type=Path, default=HERE / ".work", help="where soak-<stamp>/ goes")
    p.add_argument("--keep-old", action="store_true", help="keep earlier soak-*/ work dirs")
    p.add_argument("--results", type=Path, default=HERE / "RESULTS.md", help="append the figures here")
    p.add_argument("--note", help="a line for the results section (e.g. what else ran on the machine)")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = int(time.time()) % 100_000
    if not 0 <= args.kill_probability <= 1 or args.minutes <= 0:
        p.error("--kill-probability must be in [0, 1] and --minutes above 0")
    return soak(args)


if __name__ == "__main__":
    sys.exit(main())
