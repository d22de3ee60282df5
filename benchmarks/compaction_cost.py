"""Sections 1-4 for one table size: compaction before and after stage-prove-publish vs the bare procedure.

Three tables are written from the same seeded layout (identical rows, files and bytes; checked):
`<label>_bare`, `<label>_old` and `<label>_new`. Two worker processes, each with its own Spark
session kept for the whole run (see versions.py / compaction_worker.py), compact them:

- old: the version before stage-prove-publish (a git worktree of `versions.BEFORE_STAGING`):
  `Compactor.run` with its GX proof, and with the proof skipped;
- new: the working tree's `Compactor.run` (stage, prove, publish) with its proof, and with the
  proof skipped (stage + unproven publish);
- both workers also run the bare `CALL rewrite_data_files` (benchmarks/baseline.py) on
  `<label>_bare`, so every version has a baseline measured in its own JVM.

Before every run its table is rolled back to its written snapshot (`rollback_to_snapshot`, by the
harness's own session, untimed), so every run rewrites the same files. Run order rotates between
repetitions. Afterwards one independent reader (benchmarks/verify.py: pyiceberg + pyarrow,
no Spark) checks that the snapshot every run produced holds exactly the rows the tables were
written with.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from icemaint.config import MaintenanceConfig
from icemaint.domain.verdicts import RUN
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.domain.scope import DateScope

from benchmarks.baseline import rewrite_options, rewrite_sql
from benchmarks.floor import rewrite_with_pyarrow
from benchmarks.lake import (SmallFileLayout, build_small_file_table, current_snapshot_id, date_data_file_paths,
                             date_file_stats, rollback)
from benchmarks.machine import CpuShare, load_average
from benchmarks.measure import median, ratio
from benchmarks.probes import measure_probes
from benchmarks.verify import snapshot_digest


class BenchmarkInvalid(RuntimeError):
    """The benchmark could not measure what it claims (e.g. the Compactor did not rewrite)."""


@dataclass(frozen=True)
class CompactionCase:
    label: str
    layout: SmallFileLayout


@dataclass(frozen=True)
class Variant:
    key: str
    worker: str  # "old" | "new"
    table: str  # "bare" | "old" | "new"
    kind: str  # "bare" | "compact"
    proof: bool = False
    title: str = ""


VARIANTS = (
    Variant("bare_new", "new", "bare", "bare", title="bare `rewrite_data_files` (new worker's JVM)"),
    Variant("new_proof", "new", "new", "compact", True, "after: stage, prove, publish"),
    Variant("old_proof", "old", "old", "compact", True, "before: rewrite on main, prove"),
    Variant("bare_old", "old", "bare", "bare", title="bare `rewrite_data_files` (old worker's JVM)"),
    Variant("new_noproof", "new", "new", "compact", False, "after: stage + unproven publish (proof skipped)"),
    Variant("old_noproof", "old", "old", "compact", False, "before: rewrite on main (proof skipped)"),
)
VARIANT_BY_KEY = {v.key: v for v in VARIANTS}


def run_order(rep: int) -> list[Variant]:
    """The variants in repetition `rep`'s order: rotated by two places per repetition."""
    shift = (2 * rep) % len(VARIANTS)
    return list(VARIANTS[shift:] + VARIANTS[:shift])


def _scope(reader: CatalogReader, table: TableName, date: dt.date) -> str:
    column_type = str(reader.load(table.key).schema().find_field("ts").field_type)
    return DateScope("ts", column_type, date).predicate()


def _check_compaction(variant: Variant, table: TableName, run: dict) -> None:
    if run["decision"] != RUN or run["passed"] is not True or not run["rewritten_files"]:
        raise BenchmarkInvalid(f"{variant.key}: the Compactor did not compact {table.key}: {run['decision']}: "
                               f"{run['reason']} (proof passed: {run['passed']})")
    if run["proof_skipped"] == variant.proof:
        raise BenchmarkInvalid(f"{variant.key}: the proof was {'skipped' if run['proof_skipped'] else 'run'}, "
                               f"expected the opposite (patched: {run['patched']})")


def _phase_medians(runs: list[dict]) -> dict | None:
    if not runs or any(r["phases"] is None for r in runs):
        return None
    return {k: median(r["phases"][k] for r in runs) for k in runs[0]["phases"]}


