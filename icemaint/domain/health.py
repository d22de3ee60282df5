"""Table health: pure computation from metadata rows (files, manifests, snapshots) to numbers.

No Spark, no pyiceberg, no Dagster here: `icemaint.observe.manifests` reads the rows, this module counts.
"""

from __future__ import annotations

import datetime as dt
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

# Snapshot operations that only reorganise data. Writers append, overwrite and delete; Iceberg's
# rewrite actions (data files, manifests, position deletes) commit `replace`.
MAINTENANCE_OPERATIONS = frozenset({"replace"})
# A cherry-pick (by someone else) republishes a writer's commit: the writer's activity is the time of
# the source snapshot.
REPUBLISHED_KEY = "source-snapshot-id"
# Set by icemaint on every snapshot it writes: staged appends on a staging branch and publishes.
MAINTENANCE_TAG = "icemaint.maintenance"
STAGE_PREFIX = "icemaint_stage_"  # a staging branch's name: under the table's claim, any such branch is a dead run's


@dataclass(frozen=True)
class FileEntry:
    content: int  # 0 data, 1 position deletes, 2 equality deletes
    size_bytes: int
    record_count: int
    date: dt.date | None
    # The file's partition (`icemaint.domain.layout.partition_key`): set when the table has no time
    # column, whose health is then kept per partition of its layout instead of per date.
    partition: str | None = None
    # A format v3 deletion vector (position deletes of one data file, a blob in a Puffin file)
    deletion_vector: bool = False
    # The snapshot that added the file (a manifest entry's inherited snapshot id): whose commit wrote into the
    # file's partition, read per partition for writer activity (`partition_writer_commits`)
    added_snapshot_id: int | None = None
    # The partition spec the file was written under, and the sort order it was written in (0: unsorted; None:
    # the manifest does not say): layout drift is a data file under another spec or sort order than the table's
    spec_id: int | None = None
    sort_order_id: int | None = None


@dataclass(frozen=True)
class SnapshotEntry:
    snapshot_id: int
    parent_id: int | None
    committed_at: dt.datetime
    operation: str | None
    summary: Mapping[str, str] = field(default_factory=dict)

    @property
    def by_maintenance(self) -> bool:
        return (self.operation in MAINTENANCE_OPERATIONS or REPUBLISHED_KEY in self.summary
                or self.summary.get(MAINTENANCE_TAG) == "true")


@dataclass(frozen=True)
class PartitionHealth:
    """One date of a table (its ISO date is the key), or one partition of a table without a time column."""

    key: str
    data_files: int
    small_files: int
    total_bytes: int
    small_bytes: int
    records: int
    delete_files: int
    delete_records: int
    # of which equality deletes (a CDC writer's): every later read joins them against the date's rows
    equality_delete_files: int = 0
    equality_delete_records: int = 0
    # of which format v3 deletion vectors (one per data file with deleted rows)
    deletion_vectors: int = 0
    delete_bytes: int = 0
    # The newest writer commit on `main` that added or removed files of this partition (ISO), and its age
    # when health was observed: None when none is known (every file it wrote was since rewritten, or the
    # commit is older than the writer-idle window the observer looked back over)
    last_writer_commit_at: str | None = None
    seconds_since_writer_commit: float | None = None
    # Layout drift (`icemaint.domain.drift`): data files written under a partition spec other than the table's
    # default, in a sort order other than the table's (or unsorted, on a table with one), or above
    # max_file_size_ratio x the target size; `drift_*` counts each file a drift rewrite takes once, whatever its
    # drifts (`rewrite_drift`: not a file that only records no sort order)
    old_spec_files: int = 0
    old_spec_bytes: int = 0
    unsorted_files: int = 0
    unsorted_bytes: int = 0
    oversized_files: int = 0
    oversized_bytes: int = 0
    drift_files: int = 0
    drift_bytes: int = 0
    old_spec_ids: tuple[int, ...] = ()  # the specs the old-spec files were written under

    @property
    def deleted_row_ratio(self) -> float:
        return self.delete_records / self.records if self.records else 0.0

    @property
    def position_delete_files(self) -> int:
        """Position-delete files that are neither equality deletes nor deletion vectors (what writers on the
        v2 format without file-scoped deletes leave: one small file per commit that deletes)."""
        return self.delete_files - self.equality_delete_files - self.deletion_vectors

    @property
    def date(self) -> str:
        """The key of a date partition (an ISO date)."""
        return self.key


