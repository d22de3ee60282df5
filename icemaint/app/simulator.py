"""A seeded, simulated streaming writer: many tiny day-partitioned commits and merge-on-read deletes.

It gives maintenance a realistic high-churn Iceberg table, and keeps a `Ledger` of every row it
wrote and deleted so tests and soak runs can prove that maintenance lost nothing.

Longer than most modules (~500 lines) on purpose: the writer, its ledger and its verification against
the table are one instrument, and a change to one is a change to the others.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Sequence

from icemaint.domain.names import TableName
from icemaint.engine.spark_session import iceberg_table
from icemaint.errors import OperationalError

# event_id = batch * ID_STRIDE + row: ids follow from the batch index alone, so a resumed or
# repeated run writes the same ids for the same batch and two batches never share one.
ID_STRIDE = 1_000_000
# Marks the writer's append snapshots, so a resumed writer can tell whether its ledger is behind.
BATCH_PROPERTY = "icemaint.app.simulator.batch"
STATUSES = ("ok", "ok", "ok", "ok", "warn", "error")

COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "bigint"),
    ("device_id", "int"),
    ("ts", "timestamp"),
    ("reading", "double"),
    ("status", "string"),
)
PARTITIONING = "days(ts)"
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    # Hash distribution sends each day's rows to one task: one small file per day per commit.
    "write.distribution-mode": "hash",
}


class SimulatorError(OperationalError, RuntimeError):
    """The simulated writer cannot go on safely; the message says why and what to do."""


class SchemaMismatch(SimulatorError):
    """The table exists but is not the simulator's table (other columns, types or partitioning)."""


class LedgerBehindTable(SimulatorError):
    """The table already holds batches the ledger does not know: writing would duplicate ids."""


@dataclass(frozen=True)
class WorkloadSpec:
    """What the simulated writer writes: table, days, batch size, delete cadence and seed."""

    table: str = "demo.events"
    days: int = 5
    start_date: dt.date = dt.date(2026, 1, 1)
    rows_per_day: int = 40
    delete_every: int = 4
    deletes_per_batch: int = 3
    seed: int = 7

    def __post_init__(self) -> None:
        TableName.parse(self.table)  # raises InvalidTableName before anything touches Spark
        for name in ("days", "rows_per_day", "delete_every", "deletes_per_batch", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"WorkloadSpec.{name}: {value!r} is not a whole number")
        if self.days < 1:
            raise ValueError(f"WorkloadSpec.days: {self.days} must be at least 1")
        if self.rows_per_day < 1:
            raise ValueError(f"WorkloadSpec.rows_per_day: {self.rows_per_day} must be at least 1")
        if self.days * self.rows_per_day > ID_STRIDE:
            raise ValueError(f"WorkloadSpec: days * rows_per_day = {self.days * self.rows_per_day} "
                             f"is more than {ID_STRIDE} rows per batch")
        if self.delete_every < 0 or self.deletes_per_batch < 0:
            raise ValueError("WorkloadSpec.delete_every and deletes_per_batch must be 0 or more "
                             "(0 turns deletes off)")
        if isinstance(self.start_date, dt.datetime) or not isinstance(self.start_date, dt.date):
            raise ValueError(f"WorkloadSpec.start_date: {self.start_date!r} is not a date")

    @property
    def table_name(self) -> TableName:
        return TableName.parse(self.table)

    @property
    def rows_per_batch(self) -> int:
        return self.days * self.rows_per_day

    def deletes_due(self, batch: int) -> bool:
        """Whether batch `batch` (0-based) ends with a delete: every `delete_every`-th batch."""
        return self.delete_every > 0 and self.deletes_per_batch > 0 and (batch + 1) % self.delete_every == 0


@dataclass(frozen=True)
class BatchResult:
    """What one `write_batch` committed."""

    batch: int
    appended_ids: tuple[int, ...]
    deleted_ids: tuple[int, ...]
    append_snapshot_id: int | None
    delete_snapshot_id: int | None = None


