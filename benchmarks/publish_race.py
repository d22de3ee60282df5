"""Publish under a fast writer on big metadata, and what maintenance's commits cost the writers (issue 43, 2 and 4).

    python -m benchmarks.publish_race [--commits 3000] [--intervals 0.5,0.1] [--catalogs hadoop,jdbc]
                                      [--rounds 1] [--out benchmarks/RESULTS.md] [--note TEXT]
    python -m benchmarks.publish_race --quick      # 300 commits: a smoke run, prints the section only
    python -m benchmarks.publish_race --from-results benchmarks/.work/publish_race/results.json   # re-render

The table: `benchmarks.streaming.build_table` (hadoop catalog, format v2, `days(ts)`): one date D (2026-01-01)
built by `--commits` single-file `fastAppend`s, so `main` has that many snapshots and data manifests and a
metadata.json of megabytes. It is kept as a pristine hard-linked copy and restored before every run; on the JDBC
catalog (a throwaway PostgreSQL server, tests/pg_server.py) the restored metadata.json is registered afresh.

Each run: a writer that ignores the claim commits one small file (10 rows) to today's date every `interval`
seconds (start to start; a commit that takes longer is followed at once by the next), and, once it has
committed a few times alone, icemaint compacts D (`Compactor.run` in a worker process of its own,
benchmarks/compaction_worker.py, its Spark session kept for the run). The writer goes on until the compaction has
returned and a few commits more. Writers:
- hadoop: Iceberg's Java API over Py4J (`newFastAppend().appendFile(f).commit()` after `table.refresh()`, the
  file written by pyarrow), on this process's own SparkSession (its own JVM, not the compaction's): the commit path
  of a Spark INSERT or a Flink sink (SnapshotProducer, the table's `commit.retry.*`: 4 retries, 100 ms-60 s);
- jdbc: pyiceberg's `SqlCatalog` `Table.append` with its default retry (4, 100 ms-60 s, on CommitFailedException
  only); after a failed commit the writer loads the table again and goes on (that batch is lost: counted).
Versions, interleaved: "after" is the working tree (the publish's `replace` built once and committed until it lands,
`icemaint.engine.publish`); "before" is commit 7ace456 in a temporary git worktree (each attempt a new rewrite
committed by Iceberg's `commit()`, which retries 4 times itself and then cleans the rewrite up). Both make three
table commits per file group (the staged append that creates the branch, the publish, the branch's removal) and
take the same `publish_timeout`.

Measured per (catalog, interval, version): the publish attempts and each one's seconds, the staging commit's
seconds, whether it landed; maintenance's table commits (the table's metadata versions made during the run less
the writer's commits); the writer's commits and failures (and pyiceberg's own retries); rows read back by pyiceberg
(every build id and every id the writer's ledger says committed, each once; none of a failed commit).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "publish_race"
SECTION = "## Publish under a fast writer (3,000-snapshot table)"
BEFORE = "7ace456"  # main before the pending publish: Iceberg's commit() per attempt, rebuilt after its 4 retries
WRITER_BASE = 10**9  # the writers' ids start here, far above the build's
WRITER_ROWS = 10
WARMUP_COMMITS = 3  # the writer's commits alone before the compaction starts
TAIL_COMMITS = 3  # and after it returned
# As benchmarks/streaming.py's policy, written out for both versions (no key only one of them knows).
POLICY = {"writer_idle": "0s", "hot_partition_age": "0s", "claim_wait": "0s", "small_file_size_bytes": "1MiB",
          "target_file_size_bytes": "128MiB", "min_input_files": 5, "retry_backoff": "0s",
          "max_rewrite_bytes": "10GiB", "sample_fraction": 0.05,
          # A publish that lost (after its races, or at once before) is reported, not re-planned: one staging each.
          "max_commit_retries": 0}
CATALOG_LABELS = {"hadoop": "Hadoop catalog; writer: Iceberg Java API fast appends (Py4J, its own JVM)",
                  "jdbc": "JDBC catalog on PostgreSQL; writer: pyiceberg SqlCatalog append"}


def log(message: str, _t0=time.perf_counter()) -> None:  # noqa: B008 (the process's start, once)
    print(f"[publish_race {time.perf_counter() - _t0:7.1f}s] {message}", file=sys.stderr, flush=True)


# -- the pure part: what a run's records say -----------------------------------------------------------------

def writer_summary(ledger: list[dict], window: tuple[float, float] | None) -> dict:
    """The writer's commits from its ledger: all, failed, inside the compaction's window, and their seconds.

    Args:
        ledger: one entry per commit: {"start", "seconds", "ok", "error"?, "retries"?}.
        window: (start, end) wall-clock seconds of the compaction, or None.
    """
    def inside(e: dict) -> bool:
        return window is not None and e["start"] + e["seconds"] >= window[0] and e["start"] <= window[1]

    ok = [e for e in ledger if e["ok"]]
    failed = [e for e in ledger if not e["ok"]]
    during = [e for e in ledger if inside(e)]
    alone = [e["seconds"] for e in ok if not inside(e)]
    errors: dict[str, int] = {}
    for e in failed:
        errors[e.get("error") or "?"] = errors.get(e.get("error") or "?", 0) + 1
    starts = [e["start"] for e in ledger]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    return {"commits": len(ledger), "ok": len(ok), "failed": len(failed), "during": len(during),
            "failed_during": sum(1 for e in during if not e["ok"]),
            "retries": sum(e.get("retries", 0) for e in ledger), "errors": errors,
            "commit_seconds_median": round(statistics.median([e["seconds"] for e in ok]), 3) if ok else None,
            "commit_seconds_alone_median": round(statistics.median(alone), 3) if alone else None,
            "commit_seconds_max": round(max(e["seconds"] for e in ledger), 3) if ledger else None,
            "interval_median": round(statistics.median(gaps), 3) if gaps else None}


def commit_summary(calls: list[dict]) -> dict:
    """Maintenance's commit calls (compaction_worker's `commit_calls`), by what they did.

    Returns:
        {"stage_seconds": [...], "branch_seconds": [...] (createBranch before the append, the version before),
        "publish_seconds": [...] (each attempt), "publish_errors": [...], "discard_seconds": [...]}.
    """
    out = {"stage_seconds": [], "branch_seconds": [], "publish_seconds": [], "publish_errors": [],
           "discard_seconds": [], "prepare_seconds": []}
    for c in calls:
        key = {"commit_to_branch": "stage_seconds", "open_branch": "branch_seconds", "publish": "publish_seconds",
               "_commit_publish": "publish_seconds", "discard": "discard_seconds",
               "_prepare_publish": "prepare_seconds"}.get(c["name"])
        if key:
            out[key].append(c["seconds"])
        if key == "publish_seconds" and c.get("error"):
            out["publish_errors"].append(c["error"].rsplit(".", 1)[-1])
    return out


def verdict(runs: list[dict]) -> dict:
    """The findings over all runs: did every publish land, every row check pass; writer failures per version."""
    landed = [r for r in runs if r["version"] == "after"]
    failures: dict[str, dict] = {}
    for r in runs:
        key = f"{r['catalog']}/{r['version']}"
        f = failures.setdefault(key, {"runs": 0, "failed": 0, "commits": 0, "maintenance_commits": 0})
        f["runs"] += 1
        f["failed"] += r["writer"]["failed"]
        f["commits"] += r["writer"]["commits"]
        f["maintenance_commits"] += r.get("maintenance_commits") or 0
    return {"after_all_landed": all(r["published"] for r in landed) if landed else None,
            "rows_ok": all(r["rows"]["ok"] for r in runs) if runs else None,
            "writer_failures": failures}


def findings(runs: list[dict]) -> list[str]:
    """What the runs' records show, each line only when the records show it (the causes are read from Iceberg's and
    pyiceberg's code, cited)."""
    out = []
    after = [r for r in runs if r["version"] == "after"]
    lost = [r for r in after if not r["published"] and "CommitFailedException" in r["commits"]["publish_errors"]]
    if lost:
        attempts = [s for r in lost for s in r["commits"]["publish_seconds"]]
        out.append(
            f"**The publish starves** in {len(lost)} of {len(after)} runs of this version: {len(attempts)} attempts of "
            f"{min(attempts):.1f}-{max(attempts):.1f} s, each lost to a writer's commit that landed meanwhile. Each "
            "attempt reuses the pending rewrite (its manifests filtered once, before the race), so what is left in an "
            "attempt is what every commit on this table does, the writer's too: a refresh that parses the multi-MiB "
            "metadata.json, the current manifest list read, a new manifest list and metadata.json written, the swap. "
            "An attempt cannot be shorter than the writer's own commit; against a writer whose commits follow each "
            "other back to back (its interval shorter than its commit), it lands only when an attempt happens to fit "
            "between two of them.")
    before_lost = [r for r in runs if r["version"] == "before" and not r["published"]]
    if before_lost:
        secs = [s for r in before_lost for s in r["commits"]["publish_seconds"]]
        out.append(
            f"The version before lost too ({len(before_lost)} of {sum(r['version'] == 'before' for r in runs)} runs): "
            "its publish was a standalone `newRewrite().commit()`, which Iceberg retries itself (4 times, on the "
            "refreshed metadata, keeping the manifests it already filtered), and still lost, in one call of "
            f"{min(secs):.0f}-{max(secs):.0f} s. Neither way of retrying wins against a writer that commits faster "
            "than one attempt of this publish takes.")
    value_errors = [r for r in runs if any("ValueError" in e["error"] and "sequence number" in (e.get("message") or "")
                                           for e in r.get("writer_errors", []))]
    if value_errors:
        out.append(
            "pyiceberg's failed commits are the sequence-number race, in both versions: the staged append to the "
            "branch takes the table's next sequence number while `main` stays where it was, so the writer's "
            "requirement (`AssertRefSnapshotId` on main) still holds and its snapshot, numbered from its stale "
            "metadata, is refused while the SQL catalog applies it (`pyiceberg/table/update/__init__.py`: "
            "`ValueError: Cannot add snapshot with sequence number N older than last sequence number N`). Its retry "
            "(`commit.retry.num-retries` 4, 100 ms doubling) catches only `CommitFailedException`, so **no pyiceberg "
            "setting makes these zero**: the writer must refresh and retry on that ValueError itself, or maintenance "
            "must not commit to a branch while main stays (apache/iceberg#15001 is the same race on a REST "
            "catalog, made retryable server-side by #15126). Fewer ref commits (createBranch, removeBranch) do not "
            "touch it: they take no sequence number.")
    java = [r for r in runs if r["catalog"] == "hadoop"]
    if java:
        n = sum(r["writer"]["failed"] for r in java)
        retried = "" if n else (" With Iceberg's defaults (`commit.retry.num-retries` 4, `min-wait-ms` 100, "
                                "`max-wait-ms` 60000) the Java writer lost no commit: a lost race is re-applied "
                                "on the refreshed table within its own commit.")
        if n:
            retried = (f" The Java writer lost {n} commit(s) after Iceberg's 4 retries: raising "
                       "`commit.retry.num-retries` (and `min-wait-ms`) is the writer's setting for it.")
        out.append("The Hadoop catalog's Java writer:" + retried)
    return out


