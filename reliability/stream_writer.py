"""The streaming soak's writer: one process, one Spark session, a commit a second that never stops (as a Flink
or Kafka Connect job does, it ignores the table's claim).

Each commit is one of:
- an append of `rows` rows into the *current* date, which advances on a simulated calendar (a new date every
  `day_seconds`, from `start_date`), so that dates go cold inside a soak of minutes;
- now and then (`late_probability`) late rows into the previous date;
- now and then (`delete_probability`) a merge-on-read DELETE of a few live rows of the current or previous date.

The ledger (DIR/ledger.json) holds the ids appended and deleted and, per date, the time of the writer's last
commit into it (`last_begin`/`last_end`: before the call was made and after it returned; the commit's snapshot
lies between). It is saved after each commit known to have landed. A commit that raised may still have landed:
as in reliability/writers.py it is resolved by reading its rows back before the next commit (maintenance never
adds or removes a row), and only then ledgered and counted.

    python -m reliability.stream_writer --config CONFIG --work DIR

reads DIR/stream_writer.json (the plan), writes DIR/writers.ready.json after the table exists and the first
commit landed, DIR/writers.status.json every few seconds, and DIR/writers.done.json once DIR/stop appears.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import random
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from icemaint.app.simulator import Ledger, WorkloadSpec, delete_sql
from reliability.writers import RESOLVE_TRIES, _error_kind, _write_json

log = logging.getLogger("reliability.stream_writer")
ID_STRIDE = 1_000  # event_id = commit * ID_STRIDE + row


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds")


@dataclass
class StreamLedger:
    """What landed: the ids (a simulator Ledger, so reliability.figures checks them) and, per date, the writer's
    commits into it and the time of its last one."""

    ledger: Ledger = field(default_factory=Ledger)
    dates: dict = field(default_factory=dict)  # date -> {appends, late, deletes, first_end, last_begin, last_end}
    next_commit: int = 0

    def landed(self, date: str, kind: str, begin: dt.datetime, end: dt.datetime) -> None:
        d = self.dates.setdefault(date, {"appends": 0, "late": 0, "deletes": 0, "first_end": _iso(end)})
        d[{"append": "appends", "late": "late", "delete": "deletes"}[kind]] += 1
        d["last_begin"], d["last_end"], d["last_kind"] = _iso(begin), _iso(end), kind

    def to_json(self) -> dict:
        return {"ids": self.ledger.to_json(), "dates": self.dates, "next_commit": self.next_commit}

    @classmethod
    def from_json(cls, doc: dict) -> "StreamLedger":
        return cls(Ledger.from_json(doc["ids"]), dict(doc["dates"]), int(doc["next_commit"]))

    def save(self, path: Path) -> None:
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.to_json(), fh)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "StreamLedger":
        return cls.from_json(json.loads(path.read_text()))


@dataclass
class StreamStats:
    commits: int = 0          # commits that landed (ledgered)
    appends: int = 0
    late: int = 0
    deletes: int = 0
    deleted_rows: int = 0
    commit_errors: int = 0    # commits that raised
    errors_by_kind: dict = field(default_factory=dict)
    error_samples: list = field(default_factory=list)
    resolved_landed: int = 0
    resolved_not_landed: int = 0
    commit_seconds_max: float = 0.0
    commit_seconds_total: float = 0.0
    slow_commits: int = 0     # commits that took longer than the interval
    anomalies: list = field(default_factory=list)
    stopped_by: str | None = None


class StreamWriter:
    def __init__(self, spark, config, plan: dict, ledger_path: Path):
        from icemaint.app.simulator import StreamingWriter

        self.spark, self.plan, self.ledger_path = spark, plan, ledger_path
        self.rng = random.Random(plan["seed"])
        self.start_date = dt.date.fromisoformat(plan["start_date"])
        self.ledger = StreamLedger()
        self.ledger.ledger.table = plan["table"]
        self.stats = StreamStats()
        # the simulator's table (columns, days(ts) partitioning, merge-on-read), created the simulator's way
        self.simulator = StreamingWriter(spark, config.catalog.name, WorkloadSpec(table=plan["table"]))
        self.table_sql = self.simulator.table_sql
        self.live_by_date: dict[str, list[int]] = {}
        self.t0 = time.monotonic()

    # -- the calendar -------------------------------------------------------------------------------------
    def current_date(self) -> dt.date:
        return self.start_date + dt.timedelta(days=int((time.monotonic() - self.t0) // self.plan["day_seconds"]))

    # -- one commit ----------------------------------------------------------------------------------------
    def _rows(self, n: int, date: dt.date) -> list:
        midnight = dt.datetime.combine(date, dt.time(), tzinfo=dt.timezone.utc)
        first = n * ID_STRIDE
        return [(first + j, self.rng.randrange(1, 1001),
                 midnight + dt.timedelta(seconds=self.rng.randrange(86_400), milliseconds=self.rng.randrange(1000)),
                 round(self.rng.gauss(20.0, 5.0), 3), self.rng.choice(("ok", "ok", "ok", "warn", "error")))
                for j in range(self.plan["rows"])]

    def choose(self) -> tuple[str, dt.date]:
        today = self.current_date()
        yesterday = today - dt.timedelta(days=1)
        r = self.rng.random()
        if r < self.plan["delete_probability"]:
            pool = self.live_by_date.get(str(today), []) + self.live_by_date.get(str(yesterday), [])
            if len(pool) > self.plan["deletes_per_commit"]:
                return "delete", today
        if r < self.plan["delete_probability"] + self.plan["late_probability"] and yesterday >= self.start_date:
            return "late", yesterday
        return "append", today

    def commit_once(self) -> None:
        from icemaint.app.simulator import _spark_schema

        kind, date = self.choose()
        n = self.ledger.next_commit
        ids: list[int] = []
        touched: dict[str, list[int]] = {}
        if kind == "delete":
            pool = sorted(set(self.live_by_date.get(str(date), []) +
                              self.live_by_date.get(str(date - dt.timedelta(days=1)), [])))
            ids = sorted(self.rng.sample(pool, self.plan["deletes_per_commit"]))
            for d in (date, date - dt.timedelta(days=1)):
                hit = [i for i in ids if i in set(self.live_by_date.get(str(d), []))]
                if hit:
                    touched[str(d)] = hit
        else:
            rows = self._rows(n, date)
            ids = [r[0] for r in rows]
            df = self.spark.createDataFrame(rows, _spark_schema())
        begin, t0 = _now(), time.monotonic()
        try:
            if kind == "delete":
                self.spark.sql(delete_sql(self.table_sql, ids))
            else:
                df.writeTo(self.table_sql).append()
        except Exception as exc:
            end = _now()
            self._failed(exc)
            landed = self._resolve(kind, ids)
            if landed:
                self._landed(kind, date, n, ids, touched, begin, end)
            self.ledger.next_commit = n + 1  # a not-landed append's ids are never reused
            return
        end = _now()
        seconds = time.monotonic() - t0
        self.stats.commit_seconds_max = round(max(self.stats.commit_seconds_max, seconds), 2)
        self.stats.commit_seconds_total = round(self.stats.commit_seconds_total + seconds, 2)
        self.stats.slow_commits += seconds > self.plan["interval_seconds"]
        self.ledger.next_commit = n + 1
        self._landed(kind, date, n, ids, touched, begin, end)

    def _landed(self, kind: str, date: dt.date, n: int, ids: list[int], touched: dict, begin, end) -> None:
        if kind == "delete":
            self.ledger.ledger.record_delete(n, ids, None)
            for d, hit in touched.items():
                self.live_by_date[d] = [i for i in self.live_by_date[d] if i not in set(hit)]
                self.ledger.landed(d, kind, begin, end)
            self.stats.deletes += 1
            self.stats.deleted_rows += len(ids)
        else:
            self.ledger.ledger.record_append(n, ids, None)
            self.live_by_date.setdefault(str(date), []).extend(ids)
            self.ledger.landed(str(date), kind, begin, end)
            if kind == "late":
                self.stats.late += 1
            else:
                self.stats.appends += 1
        self.stats.commits += 1
        self.ledger.save(self.ledger_path)

    def _failed(self, exc: BaseException) -> None:
        kind = _error_kind(exc)
        self.stats.commit_errors += 1
        self.stats.errors_by_kind[kind] = self.stats.errors_by_kind.get(kind, 0) + 1
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        if len(self.stats.error_samples) < 10:
            self.stats.error_samples.append({"at": _iso(_now()), "kind": kind, "message": first})
        log.warning("commit %d: %s: %s", self.ledger.next_commit, kind, first)

    def _count(self, ids: list[int]) -> int:
        return int(self.spark.sql(f"SELECT count(*) AS n FROM {self.table_sql} WHERE event_id IN "
                                  f"({', '.join(map(str, ids))})").first()["n"])

    def _resolve(self, kind: str, ids: list[int]) -> bool:
        """A commit raised: did it land? Its rows say (all there / none for an append, the reverse for a delete)."""
        for attempt in range(RESOLVE_TRIES):
            try:
                read = self._count(ids)
            except Exception as exc:  # the read can race a commit too
                log.warning("resolving failed (try %d): %s", attempt + 1, exc)
                time.sleep(min(2 ** attempt, 20))
                continue
            landed = read == len(ids) if kind != "delete" else read == 0
            not_landed = read == 0 if kind != "delete" else read == len(ids)
            if landed or not_landed:
                if landed:
                    self.stats.resolved_landed += 1
                    log.warning("the %s raised but landed: ledgered", kind)
                else:
                    self.stats.resolved_not_landed += 1
                return landed
            self.stats.anomalies.append({"at": _iso(_now()), "what": f"a failed {kind} left part of its rows",
                                         "ids": ids[:10], "read": read})
            raise RuntimeError(f"partial {kind}")
        self.stats.anomalies.append({"at": _iso(_now()), "what": "could not resolve an uncertain commit"})
        raise RuntimeError("unresolved commit")

    def run(self, stop_file: Path, status_path: Path) -> None:
        interval = self.plan["interval_seconds"]
        last_status = 0.0
        try:
            while not stop_file.exists():
                t0 = time.monotonic()
                self.commit_once()
                if t0 - last_status > 3:
                    _write_json(status_path, self.summary())
                    last_status = t0
                time.sleep(max(0.0, interval - (time.monotonic() - t0)))
            self.stats.stopped_by = "stop"
        except BaseException as exc:
            self.stats.stopped_by = f"error: {type(exc).__name__}: {exc}"
            log.error("writer stopped: %s", traceback.format_exc())
        finally:
            self.ledger.save(self.ledger_path)

    def summary(self) -> dict:
        return {"at": _iso(_now()), "table": self.plan["table"], "current_date": str(self.current_date()),
                "next_commit": self.ledger.next_commit, "expected_rows": self.ledger.ledger.expected_count(),
                "dates": len(self.ledger.dates), **asdict(self.stats)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reliability.stream_writer")
    p.add_argument("--config", required=True)
    p.add_argument("--work", required=True, type=Path)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark

    config = load_config(args.config)
    plan = json.loads((args.work / "stream_writer.json").read_text())
    spark = get_spark(config)
    writer = StreamWriter(spark, config, plan, args.work / "ledger.json")
    writer.simulator.create_table()
    writer.t0 = time.monotonic()
    writer.commit_once()
    _write_json(args.work / "writers.ready.json", {"at": _iso(_now()), "tables": [plan["table"]]})
    writer.run(args.work / "stop", args.work / "writers.status.json")
    _write_json(args.work / "writers.done.json", {"at": _iso(_now()), "writers": [writer.summary()]})
    spark.stop()
    return 0 if writer.stats.stopped_by == "stop" else 1


if __name__ == "__main__":
    sys.exit(main())