_COUNTS = ("data_files", "small_files", "total_bytes", "small_bytes", "records", "delete_files", "delete_records",
           "equality_delete_files", "equality_delete_records", "deletion_vectors", "delete_bytes",
           "old_spec_files", "old_spec_bytes", "unsorted_files", "unsorted_bytes", "oversized_files",
           "oversized_bytes", "drift_files", "drift_bytes")
_DRIFT_COUNTS = _COUNTS[-8:]


@dataclass(frozen=True)
class TableHealth:
    table: str
    metadata_location: str
    snapshot_id: int | None
    schema_id: int
    spec_id: int
    time_column: str | None
    time_transform: str | None
    data_files: int
    small_files: int
    total_bytes: int
    avg_file_bytes: float
    median_file_bytes: float
    records: int
    delete_files: int
    delete_records: int
    deleted_row_ratio: float
    manifests: int
    manifest_bytes: int
    small_manifests: int
    snapshots: int
    oldest_snapshot_age_seconds: float
    metadata_files: int
    last_commit_at: str | None
    last_commit_operation: str | None
    last_commit_by: str | None  # "writer" | "maintenance"
    last_writer_commit_at: str | None
    seconds_since_writer_commit: float | None
    small_file_size_bytes: int
    partitions: tuple[PartitionHealth, ...] = ()
    time_column_type: str | None = None  # Iceberg type of time_column ("timestamptz", "date", ...)
    format_version: int = 2
    # Data files on no date: their time value is NULL (the null partition), or they have no bound on it.
    # Per-date sums plus these equal the table totals.
    undated_files: int = 0
    undated_records: int = 0
    # Why the policy's `time_column` cannot date-scope the table (not a column, not a date/timestamp type).
    time_column_problem: str | None = None
    # Why the policy's `sort_order` cannot be applied to the table (`rewrite_plan.sort_order_problem`).
    sort_order_problem: str | None = None
    equality_delete_files: int = 0
    equality_delete_records: int = 0
    deletion_vectors: int = 0
    # bytes of the metadata.json files in the metadata log (and the current one); None when not measured
    # (one stat each: the health report measures them, the sensors' reads do not)
    metadata_bytes: int | None = None
    # metadata.json files in the metadata directory below the log's oldest version, and their bytes: what Iceberg's
    # delete-after-commit would have removed and the expiry step removes (`domain.metadata_files`); None when not
    # measured (a listing of the metadata directory: the health report measures it, the sensors' reads do not)
    metadata_files_below_log: int | None = None
    metadata_bytes_below_log: int | None = None
    # When the ages above were measured (ISO); every other number comes from the immutable metadata file.
    observed_at: str | None = None
    # Whether each partition's last writer commit is known (`PartitionHealth.last_writer_commit_at`): False when
    # the observer met more recent writer commits of unknown partitions than it reads, and writer activity is
    # then judged on the whole table
    writer_partitions_known: bool = True
    # The table's default sort order (0: unsorted) and the size above which a data file counts as oversized
    # (policy max_file_size_ratio x target_file_size_bytes; None: not judged)
    sort_order_id: int = 0
    max_file_size_bytes: int | None = None
    # Each partition spec the table has had, as people read it ("day(ts)", "hour(ts), bucket[16](id)", "unpartitioned")
    specs: Mapping[int, str] = field(default_factory=dict)
    # Layout drift of the whole table (dated and undated files): the sums of `PartitionHealth`'s drift counts
    old_spec_files: int = 0
    old_spec_bytes: int = 0
    unsorted_files: int = 0
    unsorted_bytes: int = 0
    oversized_files: int = 0
    oversized_bytes: int = 0
    drift_files: int = 0
    drift_bytes: int = 0

    def at(self, now: dt.datetime) -> TableHealth:
        """The same health with its ages measured at `now` (a later tick re-deciding a table whose metadata
        location has not moved)."""
        if self.observed_at is None:
            raise ValueError(f"health of {self.table} has no observed_at: its ages cannot be moved")
        shift = (now - dt.datetime.fromisoformat(self.observed_at)).total_seconds()
        since_writer = self.seconds_since_writer_commit
        parts = tuple(p if p.seconds_since_writer_commit is None
                      else replace(p, seconds_since_writer_commit=p.seconds_since_writer_commit + shift)
                      for p in self.partitions)
        return replace(self, observed_at=now.isoformat(), partitions=parts,
                       oldest_snapshot_age_seconds=self.oldest_snapshot_age_seconds + shift,
                       seconds_since_writer_commit=None if since_writer is None else since_writer + shift)

    @property
    def time_partitioned(self) -> bool:
        """Dated by a partition field (so each date's delete files are in the date's own partitions),
        not by the files' bounds on a policy `time_column`."""
        return self.time_column is not None and self.time_transform != "bounds"

    @property
    def dated(self) -> bool:
        """Maintained per date (it has a time column), else per partition of its layout."""
        return self.time_column is not None

    @property
    def maintained_as(self) -> str:
        """How compaction scopes this table, as people read it."""
        if self.dated:
            return f"per date of {self.time_column} ({self.time_transform})"
        if [p.key for p in self.partitions] in ([], [""]):
            return "as a whole (no time column, unpartitioned)"
        return f"per partition of its layout (no time column; {len(self.partitions)} partitions)"

    def partition(self, key: str | None) -> PartitionHealth | None:
        """One partition by its key; None: every partition summed (a run over a table's partitions)."""
        if key is None:
            written = [p for p in self.partitions if p.last_writer_commit_at is not None]
            newest = max(written, key=lambda p: p.last_writer_commit_at or "", default=None)
            return PartitionHealth("", **{f: sum(getattr(p, f) for p in self.partitions) for f in _COUNTS},
                                   old_spec_ids=tuple(sorted({s for p in self.partitions for s in p.old_spec_ids})),
                                   last_writer_commit_at=newest.last_writer_commit_at if newest else None,
                                   seconds_since_writer_commit=newest.seconds_since_writer_commit if newest else None)
        return next((p for p in self.partitions if p.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["scope"] = "date" if self.dated else "partition"
        out["maintained_as"] = self.maintained_as
        out["partitions"] = [{**asdict(p), "date": p.key if self.dated else None} for p in self.partitions]
        return out


def _iso(ts: dt.datetime | None) -> str | None:
    return ts.isoformat() if ts else None


def lineage(snapshots: Sequence[SnapshotEntry], head_id: int | None) -> list[SnapshotEntry]:
    """The snapshots of a branch: `head_id` and its ancestors, newest first.

    Snapshots outside `main`'s lineage (a staging branch's, or ones a rollback left behind) are
    not the table's history: they never count as writer activity.
    """
    by_id = {s.snapshot_id: s for s in snapshots}
    out, cursor, seen = [], head_id, set()
    while cursor is not None and cursor in by_id and cursor not in seen:
        seen.add(cursor)
        out.append(by_id[cursor])
        cursor = by_id[cursor].parent_id
    return out


def last_writer_commit(snapshots: Sequence[SnapshotEntry], head_id: int | None = None) -> dt.datetime | None:
    """When a writer last committed on `main`: the newest non-maintenance snapshot of its lineage.

    With `head_id` None every snapshot counts (callers that hold only a lineage already).
    """
    by_id = {s.snapshot_id: s for s in snapshots}
    latest = None
    for snap in (lineage(snapshots, head_id) if head_id is not None else snapshots):
        if REPUBLISHED_KEY in snap.summary:
            source = by_id.get(int(snap.summary[REPUBLISHED_KEY]))
            when = source.committed_at if source else None
        elif snap.by_maintenance:
            when = None
        else:
            when = snap.committed_at
        if when and (latest is None or when > latest):
            latest = when
    return latest


def writer_commit_times(snapshots: Sequence[SnapshotEntry], head_id: int | None) -> dict[int, dt.datetime]:
    """When each writer commit of `main`'s lineage was made, by snapshot id (a republished commit: its source's
    time). Maintenance commits are not in it."""
    by_id = {s.snapshot_id: s for s in snapshots}
    out: dict[int, dt.datetime] = {}
    for snap in lineage(snapshots, head_id):
        if REPUBLISHED_KEY in snap.summary:
            source = by_id.get(int(snap.summary[REPUBLISHED_KEY]))
            if source is not None:
                out[snap.snapshot_id] = source.committed_at
        elif not snap.by_maintenance:
            out[snap.snapshot_id] = snap.committed_at
    return out


def partition_writer_commits(files: Iterable[FileEntry], touched: Iterable[tuple[int, str]],
                             writer_times: Mapping[int, dt.datetime], dated: bool) -> dict[str, dt.datetime]:
    """The newest writer commit into each partition (its key: an ISO date, or a layout partition key).

    Read from the live files' adding snapshots (free: health reads every live entry), and from `touched`:
    (snapshot id, partition key) pairs the observer read from recent writer snapshots whose own files no
    longer all live (since rewritten or deleted), or that only removed files.
    """
    out: dict[str, dt.datetime] = {}

    def note(key: str | None, snapshot_id: int | None) -> None:
        when = writer_times.get(snapshot_id) if snapshot_id is not None else None
        if key is not None and when is not None and (key not in out or when > out[key]):
            out[key] = when

    for f in files:
        note((f.date.isoformat() if f.date else None) if dated else f.partition, f.added_snapshot_id)
    for snapshot_id, key in touched:
        note(key, snapshot_id)
    return out


def compute_health(
    *,
    table: str,
    metadata_location: str,
    snapshot_id: int | None,
    schema_id: int,
    spec_id: int,
    time_column: str | None,
    time_transform: str | None,
    files: Iterable[FileEntry],
    time_column_type: str | None = None,
    format_version: int = 2,
    time_column_problem: str | None = None,
    sort_order_problem: str | None = None,
    manifest_lengths: Sequence[int],
    snapshots: Sequence[SnapshotEntry],
    metadata_files: int,
    small_file_size_bytes: int,
    metadata_bytes: int | None = None,
    metadata_below_log: tuple[int, int] | None = None,
    small_manifest_bytes: int,
    now: dt.datetime,
    touched: Iterable[tuple[int, str]] = (),
    writer_partitions_known: bool = True,
    sort_order_id: int = 0,
    max_file_size_bytes: int | None = None,
    specs: Mapping[int, str] | None = None,
) -> TableHealth:
    """Health of one table at its current snapshot; `touched` as `partition_writer_commits` reads it;
    `sort_order_id` the table's default sort order and `max_file_size_bytes` the oversized-file limit (layout
    drift)."""
    files = list(files)
    drift = dict.fromkeys(_DRIFT_COUNTS, 0)
    old_specs: dict[str, set[int]] = {}
    data_sizes: list[int] = []
    records = delete_files = delete_records = undated_files = undated_records = 0
    equality_files = equality_records = vectors = 0
    per_date: dict[str, dict[str, int]] = {}
    for f in files:
        key = (f.date.isoformat() if f.date else None) if time_column is not None else f.partition
        part = per_date.setdefault(key, dict.fromkeys(_COUNTS, 0)) if key is not None else None
        if f.content == 0:
            data_sizes.append(f.size_bytes)
            records += f.record_count
            small = f.size_bytes < small_file_size_bytes
            if part is not None:
                part["data_files"] += 1
                part["total_bytes"] += f.size_bytes
                part["records"] += f.record_count
                part["small_files"] += small
                part["small_bytes"] += f.size_bytes if small else 0
            if ((f.spec_id != spec_id and f.spec_id is not None) or (sort_order_id and f.sort_order_id != sort_order_id)
                    or (max_file_size_bytes is not None and f.size_bytes > max_file_size_bytes)):  # the rare case
                _count_drift(f, key, part, drift, old_specs, spec_id, sort_order_id, max_file_size_bytes)
            if part is None and time_column is not None:
                undated_files += 1
                undated_records += f.record_count
        else:
            delete_files += 1
            delete_records += f.record_count
            equality = f.content == 2
            equality_files += equality
            equality_records += f.record_count if equality else 0
            vectors += f.deletion_vector
            if part is not None:
                part["delete_files"] += 1
                part["delete_records"] += f.record_count
                part["delete_bytes"] += f.size_bytes
                part["equality_delete_files"] += equality
                part["equality_delete_records"] += f.record_count if equality else 0
                part["deletion_vectors"] += f.deletion_vector

    ordered = sorted(snapshots, key=lambda s: s.committed_at)
    main = lineage(snapshots, snapshot_id)
    last = main[0] if main else None
    writer_at = last_writer_commit(snapshots, snapshot_id) if snapshot_id is not None else None
    by_partition = partition_writer_commits(files, touched, writer_commit_times(snapshots, snapshot_id),
                                            dated=time_column is not None) if snapshot_id is not None else {}
    total = sum(data_sizes)
    return TableHealth(
        table=table,
        metadata_location=metadata_location,
        snapshot_id=snapshot_id,
        schema_id=schema_id,
        spec_id=spec_id,
        time_column=time_column,
        time_transform=time_transform,
        time_column_type=time_column_type,
        format_version=format_version,
        undated_files=undated_files,
        undated_records=undated_records,
        time_column_problem=time_column_problem,
        sort_order_problem=sort_order_problem,
        data_files=len(data_sizes),
        small_files=sum(1 for s in data_sizes if s < small_file_size_bytes),
        total_bytes=total,
        avg_file_bytes=total / len(data_sizes) if data_sizes else 0.0,
        median_file_bytes=float(statistics.median(data_sizes)) if data_sizes else 0.0,
        records=records,
        delete_files=delete_files,
        delete_records=delete_records,
        deleted_row_ratio=delete_records / records if records else 0.0,
        manifests=len(manifest_lengths),
        manifest_bytes=sum(manifest_lengths),
        small_manifests=sum(1 for m in manifest_lengths if m < small_manifest_bytes),
        snapshots=len(ordered),
        oldest_snapshot_age_seconds=(now - ordered[0].committed_at).total_seconds() if ordered else 0.0,
        metadata_files=metadata_files,
        metadata_bytes=metadata_bytes,
        metadata_files_below_log=metadata_below_log[0] if metadata_below_log else None,
        metadata_bytes_below_log=metadata_below_log[1] if metadata_below_log else None,
        equality_delete_files=equality_files,
        equality_delete_records=equality_records,
        deletion_vectors=vectors,
        last_commit_at=_iso(last.committed_at) if last else None,
        last_commit_operation=last.operation if last else None,
        last_commit_by=("maintenance" if last.by_maintenance else "writer") if last else None,
        last_writer_commit_at=_iso(writer_at),
        seconds_since_writer_commit=(now - writer_at).total_seconds() if writer_at else None,
        small_file_size_bytes=small_file_size_bytes,
        partitions=tuple(PartitionHealth(key=k, **v, old_spec_ids=tuple(sorted(old_specs.get(k, ()))),
                                         last_writer_commit_at=_iso(by_partition.get(k)),
                                         seconds_since_writer_commit=(now - by_partition[k]).total_seconds()
                                         if k in by_partition else None)
                         for k, v in sorted(per_date.items())),
        observed_at=now.isoformat(),
        writer_partitions_known=writer_partitions_known,
        sort_order_id=sort_order_id,
        max_file_size_bytes=max_file_size_bytes,
        specs=dict(specs or {}),
        **drift,
    )


def _count_drift(f: FileEntry, key: str | None, part: dict[str, int] | None, drift: dict[str, int],
                 old_specs: dict[str, set[int]], spec_id: int, sort_order_id: int,
                 max_file_size_bytes: int | None) -> None:
    """Counts a drifted data file on its partition (when it has one) and on the table."""
    kinds = file_drift(f.spec_id, f.sort_order_id, f.size_bytes, spec_id, sort_order_id, max_file_size_bytes)
    if rewrite_drift(kinds, f.sort_order_id):
        kinds += ("drift",)
    for counts in (drift, part) if part is not None else (drift,):
        for kind in kinds:
            counts[f"{kind}_files"] += 1
            counts[f"{kind}_bytes"] += f.size_bytes
    if "old_spec" in kinds and key is not None and f.spec_id is not None:
        old_specs.setdefault(key, set()).add(f.spec_id)


def file_drift(spec_id: int | None, sort_order_id: int | None, size_bytes: int, table_spec_id: int,
               table_sort_order_id: int, max_file_size_bytes: int | None) -> tuple[str, ...]:
    """How one data file drifted from the table's layout: "old_spec", "unsorted", "oversized" (none: in layout).

    A file of an unknown spec (None) is not called old; on a table with a sort order, a file that records no order
    (0 or None) is unsorted, as is one recorded under another order (`rewrite_drift` tells them apart)."""
    kinds = []
    if spec_id is not None and spec_id != table_spec_id:
        kinds.append("old_spec")
    if table_sort_order_id != 0 and sort_order_id != table_sort_order_id:
        kinds.append("unsorted")
    if max_file_size_bytes is not None and size_bytes > max_file_size_bytes:
        kinds.append("oversized")
    return tuple(kinds)


def rewrite_drift(kinds: tuple[str, ...], sort_order_id: int | None) -> bool:
    """Whether a file's drift (`file_drift`) is worth a rewrite: an old spec, oversized, or not in the table's sort
    order. A file that records no order (0) on a sorted table counts: Iceberg's Spark writers before 1.11 record none
    even when they sort (apache/iceberg#13634), so it cannot be told from a file written before the order was added;
    the layout rewrite sorts by the table's order and records it on its files (`engine.relayout`), so a date is
    rewritten for it once, not at every tick."""
    return "old_spec" in kinds or "oversized" in kinds or "unsorted" in kinds