def _secs(values, limit: int = 8) -> str:
    if not values:
        return "-"
    shown = ", ".join(f"{v:.2f}" for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def _load(load) -> str:
    return " / ".join(f"{x:.1f}" for x in load) if load else "-"


def _rows(rows: dict) -> str:
    if rows["ok"]:
        return f"ok ({rows['rows']:,})"
    return (f"**WRONG**: {rows['missing']} lost, {rows['duplicated']} duplicated, {rows['unexpected']} "
            "unexpected")


def _writer_cell(w: dict) -> str:
    text = f"{w['ok']:,} ok, **{w['failed']} failed**" if w["failed"] else f"{w['ok']:,} ok, 0 failed"
    if w["retries"]:
        text += f"; {w['retries']} retried"
    return text


def render_run_row(r: dict) -> str:
    c, w = r["commits"], r["writer"]
    errors = sorted(set(c["publish_errors"]))
    published = "landed" if r["published"] else (
        f"**not landed**: lost {len(c['publish_errors'])} race(s) ({', '.join(errors)})" if errors
        else f"**not landed** ({r.get('reason', '')[:120]})")
    prepared = "".join(f"applied once first: {p:.2f}; " for p in c.get("prepare_seconds") or [])
    return (f"| {r['catalog']} | {r['interval']:g} s | {r['version']} | {len(c['publish_seconds'])} | "
            f"{prepared}{_secs(c['publish_seconds'])} | {_secs(c['branch_seconds'] + c['stage_seconds'])} | {published} | "
            f"{r.get('maintenance_commits', '-')} | {_writer_cell(w)} | {w['commit_seconds_alone_median'] or '-'} / "
            f"{w['commit_seconds_median'] or '-'} s | {w['interval_median'] or '-'} s | "
            f"{r['compaction_seconds']:.1f} s | {_rows(r['rows'])} | {_load(r['load_before'])} -> "
            f"{_load(r['load_after'])} |")


def _errors_line(runs: list[dict]) -> str:
    seen: dict[str, str] = {}
    for r in runs:
        for e in r.get("writer_errors", []):
            seen.setdefault(e["error"], e.get("message", ""))
    if not seen:
        return "- The writers' failed commits: none."
    return "- The writers' failed commits were: " + "; ".join(
        f"`{k.rsplit('.', 1)[-1]}` (\"{v[:160]}\")" for k, v in seen.items()) + "."


def render(res: dict) -> str:
    """The Markdown section of a run's results (see `run` for their shape)."""
    m, b = res["machine"], res["build"]
    runs = res["runs"]
    v = verdict(runs)
    bound = res.get("bound") or {}
    lines = [
        SECTION, "",
        f"- Measured {res['date']} on commit `{res['commit']}`{' (with uncommitted changes)' if res.get('dirty') else ''}"
        f"; command: `{res['command']}`. **A loaded machine**: {m['cores']} cores ({m['cpu_model']}, "
        f"{m['memory_gib']} GiB) shared with other engineers' test runs; load average {_load(res['load_start'])} at "
        f"the start, {_load(res['load_end'])} at the end (1/5/15 min), and before -> after each run in the table."
        + (f" {res['note']}" if res.get("note") else ""),
        f"- Versions: Java {m['java']}, Spark {m['spark']}, Iceberg {m['iceberg']}, pyiceberg {m['pyiceberg']}, "
        f"PostgreSQL {res.get('postgres', '-')}, Python {m['python']}.",
        f"- Table: `benchmarks.streaming.build_table`, {b['commits']:,} single-file commits to D = 2026-01-01: "
        f"{b['snapshots']:,} snapshots, {b['data_manifests']:,} data manifests, metadata.json "
        f"{bound.get('metadata_json_mib', '?')} MiB, manifest list {bound.get('manifest_list_kib', '?')} KiB"
        + (f" (built in {b['commit_seconds']:.0f} s" + (", reused from an earlier run" if b.get("reused") else "")
           + ")" if b.get("commit_seconds") else "") + ". Compacted: D's files into one (one file group).",
        "- Writers (ignore the claim, commit 10 rows to today's date): " + "; ".join(
            f"{k}: {CATALOG_LABELS[k].split('writer: ', 1)[1]}" for k in res["catalogs"])
        + ". Both with their default commit retries. The interval is start to start; a commit that takes longer "
        "is followed at once by the next (the 'achieved' column).",
        f"- Versions of icemaint, interleaved: after = this commit (the publish's `replace` built once and committed "
        "until it lands: a lost race costs a refresh and a metadata write, the filtered manifests are reused, the "
        "validation window moves forward, the next attempt starts at once); before = "
        f"`{res['before']}` in a temporary worktree (each attempt a new rewrite committed by Iceberg's `commit()`, "
        "which retries 4 times itself and then cleans the rewrite up, so the next attempt filters every manifest "
        "again). Both: three table commits per group, `publish_timeout` "
        f"{res.get('publish_timeout', '2m')} (the product's default is 2m), `max_commit_retries: 0`: a publish that "
        "did not land is reported, not re-planned and staged again "
        "(the default 3 would repeat the whole run up to three times).", "",
        "| catalog | writer interval | version | publish attempts | each attempt (s) | stage commit(s) (s) | publish "
        "| maintenance commits | writer commits | writer commit alone / overall, median | achieved interval "
        "| compaction | rows (pyiceberg) | load before -> after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(render_run_row(r) for r in runs), "",
        "- Maintenance commits: the table's metadata versions made during the run less the writer's commits. The "
        "writer's failures are all caused by maintenance's commits: nothing else commits to the table.",
        _errors_line(runs),
    ]
    fails = v["writer_failures"]
    if fails:
        lines.append("- Writer failures, before -> after: " + "; ".join(
            f"{cat}: {fails.get(f'{cat}/before', {}).get('failed', '-')} -> "
            f"{fails.get(f'{cat}/after', {}).get('failed', '-')} (of "
            f"{fails.get(f'{cat}/before', {}).get('commits', '-')} and {fails.get(f'{cat}/after', {}).get('commits', '-')}"
            " commits)" for cat in res["catalogs"]) + ".")
    if bound:
        lines.append(
            f"- What bounds a commit attempt on this table (no writer running, in this process's JVM, medians of "
            f"{bound.get('reps', '?')}): parsing the {bound['metadata_json_mib']} MiB metadata.json "
            f"{bound['parse_ms']:.0f} ms, writing it {bound['write_ms']:.0f} ms; reading the manifest list "
            f"({bound['manifest_list_kib']} KiB, {bound['manifests']:,} manifests) {bound['manifest_list_read_ms']:.0f} ms; "
            f"a writer's whole fast append during the build's last 100 commits {bound['build_commit_ms']:.0f} ms. "
            "Every commit, the writer's and the publish's, writes a new metadata.json of that size and a manifest "
            "list naming every manifest; the publish also rewrites the manifests that list the replaced files "
            f"({bound['manifests']:,} here, one per small file) before its commit.")
    lines += [f"- {f}" for f in findings(runs)]
    lines.append("- Rows: pyiceberg read every row back after each run: "
                 + ("all ok (every build id and every id the writer's ledger committed, each once; none of a failed "
                    "commit)." if v["rows_ok"] else "**a check failed** (see the table)."))
    if res.get("quick"):
        lines.append(f"- A quick smoke run ({b['commits']:,} commits): it proves the harness, not the figures.")
    return "\n".join(lines) + "\n"


# -- writers -------------------------------------------------------------------------------------------------

def writer_rows(first: int, n: int, today: dt.date):
    """Rows for the writer: ids first..first+n-1, ts on `today`, columns as the build's (function of the id)."""
    import numpy as np
    import pyarrow as pa

    from benchmarks.streaming import STATUSES

    ids = np.arange(first, first + n, dtype=np.int64)
    base = np.datetime64(today.isoformat(), "us")
    return {"event_id": ids, "device_id": (ids % 97).astype(np.int32),
            "ts": pa.array(base + ((ids * 37) % 86400) * np.timedelta64(1, "s"), type=pa.timestamp("us", tz="UTC")),
            "reading": ids * 0.5, "status": pa.array(np.array(STATUSES)[ids % 3])}


class Writer(threading.Thread):
    """Commits WRITER_ROWS rows to today every `interval` seconds until stopped; a ledger entry per commit."""

    def __init__(self, interval: float, first_seq: int):
        super().__init__(daemon=True)
        self.interval = interval
        self.seq = first_seq
        self.ledger: list[dict] = []
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.today = dt.datetime.now(dt.timezone.utc).date()

    def commit(self, first: int) -> int:  # the retries its library made, when it can tell
        raise NotImplementedError

    def run(self) -> None:
        try:
            self.open()
            next_start = time.monotonic()
            while not self.stop_event.is_set():
                delay = next_start - time.monotonic()
                if delay > 0 and self.stop_event.wait(delay):
                    break
                next_start = max(time.monotonic(), next_start) + self.interval
                first = WRITER_BASE + self.seq * WRITER_ROWS
                self.seq += 1
                entry = {"first": first, "start": time.time()}
                p0 = time.perf_counter()
                try:
                    entry["retries"] = self.commit(first) or 0
                    entry["ok"] = True
                except Exception as exc:  # the writer's lost commit: recorded, the writer goes on
                    entry.update(ok=False, **self.describe(exc))
                    self.after_failure()
                entry["seconds"] = round(time.perf_counter() - p0, 4)
                self.ledger.append(entry)
        except BaseException as exc:
            self.error = exc

    def open(self) -> None:
        pass

    def after_failure(self) -> None:
        pass

    @staticmethod
    def describe(exc: BaseException) -> dict:
        java = getattr(exc, "java_exception", None)
        if java is not None:
            return {"error": java.getClass().getName(), "message": str(java.getMessage() or "").splitlines()[0][:300]
                    if java.getMessage() else ""}
        return {"error": f"{type(exc).__module__}.{type(exc).__name__}", "message": str(exc).splitlines()[0][:300]
                if str(exc) else ""}

    def committed(self) -> int:
        return sum(1 for e in self.ledger if e.get("ok"))

    def finish(self) -> None:
        self.stop_event.set()
        self.join(timeout=300)
        if self.error is not None:
            raise RuntimeError(f"the writer broke: {self.error!r}") from self.error


class JavaWriter(Writer):
    """Iceberg's Java API through this process's SparkSession: refresh, write one Parquet file, fast append."""

    def __init__(self, spark, interval: float, first_seq: int):
        super().__init__(interval, first_seq)
        self.spark = spark

    def open(self) -> None:
        from benchmarks.streaming import CATALOG, TABLE, _arrow_schema
        from icemaint.domain.names import TableName
        from icemaint.engine.spark_session import iceberg_table

        # Spark resolves the catalog through this JVM thread's active session, which a new thread may lack
        self.spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(self.spark._jsparkSession)
        self.tbl = iceberg_table(self.spark, CATALOG, TableName.parse(TABLE))
        self.jvm = self.spark._jvm
        self.schema = _arrow_schema(self.tbl)
        self.location = str(self.tbl.location())
        self.partition = f"ts_day={self.today.isoformat()}"
        self.folder = Path(self.location.removeprefix("file:")) / "data" / self.partition
        self.folder.mkdir(parents=True, exist_ok=True)

    def commit(self, first: int) -> int:
        import pyarrow as pa
        import pyarrow.parquet as pq

        jvm, tbl = self.jvm, self.tbl
        tbl.refresh()
        name = f"w{first}-{uuid.uuid4().hex[:8]}.parquet"
        pq.write_table(pa.table(writer_rows(first, WRITER_ROWS, self.today), schema=self.schema), self.folder / name)
        inf = tbl.io().newInputFile(f"{self.location}/data/{self.partition}/{name}")
        metrics = jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(
            inf, jvm.org.apache.iceberg.MetricsConfig.forTable(tbl))
        data_file = (jvm.org.apache.iceberg.DataFiles.builder(tbl.spec()).withInputFile(inf).withMetrics(metrics)
                     .withFormat(jvm.org.apache.iceberg.FileFormat.PARQUET).withPartitionPath(self.partition).build())
        tbl.newFastAppend().appendFile(data_file).commit()
        return 0


class _RetryCounter(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record) -> None:
        if "concurrent update" in record.getMessage():
            self.count += 1


class PyicebergWriter(Writer):
    """pyiceberg's SqlCatalog `Table.append`; after a failed commit the table is loaded again."""

    def __init__(self, catalog_props: dict, interval: float, first_seq: int):
        super().__init__(interval, first_seq)
        self.catalog_props = catalog_props

    def open(self) -> None:
        from pyiceberg.catalog import load_catalog

        from benchmarks.streaming import TABLE

        self.catalog = load_catalog("lake", **self.catalog_props)
        self.tbl = self.catalog.load_table(TABLE)
        self.counter = _RetryCounter()
        logging.getLogger("pyiceberg.table").addHandler(self.counter)

    def commit(self, first: int) -> int:
        import pyarrow as pa

        before = self.counter.count
        data = pa.table(writer_rows(first, WRITER_ROWS, self.today), schema=self.tbl.schema().as_arrow())
        self.tbl.append(data)
        return self.counter.count - before

    def after_failure(self) -> None:
        from benchmarks.streaming import TABLE

        self.tbl = self.catalog.load_table(TABLE)

    def finish(self) -> None:
        super().finish()
        logging.getLogger("pyiceberg.table").removeHandler(self.counter)


# -- the table: build once, restore per run -------------------------------------------------------------------

def _table_dir(root: Path) -> Path:
    from benchmarks.streaming import table_dir

    return table_dir(root)


def build(spark, root: Path, commits: int, rebuild: bool) -> dict:
    """The pristine table (hard-linked copy under WORK), built by `streaming.build_table` or reused when a copy of
    the same shape at the same path is there."""
    from benchmarks.streaming import build_table

    pristine = WORK / f"pristine-{commits}"
    meta = WORK / f"pristine-{commits}.json"
    if not rebuild and pristine.exists() and meta.exists():
        info = json.loads(meta.read_text())
        if info.get("root") == str(root):
            log(f"reusing the table built {info['built']} ({commits:,} commits)")
            return {**info["build"], "reused": True}
    shutil.rmtree(pristine, ignore_errors=True)
    shutil.rmtree(root / "warehouse", ignore_errors=True)
    log(f"building {commits:,} single-file commits (benchmarks.streaming.build_table)")
    b = build_table(spark, commits, 100)
    subprocess.run(["cp", "-al", str(root / "warehouse"), str(pristine)], check=True)
    meta.write_text(json.dumps({"root": str(root), "built": dt.datetime.now(dt.timezone.utc).isoformat(
        timespec="seconds"), "build": b}))
    return b


def restore(root: Path, commits: int) -> None:
    shutil.rmtree(root / "warehouse", ignore_errors=True)
    subprocess.run(["cp", "-al", str(WORK / f"pristine-{commits}"), str(root / "warehouse")], check=True)


def metadata_version(path: str) -> int:
    """A metadata file's version: `v12.metadata.json` (hadoop) or `00012-<uuid>.metadata.json` (catalogs)."""
    name = path.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0] if "-" in name else name.split(".", 1)[0]
    return int(head.lstrip("v"))


