"""What compaction buys a reader: planning and scan time of a query on the date, and files it opens.

The scan probe (`count(*)` and `sum(reading)` on the date) cannot be answered from manifest
statistics and opens every file the scan plans. Planning and scan are split as `timed_query` says;
files opened come from Iceberg's scan metrics on the executed plan. (The Compactor's own evidence, the proof's read of the date
before and after, is reported from its runs: see compaction_cost.)
"""

from __future__ import annotations

import time

from benchmarks.measure import median

# Iceberg's driver-side scan metrics (SparkScan custom metrics) that count what a scan plans.
SCAN_METRICS = ("resultDataFiles", "resultDeleteFiles", "scannedDataManifests", "skippedDataFiles",
                "totalPlanningDuration", "totalDataFileSize")


def scan_probe_sql(table_sql: str, scope: str) -> str:
    return f"SELECT count(*) AS n, sum(reading) AS total FROM {table_sql} WHERE {scope}"


def _iter_plan(node):
    """Every node of an executed physical plan, through adaptive and query-stage wrappers."""
    yield node
    name = node.getClass().getSimpleName()
    if name == "AdaptiveSparkPlanExec":
        yield from _iter_plan(node.executedPlan())
        return
    if name.endswith("QueryStageExec"):
        yield from _iter_plan(node.plan())
    children = node.children()
    for i in range(children.length()):
        yield from _iter_plan(children.apply(i))


def scan_metrics(df) -> dict:
    """Iceberg scan metrics of an executed DataFrame, summed over its batch scans.

    Returns `{"batch_scans": 0}` when no scan ran (the aggregate was answered from metadata).
    """
    out = {"batch_scans": 0, **{m: 0 for m in SCAN_METRICS}}
    for node in _iter_plan(df._jdf.queryExecution().executedPlan()):
        if node.getClass().getSimpleName() != "BatchScanExec":
            continue
        out["batch_scans"] += 1
        metrics = node.metrics()
        for name in SCAN_METRICS:
            found = metrics.get(name)
            if found.isDefined():
                out[name] += int(found.get().value())
    out["files_opened"] = out["resultDataFiles"] + out["resultDeleteFiles"]
    return out


def timed_query(spark, sql: str) -> dict:
    """Planning and scan time of `sql`, plus the scan's metrics.

    planning = Spark's analysis and optimisation (the physical plan built, nothing run) + Iceberg's
    own file planning (its `totalPlanningDuration` scan metric, which runs inside the execution);
    scan = the rest of the wall time to the collected result. Forcing the RDD is no measure of
    planning: with adaptive execution it runs the shuffle stages, i.e. the whole scan.
    """
    t0 = time.perf_counter()
    df = spark.sql(sql)
    df._jdf.queryExecution().executedPlan()
    t1 = time.perf_counter()
    rows = df.collect()
    t2 = time.perf_counter()
    metrics = scan_metrics(df)
    spark_planning = (t1 - t0) * 1000
    planning = spark_planning + metrics["totalPlanningDuration"]
    return {"planning_ms": round(planning, 3), "spark_planning_ms": round(spark_planning, 3),
            "scan_ms": round((t2 - t0) * 1000 - planning, 3), "result": [list(r) for r in rows], **metrics}


def measure_probes(spark, table_sql: str, scope: str, reps: int) -> dict:
    """The scan probe on the table's current state: medians over `reps` after one untimed warm-up each.

    The warm-up keeps JIT and class loading of a first query out of the figures; each timed query
    still loads the table's metadata afresh (the benchmark catalog caches nothing).
    """
    spark.sql(f"REFRESH TABLE {table_sql}")
    timed_query(spark, scan_probe_sql(table_sql, scope))
    scans = [timed_query(spark, scan_probe_sql(table_sql, scope)) for _ in range(reps)]
    return {
        "scan_probe": {
            "planning_ms": median(s["planning_ms"] for s in scans),
            "scan_ms": median(s["scan_ms"] for s in scans),
            "iceberg_planning_ms": median(s["totalPlanningDuration"] for s in scans),
            "rows": scans[0]["result"][0][0],
            **{k: scans[0][k] for k in ("files_opened", "resultDataFiles", "resultDeleteFiles",
                                         "scannedDataManifests", "skippedDataFiles", "totalDataFileSize")},
        },
        "reps": reps,
    }
