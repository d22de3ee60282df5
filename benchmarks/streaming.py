"""Streaming shape: one date built by ~3,000 single-file commits, before and after the product's maintenance.

    python -m benchmarks.streaming [--commits 3000] [--rows-per-commit 100] [--reps 5] [--out benchmarks/RESULTS.md]
    python -m benchmarks.streaming --quick            # 100 commits, 2 reps: a smoke run, prints the section only
    python -m benchmarks.streaming --from-results benchmarks/.work/streaming/results.json   # re-render only

The shape is what a Flink or Structured Streaming writer leaves on a busy date: every commit a `fastAppend` of
one small data file, so one new manifest and one new snapshot each, and `main` has as many snapshots and data
manifests as commits. It is built the fast honest way: pyarrow writes the small Parquet files (with Iceberg's
field ids), then each file is committed on its own through Iceberg's Java API over Py4J
(`newFastAppend().appendFile(f).commit()`, metrics from the file's footer by `ParquetUtil.fileMetrics`, the
summary carrying `flink.job-id` and `flink.max-committed-checkpoint-id` as a Flink sink's does). The table
(hadoop catalog, format v2, `days(ts)`) is kept as a pristine hard-linked copy (Iceberg never rewrites a file
in place) and restored for each variant.

Measured, each maintenance step the product's CLI in its own process (wall time of the process):
- variant `maintain`: state (a) before; `icemaint compact --date D`; state (b); `icemaint manifests`;
  `icemaint expire` (the policy's retention: snapshot_max_count 100, retain_last 1, 7 days); state (c);
- variant `manifests_first` (from the pristine copy again): `icemaint manifests`, then `icemaint compact`:
  whether a manifest rewrite first makes the compaction itself (or the sum of both) faster on this shape.
At each state: the scan probe's planning (Spark's part + Iceberg's `totalPlanningDuration`), scan time,
manifests scanned, files opened (`benchmarks.probes.measure_probes`, medians after a warm-up); data files,
data manifests, snapshots (all, and on `main`), the current metadata.json, the metadata log, the current
manifest list and the whole metadata directory in bytes; a planning profile (the metadata.json parse and the
manifest list read, timed in the JVM); and pyiceberg (`StaticTable`, independent of Spark) reads every row
back: the ids written, each once, every column the function of its id it was written as.

Target: planning after the full maintenance (c) >= 10x faster than before (a), on total planning (Spark's part
+ Iceberg's); Iceberg's own metric is shown beside it. A miss gets the profile of where planning time goes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "streaming"
SECTION = "## Streaming shape (3,000 single-file commits)"
CATALOG = "lake"
TABLE = "stream.events"
DAY = dt.date(2026, 1, 1)
SCOPE = "ts >= TIMESTAMP '2026-01-01 00:00:00' AND ts < TIMESTAMP '2026-01-02 00:00:00'"
TARGET_SPEEDUP = 10.0
SAME_WITHIN = 0.10  # process wall times closer than this are one run's noise (JVM start, a loaded machine)
DRIVER_MEMORY = "2g"  # the benchmarks' driver (benchmarks/run.py); a step that fails for memory is run again with more
FLINK_JOB_ID = "b3c1a2d4e5f60718293a4b5c6d7e8f90"
STATUSES = ("ok", "warn", "err")
# No writer-idle or hot-partition wait (the date is written minutes before it is compacted); small files < 1 MiB;
# retention as the product's defaults spell it, written out so the section can say what expiry kept.
POLICY = {"writer_idle": "0s", "hot_partition_age": "0s", "claim_wait": "0s", "small_file_size_bytes": "1MiB",
          "target_file_size_bytes": "128MiB", "min_input_files": 5, "retry_backoff": "0s",
          "max_rewrite_bytes": "10GiB", "sample_fraction": 0.05, "snapshot_older_than": "7d", "retain_last": 1,
          "snapshot_max_count": 100, "manifest_min_count": 20, "manifest_small_bytes": "8MiB"}
# The last expiry: every snapshot but the current one, the writer's newest checkpoint included (no markers).
EXPIRE_REST = {"snapshot_max_count": 1, "checkpoint_markers": []}
STATES = (("before", "(a) before"), ("compacted", "(b) after compaction"),
          ("maintained", "(c) after compaction + manifests + expiry"))


def log(message: str, _t0=time.perf_counter()) -> None:  # noqa: B008 (the process's start, once)
    print(f"[streaming {time.perf_counter() - _t0:7.1f}s] {message}", file=sys.stderr, flush=True)


# -- the pure part: verdict and report ----------------------------------------------------------------------

def speedup(before_ms: float | None, after_ms: float | None) -> float | None:
    """How many times faster `after` is than `before` (None when either is missing or after is 0)."""
    if before_ms is None or after_ms is None or after_ms <= 0:
        return None
    return before_ms / after_ms


def verdict(before: dict, after: dict, target: float = TARGET_SPEEDUP) -> dict:
    """The planning verdict of two states' scan probes: total planning (the headline) and Iceberg's own metric.

    Args:
        before, after: `measure_probe(...)["scan_probe"]` of the two states.
        target: the speed-up asked for.

    Returns:
        {"target", "total": {"before_ms", "after_ms", "speedup", "met"}, "iceberg": {...}, "met"}; "met" is the
        headline's (total planning) and is False when a speed-up cannot be computed.
    """
    out = {"target": target}
    for key, field in (("total", "planning_ms"), ("iceberg", "iceberg_planning_ms"),
                       ("spark", "spark_planning_ms")):
        b, a = before.get(field), after.get(field)
        x = speedup(b, a)
        out[key] = {"before_ms": b, "after_ms": a, "speedup": x, "met": x is not None and x >= target}
    out["met"] = out["total"]["met"]
    return out


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{int(n):,} B"


def human_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.1f} s" if ms < 100_000 else f"{ms / 1000:,.0f} s"
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def human_seconds(s: float | None) -> str:
    return "-" if s is None else human_ms(s * 1000)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def manifests_first_finding(steps: dict) -> dict:
    """Compaction on the streaming shape as it is, against compaction after a manifest rewrite.

    Args:
        steps: {"compact": seconds on the shape as built, "manifests_first": seconds of the manifest rewrite on it,
            "compact_after_manifests": seconds of the compaction after that rewrite}.

    Returns:
        {"compact_alone", "manifests", "compact_after", "sum_first", "compaction_faster", "sum_faster",
        "compaction", "sum", "compaction_speedup", "sum_speedup"}: whether compaction alone, and the two steps
        together, beat the compaction on the shape as built; "compaction" and "sum" say "faster", "slower" or
        "about the same" (within SAME_WITHIN of it: one run each, no verdict).
    """
    alone, rewrite, after = steps["compact"], steps["manifests_first"], steps["compact_after_manifests"]
    total = rewrite + after
    def compare(value: float) -> str:
        if abs(value - alone) < SAME_WITHIN * alone:
            return "about the same"
        return "faster" if value < alone else "slower"

    return {"compact_alone": alone, "manifests": rewrite, "compact_after": after, "sum_first": total,
            "compaction_faster": after < alone, "sum_faster": total < alone,
            "compaction": compare(after), "sum": compare(total),
            "compaction_speedup": speedup(alone, after), "sum_speedup": speedup(alone, total)}


def _state_row(label: str, s: dict) -> str:
    p, f = s["probe"]["scan_probe"], s["figures"]
    return (f"| {label} | {human_ms(p['planning_ms'])} | {human_ms(p['spark_planning_ms'])} | "
            f"{human_ms(p['iceberg_planning_ms'])} | {human_ms(p['scan_ms'])} | {p['scannedDataManifests']:,} | "
            f"{p['files_opened']:,} | {f['data_files']:,} | {f['data_manifests']:,} | {f['snapshots']:,} "
            f"({f['snapshots_on_main']:,}) | {human_bytes(f['metadata_json_bytes'])} | "
            f"{human_bytes(f['manifest_list_bytes'])} | {human_bytes(f['metadata_dir_bytes'])} "
            f"({f['metadata_dir_files']:,} files) |")


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _manifests_read(probe: dict, figures: dict) -> str:
    scanned, listed = probe["scannedDataManifests"], figures["data_manifests"]
    size = human_bytes(figures["data_manifest_bytes"])
    if scanned >= listed:
        return f"{_n(scanned, 'manifest')} of {size}"
    return (f"{scanned:,} of the {_n(listed, 'data manifest')}, {size} in all: a manifest listing only files a "
            "rewrite replaced, marked deleted, is skipped")


def _profile_line(label: str, s: dict) -> str:
    p, prof = s["probe"]["scan_probe"], s["profile"]
    spark, iceberg = p["spark_planning_ms"], p["iceberg_planning_ms"]
    parse = prof["metadata_json_parse_ms"]
    return (f"  - {label}: total {human_ms(p['planning_ms'])} = Spark's part {human_ms(spark)} (of it, parsing the "
            f"{human_bytes(s['figures']['metadata_json_bytes'])} metadata.json once: {human_ms(parse)}; the table "
            f"is loaded afresh for each query, the catalog caches nothing) + Iceberg's file planning "
            f"{human_ms(iceberg)} (reading the manifest list of {human_bytes(s['figures']['manifest_list_bytes'])}: "
            f"{human_ms(prof['manifest_list_read_ms'])}, then {_manifests_read(p, s['figures'])}).")


def _step_cell(step: dict | None) -> str:
    if not step:
        return "-"
    inner = step.get("inner_seconds")
    text = f"{human_seconds(step['wall_seconds'])}"
    if inner is not None:
        text += f" ({human_seconds(inner)} inside the run)"
    return text


def _step_line(name: str, step: dict | None) -> str:
    if not step:
        return f"| {name} | - | - |"
    return f"| {name} | {_step_cell(step)} | {step.get('decision', '-')}: {step.get('summary', '')} |"


def _relative(reference: float, value: float) -> str:
    """`value` against `reference` in words: "2.2x faster than" or "1.3x slower than"."""
    if value <= reference:
        return f"{_x(speedup(reference, value))} faster than"
    return f"{_x(speedup(value, reference))} slower than"


def _check_text(key: str, check: dict) -> str:
    return f"{key} {check['rows']:,} rows " + ("ok" if check["ok"] else "**WRONG**")


def _load(load) -> str:
    return " / ".join(f"{x:.2f}" for x in load) if load else "-"


def _planned_inside(r: dict) -> bool:
    return all(s["probe"]["scan_probe"].get("planned_before_execution") for s in r["states"].values())


def render(r: dict) -> str:
    """The Markdown section of a run's results (see `main` for their shape)."""
    states = r["states"]
    v = verdict(states["before"]["probe"]["scan_probe"], states["maintained"]["probe"]["scan_probe"],
                r.get("target", TARGET_SPEEDUP))
    b = r["build"]
    m = r["machine"]
    lines = [
        SECTION, "",
        f"- Measured {r['date']} on commit `{r['commit']}`{' (with uncommitted changes)' if r.get('dirty') else ''}; "
        f"command: `{r['command']}`.",
        f"- Machine: {m['cores']} cores, {m['cpu_model']}, {m['memory_gib']} GiB; Java {m['java']}, Spark "
        f"{m['spark']} ({m['spark_master']}), Iceberg {m['iceberg']}, pyiceberg {m['pyiceberg']}. Load average at "
        f"the start {_load(r['load_start'])}, at the end {_load(r['load_end'])} (1, 5, 15 min)"
        + (f"; other processes used {r['cpu']['others_average_cores']} of the {m['cores']} cores on average "
           f"during the run ({r['cpu']['wall_seconds']:,.0f} s)" if (r.get("cpu") or {}).get("others_average_cores")
           is not None else "")
        + (f"; {r['note']}" if r.get("note") else "") + ".",
        f"- Shape: one table (hadoop catalog, format v2, `days(ts)`), one date built by {b['commits']:,} commits, "
        f"each a `fastAppend` of one Parquet file of {b['rows_per_commit']:,} rows ({human_bytes(b['data_bytes'])} "
        f"in all) through Iceberg's Java API: `main` has {b['snapshots_on_main']:,} snapshots and "
        f"{b['data_manifests']:,} data manifests, {b['data_files']:,} data files, a metadata.json of "
        f"{human_bytes(b['metadata_json_bytes'])}. Built in {human_seconds(b['write_seconds'])} (pyarrow, the files) "
        f"+ {human_seconds(b['commit_seconds'])} (the commits: the last 100 took "
        f"{human_seconds(b['last_100_commit_seconds'])}).",
        "- Maintenance: the product's CLI, one process per step (wall time, JVM start included): "
        "`icemaint compact --date`, `icemaint manifests`, `icemaint expire` with the policy "
        f"`{json.dumps({k: POLICY[k] for k in ('snapshot_older_than', 'retain_last', 'snapshot_max_count')})}`.",
        f"- Probe: `` {r['probe_sql']} ``; medians of {r['reps']} runs after a warm-up. Planning = the wall time to "
        "the physical plan: the table loaded afresh (the catalog caches nothing), analysis, optimisation and "
        + ("Iceberg's file planning, which Spark 3.5 runs while it builds the physical plan (read from the scan: "
           "its files were planned before execution)" if _planned_inside(r) else
           "Iceberg's file planning (its metric, added: the files were planned during execution)")
        + "; Iceberg's metric = its own `totalPlanningDuration`; Spark's part = planning - Iceberg's metric; "
        "scan = the rest of the wall time to the result.",
        "",
        "| state | planning | Spark's part | Iceberg's metric | scan | manifests scanned | files opened | data files "
        "| data manifests | snapshots (on main) | metadata.json | manifest list | metadata dir |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_state_row(label, states[key]) for key, label in STATES),
        "",
    ]
    t, ib = v["total"], v["iceberg"]
    lines += [
        "| figure | before | after full maintenance | speed-up | target | verdict |",
        "|---|---|---|---|---|---|",
        f"| planning, total (the verdict's figure) | {human_ms(t['before_ms'])} | {human_ms(t['after_ms'])} | "
        f"{_x(t['speedup'])} | >= {v['target']:g}x | {'met' if t['met'] else '**missed**'} |",
        f"| planning, Iceberg's own metric | {human_ms(ib['before_ms'])} | {human_ms(ib['after_ms'])} | "
        f"{_x(ib['speedup'])} | >= {v['target']:g}x | {'met' if ib['met'] else '**missed**'} |",
        f"| planning, Spark's part | {human_ms(v['spark']['before_ms'])} | {human_ms(v['spark']['after_ms'])} | "
        f"{_x(v['spark']['speedup'])} | - | - |",
        "",
    ]
    profiled = [(label, states[key]) for key, label in STATES]
    lines.append("- Where planning time goes" + (" (the target is missed):" if not v["met"] else ":"))
    lines += [_profile_line(label, s) for label, s in profiled]
    if not v["met"]:
        lines.append(f"  - The miss: {miss_reason(v, states)}")
    steps = r["steps"]
    lines += [
        "", "Maintenance steps (each its own process):", "",
        "| step | wall time | outcome |", "|---|---|---|",
        _step_line("compact (on the shape as built)", steps.get("compact")),
        _step_line("manifests (after compaction)", steps.get("manifests")),
        *([_step_line(f"expire, first attempt (driver {steps['expire_failed'].get('driver_memory', '?')})",
                      steps["expire_failed"])] if steps.get("expire_failed") else []),
        _step_line(f"expire (after compaction + manifests; driver {steps.get('expire', {}).get('driver_memory', '?')})",
                   steps.get("expire")),
        *([_step_line("expire the rest (every snapshot but the current, the writer's newest checkpoint too; "
                      f"driver {steps['expire_rest'].get('driver_memory', '?')})", steps["expire_rest"])]
          if steps.get("expire_rest") else []),
        _step_line("manifests first (on the shape as built)", steps.get("manifests_first")),
        _step_line("compact after manifests first", steps.get("compact_after_manifests")),
        "",
    ]
    if all(steps.get(k) for k in ("compact", "manifests_first", "compact_after_manifests")):
        f = manifests_first_finding({k: steps[k]["wall_seconds"] for k in
                                     ("compact", "manifests_first", "compact_after_manifests")})
        lines.append(
            f"- Manifests first? Compaction on the shape as built {human_seconds(f['compact_alone'])}; after a "
            f"manifest rewrite ({human_seconds(f['manifests'])}) it took {human_seconds(f['compact_after'])} "
            f"({_relative(f['compact_alone'], f['compact_after'])} the compaction alone), "
            f"{human_seconds(f['sum_first'])} for both steps. "
            + f"The compaction itself: {f['compaction']}"
            + f"; the two steps together against the compaction alone: {f['sum']}"
            + f" (one run each, process wall times; within {SAME_WITHIN:.0%} counts as about the same).")
    checks = r["checks"]
    lines.append(
        f"- Rows: pyiceberg (StaticTable over the table's metadata, no Spark) read every row back after each state "
        f"({', '.join(_check_text(k, c) for k, c in checks.items())}): "
        "every id written exactly once, every column as written.")
    expire = steps.get("expire") or {}
    if expire.get("metrics"):
        after = states["maintained"]["figures"]
        em = expire["metrics"]
        lines.append(
            f"- Expiry by the policy kept the newest {_n(after['snapshots'], 'snapshot')} (snapshot_max_count; all are "
            f"minutes old, inside 7 days) and deleted {_n(em.get('data_files_deleted', 0), 'data file')}: the retained "
            f"appends from before the compaction still reference the small files, so {after['data_dir_files']:,} "
            "Parquet files stay on disk until those snapshots expire too. Old metadata.json versions that left the "
            "metadata log long before are not deleted by any commit (only by orphan removal, not run here): the "
            f"metadata directory's {human_bytes(after['metadata_dir_bytes'])} count "
            f"{_n(after['metadata_json_files'], 'metadata.json file')} of "
            f"{human_bytes(after['metadata_json_files_bytes'])}.")
    rest = steps.get("expire_rest") or {}
    if rest.get("metrics"):
        rm = rest["metrics"]
        lines.append(
            f"- Expiring the rest (policy {json.dumps(EXPIRE_REST)}, after state (c)) released the small files: "
            f"{_n(rm.get('data_files_deleted', 0), 'data file')}, {_n(rm.get('manifests_deleted', 0), 'manifest')} "
            f"and {_n(rm.get('manifest_lists_deleted', 0), 'manifest list')} deleted, "
            f"{human_bytes(rm.get('bytes_reclaimed', 0))} reclaimed, at driver memory {rest.get('driver_memory')}.")
    failed = steps.get("expire_failed")
    if failed:
        lines.append(
            f"- **Expiry failed** at the benchmark's driver memory ({failed.get('driver_memory')}) after "
            f"{human_seconds(failed['wall_seconds'])}: {failed.get('java_failure') or failed.get('reason')}. "
            f"Run again with {expire.get('driver_memory')}: {human_seconds(expire.get('wall_seconds'))}"
            + (f", **failed again**: {expire.get('java_failure') or expire.get('reason')}; state (c) is then the "
               "table after compaction + manifests, without expiry" if expire.get("failed") else "")
            + ". The product sets no driver memory of its own (Spark's default is 1g).")
    if r.get("quick"):
        lines.append(f"- A quick smoke run ({b['commits']:,} commits): it proves the harness, not the figures.")
    return "\n".join(lines) + "\n"