def measure_bound(spark, root: Path, reps: int = 5) -> dict:
    """Parse and write of the current metadata.json, and the manifest list's read, in the JVM (quiet)."""
    from benchmarks.streaming import _file_io, current_metadata

    tdir = _table_dir(root)
    path = current_metadata(tdir)
    jvm = spark._jvm
    io = _file_io(jvm)
    parse, write, lists = [], [], []
    scratch = root / "scratch"
    scratch.mkdir(exist_ok=True)
    manifests = 0
    for i in range(reps + 1):
        t0 = time.perf_counter()
        md = jvm.org.apache.iceberg.TableMetadataParser.read(io, str(path))
        t1 = time.perf_counter()
        out = scratch / f"w{i}.metadata.json"
        jvm.org.apache.iceberg.TableMetadataParser.overwrite(md, io.newOutputFile(str(out)))
        t2 = time.perf_counter()
        manifests = md.currentSnapshot().allManifests(io).size()
        t3 = time.perf_counter()
        if i:
            parse.append((t1 - t0) * 1000)
            write.append((t2 - t1) * 1000)
            lists.append((t3 - t2) * 1000)
    meta = json.loads(path.read_text())
    current = next(s for s in meta["snapshots"] if s["snapshot-id"] == meta["current-snapshot-id"])
    list_bytes = Path(current["manifest-list"].removeprefix("file:")).stat().st_size
    shutil.rmtree(scratch, ignore_errors=True)
    return {"reps": reps, "metadata_json_mib": round(path.stat().st_size / 2**20, 1),
            "parse_ms": statistics.median(parse), "write_ms": statistics.median(write),
            "manifest_list_read_ms": statistics.median(lists), "manifest_list_kib": round(list_bytes / 1024),
            "manifests": int(manifests)}