def _call_medians(runs: list[dict]) -> dict:
    names = sorted({n for r in runs for n in r["calls"]})
    return {n: median(r["calls"].get(n, {"seconds": 0})["seconds"] for r in runs) for n in names}


def _summary(runs: list[dict]) -> dict:
    walls = [r["wall_seconds"] for r in runs]
    out = {"wall_seconds": median(walls), "min_seconds": min(walls), "max_seconds": max(walls), "n": len(walls),
           "cpu_seconds": median(r["cpu_seconds"] for r in runs)}
    if runs and "durations" in runs[0]:
        for key in ("plan_seconds", "rewrite_seconds", "validation_seconds", "publish_seconds", "total_seconds"):
            out[key] = median(r["durations"].get(key) or 0.0 for r in runs)
        # everything but stage/rewrite, proof and publish, per run (medians of parts do not add up)
        out["rest_seconds"] = median(r["wall_seconds"] - sum(r["durations"].get(k) or 0.0 for k in (
            "rewrite_seconds", "validation_seconds", "publish_seconds")) for r in runs)
        out["phases"] = _phase_medians(runs)
        out["calls"] = _call_medians(runs)
        out["proof_reads_seconds"] = median(r["proof_reads_seconds"] for r in runs)
        out["wall_minus_proof_seconds"] = median(r["wall_seconds"] - (r["durations"].get("validation_seconds") or 0.0)
                                                 for r in runs)
    return out


def run_case(spark, config: MaintenanceConfig, case: CompactionCase, reps: int, work_dir: Path,
             log: Callable[[str], None], workers: dict) -> dict:
    """All four compaction sections for one size; every figure a median over `reps`."""
    with CpuShare() as cpu:
        result = _run_case(spark, config, case, reps, work_dir, log, workers)
    result["cpu_share"] = cpu.result
    return result