def miss_reason(v: dict, states: dict) -> str:
    """One sentence naming the part of planning that kept the speed-up under the target."""
    before, after = states["before"], states["maintained"]
    pb, pa = before["probe"]["scan_probe"], after["probe"]["scan_probe"]
    parts = {"Spark's part": (pb["spark_planning_ms"], pa["spark_planning_ms"]),
             "Iceberg's file planning": (pb["iceberg_planning_ms"], pa["iceberg_planning_ms"])}
    floor_name, (fb, fa) = max(parts.items(), key=lambda kv: kv[1][1])
    return (f"after the full maintenance {floor_name} ({human_ms(fa)}, was {human_ms(fb)}) is most of the "
            f"{human_ms(pa['planning_ms'])} left; "
            + ("it is a fixed cost of every query (analysis and optimisation of the SQL, the table's load), "
               "not of this table's metadata, so the ratio is capped by it"
               if floor_name == "Spark's part" else
               "the remaining manifests are read even after the rewrite"))


# -- the table: built, measured, checked ----------------------------------------------------------------------

def config_doc(root: Path, state: str, driver_memory: str = DRIVER_MEMORY, policy: dict | None = None) -> dict:
    return {
        "catalog": {"name": CATALOG, "type": "hadoop", "warehouse": str(root / "warehouse")},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
                                                 "spark.driver.memory": driver_memory}},
        "state_dir": str(root / state),
        "claims": {"backend": "file"},
        "audit": {"sink": "file"},
        "defaults": {**POLICY, **(policy or {})},
    }


