"""Reads Iceberg metadata with pyiceberg (no Spark): table listing, current metadata, health rows.

This is what sensors use: cheap, Spark-free observation (see STACK.md for the measured costs).
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from icemaint.config import MaintenanceConfig, catalog_secret_properties
from icemaint.domain.health import FileEntry, SnapshotEntry, TableHealth, compute_health
from icemaint.domain.names import InvalidTableName, TableName
from icemaint.domain.screen import ManifestSummary, Screened, screen_compaction

log = logging.getLogger(__name__)
EPOCH = dt.date(1970, 1, 1)
TIME_TRANSFORMS = ("hour", "day", "month", "year")


class TableNotFound(LookupError):
    """The catalog has no table of that name."""


class CatalogUnavailable(RuntimeError):
    """The catalog could not be reached or did not answer in time (named with its URI, never a secret)."""


class CatalogDenied(CatalogUnavailable):
    """The catalog answered but refused our credentials (named with its URI and the variables, never a secret)."""


# pyiceberg's answers to a request the catalog would not authorize (wrong keys, a bad signature, no grant).
_DENIED = ("ForbiddenError", "UnauthorizedError", "OAuthError")


@dataclass(frozen=True)
class TimePartitioning:
    column: str | None
    transform: str | None  # hour | day | month | year | identity | "bounds" (from file stats) | None
    source: str            # "partition spec", "policy", or a reason there is none
    column_type: str | None = None  # the column's Iceberg type, e.g. "timestamptz" or "date"

    @property
    def found(self) -> bool:
        return self.column is not None


def partition_date(value: Any, transform: str) -> dt.date | None:
    """The date a partition value of a time transform falls on (month/year: their first day)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, int):
        if transform == "day":
            return EPOCH + dt.timedelta(days=value)
        if transform == "hour":
            return (dt.datetime(1970, 1, 1) + dt.timedelta(hours=value)).date()
        if transform == "month":
            return dt.date(1970 + value // 12, value % 12 + 1, 1)
        if transform == "year":
            return dt.date(1970 + value, 1, 1)
    raise ValueError(f"cannot read a date from partition value {value!r} ({transform})")


def time_partitioning(table, time_column: str | None = None) -> TimePartitioning:
    """The table's time column: from a day/hour/month/year (or identity-on-date) partition field,
    else the policy's `time_column` (files are then dated by their column lower bound)."""
    schema = table.schema()
    spec = table.spec()
    for pf in spec.fields:
        transform = str(pf.transform)
        source = schema.find_field(pf.source_id)
        if transform in TIME_TRANSFORMS:
            # the full path (`st.ts` for a field in a struct), not the leaf name another column may share
            return TimePartitioning(schema.find_column_name(pf.source_id), transform, "partition spec",
                                    str(source.field_type))
        if transform == "identity" and str(source.field_type) == "date":
            return TimePartitioning(schema.find_column_name(pf.source_id), "identity", "partition spec", "date")
    if time_column:
        try:
            field_type = str(schema.find_field(time_column).field_type)
        except ValueError:
            return TimePartitioning(None, None, (
                f"policy time_column {time_column!r} is not a column of the table: name one of its date or timestamp "
                "columns, or remove time_column to have the table compacted per partition of its layout"))
        if field_type not in ("date", "timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns"):
            return TimePartitioning(None, None, (
                f"policy time_column {time_column!r} has type {field_type}: only a date or timestamp column can "
                "date-scope a table (a string or number holding times is not parsed); remove time_column to have "
                "the table compacted per partition of its layout, or name a date/timestamp column"))
        return TimePartitioning(time_column, "bounds", "policy", field_type)
    return TimePartitioning(None, None, "no day/hour/month/year partition and no time_column in policy")


def bounded_rest_catalog(name: str, timeout: float, **properties):
    """pyiceberg's REST catalog with a timeout on every HTTP request, its first config call included.

    pyiceberg 0.12 sets none, so a catalog that accepts the connection and never answers would hang the
    caller (a sensor tick, the CLI) for good.
    """
    from pyiceberg.catalog.rest import RestCatalog

    class BoundedRestCatalog(RestCatalog):
        def _create_session(self):
            session = super()._create_session()
            unbounded = session.request

            def request(method, url, **kwargs):
                if kwargs.get("timeout") is None:
                    kwargs["timeout"] = timeout
                return unbounded(method, url, **kwargs)

            session.request = request
            return session

    return BoundedRestCatalog(name, **properties)


class CatalogReader:
    """Spark-free access to the configured catalog's tables and their metadata."""

    def __init__(self, config: MaintenanceConfig):
        self.config = config
        self._catalog = None

    # -- catalog ---------------------------------------------------------------------------
    def _unavailable(self, exc: BaseException) -> CatalogUnavailable:
        cat = self.config.catalog
        text = (str(exc).strip().splitlines() or [""])[0][:300]
        return CatalogUnavailable(f"catalog {cat.name!r} ({cat.type} at {cat.uri or cat.warehouse}) did not answer: "
                                  f"{type(exc).__name__}: {text}")

    def _denied(self, exc: BaseException) -> CatalogDenied:
        from icemaint.config import SECRET_ENV_PREFIX

        cat = self.config.catalog
        text = (str(exc).strip().splitlines() or [""])[0][:300]
        names = sorted(n for n in os.environ if n.startswith(SECRET_ENV_PREFIX) and os.environ[n])
        return CatalogDenied(f"catalog {cat.name!r} ({cat.type} at {cat.uri or cat.warehouse}) refused the credentials: "
                             f"{text} (credentials from {', '.join(names) or f'no {SECRET_ENV_PREFIX}* variable'})")

    def _answer_or_raise(self, call):
        """Runs one catalog call; a refusal or an unreachable catalog becomes one named error."""
        try:
            return call()
        except (OSError, ConnectionError) as exc:
            raise self._unavailable(exc) from exc
        except Exception as exc:
            if type(exc).__name__ in _DENIED:
                raise self._denied(exc) from None
            if type(exc).__module__.startswith(("requests", "urllib3", "sqlalchemy")):
                raise self._unavailable(exc) from exc
            raise

    def _pyiceberg_catalog(self):
        try:
            return self._open_catalog()
        except (ValueError, TypeError):
            raise  # a configuration mistake, named by pyiceberg
        except Exception as exc:  # network, timeout, refused connection, authentication
            raise self._unavailable(exc) from exc

    def _open_catalog(self):
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            cat = self.config.catalog
            props = {**cat.properties, **catalog_secret_properties(cat)}
            if cat.type == "jdbc":
                self._catalog = load_catalog(cat.name, type="sql", uri=jdbc_to_sqlalchemy(cat.uri, props),
                                             warehouse=cat.warehouse or "")
            elif cat.type == "rest":
                self._catalog = bounded_rest_catalog(cat.name, cat.timeout_seconds, uri=cat.uri,
                                                     warehouse=cat.warehouse or "", **props)
            elif cat.type == "glue":
                self._catalog = load_catalog(cat.name, type="glue", **props)
            else:
                raise AssertionError("the hadoop catalog is read from the warehouse directory")
        return self._catalog

    def read_many(self, fn, tables):
        """`fn` over `tables` with at most `catalog.concurrent_reads` at once, results in order (the
        tick's metadata reads: `icemaint.domain.tick.plan_compaction_tick`'s `read`)."""
        workers = min(self.config.catalog.concurrent_reads, len(tables))
        if workers <= 1:
            return [fn(t) for t in tables]
        from concurrent.futures import ThreadPoolExecutor

        if self.config.catalog.type != "hadoop":
            try:
                self._pyiceberg_catalog()  # opened once, before the threads share it
            except CatalogUnavailable:
                pass  # each table's read reports it, as with one reader
        # The caller's garbage is collected here, in its own thread: a SQLite connection it dropped (Dagster's
        # instance storage) finalized by a collection in a reader thread makes SQLAlchemy log an error.
        gc.collect()
        # A few chunks per worker, not a future per table: at 10,000 tables the futures alone cost
        # more than reading the version hints they wrapped.
        size = -(-len(tables) // (workers * 4))
        chunks = [tables[i:i + size] for i in range(0, len(tables), size)]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="icemaint-metadata") as pool:
            return [r for chunk in pool.map(lambda c: [fn(t) for t in c], chunks) for r in chunk]

    def _table_dir(self, name: TableName) -> Path:
        return Path(self.config.catalog.warehouse, *name.namespace, name.name)

    def list_tables(self) -> list[str]:
        """Every table in the catalog, as `namespace.table` keys (names we cannot handle are skipped)."""
        if self.config.catalog.type == "hadoop":
            root = Path(self.config.catalog.warehouse)
            found = []
            if root.is_dir():
                # A commit replaces the version hint (delete, then rename): a table is also known by its
                # metadata files, so discovery never drops a live table for the instant of a commit.
                for marker in (*root.glob("**/metadata/version-hint.text"), *root.glob("**/metadata/v*.metadata.json")):
                    parts = marker.parent.parent.relative_to(root).parts
                    found.append(".".join(parts))
        else:
            catalog = self._pyiceberg_catalog()
            found = []
            stack = self._answer_or_raise(lambda: list(catalog.list_namespaces()))
            while stack:
                ns = stack.pop()
                found.extend(".".join(ident) for ident in self._answer_or_raise(lambda: catalog.list_tables(ns)))
                stack.extend(self._answer_or_raise(lambda: catalog.list_namespaces(ns)))
        tables = []
        for key in sorted(set(found)):
            try:
                tables.append(TableName.parse(key).key)
            except InvalidTableName as exc:
                log.warning("skipping table %s: %s", key, exc)
        return tables

    def metadata_location(self, table: str) -> str:
        """The table's current metadata file; cheap (one small read for the hadoop catalog)."""
        name = TableName.parse(table)
        if self.config.catalog.type == "hadoop":
            hint = self._table_dir(name) / "metadata" / "version-hint.text"
            try:
                version = hint.read_text().strip()
            except FileNotFoundError:
                version = ""
            if not version.isdigit():
                # A commit replaces the hint (delete, then rename): for that instant it is missing or
                # empty. Iceberg's own HadoopTableOperations then takes the highest vN.metadata.json.
                versions = [int(p.name[1:-len(".metadata.json")]) for p in hint.parent.glob("v*.metadata.json")
                            if p.name[1:-len(".metadata.json")].isdigit()]
                if not versions:
                    raise TableNotFound(f"table {table} not found in catalog {self.config.catalog.name!r} "
                                        f"(no {hint})") from None
                version = str(max(versions))
            return str(hint.parent / f"v{version}.metadata.json")
        return self.load(table).metadata_location

    def load(self, table: str):
        """The pyiceberg table at its current metadata."""
        name = TableName.parse(table)
        if self.config.catalog.type == "hadoop":
            from pyiceberg.table import StaticTable

            return StaticTable.from_metadata(self.metadata_location(table))
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self._pyiceberg_catalog()
        try:
            return self._answer_or_raise(lambda: catalog.load_table((*name.namespace, name.name)))
        except NoSuchTableError:
            raise TableNotFound(f"table {table} not found in catalog {self.config.catalog.name!r}") from None

    # -- health ----------------------------------------------------------------------------
    def health(self, table: str, now: dt.datetime | None = None, loaded=None,
               measure_metadata: bool = False) -> TableHealth:
        """Health numbers of the table's current snapshot (see `icemaint.domain.health`); with
        `measure_metadata`, also the bytes of its metadata.json files (a stat per file in the log)."""
        tbl = loaded if loaded is not None else self.load(table)
        return self._health(table, tbl, current_manifests(tbl), now, measure_metadata)

    def tick_health(self, table: str, now: dt.datetime | None = None) -> TableHealth | Screened:
        """Health as a sensor tick needs it: a table whose manifest list shows that no partition can be
        due (`icemaint.domain.screen`) is `Screened` without reading its manifests."""
        policy = self.config.policy(table)
        tbl = self.load(table)
        manifests = current_manifests(tbl)
        timing = time_partitioning(tbl, policy.time_column)
        if timing.found or not policy.time_column:  # a policy time_column that is wrong is refused in full
            reason = screen_compaction(manifest_summaries(tbl, timing, manifests), policy.min_input_files,
                                       dated=timing.found)
            if reason:
                return Screened(TableName.parse(table).key, tbl.metadata_location, reason)
        return self._health(table, tbl, manifests, now)

    def _health(self, table: str, tbl, manifests: list, now: dt.datetime | None,
                measure_metadata: bool = False) -> TableHealth:
        policy = self.config.policy(table)
        # After the load: a commit that landed while the table was read is not in the future.
        now = now or dt.datetime.now(dt.timezone.utc)
        timing = time_partitioning(tbl, policy.time_column)
        snapshot = tbl.current_snapshot()
        files = list(read_file_entries(tbl, timing, manifests))
        return compute_health(
            table=TableName.parse(table).key,
            metadata_location=tbl.metadata_location,
            snapshot_id=snapshot.snapshot_id if snapshot else None,
            schema_id=tbl.metadata.current_schema_id,
            spec_id=tbl.metadata.default_spec_id,
            time_column=timing.column,
            time_transform=timing.transform,
            time_column_type=timing.column_type,
            format_version=int(tbl.metadata.format_version),
            time_column_problem=timing.source if policy.time_column and not timing.found else None,
            files=files,
            manifest_lengths=[m.manifest_length for m in manifests],
            snapshots=read_snapshots(tbl),
            metadata_files=len(tbl.metadata.metadata_log) + 1,
            metadata_bytes=metadata_log_bytes(tbl) if measure_metadata else None,
            small_file_size_bytes=policy.small_file_size_bytes,
            small_manifest_bytes=policy.manifest_small_bytes,
            now=now,
        )


def metadata_log_bytes(tbl) -> int:
    """Bytes of the table's current metadata.json and of those in its metadata log that still exist."""
    total = 0
    for location in [entry.metadata_file for entry in tbl.metadata.metadata_log] + [tbl.metadata_location]:
        try:
            total += len(tbl.io.new_input(location))
        except FileNotFoundError:  # removed (delete-after-commit, orphan removal) while still listed
            continue
    return total


def read_snapshots(tbl) -> list[SnapshotEntry]:
    out = []
    for snap in tbl.metadata.snapshots:
        summary = snap.summary
        props = dict(summary.additional_properties) if summary else {}
        out.append(SnapshotEntry(
            snapshot_id=snap.snapshot_id,
            parent_id=snap.parent_snapshot_id,
            committed_at=dt.datetime.fromtimestamp(snap.timestamp_ms / 1000, dt.timezone.utc),
            operation=summary.operation.value if summary else None,
            summary=props,
        ))
    return out


def read_retention_signals(tbl, table: str, policy):
    """Snapshot count and age and manifest sizes from a pyiceberg table (reads the manifest list only)."""
    from icemaint.domain.retention_tick import RetentionSignals

    snapshots = tbl.metadata.snapshots
    # Branch heads and tagged snapshots never expire: an old tag must not make expiry due forever.
    referenced = {ref.snapshot_id for ref in tbl.metadata.refs.values()}
    expirable = [s.timestamp_ms for s in snapshots if s.snapshot_id not in referenced]
    lengths = [m.manifest_length for m in current_manifests(tbl)]
    return RetentionSignals(
        table=table, metadata_location=tbl.metadata_location, snapshots=len(snapshots),
        oldest_snapshot_at=min(expirable) / 1000 if expirable else None,
        manifests=len(lengths), small_manifests=sum(1 for n in lengths if n < policy.manifest_small_bytes))


def _spec_time_fields(tbl, column: str | None) -> dict[int, tuple[str, str]]:
    """Per partition spec the table has had: (partition field name, transform) of its time field.

    Files keep the spec they were written with: after `REPLACE PARTITION FIELD days(ts) WITH
    hours(ts)` a date's files carry `ts_day` or `ts_hour` depending on when they were written.
    """
    out: dict[int, tuple[str, str]] = {}
    if column is None:
        return out
    schema = tbl.schema()
    for spec_id, spec in tbl.metadata.specs().items():
        for pf in spec.fields:
            try:
                source = schema.find_field(pf.source_id)
            except ValueError:  # the source column was dropped since
                continue
            transform = str(pf.transform)
            if schema.find_column_name(pf.source_id) != column:
                continue
            if transform in TIME_TRANSFORMS:
                out[spec_id] = (pf.name, transform)
                break
            if transform == "identity" and str(source.field_type) == "date":
                out[spec_id] = (pf.name, "day")
                break
    return out


def current_manifests(tbl) -> list:
    """The current snapshot's manifests (one read of its manifest list); none for an empty table."""
    snapshot = tbl.current_snapshot()
    return list(snapshot.manifests(tbl.io)) if snapshot else []


def manifest_summaries(tbl, timing: TimePartitioning, manifests: list) -> list[ManifestSummary]:
    """The manifest list's numbers per manifest (`icemaint.domain.screen`): live files, and the dates
    their time partitions span (from the partition field summaries; unknown without a time field)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.manifest import ManifestContent
    from pyiceberg.types import IntegerType

    fields = _spec_time_fields(tbl, timing.column)
    specs = tbl.metadata.specs()
    out = []
    for m in manifests:
        added, existing = m.added_files_count, m.existing_files_count
        live = None if added is None or existing is None else added + existing
        first = last = None
        if m.partition_spec_id in fields and m.partitions:
            name, transform = fields[m.partition_spec_id]
            position = [f.name for f in specs[m.partition_spec_id].fields].index(name)
            summary = m.partitions[position] if position < len(m.partitions) else None
            if summary is not None and summary.lower_bound is not None and summary.upper_bound is not None:
                # day/hour/month/year values and dates are all 4-byte ints (days, hours, months, years);
                # files with a null time value are on no date, and counted on every date here (an upper bound)
                first = partition_date(from_bytes(IntegerType(), summary.lower_bound), transform)
                last = partition_date(from_bytes(IntegerType(), summary.upper_bound), transform)
        out.append(ManifestSummary(deletes=m.content != ManifestContent.DATA, live_files=live,
                                   first_date=first, last_date=last))
    return out


def read_file_entries(tbl, timing: TimePartitioning, manifests: list | None = None):
    """The current snapshot's data and delete files, each dated by the table's time column.

    A file is dated by its own spec's time field (every spec the table has had); a file whose spec
    has none (an older, unpartitioned spec, or a policy `time_column`) by the column's lower bound.

    Reads the manifests' entries directly: pyiceberg's `inspect.files()` would also decode every
    column's bounds into an Arrow table, which was most of a sensor tick's time (section 6 of
    benchmarks/RESULTS.md).
    """
    fields = _spec_time_fields(tbl, timing.column)
    paths = _PartitionPaths(tbl) if timing.column is None else None
    bound = _LowerBoundDate(tbl, timing.column) if timing.column else None
    specs = tbl.metadata.specs()
    for manifest in (current_manifests(tbl) if manifests is None else manifests):
        spec_id = manifest.partition_spec_id
        names = [f.name for f in specs[spec_id].fields] if spec_id in specs else []
        for entry in manifest.fetch_manifest_entry(tbl.io, discard_deleted=True):
            f = entry.data_file
            content = int(f.content)
            vector = content == 1 and str(getattr(f.file_format, "value", f.file_format)).upper() == "PUFFIN"
            size, count = f.file_size_in_bytes, f.record_count
            if paths is not None:
                yield FileEntry(content=content, size_bytes=size, record_count=count, date=None,
                                partition=paths.key(spec_id, f.partition), deletion_vector=vector)
                continue
            date = None
            if spec_id in fields:
                name, transform = fields[spec_id]
                date = partition_date(f.partition[names.index(name)], transform)
            else:
                date = bound.date(f.lower_bounds)
            yield FileEntry(content=content, size_bytes=size, record_count=count, date=date, deletion_vector=vector)


class _LowerBoundDate:
    """The date of a file's lower bound of the time column (a file whose spec has no time field)."""

    def __init__(self, tbl, column: str):
        try:
            field = tbl.schema().find_field(column)
        except ValueError:
            field = None
        self.field_id = field.field_id if field is not None else None
        self.kind = str(field.field_type) if field is not None else None

    def date(self, lower_bounds: dict | None) -> dt.date | None:
        from pyiceberg.conversions import from_bytes

        raw = (lower_bounds or {}).get(self.field_id) if self.field_id is not None else None
        if raw is None or self.kind not in _DAYS_PER_UNIT:
            return None
        from pyiceberg.types import DateType, LongType

        value = from_bytes(DateType() if self.kind == "date" else LongType(), raw)
        return EPOCH + dt.timedelta(days=value // _DAYS_PER_UNIT[self.kind])


# A time column's stored unit per day: dates are days, timestamps microseconds, `_ns` nanoseconds.
_DAYS_PER_UNIT = {"date": 1, "timestamp": 86_400_000_000, "timestamptz": 86_400_000_000,
                  "timestamp_ns": 86_400_000_000_000, "timestamptz_ns": 86_400_000_000_000}


class _PartitionPaths:
    """A file's partition key (`icemaint.domain.layout`) from pyiceberg's partition record.

    The path is built as Iceberg's Java `PartitionSpec.partitionToPath` builds it, which is what the
    stager's keys come from; a value pyiceberg cannot render falls back to its plain text.
    """

    def __init__(self, tbl):
        self.specs = tbl.metadata.specs()
        self.schema = tbl.schema()
        self.current = tbl.metadata.default_spec_id

    def key(self, spec_id: int | None, partition) -> str:
        from pyiceberg.typedef import Record

        from icemaint.domain.layout import partition_key

        spec_id = self.current if spec_id is None else spec_id
        spec = self.specs.get(spec_id)
        if spec is None or not spec.fields:
            return partition_key(spec_id, "", self.current)
        values = [partition[i] if partition is not None else None for i in range(len(spec.fields))]
        try:
            path = spec.partition_to_path(Record(*values), self.schema)
        except Exception:  # a label only: never fail health over how a value prints
            path = "/".join(f"{f.name}={v}" for f, v in zip(spec.fields, values))
        return partition_key(spec_id, path, self.current)


def jdbc_to_sqlalchemy(uri: str, props: dict[str, str]) -> str:
    """`jdbc:postgresql://host:port/db` + jdbc.user/jdbc.password -> a SQLAlchemy URI for pyiceberg."""
    if uri.startswith("jdbc:postgresql://"):
        rest = uri[len("jdbc:postgresql://"):]
        user = props.get("jdbc.user") or os.environ.get("PGUSER", "")
        password = props.get("jdbc.password") or os.environ.get("PGPASSWORD", "")
        auth = ""
        if user:
            auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "") + "@"
        return f"postgresql+psycopg2://{auth}{rest}"
    if uri.startswith("jdbc:sqlite:"):
        # jdbc:sqlite:/abs/cat.db -> sqlite:////abs/cat.db (absolute); jdbc:sqlite:cat.db -> sqlite:///cat.db
        return "sqlite:///" + uri[len("jdbc:sqlite:"):]
    raise ValueError(f"catalog.uri {uri!r}: only jdbc:postgresql:// and jdbc:sqlite: JDBC catalogs are supported")
