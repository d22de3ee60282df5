"""The soak's writers: one process, one Spark session, one thread per table, each a simulated streaming
writer (icemaint.app.simulator.StreamingWriter) writing in bursts with idle gaps between them.

A writer either takes the table's claim for each commit (a cooperating writer) or ignores it (the usual
case: Flink, Spark streaming, Kafka Connect). Each keeps its ledger on disk, saved after every commit
it knows landed. A commit that raised may still have landed (Iceberg cannot always tell): it is resolved
against the table before the next one, by reading its rows back (maintenance never adds or removes a
row, so the rows say whether the writer's append or delete is on `main`), and only then counted.

    python -m reliability.writers --config CONFIG --work DIR

reads DIR/writers.json (the plan the harness wrote), writes DIR/ledgers/<table>.ledger.json, a status
DIR/writers.status.json every few seconds, and DIR/writers.done.json when DIR/stop appears and every
writer has finished its batch.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import random
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from icemaint.app.simulator import ID_STRIDE, Ledger, StreamingWriter, WorkloadSpec, batch_rows, choose_deletes

log = logging.getLogger("reliability.writers")
RESOLVE_TRIES = 12


@dataclass
class WriterStats:
    """What one writer did; `anomalies` are observations the final check should explain."""

    table: str
    claim: bool
    batches: int = 0
    appends: int = 0
    deletes: int = 0
    deleted_rows: int = 0
    commit_errors: int = 0
    errors_by_kind: dict = field(default_factory=dict)
    resolved_landed: int = 0
    resolved_not_landed: int = 0
    claim_waits: int = 0
    claim_wait_seconds: float = 0.0
    claim_wait_max_seconds: float = 0.0
    anomalies: list = field(default_factory=list)
    stopped_by: str | None = None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _error_kind(exc: BaseException) -> str:
    """The Java exception's class when py4j carries one (e.g. ValidationException), else the Python class."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            return java.getClass().getSimpleName()
        except Exception:  # the gateway may be unusable; the Python class still says something
            pass
    text = str(exc)
    for name in ("ValidationException", "CommitFailedException", "CommitStateUnknownException",
                 "NotFoundException", "ClaimBusy"):
        if name in text:
            return name
    return type(exc).__name__