def write_config(root: Path, state: str, driver_memory: str = DRIVER_MEMORY, policy: dict | None = None,
                 label: str = "") -> Path:
    import yaml

    path = root / f"icemaint-{state}-{driver_memory}{label}.yaml"
    path.write_text(yaml.safe_dump(config_doc(root, state, driver_memory, policy), sort_keys=False))
    return path


def table_dir(root: Path) -> Path:
    return root / "warehouse" / Path(*TABLE.split("."))


def arrow_rows(first: int, n: int):
    """Rows whose every column is a function of event_id (so a reader checks each row on its own)."""
    import numpy as np
    import pyarrow as pa

    ids = np.arange(first, first + n, dtype=np.int64)
    base = np.datetime64(DAY.isoformat(), "us")
    return {
        "event_id": ids, "device_id": (ids % 97).astype(np.int32),
        "ts": pa.array(base + ((ids * 37) % 86400) * np.timedelta64(1, "s"), type=pa.timestamp("us", tz="UTC")),
        "reading": ids * 0.5, "status": pa.array(np.array(STATUSES)[ids % 3]),
    }


def _arrow_schema(jtable):
    """The table's columns as a pyarrow schema carrying Iceberg's field ids (what a writer's Parquet holds)."""
    import pyarrow as pa

    types = {"event_id": pa.int64(), "device_id": pa.int32(), "ts": pa.timestamp("us", tz="UTC"),
             "reading": pa.float64(), "status": pa.string()}
    schema = jtable.schema()
    return pa.schema([pa.field(name, typ, nullable=True,
                               metadata={"PARQUET:field_id": str(schema.findField(name).fieldId())})
                      for name, typ in types.items()])


