"""The streaming soak: a writer that never stops, maintenance running as in production, and at the end every
row, every publish and every date's compaction lag checked.

    make soak-streaming MINUTES=20          # or: python -m reliability.soak_streaming --minutes 20
    python -m reliability.soak_streaming --minutes 3 --day-seconds 40 --results reliability/.work/smoke.md

What runs, in a fresh warehouse and state dir under reliability/.work/stream-<stamp>/:
- one writer process (reliability/stream_writer.py, one Spark session) that ignores the claim, as Flink does:
  a commit a second into the *current* date of a simulated calendar (a new date every `--day-seconds`,
  from 2026-01-01; policy `hot_partition_age: 0s` so the real calendar does not hold the dates), now and then
  late rows into the previous date, now and then a merge-on-read DELETE of a few rows of the current or
  previous date; its ledger (ids appended and deleted, per date the time of its last commit) saved after
  each commit known to have landed;
- `icemaint --config X tick --json` in its own process group every `--tick-interval` seconds (start to
  start; a tick that runs longer is followed by the next at once), default policy except `writer_idle`,
  `min_input_files`, small sizes, and retention keys that make expiry and manifest rewrites act;
- the table's snapshot and manifest counts read with pyiceberg before and after every tick (their peak),
  and every few ticks the rows checked against the ledger while the writer writes;
- at the end the writer stops, ticks run undisturbed until one does nothing (at least two), and the final
  checks: rows lost/duplicated/resurrected against the ledger with pyiceberg; every compaction published with
  its proof passed (`icemaint audit`); per date the lag from its last writer commit to the published
  compaction that covered it (reliability/streaming_figures.py says how); snapshots and manifests at the end
  and at their peak; the writer's own failed commits by error kind.

The verdict is one line; it and the figures are appended to reliability/RESULTS.md. Exit status 1 when a row
was lost, duplicated, resurrected or unexpected, a date was left due and never compacted, or a published
compaction had no passed proof.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import yaml

from reliability.figures import audit_figures, check_rows, check_rows_while_writing
from reliability.soak import (HERE, TickResult, _code_line, _kinds, _utc, code_changes, dagster_runs, log_tick, product_code,
                              read_ids, run_tick, say, staging_branches, start_group, stop_writers, wait_for_writers)
from reliability.streaming_figures import (compactions_from_audit, date_lags, lag_summary, publish_figures,
                                           streaming_verdict)

TABLE = "stream.events"
START_DATE = "2026-01-01"


def config_doc(work: Path, args) -> dict:
    """Production-like: the default policy except the writer's idle window, small-file sizes that fit a soak,
    and retention keys that make expiry and manifest rewrites act within minutes."""
    return {
        "catalog": {"name": "lake", "type": "hadoop", "warehouse": str(work / "warehouse")},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                                  "spark.default.parallelism": "2", "spark.driver.memory": "1g"}},
        "state_dir": str(work / "state"),
        "claims": {"backend": "file"},
        "audit": {"sink": "file"},
        "scope": {"include": ["stream.*"], "exclude": []},
        "defaults": {
            "writer_idle": args.writer_idle, "hot_partition_age": "0s",
            "small_file_size_bytes": "1MiB", "target_file_size_bytes": "8MiB", "min_input_files": args.min_input_files,
            "snapshot_older_than": "10m", "retain_last": 5, "snapshot_max_count": args.snapshot_max_count,
            "manifest_min_count": args.manifest_min_count,
        },
        "tables": {TABLE: {"owner": "stream-soak"}},
    }


def writer_plan(args) -> dict:
    return {"table": TABLE, "start_date": START_DATE, "seed": args.seed, "day_seconds": args.day_seconds,
            "interval_seconds": 1.0, "rows": 20, "late_probability": args.late_probability,
            "delete_probability": args.delete_probability, "deletes_per_commit": 3}


def prepare(args) -> Path:
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.keep_old:
        for old in args.work.iterdir():
            if old.is_dir() and old.name.startswith("stream-"):
                shutil.rmtree(old, ignore_errors=True)
    work = args.work / f"stream-{_utc():%Y%m%dT%H%M%SZ}"
    for sub in ("ticks", "final"):
        (work / sub).mkdir(parents=True)
    (work / "maintenance.yaml").write_text(yaml.safe_dump(config_doc(work, args), sort_keys=False))
    (work / "stream_writer.json").write_text(json.dumps(writer_plan(args), indent=2))
    return work


# -- what the table looks like ---------------------------------------------------------------------------------

class Sampler:
    """Snapshot and manifest counts over time (with pyiceberg), and every snapshot's commit time seen, so a
    compaction's base snapshot can be dated after expiry removed it."""

    def __init__(self, config, work: Path, every_seconds: float = 10.0):
        self.config, self.work, self.every = config, work, every_seconds
        self.snapshot_ms: dict[int, int] = {}
        self.samples: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        """Sample every few seconds in the background too: a tick can run for minutes, and the counts peak
        inside it (the first runs sampled only around the ticks and missed their peak)."""
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample("while writing")

    def sample(self, when: str) -> dict | None:
        with self._lock:
            return self._sample(when)

    def _sample(self, when: str) -> dict | None:
        from icemaint.observe.catalog import CatalogReader

        for _ in range(10):  # a Hadoop table's version hint is missing for a moment in each commit
            try:
                tbl = CatalogReader(self.config).load(TABLE)
                snap = tbl.current_snapshot()
                manifests = len(snap.manifests(tbl.io)) if snap else 0
                break
            except Exception:  # noqa: BLE001 - retried; a sample is not worth failing the soak for
                time.sleep(0.2)
        else:
            return None
        for s in tbl.metadata.snapshots:
            self.snapshot_ms[s.snapshot_id] = s.timestamp_ms
        row = {"at": _utc().isoformat(timespec="seconds"), "when": when, "snapshots": len(tbl.metadata.snapshots),
               "manifests": manifests, **metadata_json(self.work)}
        self.samples.append(row)
        with open(self.work / "samples.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        return row


def files_by_date(config, small_bytes: int) -> dict[str, dict]:
    """Per date: live data files, those below the small-file size, and delete files (pyiceberg)."""
    from icemaint.observe.catalog import CatalogReader

    files = CatalogReader(config).load(TABLE).inspect.files()
    part = files.column("partition").combine_chunks()
    days = part.field(0).to_pylist()
    out: dict[str, dict] = {}
    for content, size, day in zip(files.column("content").to_pylist(), files.column("file_size_in_bytes").to_pylist(),
                                  days):
        date = str(day) if isinstance(day, dt.date) else str(dt.date(1970, 1, 1) + dt.timedelta(days=int(day)))
        d = out.setdefault(date, {"data_files": 0, "small_data_files": 0, "delete_files": 0})
        if content == 0:
            d["data_files"] += 1
            d["small_data_files"] += size < small_bytes
        else:
            d["delete_files"] += 1
    return out


def expiry_counts(records: list[dict]) -> dict:
    """The snapshot counts each expiry saw ("expired 260 of 362 snapshots ..."): the peaks it cut down."""
    seen = [int(m.group(1)) for r in records if r.get("operation") == "expire" and r.get("decision") == "run"
            for m in [re.search(r"expired \d+ of (\d+) snapshots", r.get("reason") or "")] if m]
    return {"snapshots_at_expiries": seen}


def metadata_files(work: Path) -> dict:
    """The table's metadata directory at the end: metadata.json versions kept, all files, bytes."""
    meta = work / "warehouse" / Path(*TABLE.split(".")) / "metadata"
    files = [p for p in meta.iterdir() if p.is_file() and not p.name.startswith(".")] if meta.exists() else []
    return {"metadata_json_files": sum(p.name.endswith(".metadata.json") for p in files),
            "metadata_dir_files": len(files), "metadata_dir_bytes": sum(p.stat().st_size for p in files)}


def metadata_json(work: Path) -> dict:
    """The table's metadata.json files on disk now (a sample: they pile up between commits and cleanups)."""
    meta = work / "warehouse" / Path(*TABLE.split(".")) / "metadata"
    sizes = []
    for p in (meta.glob("*.metadata.json") if meta.exists() else ()):
        try:
            sizes.append(p.stat().st_size)
        except FileNotFoundError:  # removed while listed
            continue
    return {"metadata_json_files": len(sizes), "metadata_json_bytes": sum(sizes)}


def ledger_sets(work: Path) -> tuple[set[int], set[int]]:
    from reliability.stream_writer import StreamLedger

    path = work / "ledger.json"
    if not path.exists():
        return set(), set()
    ledger = StreamLedger.load(path).ledger
    return set(ledger.written), set(ledger.deleted)


def tick_decisions(report: dict | None) -> list[dict]:
    return [] if not report else [d for d in report.get("decisions", []) if d.get("table") == TABLE]


# -- the run ---------------------------------------------------------------------------------------------------

def soak(args) -> int:
    from benchmarks.machine import describe_machine, load_average
    from icemaint.config import load_config
    from icemaint.safety.audit import open_audit
    from reliability.stream_writer import StreamLedger

    work = prepare(args)
    config_path = work / "maintenance.yaml"
    config = load_config(str(config_path))
    policy = config.policy(TABLE)
    started_at, load_start, code_start = _utc(), load_average(), product_code()
    say(f"soak-streaming: {args.minutes:g} min of writing, a new date every {args.day_seconds:g}s, seed {args.seed}, "
        f"work dir {work}")
    writer = start_group([sys.executable, "-m", "reliability.stream_writer", "--config", str(config_path),
                          "--work", str(work)], work / "writer.log")
    sampler = Sampler(config, work)
    ticks: list[TickResult] = []
    midrun: list[dict] = []
    loads: list = []
    decisions: list[dict] = []
    rng = random.Random(args.seed)
    try:
        wait_for_writers(writer, work)
        say(f"writer ready on {TABLE}")
        sampler.start()
        t_end = time.monotonic() + args.minutes * 60
        while time.monotonic() < t_end:
            if writer.poll() is not None:
                say(f"the writer exited ({writer.returncode}) early: see {work / 'writer.log'}")
                break
            t_tick = time.monotonic()
            sampler.sample("before tick")
            tick = run_tick(len(ticks) + 1, config_path, work, rng, 0.0, args.tick_timeout)
            ticks.append(tick)
            loads.append(load_average())
            after = sampler.sample("after tick")
            decided = tick_decisions(tick.report)
            decisions += [{**d, "tick": tick.number} for d in decided]
            say(f"tick {tick.number}: {tick.seconds:.0f}s, {tick.summary()}; snapshots {after and after['snapshots']}, "
                f"manifests {after and after['manifests']}")
            log_tick(work, tick)
            if tick.number % args.check_every == 0:
                before = ledger_sets(work)
                ids = read_ids(config, TABLE)
                check = check_rows_while_writing(TABLE, ids, before, ledger_sets(work))
                midrun.append({"after_tick": tick.number, "check": check.to_dict()})
                if check.lost or check.duplicated or check.resurrected:
                    say(f"ROWS WRONG while writing: {check}")
            while time.monotonic() < min(t_tick + args.tick_interval, t_end):
                time.sleep(min(5.0, max(0.0, t_tick + args.tick_interval - time.monotonic())))
                sampler.sample("between ticks")
    finally:
        sampler.stop()
        sampler.sample("writer stopping")
        stopped_at = _utc()
        writer_report = stop_writers(writer, work)
    say("writer stopped; final ticks, undisturbed")

    time.sleep(policy.writer_idle_seconds + 2)
    final_ticks = []
    for i in range(args.final_ticks_max):
        tick = run_tick(len(ticks) + 1, config_path, work, rng, 0.0, args.tick_timeout)
        ticks.append(tick)
        final_ticks.append(tick.number)
        decided = tick_decisions(tick.report)
        decisions += [{**d, "tick": tick.number, "final": True} for d in decided]
        sampler.sample("after final tick")
        say(f"final tick {tick.number}: {tick.seconds:.0f}s, {tick.summary()}")
        log_tick(work, tick)
        if i >= 1 and not any(d.get("decision") == "run" for d in decided):
            break

    # -- the final checks ---------------------------------------------------------------------------------------
    ledger = StreamLedger.load(work / "ledger.json")
    rows = check_rows(TABLE, read_ids(config, TABLE), set(ledger.ledger.written), set(ledger.ledger.deleted))
    records = [r.to_dict() for r in open_audit(config).records()]
    (work / "final" / "audit.json").write_text(json.dumps(records, indent=1, default=str))
    audit = audit_figures(records)
    compactions = compactions_from_audit(records, sampler.snapshot_ms)
    files_end = files_by_date(config, policy.small_file_size_bytes)
    lags = date_lags(ledger.dates, compactions, files_end, stopped_at, policy.writer_idle_seconds,
                     policy.min_input_files)
    lag = lag_summary(lags)
    publishes = publish_figures(compactions, audit)
    samples = list(sampler.samples)
    writing = [s for s in samples if s["when"] in ("before tick", "after tick", "between ticks", "while writing")]
    metadata = {"snapshots_end": samples[-1]["snapshots"], "manifests_end": samples[-1]["manifests"],
                "snapshots_peak": max(s["snapshots"] for s in writing or samples),
                "manifests_peak": max(s["manifests"] for s in writing or samples),
                "metadata_json_peak": max(s.get("metadata_json_files", 0) for s in writing or samples),
                "metadata_json_bytes_peak": max(s.get("metadata_json_bytes", 0) for s in writing or samples),
                "samples": len(samples), **expiry_counts(records), **metadata_files(work)}
    wstats = (writer_report.get("writers") or [{}])[0]
    passed, verdict = streaming_verdict(args.minutes, rows, lag, publishes, wstats, metadata)
    last_final = {(d.get("date") or d.get("operation")): d.get("reason") for d in decisions if d.get("final")}
    figures = {
        "verdict": verdict, "passed": passed, "started": started_at.isoformat(timespec="seconds"),
        "writing_stopped": stopped_at.isoformat(timespec="seconds"), "finished": _utc().isoformat(timespec="seconds"),
        "minutes": args.minutes, "args": {k: str(v) for k, v in vars(args).items()}, "work": str(work),
        "rows": rows.to_dict(), "lag": lag, "dates": [x.to_dict() for x in lags], "publishes": publishes,
        "audit": audit, "metadata": metadata, "writer": writer_report,
        "ticks": {"total": len(ticks), "final": final_ticks, "seconds": [round(t.seconds, 1) for t in ticks],
                  "aborted": [{"tick": t.number, "rc": t.returncode, "error": t.error}
                              for t in ticks if t.report is None],
                  "errors": [{"tick": t.number, "errors": t.report.get("errors")} for t in ticks
                             if t.report and t.report.get("errors")]},
        "decisions": _decision_counts(decisions), "final_reasons": last_final,
        "writer_active_defers": _writer_active(decisions),
        "midrun": {"checks": len(midrun), "bad": [m for m in midrun if m["check"]["lost"] or
                                                  m["check"]["duplicated"] or m["check"]["resurrected"]]},
        "dagster_runs": dagster_runs(config), "staging_left": staging_branches(config, TABLE),
        "load_average": {"start": load_start, "end": load_average(),
                         "max_1min": max((x[0] for x in loads if x), default=None)},
        "policy": {"writer_idle_seconds": policy.writer_idle_seconds, "min_input_files": policy.min_input_files,
                   "snapshot_max_count": policy.snapshot_max_count, "manifest_min_count": policy.manifest_min_count,
                   "publish_timeout_seconds": policy.publish_timeout_seconds, "writer_scope": policy.writer_scope},
        "code": code_changes(code_start, product_code()),
        "machine": describe_machine(None),
    }
    (work / "figures.json").write_text(json.dumps(figures, indent=2, default=str))
    append_results(args.results, figures, args)
    print(verdict, flush=True)
    return 0 if passed and not figures["midrun"]["bad"] else 1


def _decision_counts(decisions: list[dict]) -> dict:
    out: dict[str, int] = {}
    for d in decisions:
        key = f"{d.get('operation')} {d.get('decision')}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _writer_active(decisions: list[dict]) -> dict:
    """Compaction defers for a writer active on the date (the partition-scoped gate), and a sample reason."""
    active = [d for d in decisions if d.get("operation") == "compact" and d.get("decision") == "defer"
              and "writer active" in (d.get("reason") or "")]
    return {"count": len(active), "dates": len({d.get("date") for d in active}),
            "sample": active[-1].get("reason") if active else None}


# -- RESULTS.md --------------------------------------------------------------------------------------------------

def append_results(path: Path, f: dict, args) -> None:
    m, lag, pub, md, a = f["machine"], f["lag"], f["publishes"], f["metadata"], f["audit"]
    w = (f["writer"].get("writers") or [{}])[0]
    la = f["load_average"]
    lines = [
        "", f"## {f['started'][:16].replace('T', ' ')} UTC: {f['minutes']:g}-minute streaming soak", "",
        f"`{f['verdict']}`", "",
        f"- Command: `python -m reliability.soak_streaming --minutes {f['minutes']:g} --seed {args.seed} "
        f"--day-seconds {args.day_seconds:g} --writer-idle {args.writer_idle} --min-input-files {args.min_input_files} "
        f"--tick-interval {args.tick_interval:g}` (wall time "
        f"{(dt.datetime.fromisoformat(f['finished']) - dt.datetime.fromisoformat(f['started'])).total_seconds() / 60:.0f}"
        " min with the writer's start and the final ticks)",
        f"- Machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu_model']}, **shared with other engineers' work "
        f"during the run**; load average {la['start']} at the start, {la['end']} at the end, 1-minute load up to "
        f"{la['max_1min']} after the ticks",
        f"- Code: {_code_line(f['code'])}",
        f"- Software: Python {m['python']}, Java {m['java']}, Spark {m['spark']} (local[2]), pyiceberg {m['pyiceberg']}, "
        f"Dagster {m['dagster']}, Great Expectations {m['great_expectations']}; Hadoop catalog, file claims and audit",
        f"- Policy: default except writer_idle {f['policy']['writer_idle_seconds']:g}s (writer_scope "
        f"{f['policy']['writer_scope']}), hot_partition_age 0s, min_input_files {f['policy']['min_input_files']}, "
        f"small files < 1 MiB, snapshot_max_count {f['policy']['snapshot_max_count']}, snapshot_older_than 10m, "
        f"retain_last 5, manifest_min_count {f['policy']['manifest_min_count']}; publish_timeout "
        f"{f['policy']['publish_timeout_seconds']:g}s",
        f"- Writer: one commit a second (when a commit takes longer, the next follows at once), 20 rows, ignores "
        f"the claim; a new simulated date every {args.day_seconds:g}s from {START_DATE}; late rows into the previous "
        f"date with probability {args.late_probability:g}, a DELETE of 3 rows of the current or previous date with "
        f"probability {args.delete_probability:g}",
        "",
        "| writer | count |", "|---|---|",
        f"| commits landed (appends / late / deletes, rows deleted) | {w.get('commits', '?')} ({w.get('appends', '?')} / "
        f"{w.get('late', '?')} / {w.get('deletes', '?')}, {w.get('deleted_rows', '?')}) |",
        f"| commits that raised (by kind; resolved landed / not) | {w.get('commit_errors', '?')} "
        f"({_kinds(w.get('errors_by_kind') or {})}; {w.get('resolved_landed', 0)} / {w.get('resolved_not_landed', 0)}) |",
        f"| commit call seconds: mean / max; calls over the 1 s interval | "
        f"{(w.get('commit_seconds_total', 0) / max(w.get('commits', 1), 1)):.2f} / {w.get('commit_seconds_max', '?')}; "
        f"{w.get('slow_commits', '?')} |",
        f"| rows expected / read / lost / duplicated / resurrected / unexpected | {f['rows']['expected']} / "
        f"{f['rows']['read']} / {f['rows']['lost']} / {f['rows']['duplicated']} / {f['rows']['resurrected']} / "
        f"{f['rows']['unexpected']} |",
        f"| row checks while writing (with damage) | {f['midrun']['checks']} ({len(f['midrun']['bad'])}) |",
        "",
        "| maintenance | count |", "|---|---|",
        f"| ticks (after the writer stopped); seconds each: median / max | {f['ticks']['total']} "
        f"({len(f['ticks']['final'])}); {_median(f['ticks']['seconds'])} / {max(f['ticks']['seconds'], default=0)} |",
        f"| compactions published / proof passed / runs not published / proofs failed (not_published) | "
        f"{pub['published']} / {pub['proven']} / {pub['runs_not_published']} / {pub['not_published']} |",
        f"| publish conflicts with the writer's deletes / calls failed | {pub['conflicts']} / {a['failed']} "
        f"({_kinds(a['failed_by_operation'])}) |",
        f"| compaction defers (by kind) | {a['defers']} ({_kinds(a['defers_by_kind'])}) |",
        f"| tick decisions \"writer active on <date>\" (distinct dates) | {f['writer_active_defers']['count']} "
        f"({f['writer_active_defers']['dates']}) |",
        f"| expiries / manifest rewrites | {a['expiries']} / {a['manifest_rewrites']} |",
        f"| snapshots at the end (peak while writing) | {md['snapshots_end']} ({md['snapshots_peak']}) |",
        f"| manifests at the end (peak while writing) | {md['manifests_end']} ({md['manifests_peak']}) |",
        f"| snapshots each expiry found (it cut them to snapshot_max_count) | "
        f"{', '.join(map(str, md['snapshots_at_expiries'])) or 'none'} |",
        f"| metadata directory at the end: metadata.json versions / files / MiB | {md['metadata_json_files']} / "
        f"{md['metadata_dir_files']} / {md['metadata_dir_bytes'] / 2**20:.0f} |",
        f"| metadata.json files / MiB at their peak while writing | {md.get('metadata_json_peak', 0)} / "
        f"{md.get('metadata_json_bytes_peak', 0) / 2**20:.1f} |",
        f"| staging branches left / Dagster runs left in flight | {len(f['staging_left'])} / "
        f"{len(f['dagster_runs']['left_in_flight'])} |",
        f"| ticks without a report / with table errors | {len(f['ticks']['aborted'])} / {len(f['ticks']['errors'])} |",
        "",
        f"Lag (last writer commit into a date -> its covering compaction published), over the {lag['lag_dates']} dates "
        f"that went cold while the writer wrote: max {_mins(lag['lag_max_minutes'])}, median "
        f"{_mins(lag['lag_median_minutes'])}; dates live when it stopped (compacted by the final ticks): max "
        f"{_mins(lag['lag_at_stop_max_minutes'])}.",
        "",
        "| date | commits (late, deletes) | last commit | cold while writing | compactions | status | covering "
        "compaction | lag min | files at the end (small, deletes) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in f["dates"]:
        lines.append(
            f"| {x['date']} | {x['commits']} ({x['late']}, {x['deletes']}) | {x['last_commit'][11:19]} "
            f"({x['last_kind']}) | {'yes' if x['cold_while_writing'] else 'no'} | {x['compactions']} | {x['status']} | "
            f"{(x['compacted_at'] or '-')[11:19] or '-'}{'' if x['base_known'] in (None, True) else ' (base unknown)'} | "
            f"{'-' if x['lag_minutes'] is None else x['lag_minutes']} | {x['data_files_end']} ({x['small_files_end']}, "
            f"{x['delete_files_end']}) |")
    notes = []
    if lag["never_compacted"]:
        notes.append("Dates left due and never compacted (the final tick's reason): " + "; ".join(
            f"{d}: {f['final_reasons'].get(d, 'no decision')}" for d in lag["never_compacted"]))
    if pub["unproven"]:
        notes.append(f"Published without a passed proof: {pub['unproven']}")
    for x in f["ticks"]["aborted"]:
        notes.append(f"tick {x['tick']} ended without a report: rc {x['rc']}: `{x['error']}`")
    for s in (w.get("error_samples") or [])[:5]:
        notes.append(f"writer commit failed at {s['at'][11:19]}: {s['kind']}: `{s['message'][:200]}`")
    for an in w.get("anomalies") or []:
        notes.append(f"writer anomaly: {an}")
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    if args.note:
        lines += ["", f"Note: {args.note}"]
    with open(path, "a") as fh:
        fh.write("\n".join(lines) + "\n")
    say(f"results appended to {path}")


def _median(xs: list[float]) -> float:
    import statistics

    return round(statistics.median(xs), 1) if xs else 0.0


def _mins(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} min"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reliability.soak_streaming", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0, help="writing time (default 20)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    p.add_argument("--day-seconds", type=float, default=150.0, help="simulated date length (default 150 s)")
    p.add_argument("--late-probability", type=float, default=0.05, help="a commit is late rows (default 0.05)")
    p.add_argument("--delete-probability", type=float, default=0.03, help="a commit is a DELETE (default 0.03)")
    p.add_argument("--writer-idle", default="30s", help="policy writer_idle (default 30s)")
    p.add_argument("--min-input-files", type=int, default=3, help="policy min_input_files (default 3)")
    p.add_argument("--snapshot-max-count", type=int, default=100, help="policy snapshot_max_count (default 100)")
    p.add_argument("--manifest-min-count", type=int, default=16, help="policy manifest_min_count (default 16)")
    p.add_argument("--tick-interval", type=float, default=20.0, help="seconds from a tick's start to the next's")
    p.add_argument("--tick-timeout", type=float, default=900.0, help="a tick running longer is killed as hung")
    p.add_argument("--final-ticks-max", type=int, default=6, help="undisturbed ticks after the writer stops, at most")
    p.add_argument("--check-every", type=int, default=3, help="check the rows while writing every N ticks")
    p.add_argument("--work", type=Path, default=HERE / ".work", help="where stream-<stamp>/ goes")
    p.add_argument("--keep-old", action="store_true", help="keep earlier stream-*/ work dirs")
    p.add_argument("--results", type=Path, default=HERE / "RESULTS.md", help="append the figures here")
    p.add_argument("--note", help="a line for the results section (e.g. what else ran on the machine)")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = int(time.time()) % 100_000
    if args.minutes <= 0 or args.day_seconds <= 0:
        p.error("--minutes and --day-seconds must be above 0")
    return soak(args)


if __name__ == "__main__":
    sys.exit(main())
