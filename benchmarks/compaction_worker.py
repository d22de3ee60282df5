"""One icemaint version's compaction, measured in its own process and Spark session.

`benchmarks.versions.Worker` starts this file as a script with PYTHONPATH at an icemaint checkout
(the working tree, or a git worktree of the version before stage-prove-publish), so that the
`icemaint` imported here is that version's. It then sends one JSON request per line on stdin:

- init: parse the benchmark config, start the Spark session (one per worker, kept for the run);
- compact: one `Compactor.run` on a table, with the proof or with the proof skipped;
- bare: one timed statement (the bare `rewrite_data_files` CALL built by the harness);
- quit.

Replies are single JSON lines on the original stdout, prefixed with REPLY; everything else the
process or its JVM prints goes to stderr (fd 1 is pointed at fd 2 before Spark starts).

"Proof skipped" replaces the version's proof function in `icemaint.engine.validation` (`prove_rows` after
the change, `validate_rewrite` before it) with one that returns a passing result at once, marked
`skipped_by_benchmark`, for the duration of that one run, and (since issue 20) `digest_feed` in
`icemaint.engine.digest`, the proof's digest of the old rows taken while they are rewritten, with one that
digests nothing: everything else (claim, plan, stage or rewrite, publish, evidence, audit) is the version's
own code. This exists only in the benchmark.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
from pathlib import Path

REPLY = "@@icemaint-bench-worker@@ "
HERE = Path(__file__).resolve().parent
_MACHINE = None  # benchmarks/machine.py, loaded by path in main()


def _load(name: str):
    """benchmarks/<name>.py by path (no `benchmarks` package import: PYTHONPATH may hold another one)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpu_seconds() -> float | None:
    """CPU seconds used so far by this worker and its JVM (user + system; far less sensitive to other load)."""
    return _MACHINE.tree_cpu_seconds(os.getpid())



def ours(module: str):
    """A module of the version under test: the layered path (after the 2026-11 re-cut), else the flat one.

    The "before" worker runs a commit from before the re-cut, where `icemaint.operations.compaction`
    was `icemaint.compaction`; benchmarks compare versions, so they speak both.
    """
    import importlib

    import icemaint

    # Decide by the files of the `icemaint` this worker loaded (PYTHONPATH's version): trying the
    # layered name first could reach the editable install's newer layout instead.
    flat = module.rsplit(".", 1)[-1].replace("catalog", "metadata")
    if (Path(icemaint.__file__).parent / f"{flat}.py").exists():
        return importlib.import_module(f"icemaint.{flat}")
    return importlib.import_module(module)

class _SkippedProof:
    """What the version's proof function returns when the benchmark skips the proof: a pass, marked."""

    passed, reads, checks, error = True, {}, (), None  # as a typed proof (ValidationResult) is read

    def __init__(self, before: int, after: int, scope: str | None):
        self.scope = scope
        self.doc = {"passed": True, "skipped_by_benchmark": True, "before_snapshot_id": int(before),
                    "after_snapshot_id": int(after), "scope": scope, "checks": [], "duration_seconds": 0.0,
                    "reads": {}}

    def to_dict(self) -> dict:
        return dict(self.doc)


def _skip_validate_rewrite(spark, table_sql, before_snapshot_id, after_snapshot_id, scope=None, **_):
    return _SkippedProof(before_snapshot_id, after_snapshot_id, scope)


def _skip_prove_rows(before, after, *, scope=None, **_):
    return _SkippedProof(before.snapshot_id, after.snapshot_id, scope)


def _skip_digest_feed(rows, snapshot_id, **_):
    """No digest of the old rows on their way to the writer: that is the proof's work (since issue 20)."""
    return rows, None


@contextlib.contextmanager
def patched(owner, replacements: dict):
    """Sets attributes of `owner` for the block, restoring them after (only those it has)."""
    saved = {k: getattr(owner, k) for k in replacements if hasattr(owner, k)}
    try:
        for k in saved:
            setattr(owner, k, replacements[k])
        yield sorted(saved)
    finally:
        for k, v in saved.items():
            setattr(owner, k, v)


