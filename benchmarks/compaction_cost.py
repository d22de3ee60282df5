"""Sections 1-4 for one table size: project compaction vs a bare rewrite, what it buys, the floor, GX cost.

Two tables are written from the same seeded layout: `<label>_project` is compacted by
`Compactor.run` (health, claim, rewrite, GX proof, evidence, audit) and `<label>_bare` by the bare
`CALL rewrite_data_files` with exactly the where clause and options the Compactor passed (recorded
through its `rewrite` hook). Between repetitions both tables are rolled back to their written
snapshot, so every repetition rewrites the same files; the order of the two alternates.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from icemaint.audit import open_audit
from icemaint.claims import open_claims
from icemaint.compaction import CompactionRequest, Compactor, call_rewrite_data_files
from icemaint.config import MaintenanceConfig
from icemaint.decisions import RUN
from icemaint.metadata import CatalogReader
from icemaint.names import TableName
from icemaint.scope import DateScope

from benchmarks.floor import rewrite_with_pyarrow
from benchmarks.lake import (SmallFileLayout, build_small_file_table, date_data_file_paths, date_file_stats,
                             rollback)
from benchmarks.measure import CallTimes, Stopwatch, TimedProxy, median, ratio
from benchmarks.probes import measure_probes


class BenchmarkInvalid(RuntimeError):
    """The benchmark could not measure what it claims (e.g. the Compactor did not rewrite)."""


@dataclass(frozen=True)
class CompactionCase:
    label: str
    layout: SmallFileLayout


class RecordingRewrite:
    """The Compactor's `rewrite` hook: calls Iceberg's procedure unchanged and keeps its arguments."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, spark, catalog, table, scope, options, strategy="binpack", sort_order=None):
        self.calls.append({"scope": scope, "options": dict(options), "strategy": strategy, "sort_order": sort_order})
        return call_rewrite_data_files(spark, catalog, table, scope, options, strategy, sort_order)


def _scope(reader: CatalogReader, table: TableName, date: dt.date) -> str:
    column_type = str(reader.load(table.key).schema().find_field("ts").field_type)
    return DateScope("ts", column_type, date).predicate()


def run_project(spark, config: MaintenanceConfig, table: TableName, date: dt.date, run_id: str,
                recorder: RecordingRewrite) -> dict:
    """One `Compactor.run` with its time split into phases (progress marks + timed claims/audit/reader)."""
    times = CallTimes()
    marks: dict[str, float] = {}

    def progress(message: str) -> None:
        marks.setdefault(message.split(" ", 1)[0], time.perf_counter())

    reader = TimedProxy(CatalogReader(config), times, "reader", ("metadata_location", "load", "health"))
    claims = TimedProxy(open_claims(config), times, "claims", ("acquire",))
    audit = TimedProxy(open_audit(config), times, "audit", ("records", "append"))
    compactor = Compactor(config, spark, reader, claims, audit, rewrite=recorder, progress=progress)
    started = time.perf_counter()
    outcome = compactor.run(CompactionRequest(table=table.key, date=date.isoformat(), trigger="benchmark",
                                              run_id=run_id))
    ended = time.perf_counter()
    if outcome.decision != RUN or outcome.validation.get("passed") is not True:
        raise BenchmarkInvalid(f"the Compactor did not compact {table.key} {date}: {outcome.decision}: "
                               f"{outcome.reason} (validation {outcome.validation.get('passed')})")
    d = outcome.durations
    wall = ended - started
    rewrite_at, validate_at = marks["rewriting"], marks["validating"]
    reads = [r for proof in outcome.validation["commits"] for r in proof.get("reads", {}).values()]
    commit = outcome.validation["commits"][0]
    rows = next(c for c in commit["checks"] if c["name"] == "row_count_parity")["observed"]["before_row_count"]
    return {
        "wall_seconds": wall,
        "compaction_only_seconds": wall - d["validation_seconds"],
        "rewrite_seconds": d["rewrite_seconds"],
        "validation_seconds": d["validation_seconds"],
        "reported_total_seconds": d["total_seconds"],
        "plan_seconds": d["plan_seconds"],
        "phases": {
            "before_rewrite": rewrite_at - started,
            "rewrite": d["rewrite_seconds"],
            "between_rewrite_and_validation": validate_at - rewrite_at - d["rewrite_seconds"],
            "validation": d["validation_seconds"],
            "after_validation": ended - validate_at - d["validation_seconds"],
        },
        "proof_reads_seconds": sum(r["planning_ms"] + r["scan_ms"] for r in reads) / 1000,
        "read_before": outcome.read_before, "read_after": outcome.read_after,
        "calls": times.snapshot(),
        "files_before": outcome.files_before, "files_after": outcome.files_after,
        "rewritten_files": outcome.rewritten_files, "added_files": outcome.added_files,
        "rewritten_bytes": outcome.rewritten_bytes, "validated_rows": rows,
        "validation_checks": {c["name"]: c["passed"] for c in commit["checks"]},
    }