class SoakWriter:
    """One table's writer thread: bursts of batches, idle gaps, every commit resolved and ledgered."""

    def __init__(self, spark, config, plan: dict, ledger_path: Path, stop: threading.Event):
        from icemaint.safety.claims import table_claim

        self.plan = plan
        self.spec = WorkloadSpec(table=plan["table"], days=plan["days"], rows_per_day=plan["rows_per_day"],
                                 delete_every=plan["delete_every"], deletes_per_batch=plan["deletes_per_batch"],
                                 start_date=dt.date.fromisoformat(plan["start_date"]), seed=plan["seed"])
        self.ledger_path = ledger_path
        self.ledger = Ledger.load(ledger_path) if ledger_path.exists() else Ledger()
        self.stats = WriterStats(self.spec.table_name.key, bool(plan["claim"]))
        self.stop = stop
        self.rng = random.Random(f"{plan['seed']}/schedule")
        self.spark = spark
        self._lock = threading.Lock()

        @contextlib.contextmanager
        def timed_claim():
            t0 = time.monotonic()
            with table_claim(config, self.spec.table, holder=f"soak-writer:{plan['name']}",
                             wait_seconds=plan.get("claim_wait_seconds", 900), poll_seconds=0.2) as claim:
                waited = time.monotonic() - t0
                with self._lock:
                    if waited > 0.5:
                        self.stats.claim_waits += 1
                    self.stats.claim_wait_seconds = round(self.stats.claim_wait_seconds + waited, 1)
                    self.stats.claim_wait_max_seconds = round(max(self.stats.claim_wait_max_seconds, waited), 1)
                yield claim

        self.writer = StreamingWriter(spark, config.catalog.name, self.spec, ledger=self.ledger,
                                      claim_factory=timed_claim if plan["claim"] else None,
                                      on_commit=self._committed)

    # -- the table ----------------------------------------------------------------------------------
    def _committed(self, batch: int, kind: str) -> None:
        self.ledger.save(self.ledger_path)
        with self._lock:
            if kind == "append":
                self.stats.appends += 1
            else:
                self.stats.deletes += 1
                self.stats.deleted_rows += len(self.ledger.history[-1].get("deleted_ids", []))

    def _count(self, where: str) -> int:
        return int(self.spark.sql(f"SELECT count(*) AS n FROM {self.writer.table_sql} WHERE {where}").first()["n"])

    def _anomaly(self, what: str, **details) -> None:
        log.error("%s: %s %s", self.spec.table, what, details)
        with self._lock:
            self.stats.anomalies.append({"at": _now(), "what": what, **details})

    # -- one batch -----------------------------------------------------------------------------------
    def one_batch(self) -> None:
        batch = self.writer.next_batch
        try:
            result = self.writer.write_batch()
        except Exception as exc:
            kind = _error_kind(exc)
            with self._lock:
                self.stats.commit_errors += 1
                self.stats.errors_by_kind[kind] = self.stats.errors_by_kind.get(kind, 0) + 1
            log.warning("%s batch %d: %s: %s", self.spec.table, batch, kind, str(exc).splitlines()[0][:300]
                        if str(exc) else "")
            self._resolve(batch, kind)
            return
        with self._lock:
            self.stats.batches += 1
        if result.append_snapshot_id is None:
            # The append returned, but no snapshot carries its batch: a commit the catalog lost?
            landed = self._count(self._batch_where(batch))
            self._anomaly("append returned but no snapshot carries its batch", batch=batch, rows_read=landed)
        if result.deleted_ids:
            still = self._count(f"event_id IN ({', '.join(map(str, result.deleted_ids))})")
            if still:
                self._anomaly("delete returned but its rows are still read", batch=batch, ids=list(result.deleted_ids),
                              rows_read=still, delete_snapshot_id=result.delete_snapshot_id)

    def _batch_where(self, batch: int) -> str:
        first = batch * ID_STRIDE
        return f"event_id BETWEEN {first} AND {first + self.spec.rows_per_batch - 1}"

    def _resolve(self, batch: int, kind: str) -> None:
        """A commit raised: did it land? Read the rows back; ledger only what is on `main`."""
        for attempt in range(RESOLVE_TRIES):
            try:
                self._resolve_once(batch, kind)
                self.ledger.save(self.ledger_path)
                return
            except Exception as exc:  # the read itself can race a commit; try again
                log.warning("%s: resolving batch %d failed (try %d): %s", self.spec.table, batch, attempt + 1, exc)
                time.sleep(min(2 ** attempt, 20))
        self._anomaly("could not resolve an uncertain commit; the writer stops", batch=batch)
        raise RuntimeError(f"{self.spec.table}: batch {batch} unresolved")

    def _resolve_once(self, batch: int, kind: str) -> None:
        if self.writer.next_batch == batch:  # the append raised
            ids = [r[0] for r in batch_rows(self.spec, batch)]
            read = self._count(self._batch_where(batch))
            if read == len(ids):
                self.ledger.record_append(batch, ids, self.writer._snapshot_of_batch(batch))
                self._landed("append", batch, kind)
            elif read == 0:
                self._not_landed("append", batch, kind)
            else:
                self._anomaly("a failed append left part of its rows", batch=batch, rows_read=read, rows=len(ids))
                raise RuntimeError("partial append")
            return
        if not self.spec.deletes_due(batch):  # the append landed and nothing else was due: nothing to resolve
            return
        last = self.ledger.history[-1] if self.ledger.history else {}
        if last.get("batch") == batch and last.get("kind") == "delete":
            return  # the delete landed and was ledgered; what raised came after it

        # The append landed, the delete raised: the same seeded choice write_batch made.
        ids = choose_deletes(self.ledger.expected_ids(), self.spec.deletes_per_batch, self.spec.seed, batch)
        if not ids:
            return
        read = self._count(f"event_id IN ({', '.join(map(str, ids))})")
        if read == 0:
            self.ledger.record_delete(batch, ids, None)
            self._landed("delete", batch, kind)
        elif read == len(ids):
            self._not_landed("delete", batch, kind)
        else:
            self._anomaly("a failed delete removed part of its rows", batch=batch, ids=ids, rows_read=read)
            raise RuntimeError("partial delete")

    def _landed(self, what: str, batch: int, kind: str) -> None:
        log.warning("%s batch %d: the %s raised %s but landed: ledgered", self.spec.table, batch, what, kind)
        with self._lock:
            self.stats.resolved_landed += 1

    def _not_landed(self, what: str, batch: int, kind: str) -> None:
        with self._lock:
            self.stats.resolved_not_landed += 1

    # -- the thread ----------------------------------------------------------------------------------
    def run(self) -> None:
        lo, hi = self.plan["burst"]
        try:
            while not self.stop.is_set():
                for _ in range(self.rng.randint(lo, hi)):
                    if self.stop.is_set():
                        break
                    self.one_batch()
                    self.stop.wait(self.rng.uniform(*self.plan["gap_seconds"]))
                self.stop.wait(self.rng.uniform(*self.plan["idle_seconds"]))
            self.stats.stopped_by = "stop"
        except BaseException as exc:
            self.stats.stopped_by = f"error: {type(exc).__name__}: {exc}"
            log.error("%s: writer stopped: %s", self.spec.table, traceback.format_exc())
        finally:
            self.ledger.save(self.ledger_path)

    def summary(self) -> dict:
        with self._lock:
            return {**asdict(self.stats), "next_batch": self.writer.next_batch,
                    "expected_rows": self.ledger.expected_count(), "written_rows": len(self.ledger.written),
                    "ledger": str(self.ledger_path)}


def _write_json(path: Path, doc) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reliability.writers")
    p.add_argument("--config", required=True)
    p.add_argument("--work", required=True, type=Path)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark

    config = load_config(args.config)
    plans = json.loads((args.work / "writers.json").read_text())
    spark = get_spark(config)
    stop = threading.Event()
    writers = [SoakWriter(spark, config, plan, args.work / "ledgers" / f"{plan['table']}.ledger.json", stop)
               for plan in plans]
    for w in writers:  # one at a time: concurrent CREATE NAMESPACE on a Hadoop catalog can collide
        w.writer.create_table()
        w.one_batch()
    _write_json(args.work / "writers.ready.json", {"at": _now(), "tables": [w.spec.table for w in writers]})
    threads = [threading.Thread(target=w.run, name=f"writer-{w.plan['name']}", daemon=True) for w in writers]
    for t in threads:
        t.start()
    stop_file = args.work / "stop"
    while not stop_file.exists() and any(t.is_alive() for t in threads):
        _write_json(args.work / "writers.status.json", {"at": _now(), "writers": [w.summary() for w in writers]})
        time.sleep(3)
    stop.set()
    for t in threads:
        t.join()
    _write_json(args.work / "writers.done.json", {"at": _now(), "writers": [w.summary() for w in writers]})
    spark.stop()
    return 0 if all(w.stats.stopped_by == "stop" for w in writers) else 1


if __name__ == "__main__":
    sys.exit(main())
