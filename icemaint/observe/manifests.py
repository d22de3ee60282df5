"""Turns a table's metadata into health inputs (pyiceberg, no Spark): what dates its files fall on.

Owns the reading of one loaded table's metadata, below the catalog: its time partitioning (which
column and transform date its files, for every partition spec it has had), its current manifest list
and the `ManifestSummary` rows the tick's screen reads from it, the `FileEntry` rows of its current
data and delete files, its `SnapshotEntry` rows, the bytes of its metadata log, and the retention
signals. Opening the catalog and loading the table is `icemaint.observe.catalog`'s work.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from icemaint.domain.health import FileEntry, SnapshotEntry
from icemaint.domain.screen import ManifestSummary
from icemaint.observe.manifest_reader import changed_entries, live_entries

EPOCH = dt.date(1970, 1, 1)
TIME_TRANSFORMS = ("hour", "day", "month", "year")


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


def schema_columns(schema) -> dict[str, str]:
    """Every column and struct field path of a pyiceberg schema, with its Iceberg type (`decimal(10, 2)`)."""
    from pyiceberg.schema import index_by_name

    return {name: str(schema.find_type(field_id)) for name, field_id in index_by_name(schema).items()}


def metadata_log_bytes(tbl) -> int:
    """Bytes of the table's current metadata.json and of those in its metadata log that still exist."""
    total = 0
    for location in [entry.metadata_file for entry in tbl.metadata.metadata_log] + [tbl.metadata_location]:
        try:
            total += len(tbl.io.new_input(location))
        except FileNotFoundError:  # removed (delete-after-commit, orphan removal) while still listed
            continue
    return total


def metadata_below_log(tbl, now: dt.datetime) -> tuple[int, int] | None:
    """metadata.json files of the table's metadata directory below its metadata log, and their bytes
    (`domain.metadata_files.stale_metadata_files`, with no age margin); None when the table's FileIO cannot list
    (pyiceberg's PyArrowFileIO can: the local disk, S3, GCS, HDFS)."""
    from icemaint.domain.metadata_files import ListedFile, stale_metadata_files

    fs_by_scheme, parse = getattr(tbl.io, "fs_by_scheme", None), getattr(tbl.io, "parse_location", None)
    if fs_by_scheme is None or parse is None:
        return None
    from pyarrow.fs import FileSelector, FileType

    scheme, netloc, path = parse(tbl.metadata_location)
    directory = path.rsplit("/", 1)[0]
    infos = fs_by_scheme(scheme, netloc).get_file_info(FileSelector(directory, allow_not_found=True))
    listed = [ListedFile(f"{directory}/{i.base_name}", int(i.size or 0),
                         int(i.mtime.timestamp() * 1000) if i.mtime else 0)
              for i in infos if i.type == FileType.File]
    plan = stale_metadata_files(listed, path, [parse(e.metadata_file)[2] for e in tbl.metadata.metadata_log],
                                int(now.timestamp() * 1000), min_age_seconds=0)
    return len(plan.remove), plan.remove_bytes


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


def main_lineage(table) -> Iterable[tuple[int, int | None, str | None, Mapping[str, str]]]:
    """(snapshot id, parent id, operation, summary properties) of a pyiceberg table's `main`, newest first."""
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}  # one pass, however long the history
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary
        operation = summary.operation.value if summary is not None else None
        yield (snapshot.snapshot_id, snapshot.parent_snapshot_id, operation,
               dict(summary.additional_properties) if summary is not None else {})
        snapshot = by_id.get(snapshot.parent_snapshot_id)


def read_retention_signals(tbl, table: str, policy):
    """Snapshot count and age and manifest sizes from a pyiceberg table (reads the manifest list only)."""
    from icemaint.domain.health import STAGE_PREFIX
    from icemaint.domain.retention_tick import RetentionSignals
    from icemaint.observe.statistics import read_statistics_state

    snapshots = tbl.metadata.snapshots
    # Branch heads and tagged snapshots never expire: an old tag must not make expiry due forever.
    referenced = {ref.snapshot_id for ref in tbl.metadata.refs.values()}
    expirable = [s.timestamp_ms for s in snapshots if s.snapshot_id not in referenced]
    lengths = [m.manifest_length for m in current_manifests(tbl)]
    return RetentionSignals(
        table=table, metadata_location=tbl.metadata_location, snapshots=len(snapshots),
        oldest_snapshot_at=min(expirable) / 1000 if expirable else None,
        manifests=len(lengths), small_manifests=sum(1 for n in lengths if n < policy.manifest_small_bytes),
        statistics=read_statistics_state(tbl) if policy.statistics else None,
        staging_branches=sum(1 for name in tbl.metadata.refs if name.startswith(STAGE_PREFIX)))


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


def spec_descriptions(tbl) -> dict[int, str]:
    """Each partition spec the table has had, as people read it: 'day(ts)', 'hour(ts), bucket[16](id)'."""
    schema = tbl.schema()
    out = {}
    for spec_id, spec in tbl.metadata.specs().items():
        parts = []
        for pf in spec.fields:
            try:
                source = schema.find_column_name(pf.source_id) or pf.name
            except ValueError:  # the source column was dropped since
                source = pf.name
            parts.append(f"{pf.transform}({source})")
        out[spec_id] = ", ".join(parts) or "unpartitioned"
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
                                   first_date=first, last_date=last, spec_id=m.partition_spec_id))
    return out