def build_table(spark, commits: int, rows_per_commit: int) -> dict:
    """Creates the table and commits `commits` single-file appends on DAY (one manifest and snapshot each)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.lake import create_table
    from icemaint.domain.names import TableName
    from icemaint.engine.spark_session import iceberg_table

    name = TableName.parse(TABLE)
    create_table(spark, CATALOG, name)
    jvm = spark._jvm
    tbl = iceberg_table(spark, CATALOG, name)
    location = str(tbl.location())
    local = location.removeprefix("file:")
    folder = Path(local) / "data" / f"ts_day={DAY.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    schema = _arrow_schema(tbl)
    t0 = time.perf_counter()
    paths = []
    for c in range(commits):
        path = folder / f"{c:05d}-0-stream-{FLINK_JOB_ID[:8]}.parquet"
        pq.write_table(pa.table(arrow_rows(c * rows_per_commit, rows_per_commit), schema=schema), path)
        paths.append(path)
    write_seconds = time.perf_counter() - t0
    spec, io = tbl.spec(), tbl.io()
    metrics_config = jvm.org.apache.iceberg.MetricsConfig.forTable(tbl)
    parquet = jvm.org.apache.iceberg.FileFormat.PARQUET
    partition = f"ts_day={DAY.isoformat()}"
    t1 = time.perf_counter()
    times = []
    for c, path in enumerate(paths):
        tc = time.perf_counter()
        inf = io.newInputFile(f"{location}/data/{partition}/{path.name}")
        metrics = jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(inf, metrics_config)
        data_file = (jvm.org.apache.iceberg.DataFiles.builder(spec).withInputFile(inf).withMetrics(metrics)
                     .withFormat(parquet).withPartitionPath(partition).build())
        (tbl.newFastAppend().appendFile(data_file).set("flink.job-id", FLINK_JOB_ID)
         .set("flink.max-committed-checkpoint-id", str(c + 1)).commit())
        times.append(time.perf_counter() - tc)
        if (c + 1) % 500 == 0:
            log(f"committed {c + 1:,} of {commits:,} (last 100: {sum(times[-100:]):.1f} s)")
    commit_seconds = time.perf_counter() - t1
    return {"commits": commits, "rows_per_commit": rows_per_commit, "rows": commits * rows_per_commit,
            "data_bytes": sum(p.stat().st_size for p in paths), "write_seconds": round(write_seconds, 2),
            "commit_seconds": round(commit_seconds, 2), "first_100_commit_seconds": round(sum(times[:100]), 2),
            "last_100_commit_seconds": round(sum(times[-100:]), 2)}


def current_metadata(tdir: Path) -> Path:
    version = (tdir / "metadata" / "version-hint.text").read_text().strip()
    return tdir / "metadata" / f"v{version}.metadata.json"


def table_figures(spark, tdir: Path) -> dict:
    """Files, manifests, snapshots and metadata bytes of the table's current state (its metadata.json read as
    JSON; manifests from the current manifest list through the Java API)."""
    meta_path = current_metadata(tdir)
    meta = json.loads(meta_path.read_text())
    snapshots = {s["snapshot-id"]: s for s in meta.get("snapshots", [])}
    main = meta.get("refs", {}).get("main", {}).get("snapshot-id", meta.get("current-snapshot-id"))
    on_main, sid = 0, main
    while sid is not None and sid in snapshots:
        on_main += 1
        sid = snapshots[sid].get("parent-snapshot-id")
    current = snapshots.get(main, {})
    summary = current.get("summary", {})
    jvm = spark._jvm
    md = jvm.org.apache.iceberg.TableMetadataParser.read(_file_io(jvm), str(meta_path))
    snap = md.currentSnapshot()
    io = _file_io(jvm)
    data = snap.dataManifests(io)
    data_bytes = sum(int(data.get(i).length()) for i in range(data.size()))
    delete = snap.deleteManifests(io)
    files = [p for p in (tdir / "metadata").iterdir() if p.is_file()]
    return {
        "metadata_json": meta_path.name, "metadata_json_bytes": meta_path.stat().st_size,
        "metadata_log_entries": len(meta.get("metadata-log", [])), "snapshots": len(snapshots),
        "snapshots_on_main": on_main, "current_operation": summary.get("operation"),
        "data_files": int(summary.get("total-data-files", 0)), "rows": int(summary.get("total-records", 0)),
        "data_manifests": int(data.size()), "delete_manifests": int(delete.size()),
        "data_manifest_bytes": data_bytes,
        "manifest_list_bytes": Path(current["manifest-list"].removeprefix("file:")).stat().st_size,
        "metadata_dir_files": len(files), "metadata_dir_bytes": sum(p.stat().st_size for p in files),
        "metadata_json_files": sum(1 for p in files if p.name.endswith(".metadata.json")),
        "metadata_json_files_bytes": sum(p.stat().st_size for p in files if p.name.endswith(".metadata.json")),
        "data_dir_files": sum(1 for p in (tdir / "data").rglob("*.parquet")),
    }


def _file_io(jvm):
    return jvm.org.apache.iceberg.hadoop.HadoopFileIO(jvm.org.apache.hadoop.conf.Configuration())


def planning_profile(spark, tdir: Path, reps: int) -> dict:
    """What loading the table costs before any manifest is read: the current metadata.json parsed and the
    current snapshot's manifest list read, each timed in the JVM (medians over `reps` after one warm-up)."""
    from benchmarks.measure import median

    jvm = spark._jvm
    path = str(current_metadata(tdir))
    parse, lists = [], []
    for i in range(reps + 1):
        io = _file_io(jvm)
        t0 = time.perf_counter()
        md = jvm.org.apache.iceberg.TableMetadataParser.read(io, path)
        t1 = time.perf_counter()
        md.currentSnapshot().allManifests(io).size()
        t2 = time.perf_counter()
        if i:
            parse.append((t1 - t0) * 1000)
            lists.append((t2 - t1) * 1000)
    return {"metadata_json_parse_ms": round(median(parse), 2), "manifest_list_read_ms": round(median(lists), 2)}