# -- the catalogs --------------------------------------------------------------------------------------------

class Catalog:
    """One catalog kind's config for the compaction workers, its restore and its independent reader."""

    kind = "?"

    def __init__(self, root: Path, publish_timeout: str = "60s"):
        self.root = root
        self.publish_timeout = publish_timeout

    def worker_config(self, state: str, version: str) -> dict:
        from benchmarks.streaming import config_doc

        doc = config_doc(self.root, state)
        doc["defaults"] = {**POLICY, "publish_timeout": self.publish_timeout}  # --before must know the key
        return doc

    def restore(self, commits: int) -> None:
        restore(self.root, commits)

    def version(self) -> int:
        raise NotImplementedError

    def read_ids(self):
        raise NotImplementedError


class HadoopCatalog(Catalog):
    kind = "hadoop"

    def version(self) -> int:
        return int((_table_dir(self.root) / "metadata" / "version-hint.text").read_text().strip())

    def read_ids(self):
        from pyiceberg.table import StaticTable

        from benchmarks.streaming import current_metadata

        table = StaticTable.from_metadata(f"file://{current_metadata(_table_dir(self.root))}")
        return table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_numpy()


class JdbcCatalog(Catalog):
    kind = "jdbc"

    def __init__(self, root: Path, server, publish_timeout: str = "60s"):
        super().__init__(root, publish_timeout)
        self.server = server
        self.props = {"type": "sql", "uri": server.dsn.replace("postgresql://", "postgresql+psycopg2://", 1),
                      "warehouse": f"file://{root / 'warehouse'}"}

    def worker_config(self, state: str, version: str) -> dict:
        doc = super().worker_config(state, version)
        doc["catalog"] = {"name": "lake", "type": "jdbc", "uri": self.server.jdbc_url,
                          "warehouse": str(self.root / "warehouse"), "properties": {"jdbc.user": self.server.user}}
        return doc

    def catalog(self):
        from pyiceberg.catalog import load_catalog

        return load_catalog("lake", **self.props)

    def restore(self, commits: int) -> None:
        from benchmarks.streaming import TABLE, current_metadata

        cat = self.catalog()
        if cat.table_exists(TABLE):
            cat.drop_table(TABLE)  # the catalog's row only: pyiceberg's SQL catalog deletes no file
        super().restore(commits)
        cat.create_namespace_if_not_exists(TABLE.split(".")[0])
        self.registered = current_metadata(_table_dir(self.root))
        cat.register_table(TABLE, f"file://{self.registered}")

    def version(self) -> int:
        from benchmarks.streaming import TABLE

        location = self.catalog().load_table(TABLE).metadata_location
        return -1 if location.endswith(self.registered.name) else metadata_version(location)

    def read_ids(self):
        from benchmarks.streaming import TABLE

        table = self.catalog().load_table(TABLE)
        return table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_numpy()


