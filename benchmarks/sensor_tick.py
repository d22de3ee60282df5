"""The compaction sensor's tick over an estate, timed: full (fresh cursor) and unchanged (previous cursor).

A tick here is the sensor's own body without Dagster's daemon around it: the date keys, the real
`sensors.compaction.evaluate_compaction` (which runs `plan_compaction_tick` with the pyiceberg
`CatalogReader` callables, the claims and the audit log as the sensor wires them), the run
requests and the encoded cursor. The tables come from a real (ephemeral) Dagster instance's
`table` dynamic partitions, as in production.
"""

from __future__ import annotations

import cProfile
import datetime as dt
import json
import pstats
from pathlib import Path
from typing import Callable, Iterable

import yaml

from icemaint.safety.audit import AuditRecord, FileAuditLog, open_audit
from icemaint.config import MaintenanceConfig

from benchmarks.compaction_cost import BenchmarkInvalid
from benchmarks.estate import NEEDS_WORK_EVERY, build_estate, build_templates
from benchmarks.measure import Stopwatch, median

SENSOR_TARGET_TABLES = 10_000
# Issue 20's targets at SENSOR_TARGET_TABLES tables on this machine.
SENSOR_FULL_TARGET_SECONDS = 60.0
SENSOR_UNCHANGED_TARGET_SECONDS = 2.0
# The sensor reads each evaluated table's past runs from the audit log; a file log is parsed whole
# on every read, so history costs are measured: ticks with one past run per table up to this many
# tables (beyond, a tick would take minutes), and one read from a log of this many records.
HISTORY_TICK_MAX_TABLES = 100
AUDIT_HISTORY_RECORDS = 1000

# (label, path fragment, function name): where a tick's time goes, for the profile in RESULTS.md.
PROFILED = (
    ("dynamic partitions (Dagster instance)", "dagster", "get_dynamic_partitions"),
    ("metadata location (version-hint read)", "icemaint/observe/catalog.py", "metadata_location"),
    ("health (all of it)", "icemaint/observe/catalog.py", "health"),
    ("  load: StaticTable.from_metadata", "icemaint/observe/catalog.py", "load"),
    ("  inspect.files (manifest entries)", "pyiceberg/table/inspect.py", "files"),
    ("  inspect.manifests", "pyiceberg/table/inspect.py", "manifests"),
    ("  compute_health", "icemaint/domain/health.py", "compute_health"),
    ("claims: holder_of", "icemaint/safety/claims.py", "holder_of"),
    ("audit: records (past runs)", "icemaint/safety/audit.py", "records"),
    ("decisions", "icemaint/domain/decisions.py", "decide_table_compactions"),
)


class SensorEstate:
    """The resources and Dagster instance a compaction tick over one estate needs."""

    def __init__(self, config_path: Path, tables: list[str]):
        from dagster import DagsterInstance

        from maint_assets.partitions import table_partitions
        from resources.catalog import IcebergCatalogResource
        from resources.claims import AuditResource, TableClaimResource
        from resources.settings import MaintenanceSettings

        settings = MaintenanceSettings(config_path=str(config_path))
        self.config = settings.config
        self.catalog = IcebergCatalogResource(settings=settings)
        self.claims = TableClaimResource(settings=settings)
        self.audit = AuditResource(settings=settings)
        self.instance = DagsterInstance.ephemeral()
        self.instance.add_dynamic_partitions(table_partitions.name, tables)
        self.tables = tables
        from icemaint.domain.tick import KeptHealths

        self.kept = KeptHealths()  # as the sensor keeps it between its ticks

    def tick(self, cursor: str | None) -> dict:
        """One tick from `cursor` (None: a fresh sensor); returns its time, counts and new cursor."""
        from icemaint.domain.tick import encode_cursor
        from maint_assets.partitions import date_partitions
        from sensors.compaction import compaction_run_request, evaluate_compaction

        with Stopwatch() as sw:
            now = dt.datetime.now(dt.timezone.utc)
            date_keys = set(date_partitions(self.config.dates_start).get_partition_keys(current_time=now))
            plan = evaluate_compaction(self.instance, self.catalog, self.claims, self.audit, cursor, now, date_keys,
                                       kept=self.kept)
            requests = [compaction_run_request(d, h) for d, h in plan.runs]
            new_cursor = encode_cursor(plan.cursor)
        return {"seconds": sw.seconds, "evaluated": len(plan.evaluated), "unchanged": len(plan.unchanged),
                "screened": len(plan.screened),
                "runs": len(requests), "decisions": len(plan.decisions), "errors": dict(plan.errors),
                "cursor": new_cursor}

    def profile_tick(self, cursor: str | None) -> dict:
        """One tick under cProfile: cumulative seconds of the functions in PROFILED, and the top leaves."""
        profiler = cProfile.Profile()
        profiler.enable()
        result = self.tick(cursor)
        profiler.disable()
        stats = pstats.Stats(profiler).stats  # {(file, line, func): (cc, nc, tottime, cumtime, callers)}
        parts = []
        for label, fragment, func in PROFILED:
            cum = sum(v[3] for (path, _, name), v in stats.items() if name == func and fragment in path)
            parts.append({"label": label, "seconds": round(cum, 3)})
        leaves = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:8]
        top = [{"function": name if path == "~" else f"{Path(path).parent.name}/{Path(path).name}:{name}",
                "own_seconds": round(v[2], 3), "calls": v[1]} for (path, _, name), v in leaves]
        return {"tick_seconds": round(result["seconds"], 3), "parts": parts, "top_own_time": top}