def _run_case(spark, config: MaintenanceConfig, case: CompactionCase, reps: int, work_dir: Path,
              log: Callable[[str], None], workers: dict) -> dict:
    catalog, layout = config.catalog.name, case.layout
    load_start = load_average()
    tables = {t: TableName.parse(f"bench.{case.label}_{t}") for t in ("bare", "old", "new")}
    log(f"[{case.label}] writing three identical tables: {layout.files} files x {layout.rows_per_file} rows "
        f"in {layout.commits} commits")
    built = {t: build_small_file_table(spark, catalog, name, layout) for t, name in tables.items()}
    same = ("date_files", "date_rows", "date_bytes", "table_files")
    if any(built[t][k] != built["bare"][k] for t in built for k in same):
        raise BenchmarkInvalid(f"the {case.label} tables differ: {built}")
    log(f"[{case.label}] written in " + " + ".join(f"{b['seconds']:.1f} s" for b in built.values()) + ": "
        + ", ".join(f"{k} {built['bare'][k]}" for k in same))

    reader = CatalogReader(config)
    bare = tables["bare"]
    scope = _scope(reader, bare, layout.date)
    policy = config.policy(bare.key)
    call = {"scope": scope, "options": rewrite_options(policy), "strategy": policy.strategy,
            "sort_order": policy.sort_order}
    call["sql"] = rewrite_sql(catalog, bare, scope, call["options"], call["strategy"], call["sort_order"])

    paths = date_data_file_paths(spark, catalog, bare, layout.date)
    log(f"[{case.label}] pyarrow floor over {len(paths)} files")
    floor = [rewrite_with_pyarrow(paths, work_dir / f"floor_{case.label}.parquet") for _ in range(reps)]
    log(f"[{case.label}] probes before compaction")
    probes_before = measure_probes(spark, bare.sql(catalog), scope, reps)

    runs: dict[str, list[dict]] = {v.key: [] for v in VARIANTS}
    at_written = {t: True for t in tables}
    for rep in range(reps):
        for v in run_order(rep):
            name = tables[v.table]
            if not at_written[v.table]:
                rollback(spark, catalog, name, built[v.table]["snapshot_id"])
            if current_snapshot_id(spark, catalog, name) != built[v.table]["snapshot_id"]:
                raise BenchmarkInvalid(f"{name.key} is not at its written snapshot before {v.key}")
            log(f"[{case.label}] repetition {rep + 1}/{reps}: {v.key}")
            worker = workers[v.worker]
            if v.kind == "bare":
                sql = rewrite_sql(catalog, name, scope, call["options"], call["strategy"], call["sort_order"])
                run = worker.request("bare", sql=sql, table_sql=name.sql(catalog))
                if not run["result"].get("rewritten_data_files_count"):
                    raise BenchmarkInvalid(f"the bare rewrite of {name.key} rewrote nothing: {run['result']}")
                run.update(rewritten_files=run["result"]["rewritten_data_files_count"],
                           added_files=run["result"]["added_data_files_count"],
                           rewritten_bytes=run["result"]["rewritten_bytes_count"])
            else:
                run = worker.request("compact", table=name.key, date=layout.date.isoformat(), proof=v.proof,
                                     run_id=f"bench-{case.label}-{v.key}-{rep}")
                _check_compaction(v, name, run)
                for recorded in run.get("recorded_calls") or []:
                    mine = {k: call[k] for k in ("scope", "options", "strategy", "sort_order")}
                    if recorded != mine:
                        raise BenchmarkInvalid(f"the old Compactor's CALL differs from the bare baseline's: "
                                               f"{recorded} vs {mine}")
            run["rep"] = rep
            runs[v.key].append(run)
            at_written[v.table] = False
    log(f"[{case.label}] probes after compaction")
    probes_after = measure_probes(spark, bare.sql(catalog), scope, reps)
    files_after = date_file_stats(spark, catalog, bare, layout.date)

    verification = verify_rows(config, tables, built, runs, log, case.label)

    s = {k: _summary(v) for k, v in runs.items()}
    bare_old, bare_new = s["bare_old"]["wall_seconds"], s["bare_new"]["wall_seconds"]
    floor_s = median(f["seconds"] for f in floor)
    proof_read = {
        ver: {side: {k: median(r[f"read_{side}"].get(k, 0) for r in runs[f"{ver}_proof"])
                     for k in ("planning_ms", "scan_ms")} for side in ("before", "after")}
        for ver in ("old", "new")}
    pb, pa = proof_read["new"]["before"], proof_read["new"]["after"]
    return {
        "label": case.label,
        "layout": {"files": layout.files, "rows_per_file": layout.rows_per_file, "commits": layout.commits,
                   "date": layout.date.isoformat(), "neighbour_files": layout.neighbour_files, "seed": layout.seed},
        "tables": built,
        "rewrite_call": call,
        "reps": reps,
        "load_average": {"start": load_start, "end": load_average()},
        "variants": s,
        "cost": {
            "bare_old_seconds": bare_old, "bare_new_seconds": bare_new,
            "bare_jvm_ratio": ratio(bare_new, bare_old),
            # each version against the bare procedure measured in its own worker's JVM
            "old_compaction_only_ratio": ratio(s["old_noproof"]["wall_seconds"], bare_old),
            "old_with_proof_ratio": ratio(s["old_proof"]["wall_seconds"], bare_old),
            "new_compaction_only_ratio": ratio(s["new_noproof"]["wall_seconds"], bare_new),
            "new_with_proof_ratio": ratio(s["new_proof"]["wall_seconds"], bare_new),
            # after vs before, same variant
            "compaction_only_new_over_old": ratio(s["new_noproof"]["wall_seconds"], s["old_noproof"]["wall_seconds"]),
            "with_proof_new_over_old": ratio(s["new_proof"]["wall_seconds"], s["old_proof"]["wall_seconds"]),
            "proof_new_over_old": ratio(s["new_proof"]["validation_seconds"], s["old_proof"]["validation_seconds"]),
            "rewrite_new_over_old": ratio(s["new_proof"]["rewrite_seconds"], s["old_proof"]["rewrite_seconds"]),
            # the same on CPU seconds of the worker (Python + JVM): robust to other processes' load
            "cpu_bare_new_over_old": ratio(s["bare_new"]["cpu_seconds"], s["bare_old"]["cpu_seconds"]),
            "cpu_compaction_only_new_over_old": ratio(s["new_noproof"]["cpu_seconds"], s["old_noproof"]["cpu_seconds"]),
            "cpu_with_proof_new_over_old": ratio(s["new_proof"]["cpu_seconds"], s["old_proof"]["cpu_seconds"]),
        },
        "buys": {
            "files_before": built["bare"]["date_files"], "files_after": files_after["date_files"],
            "file_count_ratio": ratio(built["bare"]["date_files"], files_after["date_files"]),
            "probes_before": probes_before, "probes_after": probes_after,
            "proof_read": proof_read, "proof_read_before": pb, "proof_read_after": pa,
            "read_planning_speedup": ratio(pb["planning_ms"], pa["planning_ms"]),
            "read_scan_speedup": ratio(pb["scan_ms"], pa["scan_ms"]),
            "scan_planning_speedup": ratio(probes_before["scan_probe"]["planning_ms"],
                                           probes_after["scan_probe"]["planning_ms"]),
            "scan_speedup": ratio(probes_before["scan_probe"]["scan_ms"], probes_after["scan_probe"]["scan_ms"]),
            "request_ratio": ratio(probes_before["scan_probe"]["files_opened"], probes_after["scan_probe"]["files_opened"]),
        },
        "floor": {
            "pyarrow_seconds": floor_s, "read_seconds": median(f["read_seconds"] for f in floor),
            "write_seconds": median(f["write_seconds"] for f in floor), "codec": floor[0]["codec"],
            "bytes_in": floor[0]["bytes_in"], "bytes_out": floor[0]["bytes_out"], "rows": floor[0]["rows"],
            "spark_over_floor": ratio(bare_new, floor_s),
            "new_stage_over_floor": ratio(s["new_proof"]["rewrite_seconds"], floor_s),
            "old_rewrite_over_floor": ratio(s["old_proof"]["rewrite_seconds"], floor_s),
        },
        "validation": {
            ver: {"rows": runs[f"{ver}_proof"][0]["validated_rows"],
                  "validation_seconds": s[f"{ver}_proof"]["validation_seconds"],
                  "rewrite_seconds": s[f"{ver}_proof"]["rewrite_seconds"],
                  "validation_over_rewrite": ratio(s[f"{ver}_proof"]["validation_seconds"],
                                                   s[f"{ver}_proof"]["rewrite_seconds"]),
                  "read_before_seconds": (proof_read[ver]["before"]["planning_ms"]
                                          + proof_read[ver]["before"]["scan_ms"]) / 1000,
                  "read_after_seconds": (proof_read[ver]["after"]["planning_ms"]
                                         + proof_read[ver]["after"]["scan_ms"]) / 1000,
                  "checks": runs[f"{ver}_proof"][0]["validation_checks"]}
            for ver in ("old", "new")},
        "verification": verification,
        "runs": {**runs, "floor": floor},
    }