def run_bare(spark, catalog: str, table: TableName, call: dict) -> dict:
    """The bare procedure call with the Compactor's recorded arguments, timed."""
    with Stopwatch() as sw:
        result = call_rewrite_data_files(spark, catalog, table, call["scope"], call["options"], call["strategy"],
                                         call["sort_order"])
    if not result.get("rewritten_data_files_count"):
        raise BenchmarkInvalid(f"the bare rewrite of {table.key} rewrote nothing: {result}")
    return {"wall_seconds": sw.seconds, "rewritten_files": int(result["rewritten_data_files_count"]),
            "added_files": int(result["added_data_files_count"]), "rewritten_bytes": int(result["rewritten_bytes_count"])}


def _median_of(runs: list[dict], key: str) -> float:
    return median(r[key] for r in runs)


def run_case(spark, config: MaintenanceConfig, case: CompactionCase, reps: int, work_dir: Path,
             log: Callable[[str], None]) -> dict:
    """All four compaction sections for one size; every figure a median over `reps`."""
    catalog, layout = config.catalog.name, case.layout
    project, bare = TableName.parse(f"bench.{case.label}_project"), TableName.parse(f"bench.{case.label}_bare")
    log(f"[{case.label}] writing two identical tables: {layout.files} files x {layout.rows_per_file} rows "
        f"in {layout.commits} commits")
    built = {"project": build_small_file_table(spark, catalog, project, layout),
             "bare": build_small_file_table(spark, catalog, bare, layout)}
    same = ("date_files", "date_rows", "date_bytes", "table_files")
    if any(built["project"][k] != built["bare"][k] for k in same):
        raise BenchmarkInvalid(f"the two {case.label} tables differ: {built}")
    log(f"[{case.label}] written in {built['project']['seconds']:.1f} s + {built['bare']['seconds']:.1f} s: "
        + ", ".join(f"{k} {built['project'][k]}" for k in same))

    reader = CatalogReader(config)
    scope = _scope(reader, bare, layout.date)
    paths = date_data_file_paths(spark, catalog, bare, layout.date)
    log(f"[{case.label}] pyarrow floor over {len(paths)} files")
    floor = [rewrite_with_pyarrow(paths, work_dir / f"floor_{case.label}.parquet") for _ in range(reps)]
    log(f"[{case.label}] probes before compaction")
    probes_before = measure_probes(spark, bare.sql(catalog), scope, reps)

    recorder = RecordingRewrite()
    project_runs, bare_runs = [], []
    for rep in range(reps):
        if rep:
            rollback(spark, catalog, project, built["project"]["snapshot_id"])
            rollback(spark, catalog, bare, built["bare"]["snapshot_id"])
        # the project runs first in repetition 0: its recorded call is what the bare run replays
        order = ("project", "bare") if rep % 2 == 0 else ("bare", "project")
        for who in order:
            log(f"[{case.label}] repetition {rep + 1}/{reps}: {who}")
            if who == "project":
                project_runs.append(run_project(spark, config, project, layout.date, f"bench-{case.label}-{rep}",
                                                recorder))
            else:
                bare_runs.append(run_bare(spark, catalog, bare, recorder.calls[0]))
    if recorder.calls[0]["scope"] != scope or any(c != recorder.calls[0] for c in recorder.calls):
        raise BenchmarkInvalid(f"the Compactor's rewrite arguments changed between runs: {recorder.calls}")
    log(f"[{case.label}] probes after compaction")
    probes_after = measure_probes(spark, bare.sql(catalog), scope, reps)
    files_after = date_file_stats(spark, catalog, bare, layout.date)

    bare_s = _median_of(bare_runs, "wall_seconds")
    project_s = _median_of(project_runs, "wall_seconds")
    compaction_only_s = _median_of(project_runs, "compaction_only_seconds")
    rewrite_s = _median_of(project_runs, "rewrite_seconds")
    validation_s = _median_of(project_runs, "validation_seconds")
    floor_s = _median_of(floor, "seconds")
    phases = {k: median(r["phases"][k] for r in project_runs) for k in project_runs[0]["phases"]}
    call_names = sorted({n for r in project_runs for n in r["calls"]})
    proof_read_before = {k: median(r["read_before"][k] for r in project_runs) for k in ("planning_ms", "scan_ms")}
    proof_read_after = {k: median(r["read_after"][k] for r in project_runs) for k in ("planning_ms", "scan_ms")}
    calls = {n: median(r["calls"].get(n, {"seconds": 0})["seconds"] for r in project_runs) for n in call_names}
    return {
        "label": case.label,
        "layout": {"files": layout.files, "rows_per_file": layout.rows_per_file, "commits": layout.commits,
                   "date": layout.date.isoformat(), "neighbour_files": layout.neighbour_files, "seed": layout.seed},
        "tables": built,
        "rewrite_call": recorder.calls[0],
        "reps": reps,
        "overhead": {
            "bare_seconds": bare_s, "project_seconds": project_s, "project_compaction_only_seconds": compaction_only_s,
            "project_rewrite_seconds": rewrite_s, "validation_seconds": validation_s,
            "compaction_only_ratio": ratio(compaction_only_s, bare_s),
            "with_validation_ratio": ratio(project_s, bare_s),
            "rewrite_call_ratio": ratio(rewrite_s, bare_s),
            "phases": phases, "calls": calls,
            "plan_seconds": _median_of(project_runs, "plan_seconds"),
            "proof_reads_seconds": _median_of(project_runs, "proof_reads_seconds"),
        },
        "buys": {
            "files_before": built["bare"]["date_files"], "files_after": files_after["date_files"],
            "file_count_ratio": ratio(built["bare"]["date_files"], files_after["date_files"]),
            "probes_before": probes_before, "probes_after": probes_after,
            "proof_read_before": proof_read_before, "proof_read_after": proof_read_after,
            "read_planning_speedup": ratio(proof_read_before["planning_ms"], proof_read_after["planning_ms"]),
            "read_scan_speedup": ratio(proof_read_before["scan_ms"], proof_read_after["scan_ms"]),
            "scan_planning_speedup": ratio(probes_before["scan_probe"]["planning_ms"],
                                           probes_after["scan_probe"]["planning_ms"]),
            "scan_speedup": ratio(probes_before["scan_probe"]["scan_ms"], probes_after["scan_probe"]["scan_ms"]),
            "request_ratio": ratio(probes_before["scan_probe"]["files_opened"], probes_after["scan_probe"]["files_opened"]),
        },
        "floor": {
            "pyarrow_seconds": floor_s, "read_seconds": _median_of(floor, "read_seconds"),
            "write_seconds": _median_of(floor, "write_seconds"), "codec": floor[0]["codec"],
            "bytes_in": floor[0]["bytes_in"], "bytes_out": floor[0]["bytes_out"], "rows": floor[0]["rows"],
            "spark_over_floor": ratio(bare_s, floor_s),
            "project_rewrite_over_floor": ratio(rewrite_s, floor_s),
        },
        "validation": {
            "rows": project_runs[0]["validated_rows"], "validation_seconds": validation_s, "rewrite_seconds": rewrite_s,
            "validation_over_rewrite": ratio(validation_s, rewrite_s),
            "checks": project_runs[0]["validation_checks"],
        },
        "runs": {"project": project_runs, "bare": bare_runs, "floor": floor},
    }