def check_ids(ids, build_rows: int, ledger: list[dict]) -> dict:
    """Every build id (0..build_rows-1) and every id of the ledger's committed batches exactly once; nothing else
    (a failed batch's ids absent)."""
    import numpy as np

    expected = np.arange(build_rows, dtype=np.int64)
    written = [np.arange(e["first"], e["first"] + WRITER_ROWS, dtype=np.int64) for e in ledger if e["ok"]]
    expected = np.concatenate([expected, *written]) if written else expected
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    uniq, counts = np.unique(ids, return_counts=True)
    missing = np.setdiff1d(expected, uniq, assume_unique=True)
    unexpected = np.setdiff1d(uniq, expected, assume_unique=True)
    failed = [e for e in ledger if not e["ok"]]
    failed_ids = np.concatenate([np.arange(e["first"], e["first"] + WRITER_ROWS) for e in failed]) if failed \
        else np.array([], dtype=np.int64)
    return {"rows": int(len(ids)), "expected": int(len(expected)), "missing": int(len(missing)),
            "duplicated": int((counts > 1).sum()), "unexpected": int(len(unexpected)),
            "failed_batches_present": int(np.isin(failed_ids, uniq).sum()),
            "ok": bool(len(missing) == 0 and (counts == 1).all() and len(unexpected) == 0)}