def check_rows(tdir: Path, expected: int) -> dict:
    """Every row read by pyiceberg from the table's current metadata (no Spark): ids exactly 0..expected-1, each
    once, every other column the function of its id it was written as."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.table import StaticTable

    t0 = time.perf_counter()
    table = StaticTable.from_metadata(f"file://{current_metadata(tdir)}")
    seen = np.zeros(expected, dtype=np.int8)
    rows = bad = 0
    day0 = int(dt.datetime.combine(DAY, dt.time(), dt.timezone.utc).timestamp())
    for batch in table.scan().to_arrow_batch_reader():
        ids = batch.column("event_id").to_numpy()
        rows += len(ids)
        inside = (ids >= 0) & (ids < expected)
        bad += int((~inside).sum())
        np.add.at(seen, ids[inside], 1)
        bad += int((batch.column("device_id").to_numpy() != ids % 97).sum())
        bad += int((batch.column("reading").to_numpy() != ids * 0.5).sum())
        codes = pc.index_in(batch.column("status"), value_set=pa.array(list(STATUSES))).to_numpy(zero_copy_only=False)
        bad += int((codes != ids % 3).sum())
        seconds = pc.cast(pc.cast(batch.column("ts"), pa.timestamp("us")), pa.int64()).to_numpy() // 1_000_000
        bad += int((seconds - day0 != (ids * 37) % 86400).sum())
    return {"rows": rows, "expected": expected, "missing": int((seen == 0).sum()),
            "duplicated": int((seen > 1).sum()), "wrong_values": bad,
            "ok": rows == expected and bad == 0 and bool((seen == 1).all()),
            "seconds": round(time.perf_counter() - t0, 2)}


def measure_probe(spark, reps: int) -> dict:
    """The scan probe (`benchmarks.probes.scan_probe_sql`) on the table's current state: medians over `reps` after
    one untimed warm-up. Each query loads the table afresh: the catalog caches nothing (`cache-enabled=false`)."""
    from benchmarks.measure import median
    from benchmarks.probes import scan_probe_sql, timed_query
    from icemaint.domain.names import TableName

    table_sql = TableName.parse(TABLE).sql(CATALOG)
    sql = scan_probe_sql(table_sql, SCOPE)
    spark.sql(f"REFRESH TABLE {table_sql}")
    timed_query(spark, sql)
    runs = [timed_query(spark, sql) for _ in range(reps)]
    keys = ("planning_ms", "spark_planning_ms", "iceberg_planning_ms", "scan_ms")
    return {"scan_probe": {
        **{k: median(r[k] for r in runs) for k in keys},
        "planned_before_execution": runs[0]["planned_before_execution"],
        "rows": runs[0]["result"][0][0],
        **{k: runs[0][k] for k in ("files_opened", "resultDataFiles", "resultDeleteFiles", "scannedDataManifests",
                                   "skippedDataFiles", "totalDataFileSize")},
    }, "reps": reps, "runs": [{k: r[k] for k in keys} for r in runs]}


def measure_state(spark, root: Path, expected: int, reps: int) -> dict:
    tdir = table_dir(root)
    probe = measure_probe(spark, reps)
    figures = table_figures(spark, tdir)
    profile = planning_profile(spark, tdir, reps)
    check = check_rows(tdir, expected)
    p = probe["scan_probe"]
    log(f"planning {p['planning_ms']:.0f} ms (Spark {p['spark_planning_ms']:.0f}, Iceberg "
        f"{p['iceberg_planning_ms']:.0f}), scan {p['scan_ms']:.0f} ms, {figures['data_files']} files, "
        f"{figures['data_manifests']} data manifests, {figures['snapshots']} snapshots, metadata.json "
        f"{human_bytes(figures['metadata_json_bytes'])}; rows {'ok' if check['ok'] else 'WRONG'}")
    if not check["ok"]:
        raise RuntimeError(f"rows differ from what was written: {check}")
    if p["rows"] != expected:
        raise RuntimeError(f"the probe counted {p['rows']} rows, {expected} were written")
    return {"probe": probe, "figures": figures, "profile": profile, "check": check}


# -- the product's CLI, one process a step ---------------------------------------------------------------------

def _durations_text(durations: dict) -> str:
    return ", ".join(f"{k.removesuffix('_seconds')} {v:.1f} s" for k, v in durations.items()
                     if isinstance(v, (int, float)) and k != "total_seconds")


KEY_METRICS = ("snapshots_before", "snapshots_after", "data_files_deleted", "manifests_deleted",
               "manifest_lists_deleted", "bytes_reclaimed", "manifests_before", "manifests_after")


def _summary(operation: str, out) -> str:
    if operation == "compact":
        o = out[0]
        inside = _durations_text(o.get("durations") or {})
        return (f"files {o.get('files_before')} -> {o.get('files_after')}, published {o.get('published')}"
                + (f"; inside the run: {inside}" if inside else ""))
    metrics = {k: v for k, v in (out.get("metrics") or {}).items() if k in KEY_METRICS}
    inside = _durations_text(out.get("durations") or {})
    return (str(out.get("reason") or "") + (f" ({', '.join(f'{k} {v:,}' for k, v in metrics.items())})" if metrics
                                             else "") + (f"; inside: {inside}" if inside else ""))


def _java_failure(state_dir: Path, run_id: str | None) -> str | None:
    """The Java error behind a failed run and where it struck, from the run's Dagster event log (the CLI's JSON
    names only the Py4J call): e.g. `java.lang.OutOfMemoryError: Java heap space in retention.py:251
    files_released; Iceberg: ManifestLists.read < BaseSnapshot.allManifests < AllFilesTable...`."""
    import re
    import sqlite3

    db = state_dir / "dagster" / "history" / "runs" / f"{run_id}.db"
    if not run_id or not db.exists():
        return None
    with sqlite3.connect(db) as con:
        events = [row[0] for row in con.execute("SELECT event FROM event_logs")]
    for event in events:
        text = json.dumps(json.loads(event))
        text = text.encode().decode("unicode_escape", errors="ignore")
        error = re.search(r"(java\.lang\.\w+(?:Error|Exception)[^\n]*|org\.apache\.\S+Exception[^\n]*)", text)
        if not error:
            continue
        frames = re.findall(r'File "[^"]*/(icemaint/[^"]+)", line (\d+), in (\w+)', text)
        where = f" in {frames[-1][0]}:{frames[-1][1]} {frames[-1][2]}" if frames else ""
        java = re.findall(r"at org\.apache\.iceberg\.(\w+(?:\$\w+)?)\.(\w+)\(", text)
        seen: list[str] = []
        for cls, method in java:
            name = f"{cls}.{method}"
            if name not in seen and "lambda" not in method:
                seen.append(name)
        return error.group(1).strip()[:200] + where + (f"; Iceberg frames: {' < '.join(seen[:6])}" if seen else "")
    return None


def run_step(root: Path, config: Path, operation: str, *extra: str, label: str | None = None,
             must_succeed: bool = True) -> dict:
    """`icemaint --config CONFIG <operation> TABLE ... --json` in its own process; its wall time and outcome.

    A failed process raises, unless `must_succeed` is false: then the step says it failed, and why."""
    import yaml

    icemaint = str(Path(sys.executable).parent / "icemaint")
    argv = [icemaint, "--config", str(config), operation, TABLE, *extra, "--json"]
    env = {**os.environ, "DAGSTER_HOME": str(root / "dagster"), "ICEMAINT_IDENTITY": "benchmark"}
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=root)
    wall = time.perf_counter() - t0
    label = label or "-".join([operation, *[e.lstrip("-") for e in extra]])
    (root / f"{label}.log").write_text(f"$ {shlex.join(argv)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout}\n"
                                       f"--- stderr\n{proc.stderr}")
    common = {"wall_seconds": round(wall, 2), "command": shlex.join(["icemaint", operation, TABLE, *extra]),
              "driver_memory": yaml.safe_load(config.read_text())["spark"]["conf"]["spark.driver.memory"]}
    if proc.returncode != 0:
        try:
            out = json.loads(proc.stdout)
            out = out[0] if isinstance(out, list) else out
        except ValueError:
            out = {}
        reason = str(out.get("reason") or (proc.stderr or proc.stdout).strip()[-600:])
        cause = _java_failure(Path(yaml.safe_load(config.read_text())["state_dir"]), out.get("run_id"))
        if must_succeed:
            raise RuntimeError(f"icemaint {operation} exited {proc.returncode}: {reason}"
                               + (f" ({cause})" if cause else ""))
        log(f"{operation}: FAILED after {human_seconds(wall)}: {cause or reason}")
        return {**common, "failed": True, "decision": "failed", "reason": reason, "java_failure": cause,
                "summary": cause or reason}
    out = json.loads(proc.stdout)
    if operation == "compact":
        o = out[0]
        if o.get("decision") != "run" or not o.get("published"):
            raise RuntimeError(f"compaction did not publish: {o.get('decision')}: {o.get('reason')}")
        durations = o.get("durations") or {}
        step = {"decision": o["decision"], "inner_seconds": durations.get("total_seconds"),
                "files_before": o.get("files_before"), "files_after": o.get("files_after"), "durations": durations}
    else:
        step = {"decision": out.get("decision"), "reason": out.get("reason"), "metrics": out.get("metrics") or {},
                "inner_seconds": (out.get("durations") or {}).get("total_seconds"),
                "durations": out.get("durations") or {}}
    step.update(common, summary=_summary(operation, out))
    log(f"{operation}: {human_seconds(wall)}; {step['summary'][:200]}")
    return step


def restore(root: Path, pristine: Path) -> None:
    """The table as built, again: a hard-linked copy of the pristine warehouse (Iceberg writes every file once,
    never in place: the hadoop catalog's version-hint too is a new file renamed over the old)."""
    shutil.rmtree(root / "warehouse", ignore_errors=True)
    subprocess.run(["cp", "-al", str(pristine), str(root / "warehouse")], check=True)


# -- the run -------------------------------------------------------------------------------------------------

def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def run(args) -> dict:
    from benchmarks.machine import describe_machine, load_average
    from benchmarks.probes import scan_probe_sql
    from icemaint.config import load_config
    from icemaint.domain.names import TableName
    from icemaint.engine.spark_session import get_spark

    load_start = load_average()
    root = WORK / ("quick" if args.quick else "full")
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "commit": _git("rev-parse", "--short", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--",
                                                                                  "icemaint", "benchmarks")),
               "command": shlex.join(["python", "-m", "benchmarks.streaming", *args.given]),
               "load_start": load_start, "note": args.note, "reps": args.reps, "target": TARGET_SPEEDUP,
               "policy": POLICY, "quick": args.quick,
               "probe_sql": scan_probe_sql(TableName.parse(TABLE).sql(CATALOG), SCOPE)}
    spark = get_spark(load_config(str(write_config(root, "state-build"))))
    results["machine"] = describe_machine(spark)
    log(f"building {args.commits:,} single-file commits")
    build = build_table(spark, args.commits, args.rows_per_commit)
    expected = build["rows"]
    pristine = root / "pristine"
    subprocess.run(["cp", "-al", str(root / "warehouse"), str(pristine)], check=True)
    states, steps, checks = {}, {}, {}
    log("state (a): before")
    states["before"] = measure_state(spark, root, expected, args.reps)
    build.update({k: states["before"]["figures"][k] for k in ("snapshots", "snapshots_on_main", "data_manifests",
                                                              "data_files", "metadata_json_bytes")})
    if build["snapshots_on_main"] != args.commits or build["data_manifests"] != args.commits:
        raise RuntimeError(f"the shape is wrong: {build}")
    results["build"] = build
    steps["compact"] = run_step(root, write_config(root, "state-a"), "compact", "--date", DAY.isoformat())
    log("state (b): after compaction")
    states["compacted"] = measure_state(spark, root, expected, args.reps)
    steps["manifests"] = run_step(root, write_config(root, "state-a"), "manifests")
    expire = run_step(root, write_config(root, "state-a"), "expire", must_succeed=False)
    if expire.get("failed"):
        # Recorded as it failed, then run again with a bigger driver so the after-state can still be measured.
        steps["expire_failed"] = expire
        expire = run_step(root, write_config(root, "state-a", args.retry_driver_memory), "expire",
                          label=f"expire-{args.retry_driver_memory}", must_succeed=False)
    steps["expire"] = expire
    log("state (c): after compaction + manifests + expiry")
    states["maintained"] = measure_state(spark, root, expected, args.reps)
    # Then everything the policy may let go: the small files leave only when the last snapshot that reads
    # them (the writer's newest checkpoint, which the policy keeps) expires.
    steps["expire_rest"] = run_step(root, write_config(root, "state-a", policy=EXPIRE_REST, label="-rest"),
                                    "expire", label="expire-rest", must_succeed=False)
    expired_rest = check_rows(table_dir(root), expected)
    log(f"expire the rest: {human_seconds(steps['expire_rest']['wall_seconds'])}; rows "
        + ("ok" if expired_rest["ok"] else "WRONG"))
    log("variant: manifests first, from the pristine copy")
    restore(root, pristine)
    steps["manifests_first"] = run_step(root, write_config(root, "state-b"), "manifests", label="manifests-first")
    steps["compact_after_manifests"] = run_step(root, write_config(root, "state-b"), "compact", "--date",
                                                DAY.isoformat(), label="compact-after-manifests")
    checks_b = check_rows(table_dir(root), expected)
    if not checks_b["ok"]:
        raise RuntimeError(f"manifests first: rows differ from what was written: {checks_b}")
    for key, _ in STATES:
        checks[key] = states[key]["check"]
    checks["expired_rest"] = expired_rest
    checks["manifests_first"] = checks_b
    results.update(states=states, steps=steps, checks=checks, load_end=load_average())
    return results