def write_audit_history(state_dir: Path, template: AuditRecord, tables: Iterable[str]) -> int:
    """Adds one copy of `template` per table to the file audit log under `state_dir`.

    Lines are serialised exactly as `FileAuditLog.append` does, written in one go rather than
    with an fsync each. Returns the bytes of one line.
    """
    log = FileAuditLog(state_dir)
    log.path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(AuditRecord.from_dict({**template.to_dict(), "table": t}).to_dict(), sort_keys=True,
                        allow_nan=False) for t in tables]
    with open(log.path, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return len(lines[0].encode()) + 1


def past_runs_read_seconds(state_dir: Path, table: str, reps: int) -> float:
    """Median time of the sensor's per-table `past_runs` read (`records(table=, operation="compact")`)."""
    log = FileAuditLog(state_dir)
    times = []
    for _ in range(reps):
        with Stopwatch() as sw:
            log.records(table=table, operation="compact")
        times.append(sw.seconds)
    return median(times)


def expected_runs(tables: int) -> int:
    """Runs a full tick requests over a fresh estate: one per `needs_work` copy, within the tick's budget."""
    from sensors.compaction import MAX_RUNS_PER_TICK

    return min(len(range(0, tables, NEEDS_WORK_EVERY)), MAX_RUNS_PER_TICK)


def _at_target_full(sizes: list[dict]) -> float | None:
    return next((s["full_seconds"] for s in sizes if s["tables"] == SENSOR_TARGET_TABLES), None)


def measure_sensor_scale(spark, config: MaintenanceConfig, sizes: tuple[int, ...], reps: int, work_dir: Path,
                         estate_config_doc: Callable[[Path], dict], log: Callable[[str], None],
                         profile: bool, history_config: MaintenanceConfig | None = None) -> dict:
    """Section 5: full, unchanged and with-history ticks per estate size, the audit read cost, a profile.

    Args:
        spark, config: the benchmark's session and config (the templates are written with them).
        sizes: estate sizes (tables).
        reps: repetitions per figure.
        work_dir: where the estates go (`estate_<n>/` each).
        estate_config_doc: the config document for an estate rooted at a directory.
        log: progress lines.
        profile: profile a full tick at the largest size even when the targets are met.
        history_config: the config whose audit log holds this run's compactions (default `config`).
    """
    log("sensor: writing the template tables")
    templates = build_templates(spark, config.catalog.name, config.catalog.warehouse)
    # The template of audit history: a real record of this run's compactions, GX evidence and all
    # (a run whose proof the benchmark skipped carries no evidence: not a template).
    past_run = [r for r in open_audit(history_config or config).records(operation="compact")
                if r.decision == "run" and not any(c.get("skipped_by_benchmark")
                                                   for c in (r.validation or {}).get("commits") or [])][-1]
    results = []
    estate = None
    for n in sizes:
        root = work_dir / f"estate_{n}"
        with Stopwatch() as built:
            tables = build_estate(templates, root / "warehouse", n)
        config_path = root / "maintenance.yaml"
        config_path.write_text(yaml.safe_dump(estate_config_doc(root), sort_keys=False))
        estate = SensorEstate(config_path, tables)
        log(f"sensor: {n} tables copied in {built.seconds:.1f} s; full ticks")
        full = [estate.tick(None) for _ in range(reps)]
        bad = [t for t in full if t["errors"] or t["evaluated"] != n or t["runs"] != expected_runs(n)]
        if bad:
            raise BenchmarkInvalid(f"sensor tick over {n} tables did not see the estate it was given: "
                                   f"{bad[0]['evaluated']} evaluated, {bad[0]['runs']} runs (expected "
                                   f"{expected_runs(n)}), errors {list(bad[0]['errors'].items())[:3]}")
        log(f"sensor: {n} tables; unchanged-estate ticks")
        unchanged = [estate.tick(full[0]["cursor"]) for _ in range(reps)]
        full_s, unchanged_s = median(t["seconds"] for t in full), median(t["seconds"] for t in unchanged)
        history_s = None
        if n <= HISTORY_TICK_MAX_TABLES:
            write_audit_history(root / "state", past_run, tables)
            log(f"sensor: {n} tables; full ticks with one past run per table in the audit log")
            history_s = median(estate.tick(None)["seconds"] for _ in range(reps))
        results.append({
            "tables": n, "copy_seconds": round(built.seconds, 3),
            "full_seconds": full_s, "unchanged_seconds": unchanged_s,
            "full_ms_per_table": full_s / n * 1000, "unchanged_ms_per_table": unchanged_s / n * 1000,
            "runs_requested": full[0]["runs"], "evaluated_full": full[0]["evaluated"],
            "evaluated_unchanged": unchanged[0]["evaluated"], "unchanged_tables": unchanged[0]["unchanged"],
            "screened_full": full[0]["screened"],
            "full_with_history_seconds": history_s,
            "full_reps": [round(t["seconds"], 3) for t in full],
            "unchanged_reps": [round(t["seconds"], 3) for t in unchanged],
        })
    largest = results[-1]
    projected_full = largest["full_seconds"] * SENSOR_TARGET_TABLES / largest["tables"]
    projected_unchanged = largest["unchanged_seconds"] * SENSOR_TARGET_TABLES / largest["tables"]
    log(f"sensor: reading past runs from a file audit log of {AUDIT_HISTORY_RECORDS} records")
    history_dir = work_dir / "audit_history" / "state"
    record_bytes = write_audit_history(history_dir, past_run,
                                       [f"estate.t{i:05d}" for i in range(AUDIT_HISTORY_RECORDS)])
    read_s = past_runs_read_seconds(history_dir, "estate.t00000", reps)
    out = {"sizes": results, "projected_full_at_target": projected_full,
           "projected_unchanged_at_target": projected_unchanged, "full_target_seconds": SENSOR_FULL_TARGET_SECONDS,
           "unchanged_target_seconds": SENSOR_UNCHANGED_TARGET_SECONDS,
           "concurrent_reads": config.catalog.read_workers,
           "audit_read": {"records": AUDIT_HISTORY_RECORDS, "record_bytes": record_bytes, "seconds_per_read": read_s,
                          # the sensor reads the audit log once per tick (sensors.compaction.TickHistory)
                          "projected_full_at_target_with_history": (_at_target_full(results) or projected_full)
                          + read_s}}
    if profile or projected_full >= SENSOR_FULL_TARGET_SECONDS or projected_unchanged >= SENSOR_UNCHANGED_TARGET_SECONDS:
        log(f"sensor: profiling one full tick over {largest['tables']} tables")
        out["profile"] = estate.profile_tick(None)
        out["profile"]["tables"] = largest["tables"]
        out["profile"]["with_history"] = largest["full_with_history_seconds"] is not None
    return out