# -- one run ---------------------------------------------------------------------------------------------------

def one_run(cat: Catalog, worker, version: str, interval: float, spark, commits: int, build_rows: int,
            run_no: int) -> dict:
    from benchmarks.machine import load_average
    from benchmarks.streaming import DAY, TABLE

    cat.restore(commits)
    v0 = cat.version()
    first_seq = run_no * 1_000_000
    writer = (JavaWriter(spark, interval, first_seq) if cat.kind == "hadoop"
              else PyicebergWriter(cat.props, interval, first_seq))
    load_before = load_average()
    writer.start()
    deadline = time.monotonic() + 120
    while writer.committed() < WARMUP_COMMITS and time.monotonic() < deadline and writer.is_alive():
        time.sleep(0.05)
    started = time.time()
    defers, reply = 0, None
    for _ in range(10):  # a writer's commit that lands while health is read may defer a zero idle window once
        reply = worker.request("compact", table=TABLE, date=DAY.isoformat(), proof=True, commit_log=True,
                               run_id=f"race{run_no}{uuid.uuid4().hex[:6]}")
        if reply["decision"] != "defer" or not (reply.get("reason") or "").startswith("writer active"):
            break
        defers += 1
    ended = time.time()
    tail = writer.committed() + TAIL_COMMITS
    deadline = time.monotonic() + 60
    while writer.committed() < tail and time.monotonic() < deadline and writer.is_alive():
        time.sleep(0.05)
    writer.finish()
    load_after = load_average()
    v1 = cat.version()
    ws = writer_summary(writer.ledger, (started, ended))
    ids = cat.read_ids()
    rows = check_ids(ids, build_rows, writer.ledger)
    staged = reply.get("staged") or []
    published = bool(reply.get("published")) and all(s.get("verdict") == "published" for s in staged)
    table_commits = v1 - v0 if cat.kind == "hadoop" else v1 + 1
    run = {"catalog": cat.kind, "interval": interval, "version": version, "decision": reply["decision"],
           "reason": reply.get("reason") or "", "published": bool(published), "defers": defers,
           "compaction_seconds": round(ended - started, 2), "window": [started, ended],
           "commits": commit_summary(reply.get("commit_calls") or []), "commit_calls": reply.get("commit_calls"),
           "staged": staged, "files_before": reply.get("files_before"), "files_after": reply.get("files_after"),
           "durations": reply.get("durations"), "table_commits": table_commits,
           "maintenance_commits": table_commits - ws["ok"], "writer": ws,
           "writer_errors": [{k: e.get(k) for k in ("error", "message", "start", "seconds")}
                             for e in writer.ledger if not e["ok"]],
           "ledger": writer.ledger, "rows": rows, "load_before": load_before, "load_after": load_after}
    c = run["commits"]
    log(f"{cat.kind} {interval:g}s {version}: {reply['decision']} published={published} publish attempts "
        f"{_secs(c['publish_seconds'])} stage {_secs(c['branch_seconds'] + c['stage_seconds'])}; maintenance commits "
        f"{run['maintenance_commits']}; writer {ws['ok']} ok {ws['failed']} failed ({ws['errors']}), retries "
        f"{ws['retries']}, commit median {ws['commit_seconds_median']} s; rows {'ok' if rows['ok'] else rows}; "
        f"{run['compaction_seconds']} s; load {load_before} -> {load_after}")
    return run