def run_measured(args, saved: Path) -> dict:
    """`run`, with the CPU that other processes used meanwhile (the machine may be shared)."""
    from benchmarks.machine import CpuShare

    with CpuShare() as cpu:
        results = run(args)
    results["cpu"] = cpu.result
    saved.write_text(json.dumps(results, indent=1, default=str))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streaming", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=None, help="single-file commits (default 3000; --quick 100)")
    parser.add_argument("--rows-per-commit", type=int, default=100, help="rows in each commit's file (default 100)")
    parser.add_argument("--reps", type=int, default=None, help="timed probe runs per state (default 5; --quick 2)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run (100 commits): prints the section unless --out is given, never the report")
    parser.add_argument("--out", default=None, help="the file whose section is written (default benchmarks/RESULTS.md)")
    parser.add_argument("--retry-driver-memory", default="6g",
                        help=f"driver memory for a maintenance step run again after failing at {DRIVER_MEMORY} "
                             "(default 6g)")
    parser.add_argument("--note", default="", help="a line for the section (e.g. machine conditions)")
    parser.add_argument("--from-results", metavar="JSON",
                        help="only render the section from a previous run's figures (benchmarks/.work/streaming/"
                             "results.json)")
    args = parser.parse_args(argv)
    from benchmarks.stack_bench import write_section

    args.given = argv if argv is not None else sys.argv[1:]
    if args.from_results:
        results = json.loads(Path(args.from_results).read_text())
        section = render(results)
    else:
        args.commits = args.commits or (100 if args.quick else 3000)
        args.reps = args.reps or (2 if args.quick else 5)
        if args.commits < 10 or args.rows_per_commit < 1 or args.reps < 1:
            parser.error("--commits >= 10, --rows-per-commit >= 1, --reps >= 1")
        saved = WORK / ("results-quick.json" if args.quick else "results.json")
        results = run_measured(args, saved)
        log(f"raw figures: {saved}")
        section = render(results)
    # A smoke run's figures never replace the report's section unless --out names a file.
    quick = args.quick or (args.from_results and results.get("quick"))
    out = args.out or (None if quick else str(HERE / "RESULTS.md"))
    if out is None:
        print(section)
        return 0
    write_section(Path(out), section, heading=SECTION)
    log(f"wrote {out} ({SECTION[3:]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