@dataclass
class Ledger:
    """Every event_id the writer committed and deleted, with a per-batch history.

    `expected_ids()` is what `SELECT event_id FROM <table>` must return if nothing was lost.
    """

    table: str | None = None
    written: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    history: list[dict[str, Any]] = field(default_factory=list)

    def expected_ids(self) -> set[int]:
        return self.written - self.deleted

    def expected_count(self) -> int:
        return len(self.written) - len(self.deleted)

    @property
    def next_batch(self) -> int:
        """The index of the next batch to write: one past the last recorded batch."""
        return max((h["batch"] for h in self.history), default=-1) + 1

    def record_append(self, batch: int, ids: Sequence[int], snapshot_id: int | None) -> None:
        self.written.update(ids)
        self.history.append({"batch": batch, "kind": "append", "ids": len(ids),
                             "first_id": min(ids), "last_id": max(ids), "snapshot_id": snapshot_id,
                             "at": _now_iso()})

    def record_delete(self, batch: int, ids: Sequence[int], snapshot_id: int | None) -> None:
        self.deleted.update(ids)
        self.history.append({"batch": batch, "kind": "delete", "ids": len(ids),
                             "deleted_ids": sorted(ids), "snapshot_id": snapshot_id, "at": _now_iso()})

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "written": sorted(self.written), "deleted": sorted(self.deleted),
                "history": self.history}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Ledger":
        try:
            ledger = cls(doc.get("table"), {int(i) for i in doc["written"]},
                         {int(i) for i in doc["deleted"]}, list(doc["history"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a simulator ledger: {exc!r}") from None
        if not ledger.deleted <= ledger.written:
            raise ValueError("not a consistent simulator ledger: it deletes ids it never wrote")
        return ledger

    def save(self, path: str | os.PathLike) -> None:
        """Write the ledger as JSON, atomically (a crash leaves the old file, never half a file)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=p.name, suffix=".tmp", dir=p.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_json(), fh)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Ledger":
        """Read a ledger saved by `save`. Raises ValueError naming the file if it is not one."""
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _rng(seed: int, batch: int, stream: str) -> random.Random:
    # A string seed is hashed with SHA-512, so the stream is the same in every process.
    return random.Random(f"{seed}/{batch}/{stream}")


def batch_rows(spec: WorkloadSpec, batch: int) -> list[tuple[int, int, dt.datetime, float, str]]:
    """The rows of batch `batch`: `rows_per_day` rows on each of the spec's days, seeded.

    Timestamps are timezone-aware UTC so Spark stores the same instant on any machine.
    """
    if batch < 0:
        raise ValueError(f"batch index {batch} is negative")
    rng = _rng(spec.seed, batch, "rows")
    rows = []
    for day in range(spec.days):
        midnight = dt.datetime.combine(spec.start_date + dt.timedelta(days=day), dt.time(),
                                       tzinfo=dt.timezone.utc)
        for j in range(spec.rows_per_day):
            event_id = batch * ID_STRIDE + day * spec.rows_per_day + j
            ts = midnight + dt.timedelta(seconds=rng.randrange(86_400), microseconds=rng.randrange(1000) * 1000)
            rows.append((event_id, rng.randrange(1, 1001), ts, round(rng.gauss(20.0, 5.0), 3),
                         rng.choice(STATUSES)))
    return rows


def choose_deletes(live_ids: Iterable[int], k: int, seed: int, batch: int) -> list[int]:
    """A seeded choice of up to `k` ids from the live ones (any batch), sorted."""
    pool = sorted(live_ids)
    return sorted(_rng(seed, batch, "deletes").sample(pool, min(k, len(pool))))


def delete_sql(table_sql: str, ids: Sequence[int]) -> str:
    """`DELETE ... WHERE event_id IN (...)` built from ints only (anything else is refused)."""
    if not ids:
        raise ValueError("no event ids to delete")
    for i in ids:
        if type(i) is not int:  # bool and numpy ints are refused too: only plain ints reach SQL
            raise TypeError(f"event id {i!r} is not an int; refusing to build the DELETE")
    return f"DELETE FROM {table_sql} WHERE event_id IN ({', '.join(str(i) for i in ids)})"


def _spark_schema():
    from pyspark.sql.types import (DoubleType, IntegerType, LongType, StringType, StructField,
                                   StructType, TimestampType)

    return StructType([StructField("event_id", LongType()), StructField("device_id", IntegerType()),
                       StructField("ts", TimestampType()), StructField("reading", DoubleType()),
                       StructField("status", StringType())])


class StreamingWriter:
    """Appends seeded micro-batches to a day-partitioned merge-on-read table, deleting now and then.

    Every commit runs inside `with claim_factory():` when a factory is given, so the writer never
    commits while maintenance holds the table's claim. `on_commit(batch, kind)` is called after
    each commit (kind is "append" or "delete"), outside the claim.
    """

    def __init__(self, spark, catalog: str, spec: WorkloadSpec, *, ledger: Ledger | None = None,
                 claim_factory: Callable[[], ContextManager[Any]] | None = None,
                 on_commit: Callable[[int, str], None] | None = None) -> None:
        if not isinstance(catalog, str) or not catalog.isidentifier():
            raise ValueError(f"catalog name {catalog!r} must be a plain identifier")
        self.spark = spark
        self.catalog = catalog
        self.spec = spec
        self.name = spec.table_name
        self.ledger = ledger if ledger is not None else Ledger()
        if self.ledger.table is None:
            self.ledger.table = self.name.key
        elif self.ledger.table != self.name.key:
            raise SimulatorError(f"the ledger belongs to table {self.ledger.table!r}, not {self.name.key!r}; "
                                 "use a separate ledger file per table")
        self.claim_factory = claim_factory
        self.on_commit = on_commit
        self._verified = False  # the table and the ledger checked since the last failed write
        self._table_checked = False  # the table found and its shape checked (check_table)

    @property
    def table_sql(self) -> str:
        return self.name.sql(self.catalog)

    @property
    def next_batch(self) -> int:
        return self.ledger.next_batch

    # -- table ------------------------------------------------------------------------------

    def table_exists(self) -> bool:
        return bool(self.spark.catalog.tableExists(self.table_sql))

    def create_table(self) -> None:
        """Create the table if missing; if it exists, check it is the simulator's table.

        Raises:
            SchemaMismatch: the table exists with other columns, types or partitioning.
        """
        if not self.table_exists():
            namespace = ".".join(f"`{p}`" for p in (self.catalog, *self.name.namespace))
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
            columns = ", ".join(f"{col} {typ.upper()}" for col, typ in COLUMNS)
            props = ", ".join(f"'{k}'='{v}'" for k, v in TABLE_PROPERTIES.items())
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {self.table_sql} ({columns}) USING iceberg "
                           f"PARTITIONED BY ({PARTITIONING}) TBLPROPERTIES ({props})")
        self.check_table()  # also when created here: IF NOT EXISTS leaves a table another writer just created

    def check_table(self) -> None:
        """Raise SchemaMismatch unless the table has the simulator's columns and day partitioning."""
        rows = self.spark.sql(f"DESCRIBE TABLE {self.table_sql}").collect()
        columns, partitioning, section = [], [], "columns"
        for row in rows:
            name, typ = row["col_name"], row["data_type"]
            if name.startswith("#"):
                section = name
            elif not name:
                continue
            elif section == "columns":
                columns.append((name, typ))
            elif section == "# Partitioning":
                partitioning.append(typ)
        problems = []
        if tuple(columns) != COLUMNS:
            problems.append(f"columns are {columns}, expected {list(COLUMNS)}")
        if partitioning != [PARTITIONING]:
            problems.append(f"partitioning is {partitioning or 'none'}, expected [{PARTITIONING!r}]")
        if problems:
            raise SchemaMismatch(f"table {self.name.key} exists but is not a simulator table: "
                                 + "; ".join(problems) + ". Use another table name or drop it.")
        self._table_checked = True

    def _highest_committed_batch(self) -> int | None:
        if not iceberg_table(self.spark, self.catalog, self.name).snapshots().iterator().hasNext():
            return None  # a table with no snapshot yet (just created): no batch, and no Spark job to say so
        row = self.spark.sql(
            f"SELECT max(CAST(summary['{BATCH_PROPERTY}'] AS BIGINT)) AS b FROM {self.table_sql}.`snapshots`"
        ).collect()[0]
        return None if row["b"] is None else int(row["b"])

    def _verify(self) -> None:
        """Before the first write (and after a failed one): the right table (unless create_table checked it since),
        the ledger not behind it."""
        if not self._table_checked:
            if not self.table_exists():
                raise SimulatorError(f"table {self.name.key} does not exist; call create_table() first")
            self.check_table()
        highest = self._highest_committed_batch()
        if highest is not None and highest >= self.next_batch:
            raise LedgerBehindTable(
                f"table {self.name.key} already has batch {highest} committed but the ledger's next "
                f"batch is {self.next_batch}: the ledger is stale or belongs to another writer. "
                "Resume with the ledger saved by the writer that wrote this table."
            )
        self._verified = True

    def _snapshot_of_batch(self, batch: int) -> int | None:
        """The append snapshot of `batch` among main's ancestors, newest first: read through Iceberg's Java API
        (a few calls, where a query of the `snapshots` table is a Spark job per batch)."""
        table = iceberg_table(self.spark, self.catalog, self.name)
        snapshot = table.currentSnapshot()
        while snapshot is not None:
            if snapshot.summary().get(BATCH_PROPERTY) == str(int(batch)):
                return int(snapshot.snapshotId())
            parent = snapshot.parentId()
            snapshot = table.snapshot(parent) if parent is not None else None
        return None

    def _current_snapshot(self) -> int | None:
        snapshot = iceberg_table(self.spark, self.catalog, self.name).currentSnapshot()
        return None if snapshot is None else int(snapshot.snapshotId())

    # -- writing ----------------------------------------------------------------------------

    def _claim(self) -> ContextManager[Any]:
        return self.claim_factory() if self.claim_factory is not None else contextlib.nullcontext()

    def write_batch(self) -> BatchResult:
        """Append the next batch (one small file per day) and, when due, delete a few live rows.

        Returns:
            The batch index, the ids appended and deleted, and the snapshots committed.

        Raises:
            SchemaMismatch, LedgerBehindTable, SimulatorError: before anything is written.
        """
        try:
            if not self._verified:
                self._verify()
            return self._write_batch()
        except BaseException:
            # A commit may or may not have landed (or the table went): check both again before the next one.
            self._verified = self._table_checked = False
            raise

    def _write_batch(self) -> BatchResult:
        batch = self.next_batch
        rows = batch_rows(self.spec, batch)
        ids = [r[0] for r in rows]
        clash = self.ledger.written.intersection(ids)
        if clash:
            raise SimulatorError(f"batch {batch} would reuse {len(clash)} event ids already in the ledger "
                                 f"(e.g. {min(clash)}); the ledger history is inconsistent")
        df = self.spark.createDataFrame(rows, _spark_schema())
        append_snapshot = None
        with self._claim():
            df.writeTo(self.table_sql).option(f"snapshot-property.{BATCH_PROPERTY}", str(batch)).append()
            try:
                append_snapshot = self._snapshot_of_batch(batch)
            finally:
                # The append has landed: the ledger must say so even if the lookup failed.
                self.ledger.record_append(batch, ids, append_snapshot)
        if self.on_commit is not None:
            self.on_commit(batch, "append")

        deleted: list[int] = []
        delete_snapshot = None
        if self.spec.deletes_due(batch):
            deleted = choose_deletes(self.ledger.expected_ids(), self.spec.deletes_per_batch,
                                     self.spec.seed, batch)
        if deleted:
            with self._claim():
                self.spark.sql(delete_sql(self.table_sql, deleted))
                try:
                    # Inside the claim no one else commits, so main's head is this delete.
                    delete_snapshot = self._current_snapshot()
                finally:
                    self.ledger.record_delete(batch, deleted, delete_snapshot)
            if self.on_commit is not None:
                self.on_commit(batch, "delete")
        return BatchResult(batch, tuple(ids), tuple(deleted), append_snapshot, delete_snapshot)

    def run(self, batches: int, interval_seconds: float = 0.0,
            stop: threading.Event | None = None) -> Ledger:
        """Write up to `batches` batches, `interval_seconds` apart, until done or `stop` is set."""
        if batches < 0 or interval_seconds < 0:
            raise ValueError("batches and interval_seconds must be 0 or more")
        for i in range(batches):
            if stop is not None and stop.is_set():
                break
            self.write_batch()
            if interval_seconds and i < batches - 1:
                if stop is not None:
                    stop.wait(interval_seconds)
                else:
                    time.sleep(interval_seconds)
        return self.ledger


# -- command line -----------------------------------------------------------------------------

def default_ledger_path(state_dir: str | os.PathLike, table: str) -> Path:
    return Path(state_dir) / "simulator" / f"{TableName.parse(table).key}.ledger.json"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m icemaint.app.simulator",
                                description="Simulated streaming writer for an Iceberg table (resumable).")
    p.add_argument("--config", help="maintenance config file (default: $ICEMAINT_CONFIG or maintenance.yaml)")
    p.add_argument("--table", default=WorkloadSpec.table, help="namespace.table (default %(default)s)")
    p.add_argument("--batches", type=int, default=10, help="batches to write (default %(default)s)")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between batches (default 0)")
    p.add_argument("--ledger", help="ledger JSON to resume and update "
                                    "(default <state_dir>/simulator/<table>.ledger.json)")
    p.add_argument("--days", type=int, default=WorkloadSpec.days)
    p.add_argument("--start-date", type=dt.date.fromisoformat, default=WorkloadSpec.start_date)
    p.add_argument("--rows-per-day", type=int, default=WorkloadSpec.rows_per_day)
    p.add_argument("--delete-every", type=int, default=WorkloadSpec.delete_every)
    p.add_argument("--deletes-per-batch", type=int, default=WorkloadSpec.deletes_per_batch)
    p.add_argument("--seed", type=int, default=WorkloadSpec.seed)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator from the command line; the ledger is saved after every commit."""
    from icemaint.config import load_config
    from icemaint.config.parse import ConfigError

    args = _parser().parse_args(argv)
    try:
        spec = WorkloadSpec(table=args.table, days=args.days, start_date=args.start_date,
                            rows_per_day=args.rows_per_day, delete_every=args.delete_every,
                            deletes_per_batch=args.deletes_per_batch, seed=args.seed)
        if args.batches < 0 or args.interval < 0:
            raise ValueError("--batches and --interval must be 0 or more")
        config = load_config(args.config)
        ledger_path = Path(args.ledger) if args.ledger else default_ledger_path(config.state_dir, spec.table)
        ledger = Ledger.load(ledger_path) if ledger_path.exists() else Ledger()
        if ledger.table not in (None, spec.table_name.key):
            raise ValueError(f"{ledger_path}: the ledger belongs to table {ledger.table!r}, not {spec.table!r}")
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from icemaint.engine.spark_session import get_spark

    writer = StreamingWriter(get_spark(config), config.catalog.name, spec, ledger=ledger,
                             on_commit=lambda batch, kind: ledger.save(ledger_path))
    try:
        writer.create_table()
        writer.run(args.batches, args.interval)
    except SimulatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if ledger.history:  # a refused or empty run leaves no ledger file behind
            ledger.save(ledger_path)
    print(json.dumps({"table": spec.table, "ledger": str(ledger_path), "batches": writer.next_batch,
                      "expected_rows": writer.ledger.expected_count(),
                      "deleted_rows": len(writer.ledger.deleted)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