def verify_rows(config: MaintenanceConfig, tables: dict, built: dict, runs: dict, log, label: str) -> dict:
    """Every run's resulting snapshot against the rows the tables were written with (one reader)."""
    warehouse = Path(config.catalog.warehouse)
    log(f"[{label}] verifying rows with pyiceberg: the written snapshot, then every run's result")
    reference = snapshot_digest(warehouse, tables["bare"], built["bare"]["snapshot_id"])
    checked = []
    for key, variant_runs in runs.items():
        table = tables[VARIANT_BY_KEY[key].table]
        for run in variant_runs:
            d = snapshot_digest(warehouse, table, run["after_snapshot_id"])
            same = d["rows"] == reference["rows"] and d["digest"] == reference["digest"]
            checked.append({"variant": key, "rep": run["rep"], "table": table.key, **d, "identical": same})
            run["rows_identical"] = same
    bad = [c for c in checked if not c["identical"]]
    if bad:  # recorded, not raised: the report leads with it (a finding about the product, not the harness)
        log(f"[{label}] ROWS DIFFER from the written table after {len(bad)} run(s): "
            + ", ".join(f"{c['variant']} rep {c['rep'] + 1}" for c in bad))
    return {"reader": "pyiceberg scan + pyarrow + numpy multiset hash (benchmarks/verify.py)",
            "reference": reference, "checked": checked, "all_identical": not bad,
            "result_files": sorted({c["files"] for c in checked})}