class Worker:
    def __init__(self, measure):
        self.measure = measure
        self.config = None
        self.spark = None
        self.label = "?"

    # -- requests ---------------------------------------------------------------------------
    def init(self, req: dict) -> dict:
        import icemaint
        from icemaint.config import parse_config

        Compactor = ours("icemaint.operations.compaction").Compactor
        get_spark = ours("icemaint.engine.spark_session").get_spark

        self.label = req["label"]
        self.config = parse_config(req["config"], Path(req["root"]), source=f"benchmarks-{self.label}")
        started = time.perf_counter()
        self.spark = get_spark(self.config)
        params = inspect.signature(Compactor.__init__).parameters
        self.staged = "after_stage" in params
        return {"label": self.label, "pid": os.getpid(), "icemaint": str(Path(icemaint.__file__).resolve().parent),
                "staged_compactor": self.staged, "compactor_params": sorted(params),
                "spark_session_seconds": time.perf_counter() - started, "spark": self.spark.version}

    def bare(self, req: dict) -> dict:
        cpu = _cpu_seconds()
        started = time.perf_counter()
        row = self.spark.sql(req["sql"]).collect()[0].asDict()
        wall = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu
        after = self.spark.sql(f"SELECT snapshot_id FROM {req['table_sql']}.refs WHERE name = 'main'").first()
        return {"wall_seconds": wall, "cpu_seconds": cpu,
                "result": {k: int(v) if v is not None else None for k, v in row.items()},
                "after_snapshot_id": int(after["snapshot_id"]), "load_1m": os.getloadavg()[0]}

    def compact(self, req: dict) -> dict:
        compaction = ours("icemaint.operations.compaction")
        validation = ours("icemaint.engine.validation")
        try:
            digest = ours("icemaint.engine.digest")
        except ImportError:  # a version without it
            digest = None
        open_audit = ours("icemaint.safety.audit").open_audit
        open_claims = ours("icemaint.safety.claims").open_claims
        CompactionRequest, Compactor = compaction.CompactionRequest, compaction.Compactor
        CatalogReader = ours("icemaint.observe.catalog").CatalogReader

        m = self.measure
        times = m.CallTimes()
        marks: dict[str, float] = {}

        def progress(message: str) -> None:
            marks.setdefault(message.split(" ", 1)[0].lower(), time.perf_counter())

        reader = m.TimedProxy(CatalogReader(self.config), times, "reader", ("metadata_location", "load", "health"))
        claims = m.TimedProxy(open_claims(self.config), times, "claims", ("acquire",))
        audit = m.TimedProxy(open_audit(self.config), times, "audit", ("records", "append"))
        kwargs, recorded = {}, []
        if not self.staged:  # the old Compactor's rewrite hook: record its CALL's arguments, call it unchanged
            def recording_rewrite(spark, catalog, table, scope, options, strategy="binpack", sort_order=None):
                recorded.append({"scope": scope, "options": dict(options), "strategy": strategy,
                                 "sort_order": sort_order})
                return compaction.call_rewrite_data_files(spark, catalog, table, scope, options, strategy,
                                                          sort_order)
            kwargs["rewrite"] = recording_rewrite
        compactor = Compactor(self.config, self.spark, reader, claims, audit, progress=progress, **kwargs)
        skip = {} if req["proof"] else {"prove_rows": _skip_prove_rows, "validate_rewrite": _skip_validate_rewrite}
        with contextlib.ExitStack() as stack:
            skipped = stack.enter_context(patched(validation, skip))
            if not req["proof"] and digest is not None:  # (`patched` sets only what the version has)
                skipped += stack.enter_context(patched(digest, {"digest_feed": _skip_digest_feed}))
            stack.enter_context(self._timed_internals(times))
            commit_calls: list[dict] = []
            if req.get("commit_log") and self.staged:
                stack.enter_context(self._logged_commits(commit_calls))
            load = os.getloadavg()[0]
            cpu = _cpu_seconds()
            started = time.perf_counter()
            outcome = compactor.run(CompactionRequest(table=req["table"], date=req["date"], trigger="benchmark",
                                                      run_id=req["run_id"]))
            ended = time.perf_counter()
            cpu = _cpu_seconds() - cpu
        out = self._describe(outcome, started, ended, marks, times, recorded, skipped, load)
        out["cpu_seconds"] = cpu
        if req.get("commit_log"):
            out["commit_calls"] = commit_calls
        return out

    # -- helpers ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _timed_internals(self, times):
        """Times the version's own table operations (read-only wrappers, removed after the run)."""
        compaction = ours("icemaint.operations.compaction")

        with contextlib.ExitStack() as stack:
            if self.staged:
                staging = ours("icemaint.engine.staging")

                area = staging.StagingArea
                names = ("stale_branches", "plan_date_files", "stage", "publish", "discard", "release_reads")
                stack.enter_context(patched(area, {n: times.wrap(f"staging.{n}", getattr(area, n))
                                                   for n in names}))
            else:
                stack.enter_context(patched(compaction, {
                    "read_snapshots": times.wrap("read_snapshots", compaction.read_snapshots),
                    "call_rewrite_data_files": times.wrap("rewrite_data_files CALL",
                                                          compaction.call_rewrite_data_files)}))
            yield

    # The version's methods that make a table commit (each call one commit, or one attempt of one): the staged
    # append (with the branch's creation since 7c2c8b4), the branch's creation and removal before it, the publish
    # (before 7c2c8b4 the whole `publish`, since then each attempt `_commit_publish`).
    COMMIT_METHODS = ("open_branch", "commit_to_branch", "_prepare_publish", "_commit_publish", "publish", "discard")

    @contextlib.contextmanager
    def _logged_commits(self, calls: list):
        """Each call of the version's commit-making staging methods: name, wall-clock start, seconds, error class
        (a read-only wrapper, removed after the run). Publish attempts of the newer version are `_commit_publish`."""
        area = ours("icemaint.engine.staging").StagingArea

        def logged(name, fn):
            def call(*args, **kwargs):
                t0, p0 = time.time(), time.perf_counter()
                error = None
                try:
                    return fn(*args, **kwargs)
                except BaseException as exc:
                    java = getattr(exc, "java_exception", None)
                    error = java.getClass().getName() if java is not None else type(exc).__name__
                    raise
                finally:
                    calls.append({"name": name, "start": t0, "seconds": round(time.perf_counter() - p0, 4),
                                  "error": error})
            return call

        names = [n for n in self.COMMIT_METHODS if hasattr(area, n)]
        if "_commit_publish" in names:
            names.remove("publish")  # its attempts are logged one by one
        with patched(area, {n: logged(n, getattr(area, n)) for n in names}):
            yield

    def _describe(self, outcome, started, ended, marks, times, recorded, skipped, load) -> dict:
        d = dict(outcome.durations)
        wall = ended - started
        doc = outcome.to_dict()  # every version's outcome has it, typed inside or not
        proof = doc.get("validation") or {}
        commits = proof.get("commits") or []
        proof_skipped = bool(commits) and all(c.get("skipped_by_benchmark") for c in commits)
        rewrite_at = marks.get("staging", marks.get("rewriting"))
        proof_at = marks.get("proving", marks.get("validating"))
        rewrite_s, proof_s, publish_s = (d.get("rewrite_seconds") or 0.0, d.get("validation_seconds") or 0.0,
                                         d.get("publish_seconds") or 0.0)
        phases = None
        if rewrite_at is not None and proof_at is not None:
            phases = {
                "before_rewrite": rewrite_at - started,
                "rewrite": rewrite_s,
                "between_rewrite_and_proof": proof_at - rewrite_at - rewrite_s,
                "proof": proof_s,
                "publish": publish_s,
                "after": ended - proof_at - proof_s - publish_s,
            }
        reads = [r for c in commits for r in (c.get("reads") or {}).values()]
        rows = None
        if commits and commits[0].get("checks"):
            rows = next((c["observed"].get("before_row_count") for c in commits[0]["checks"]
                         if c["name"] == "row_count_parity"), None)
        return {
            "decision": outcome.decision, "reason": outcome.reason, "published": getattr(outcome, "published", None),
            "passed": proof.get("passed"), "proof_skipped": proof_skipped, "patched": skipped,
            "wall_seconds": wall, "durations": d, "phases": phases,
            "proof_reads_seconds": sum(r.get("planning_ms", 0) + r.get("scan_ms", 0) for r in reads) / 1000,
            "read_before": dict(doc.get("read_before") or {}), "read_after": dict(doc.get("read_after") or {}),
            "calls": times.snapshot(),
            "files_before": outcome.files_before, "files_after": outcome.files_after,
            "rewritten_files": outcome.rewritten_files, "added_files": outcome.added_files,
            "rewritten_bytes": outcome.rewritten_bytes, "validated_rows": rows,
            "validation_checks": {c["name"]: c["passed"] for c in (commits[0].get("checks") or [])} if commits else {},
            "before_snapshot_id": outcome.before_snapshot_id, "after_snapshot_id": outcome.after_snapshot_id,
            "committed_snapshot_ids": list(outcome.committed_snapshot_ids),
            "staged": [g.to_dict() if hasattr(g, "to_dict") else g
                       for g in getattr(outcome, "staged", []) or []], "attempts": outcome.attempts,
            "recorded_calls": recorded, "load_1m": load,
        }


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # the JVM and any print go to stderr; only replies use the protocol pipe
    sys.stdout = sys.stderr
    if sys.path and Path(sys.path[0]).resolve() == HERE:
        sys.path.pop(0)  # this directory's modules are not packages to import from
    global _MACHINE
    _MACHINE = _load("machine")
    worker = Worker(_load("measure"))
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "quit":
                reply = {"ok": True}
            elif op in ("init", "compact", "bare"):
                reply = {"ok": True, "result": getattr(worker, op)(req)}
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except BaseException as exc:  # reported to the harness, which stops the run
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        proto.write(REPLY + json.dumps(reply, default=str) + "\n")
        proto.flush()
        if op == "quit":
            break
    if worker.spark is not None:
        worker.spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