def run(args) -> dict:
    from benchmarks.machine import describe_machine, load_average
    from benchmarks.streaming import write_config
    from benchmarks.versions import checkout, describe_source, start_workers
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark

    load_start = load_average()
    root = WORK / "run"
    root.mkdir(parents=True, exist_ok=True)
    for d in root.iterdir():
        if d.name != "warehouse":
            shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink()
    res = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                    text=True).stdout.strip(),
           "dirty": bool(subprocess.run(["git", "status", "--porcelain", "--", "icemaint", "benchmarks"], cwd=REPO,
                                        capture_output=True, text=True).stdout.strip()),
           "command": shlex.join(["python", "-m", "benchmarks.publish_race", *args.given]), "note": args.note,
           "quick": args.quick, "load_start": load_start, "catalogs": args.catalogs, "intervals": args.intervals,
           "before": args.before, "publish_timeout": args.publish_timeout, "runs": []}
    spark = get_spark(load_config(str(write_config(root, "state-main"))))
    res["machine"] = describe_machine(spark)
    b = build(spark, root, args.commits, args.rebuild)
    res["build"] = {**b, "snapshots": args.commits, "data_manifests": args.commits}
    restore(root, args.commits)
    res["bound"] = {**measure_bound(spark, root),
                    "build_commit_ms": round(b["last_100_commit_seconds"] * 10, 1)}
    log(f"bound: {res['bound']}")
    build_rows = b["rows"]
    run_no = 0
    with checkout(args.before) as before_src, contextlib_server(args) as server:
        res["sources"] = {"before": describe_source(before_src), "after": describe_source(REPO)}
        if server is not None:
            res["postgres"] = _postgres_version(server)
            os.environ["ICEMAINT_CATALOG_JDBC_PASSWORD"] = server.password
        for kind in args.catalogs:
            cat = (HadoopCatalog(root, args.publish_timeout) if kind == "hadoop"
                   else JdbcCatalog(root, server, args.publish_timeout))
            cat.restore(args.commits)
            specs = [("after", REPO)] if args.only_after else [("before", before_src), ("after", REPO)]
            workers = start_workers(specs, lambda label: cat.worker_config(f"state-{kind}-{label}", label), root,
                                    root / "logs" / kind)
            try:
                for rnd in range(args.rounds):
                    for i, interval in enumerate(args.intervals):
                        order = ("after", "before") if (i + rnd) % 2 == 0 else ("before", "after")
                        order = tuple(v for v in order if v in workers)
                        for version in order:
                            run_no += 1
                            res["runs"].append(one_run(cat, workers[version], version, interval, spark,
                                                       args.commits, build_rows, run_no))
                            # a run cut short still leaves its figures (render them with --from-results)
                            args.saved.write_text(json.dumps({**res, "load_end": load_average()}, indent=1,
                                                             default=str))
            finally:
                for w in workers.values():
                    w.close()
    res["load_end"] = load_average()
    return res