def read_file_entries(tbl, timing: TimePartitioning, manifests: list | None = None):
    """The current snapshot's data and delete files, each dated by the table's time column.

    A file is dated by its own spec's time field (every spec the table has had); a file whose spec
    has none (an older, unpartitioned spec, or a policy `time_column`) by the column's lower bound.

    Reads the manifests' entries directly: pyiceberg's `inspect.files()` would also decode every
    column's bounds into an Arrow table, which was most of a sensor tick's time (section 6 of
    benchmarks/RESULTS.md).
    """
    place = _FilePlace(tbl, timing)
    for manifest in (current_manifests(tbl) if manifests is None else manifests):
        for entry in live_entries(manifest, tbl.io):
            f = entry.data_file
            content = int(f.content)
            vector = content == 1 and str(getattr(f.file_format, "value", f.file_format)).upper() == "PUFFIN"
            date, partition = place.of(manifest.partition_spec_id, f)
            yield FileEntry(content=content, size_bytes=f.file_size_in_bytes, record_count=f.record_count,
                            date=date, partition=partition, deletion_vector=vector,
                            added_snapshot_id=entry.snapshot_id, spec_id=manifest.partition_spec_id,
                            sort_order_id=f.sort_order_id if content == 0 else None)


class _FilePlace:
    """Where a file lies: its date (a table with a time column) or its layout partition key (one without)."""

    def __init__(self, tbl, timing: TimePartitioning):
        self.fields = _spec_time_fields(tbl, timing.column)
        self.paths = _PartitionPaths(tbl) if timing.column is None else None
        self.bound = _LowerBoundDate(tbl, timing.column) if timing.column else None
        self.names = {spec_id: [f.name for f in spec.fields] for spec_id, spec in tbl.metadata.specs().items()}

    def of(self, spec_id: int, f) -> tuple[dt.date | None, str | None]:
        if self.paths is not None:
            return None, self.paths.key(spec_id, f.partition)
        if spec_id in self.fields:
            name, transform = self.fields[spec_id]
            return partition_date(f.partition[self.names[spec_id].index(name)], transform), None
        return self.bound.date(f.lower_bounds), None

    def key(self, spec_id: int, f) -> str | None:
        """The partition's key in health (`PartitionHealth.key`)."""
        date, partition = self.of(spec_id, f)
        return partition if self.paths is not None else (date.isoformat() if date else None)


# Summary counts of a snapshot's own file changes: when its live files account for all of them, the partitions it
# wrote into are known from the live entries alone.
_ADDED_KEYS = ("added-data-files", "added-delete-files")
_REMOVED_KEYS = ("deleted-data-files", "removed-delete-files")
# Recent writer commits whose partitions are read from their own manifests, at most, per health read; past it
# writer activity is judged on the whole table (a writer rewriting much more than it appends, every few seconds).
MAX_WRITER_SNAPSHOTS_READ = 200


def read_writer_touches(tbl, timing: TimePartitioning, files: list[FileEntry], writer_times: dict,
                        since: dt.datetime) -> tuple[list[tuple[int, str]], bool]:
    """The partitions that recent writer commits (committed at or after `since`) touched and the live files do
    not show: (snapshot id, partition key) pairs, and whether every such commit was read.

    A writer commit whose added files all still live is known from them (`partition_writer_commits`); one whose
    files were since rewritten, or that removed files (a delete, an overwrite), is read from the manifests it
    added: its ADDED and DELETED entries. Only the window's commits are read, so a busy table costs the window's
    manifests and an unchanged one nothing more.
    """
    live = {}
    for f in files:
        if f.added_snapshot_id is not None:
            live[f.added_snapshot_id] = live.get(f.added_snapshot_id, 0) + 1
    by_id = {s.snapshot_id: s for s in tbl.metadata.snapshots}
    unexplained = []
    for snapshot_id, when in writer_times.items():
        snap = by_id.get(snapshot_id)
        if when < since or snap is None:
            continue
        props = dict(snap.summary.additional_properties) if snap.summary else {}
        try:
            added = sum(int(props.get(k, 0)) for k in _ADDED_KEYS)
            removed = sum(int(props.get(k, 0)) for k in _REMOVED_KEYS)
        except ValueError:
            added, removed = -1, 0
        if not any(k in props for k in _ADDED_KEYS + _REMOVED_KEYS) or removed or added != live.get(snapshot_id, 0):
            unexplained.append(snap)
    if len(unexplained) > MAX_WRITER_SNAPSHOTS_READ:
        return [], False
    place = _FilePlace(tbl, timing)
    out = []
    for snap in unexplained:
        for manifest in snap.manifests(tbl.io):
            if manifest.added_snapshot_id != snap.snapshot_id:
                continue
            for entry in changed_entries(manifest, tbl.io):
                if entry.snapshot_id == snap.snapshot_id:
                    key = place.key(manifest.partition_spec_id, entry.data_file)
                    if key is not None:
                        out.append((snap.snapshot_id, key))
    return out, True


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