def _postgres_version(server) -> str:
    import psycopg2

    with psycopg2.connect(server.dsn) as conn, conn.cursor() as cur:
        cur.execute("SHOW server_version")
        return cur.fetchone()[0].split()[0]


def contextlib_server(args):
    import contextlib

    if "jdbc" not in args.catalogs:
        return contextlib.nullcontext()
    from benchmarks.shared_catalog import postgres_server

    return postgres_server()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.publish_race", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=None, help="single-file commits on D (default 3000; --quick 300)")
    parser.add_argument("--intervals", default="0.5,0.1", help="the writer's seconds between commits (default 0.5,0.1)")
    parser.add_argument("--catalogs", default="hadoop,jdbc", help="hadoop, jdbc or both (default)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each (catalog, interval, version) (default 1)")
    parser.add_argument("--before", default=BEFORE, help=f"the commit measured as before (default {BEFORE})")
    parser.add_argument("--publish-timeout", default="60s",
                        help="the after version's policy publish_timeout (default 60s; the product's default is 2m)")
    parser.add_argument("--only-after", action="store_true", help="measure the working tree only (no before runs)")
    parser.add_argument("--rebuild", action="store_true", help="build the table even when a pristine copy exists")
    parser.add_argument("--quick", action="store_true", help="a smoke run (300 commits): prints the section only")
    parser.add_argument("--out", default=None, help="the file whose section is written (default benchmarks/RESULTS.md)")
    parser.add_argument("--note", default="", help="a line for the section")
    parser.add_argument("--from-results", metavar="JSON", help="only render the section from a previous run's figures")
    args = parser.parse_args(argv)
    from benchmarks.stack_bench import write_section

    args.given = argv if argv is not None else sys.argv[1:]
    if args.from_results:
        results = json.loads(Path(args.from_results).read_text())
        if args.note:
            results["note"] = args.note
    else:
        args.commits = args.commits or (300 if args.quick else 3000)
        args.intervals = [float(x) for x in args.intervals.split(",") if x.strip()]
        args.catalogs = [x.strip() for x in args.catalogs.split(",") if x.strip()]
        if not set(args.catalogs) <= {"hadoop", "jdbc"} or not args.intervals or args.commits < 10:
            parser.error("--catalogs hadoop,jdbc; --intervals a list of seconds; --commits >= 10")
        WORK.mkdir(parents=True, exist_ok=True)
        saved = args.saved = WORK / ("results-quick.json" if args.quick else "results.json")
        results = run(args)
        saved.write_text(json.dumps(results, indent=1, default=str))
        log(f"raw figures: {saved}")
    section = render(results)
    out = args.out or (None if results.get("quick") else str(HERE / "RESULTS.md"))
    if out is None:
        print(section)
        return 0
    write_section(Path(out), section, heading=SECTION)
    log(f"wrote {out} ({SECTION[3:]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
