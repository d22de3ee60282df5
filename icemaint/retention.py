"""Retention on Spark: snapshot expiry, orphan-file removal and manifest rewrites.

Owns the pure plans and due-checks behind them (`plan_expiry`, `expiry_due`, `manifests_due`) and the
Iceberg calls that carry them out, each with a dry run that computes the same numbers and changes nothing.
"""

from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable, Mapping
from urllib.parse import urlsplit

from icemaint.names import TableName
from icemaint.policy import TablePolicy

MAIN_BRANCH = "main"
# Iceberg's remove_orphan_files procedure refuses younger cutoffs: files of a commit still in
# flight look like orphans until that commit lands.
ORPHAN_MIN_AGE = timedelta(hours=24)
_QUARANTINE_STAMP = "%Y%m%dT%H%M%S%fZ"
_CATALOG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Iceberg's default `commit.manifest.target-size-bytes`, used only to estimate a dry run.
_MANIFEST_TARGET_BYTES = 8 * 2**20


class RetentionError(ValueError):
    """A retention setting or request that is not allowed; the message names the setting."""


# --------------------------------------------------------------------------------------------
# Table history as planning sees it
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: int
    parent_id: int | None
    timestamp_ms: int
    operation: str | None = None
    manifest_list: str | None = None

    @property
    def committed_at(self) -> datetime:
        return _from_ms(self.timestamp_ms)


@dataclass(frozen=True)
class SnapshotRef:
    """A branch or tag with the ref's own retention settings (None: the table's defaults apply)."""

    snapshot_id: int
    kind: str = "BRANCH"  # "BRANCH" or "TAG"
    min_snapshots_to_keep: int | None = None
    max_snapshot_age_ms: int | None = None
    max_ref_age_ms: int | None = None

    @classmethod
    def branch(cls, snapshot_id: int, **settings) -> "SnapshotRef":
        return cls(snapshot_id, "BRANCH", **settings)

    @classmethod
    def tag(cls, snapshot_id: int, **settings) -> "SnapshotRef":
        return cls(snapshot_id, "TAG", **settings)

    @property
    def is_branch(self) -> bool:
        return self.kind == "BRANCH"


# --------------------------------------------------------------------------------------------
# Pure planning
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpiryPlan:
    """What one expire_snapshots call will do.

    `older_than` and `retain_last` are the exact procedure arguments; `expiring_snapshot_ids` is
    exactly the set Iceberg removes with them on the planned table state; `protected` says why
    each remaining snapshot stays. `notes` records every adjustment made to the request.
    """

    older_than: datetime
    retain_last: int
    keep_files: bool
    expiring_snapshot_ids: tuple[int, ...]
    protected: Mapping[int, str]
    requested_older_than: datetime
    snapshot_count: int
    dropped_refs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def is_noop(self) -> bool:
        return not self.expiring_snapshot_ids and not self.dropped_refs


def _aware(value: datetime, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise RetentionError(f"{what} must be a timezone-aware datetime (e.g. datetime.now(timezone.utc)), got {value!r}")
    return value.astimezone(timezone.utc)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)


# Integer arithmetic, not float timestamps: the cutoff literal must hit a snapshot's millisecond exactly.
def _ms(value: datetime) -> int:
    return (value - _EPOCH) // _ONE_MS


def _from_ms(ms: int) -> datetime:
    return _EPOCH + ms * _ONE_MS


def _seconds(value: float, setting: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RetentionError(f"{setting}={value!r} is not a number of seconds")
    if value < 0:
        raise RetentionError(f"{setting}={value!r} is negative; an age must be zero or more seconds")
    return float(value)


def _retain_last(value: int, setting: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RetentionError(f"{setting}={value!r} is not allowed; it must be a whole number of at least 1 "
                             "(the current snapshot is always kept)")
    return value


def _ancestry(head: int, by_id: Mapping[int, SnapshotInfo]) -> list[SnapshotInfo]:
    """The head and its ancestors, newest first, stopping where history was already expired."""
    chain, seen, current = [], set(), head
    while current is not None and current in by_id and current not in seen:
        seen.add(current)
        chain.append(by_id[current])
        current = by_id[current].parent_id
    return chain


def _kept_refs(refs: Mapping[str, SnapshotRef], by_id: Mapping[int, SnapshotInfo], now_ms: int) -> dict[str, SnapshotRef]:
    """Refs Iceberg keeps: main always; others while their snapshot exists and is within max_ref_age."""
    kept = {}
    for name, ref in refs.items():
        if name == MAIN_BRANCH:
            kept[name] = ref
            continue
        snap = by_id.get(ref.snapshot_id)
        if snap is None:
            continue
        if ref.max_ref_age_ms is None or now_ms - snap.timestamp_ms <= ref.max_ref_age_ms:
            kept[name] = ref
    return kept


def procedure_retains(snapshots: Iterable[SnapshotInfo], refs: Mapping[str, SnapshotRef], older_than_ms: int,
                      retain_last: int, now_ms: int) -> set[int]:
    """The snapshot ids Iceberg's expire_snapshots keeps for these arguments.

    A transcription of `org.apache.iceberg.RemoveSnapshots` (1.10): kept refs' snapshots; per branch,
    the ancestors walked newest first while fewer than min-snapshots-to-keep are kept or the
    ancestor is not older than the cutoff (the walk stops at the first one that is); snapshots on
    no branch's ancestry that are not older than the cutoff. Per-ref settings override the defaults.
    """
    by_id = {s.snapshot_id: s for s in snapshots}
    kept_refs = _kept_refs(refs, by_id, now_ms)
    retained = {ref.snapshot_id for ref in kept_refs.values()}
    on_a_branch: set[int] = set()
    for ref in kept_refs.values():
        if not ref.is_branch:
            on_a_branch.add(ref.snapshot_id)
            continue
        cutoff = now_ms - ref.max_snapshot_age_ms if ref.max_snapshot_age_ms is not None else older_than_ms
        keep = ref.min_snapshots_to_keep if ref.min_snapshots_to_keep is not None else retain_last
        chain = _ancestry(ref.snapshot_id, by_id)
        # The whole ancestry counts as referenced, also beyond where the retention walk stops.
        on_a_branch.update(s.snapshot_id for s in chain)
        walked: set[int] = set()
        for snap in chain:
            if len(walked) < keep or snap.timestamp_ms >= cutoff:
                walked.add(snap.snapshot_id)
            else:
                break
        retained |= walked
    retained |= {s.snapshot_id for s in by_id.values()
                 if s.snapshot_id not in on_a_branch and s.timestamp_ms >= older_than_ms}
    return retained & set(by_id)


def _cutoff_to_keep(snapshot_id: int, by_id: Mapping[int, SnapshotInfo], refs: Mapping[str, SnapshotRef],
                    retain_last: int) -> int | None:
    """The newest cutoff (ms) at which the procedure keeps `snapshot_id`, or None if no cutoff can."""
    best: int | None = None
    on_branch = False
    for ref in refs.values():
        if not ref.is_branch:
            continue
        chain = _ancestry(ref.snapshot_id, by_id)
        ids = [s.snapshot_id for s in chain]
        if snapshot_id not in ids:
            continue
        on_branch = True
        if ref.max_snapshot_age_ms is not None:
            continue  # this branch ignores our cutoff
        keep = ref.min_snapshots_to_keep if ref.min_snapshots_to_keep is not None else retain_last
        position = ids.index(snapshot_id)
        if position < keep:
            return by_id[snapshot_id].timestamp_ms + 1  # kept at any cutoff
        # Every ancestor between the retained head and this one must pass the cutoff.
        needed = min(s.timestamp_ms for s in chain[keep:position + 1])
        best = needed if best is None else max(best, needed)
    if not on_branch:
        return by_id[snapshot_id].timestamp_ms
    return best


def plan_expiry(snapshots: list[SnapshotInfo], refs: Mapping[str, SnapshotRef], now: datetime, policy: TablePolicy, *,
                older_than_seconds: float | None = None, retain_last: int | None = None,
                keep_files: bool | None = None, in_flight_snapshot_ids: Iterable[int] = frozenset()) -> ExpiryPlan:
    """Plans which snapshots one expire_snapshots call removes, never the ones that must stay.

    Kept always: the current snapshot, every branch head and tagged snapshot, the newest
    `retain_last` of each branch, snapshots younger than the owner's `snapshot_min_age`, and
    snapshots an in-flight maintenance run is based on. The procedure takes a cutoff, not ids,
    so the cutoff is lowered to the newest one at which all of these survive; the plan's
    expiring ids are then exactly what Iceberg expires with the plan's arguments.

    Overrides: an explicit `older_than_seconds` inside the owner's window is refused. The
    policy's own `snapshot_older_than` is clamped to the window (noted in the plan). Without an
    explicit override, more than `snapshot_max_count` snapshots raises the cutoff so that only
    the newest `snapshot_max_count` remain, again never inside the window.

    Args:
        snapshots: The table's snapshots (see `read_snapshots`).
        refs: Branches and tags by name, with their own retention settings.
        now: The planning time (timezone-aware).
        policy: The table's policy.
        older_than_seconds: Expire snapshots older than this; default the policy's.
        retain_last: Snapshots of each branch always kept; default the policy's.
        keep_files: Expire the snapshots but leave their files on disk; default the policy's.
        in_flight_snapshot_ids: Snapshots running maintenance is based on.

    Raises:
        RetentionError: read-only policy, retain_last < 1, negative ages, an override inside the
            owner's window, or a snapshot that must stay but that no cutoff can keep.
    """
    now = _aware(now, "now")
    if policy.read_only:
        raise RetentionError("the table's policy is read_only: snapshot expiry is not allowed")
    min_age = _seconds(policy.snapshot_min_age_seconds, "snapshot_min_age")
    policy_older = _seconds(policy.snapshot_older_than_seconds, "snapshot_older_than")
    keep = _retain_last(policy.snapshot_retain_last if retain_last is None else retain_last, "retain_last")
    max_count = policy.snapshot_max_count
    if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
        raise RetentionError(f"snapshot_max_count={max_count!r} must be a whole number of at least 1")
    notes: list[str] = []
    if older_than_seconds is not None:
        older = _seconds(older_than_seconds, "older_than")
        if older < min_age:
            raise RetentionError(
                f"older_than={older:g}s is inside the owner's retention window snapshot_min_age={min_age:g}s: "
                f"snapshots younger than that are never expired; ask for {min_age:g}s or more")
    else:
        older = policy_older

    by_id = {s.snapshot_id: s for s in snapshots}
    now_ms = _ms(now)
    window_ms = now_ms - int(min_age * 1000)
    requested_ms = now_ms - int(older * 1000)
    cutoff = requested_ms
    if older_than_seconds is None and len(by_id) > max_count:
        newest = sorted((s.timestamp_ms for s in by_id.values()), reverse=True)
        if newest[max_count - 1] > cutoff:
            cutoff = newest[max_count - 1]
            notes.append(f"{len(by_id)} snapshots exceed snapshot_max_count={max_count}: cutoff raised to keep the newest {max_count}")
    if cutoff > window_ms:
        cutoff = window_ms
        notes.append(f"cutoff clamped to the owner's retention window snapshot_min_age={min_age:g}s")

    kept_refs = _kept_refs(refs, by_id, now_ms)
    dropped = tuple(sorted(set(refs) - set(kept_refs)))
    if dropped:
        notes.append(f"Iceberg drops refs past their max-ref-age or pointing at missing snapshots: {', '.join(dropped)}")
    must_keep: dict[int, list[str]] = {}

    def require(sid: int, why: str) -> None:
        if sid in by_id:
            must_keep.setdefault(sid, []).append(why)

    main = refs.get(MAIN_BRANCH)
    if main is not None:
        require(main.snapshot_id, "current snapshot")
    for name, ref in sorted(kept_refs.items()):
        if name != MAIN_BRANCH:
            require(ref.snapshot_id, f"head of branch {name!r}" if ref.is_branch else f"tagged {name!r}")
    for sid in in_flight_snapshot_ids:
        require(int(sid), "an in-flight maintenance run is based on it")
    for s in by_id.values():
        if s.timestamp_ms > window_ms:
            require(s.snapshot_id, f"younger than the owner's retention window ({min_age:g}s)")

    first_cutoff = cutoff
    retained = procedure_retains(by_id.values(), kept_refs, cutoff, keep, now_ms)
    lowered_for: list[int] = []
    for _ in range(len(by_id) + 1):
        missing = sorted(set(must_keep) - retained)
        if not missing:
            break
        for sid in missing:
            needed = _cutoff_to_keep(sid, by_id, kept_refs, keep)
            if needed is None:
                raise RetentionError(
                    f"snapshot {sid} must stay ({'; '.join(must_keep[sid])}) but a branch's own "
                    "max-snapshot-age setting expires it whatever the cutoff; change that branch's retention first")
            if needed < cutoff:
                cutoff = needed
                lowered_for.append(sid)
        retained = procedure_retains(by_id.values(), kept_refs, cutoff, keep, now_ms)
    else:  # pragma: no cover - lowering the cutoff only ever keeps more
        raise RetentionError("could not find a cutoff that keeps every protected snapshot")
    if lowered_for:
        notes.append(f"cutoff lowered from {_from_ms(first_cutoff).isoformat()} to {_from_ms(cutoff).isoformat()} "
                     f"so that protected snapshots {sorted(set(lowered_for))} survive")

    protected: dict[int, str] = {}
    branch_newest = {s.snapshot_id for ref in kept_refs.values() if ref.is_branch
                     for s in _ancestry(ref.snapshot_id, by_id)[:keep]}
    for sid in sorted(retained):
        if sid in must_keep:
            protected[sid] = "; ".join(must_keep[sid])
        elif sid in branch_newest:
            protected[sid] = f"one of the newest {keep} snapshots of a branch (retain_last)"
        elif by_id[sid].timestamp_ms < first_cutoff:
            protected[sid] = "kept by the cutoff lowered for a protected snapshot"
        else:
            protected[sid] = "not older than the cutoff"
    return ExpiryPlan(
        older_than=_from_ms(cutoff),
        retain_last=keep,
        keep_files=policy.keep_files if keep_files is None else bool(keep_files),
        expiring_snapshot_ids=tuple(sorted(set(by_id) - retained)),
        protected=protected,
        requested_older_than=_from_ms(requested_ms),
        snapshot_count=len(by_id),
        dropped_refs=dropped,
        notes=tuple(notes),
    )


def expiry_due(snapshot_count: int, oldest_snapshot_age_seconds: float, policy: TablePolicy) -> tuple[bool, str]:
    """Whether snapshot expiry is worth a run, and why (or why not)."""
    if isinstance(snapshot_count, bool) or not isinstance(snapshot_count, int) or snapshot_count < 0:
        raise RetentionError(f"snapshot_count={snapshot_count!r} must be a whole number of zero or more")
    age = _seconds(oldest_snapshot_age_seconds, "oldest_snapshot_age_seconds")
    if policy.read_only:
        return False, "the table's policy is read_only"
    if snapshot_count <= policy.snapshot_retain_last:
        return False, f"{snapshot_count} snapshots, retain_last={policy.snapshot_retain_last} keeps them all"
    if age <= policy.snapshot_min_age_seconds:
        return False, (f"the oldest snapshot is {age:g}s old, inside the owner's retention window "
                       f"snapshot_min_age={policy.snapshot_min_age_seconds:g}s")
    if snapshot_count > policy.snapshot_max_count:
        return True, f"{snapshot_count} snapshots exceed snapshot_max_count={policy.snapshot_max_count}"
    cutoff = max(policy.snapshot_older_than_seconds, policy.snapshot_min_age_seconds)
    if age > cutoff:
        return True, f"the oldest snapshot is {age:g}s old, older than snapshot_older_than={cutoff:g}s"
    return False, (f"{snapshot_count} snapshots (max {policy.snapshot_max_count}), the oldest {age:g}s old "
                   f"(expiry after {cutoff:g}s)")


def manifests_due(manifest_count: int, small_manifest_count: int, policy: TablePolicy) -> tuple[bool, str]:
    """Whether rewriting manifests is worth a run: enough manifests and at least two small ones to merge."""
    for name, value in (("manifest_count", manifest_count), ("small_manifest_count", small_manifest_count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RetentionError(f"{name}={value!r} must be a whole number of zero or more")
    if small_manifest_count > manifest_count:
        raise RetentionError(f"small_manifest_count={small_manifest_count} exceeds manifest_count={manifest_count}")
    if policy.read_only:
        return False, "the table's policy is read_only"
    if manifest_count < policy.manifest_min_count:
        return False, f"{manifest_count} manifests, below manifest_min_count={policy.manifest_min_count}"
    if small_manifest_count < 2:
        return False, (f"{manifest_count} manifests but {small_manifest_count} smaller than "
                       f"manifest_small_bytes={policy.manifest_small_bytes}: nothing to merge")
    return True, (f"{manifest_count} manifests (manifest_min_count={policy.manifest_min_count}), "
                  f"{small_manifest_count} smaller than {policy.manifest_small_bytes} bytes")


def orphan_cutoff(now: datetime, policy: TablePolicy) -> datetime:
    """The policy's orphan cutoff: files older than this and unreferenced are orphans."""
    return _aware(now, "now") - timedelta(seconds=_seconds(policy.orphan_older_than_seconds, "orphan_older_than"))


# --------------------------------------------------------------------------------------------
# Spark side
# --------------------------------------------------------------------------------------------

def _catalog(catalog: str) -> str:
    if not isinstance(catalog, str) or not _CATALOG.match(catalog):
        raise RetentionError(f"catalog name {catalog!r} is not a plain identifier")
    return f"`{catalog}`"


def _table(table: TableName | str) -> TableName:
    return table if isinstance(table, TableName) else TableName.parse(table)


def _timestamp_literal(value: datetime) -> str:
    # Explicit UTC offset: the literal must not depend on the session time zone.
    value = _aware(value, "timestamp")
    return "TIMESTAMP '" + value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}Z'"


def _metadata_table(catalog: str, table: TableName, name: str) -> str:
    return f"{table.sql(catalog)}.`{name}`"


def _java_table(spark, catalog: str, table: TableName):
    """The Iceberg Java `Table` behind the Spark catalog (same cache as Spark SQL)."""
    return spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, f"{catalog}.{table.key}")


def _table_properties(spark, catalog: str, table: TableName) -> dict[str, str]:
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES {table.sql(catalog)}").collect()}


def _check_gc_enabled(spark, catalog: str, table: TableName) -> None:
    if _table_properties(spark, catalog, table).get("gc.enabled", "true").lower() == "false":
        raise RetentionError(f"table {table.key} has gc.enabled=false: Iceberg refuses to expire snapshots "
                             "or remove files (they may belong to other tables)")


def read_snapshots(spark, catalog: str, table: TableName | str) -> tuple[list[SnapshotInfo], dict[str, SnapshotRef]]:
    """The table's snapshots and refs from its `snapshots` and `refs` metadata tables.

    The table-wide `history.expire.max-ref-age-ms` is folded into refs that have no own setting,
    so planning sees the same ref ages Iceberg applies.
    """
    table = _table(table)
    _catalog(catalog)
    snaps = [
        SnapshotInfo(int(r["snapshot_id"]), None if r["parent_id"] is None else int(r["parent_id"]),
                     int(r["ts_ms"]), r["operation"], r["manifest_list"])
        for r in spark.sql(
            "SELECT snapshot_id, parent_id, unix_millis(committed_at) AS ts_ms, operation, manifest_list "
            f"FROM {_metadata_table(catalog, table, 'snapshots')}").collect()
    ]
    table_max_ref_age = _table_properties(spark, catalog, table).get("history.expire.max-ref-age-ms")
    refs = {}
    for r in spark.sql(f"SELECT * FROM {_metadata_table(catalog, table, 'refs')}").collect():
        max_ref_age = r["max_reference_age_in_ms"]
        if max_ref_age is None and table_max_ref_age is not None:
            max_ref_age = int(table_max_ref_age)
        refs[r["name"]] = SnapshotRef(
            int(r["snapshot_id"]), r["type"].upper(),
            None if r["min_snapshots_to_keep"] is None else int(r["min_snapshots_to_keep"]),
            None if r["max_snapshot_age_in_ms"] is None else int(r["max_snapshot_age_in_ms"]),
            None if max_ref_age is None else int(max_ref_age))
    return sorted(snaps, key=lambda s: (s.timestamp_ms, s.snapshot_id)), refs


class _Files:
    """File operations through Hadoop's FileSystem, so they work wherever Spark reads the table."""

    def __init__(self, spark):
        self._jvm = spark._jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def _path(self, location: str):
        return self._jvm.org.apache.hadoop.fs.Path(location)

    def _fs(self, path):
        return path.getFileSystem(self._conf)

    def qualify(self, location: str) -> str:
        path = self._path(location)
        return str(self._fs(path).makeQualified(path).toString())

    def exists(self, location: str) -> bool:
        path = self._path(location)
        return bool(self._fs(path).exists(path))

    def size(self, location: str) -> int | None:
        path = self._path(location)
        fs = self._fs(path)
        return int(fs.getFileStatus(path).getLen()) if fs.exists(path) else None

    def delete(self, location: str) -> bool:
        path = self._path(location)
        return bool(self._fs(path).delete(path, False))

    def delete_tree(self, location: str) -> bool:
        path = self._path(location)
        return bool(self._fs(path).delete(path, True))

    def move(self, source: str, target: str) -> None:
        src, dst = self._path(source), self._path(target)
        fs = self._fs(dst)
        fs.mkdirs(dst.getParent())
        if not fs.rename(src, dst):
            raise RetentionError(f"could not move {source} to {target}")

    def children(self, location: str) -> list[str]:
        path = self._path(location)
        fs = self._fs(path)
        if not fs.exists(path):
            return []
        return [str(status.getPath().toString()) for status in fs.listStatus(path)]


def _normalized(uri: str) -> tuple[str, str, str]:
    parts = urlsplit(uri)
    return parts.scheme.lower(), parts.netloc, posixpath.normpath(parts.path)


def _relative_under(root: str, candidate: str) -> str | None:
    """`candidate`'s path relative to `root`, or None unless it lies strictly inside `root`."""
    r_scheme, r_net, r_path = _normalized(root)
    c_scheme, c_net, c_path = _normalized(candidate)
    if (r_scheme, r_net) != (c_scheme, c_net) or ".." in candidate.split("/"):
        return None
    prefix = r_path.rstrip("/") + "/"
    return c_path[len(prefix):] if c_path.startswith(prefix) and len(c_path) > len(prefix) else None


# ---- expiry ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpiryResult:
    """What an expiry did (or, in a dry run, would do). File counts and bytes are measured, not
    taken from the procedure: predicted from metadata before the call and, after a real run,
    counted only for files that are really gone."""

    table: str
    dry_run: bool
    keep_files: bool
    older_than: datetime
    retain_last: int
    snapshots_before: int
    snapshots_after: int
    expired_snapshot_ids: tuple[int, ...]
    data_files_deleted: int = 0
    delete_files_deleted: int = 0
    manifests_deleted: int = 0
    manifest_lists_deleted: int = 0
    bytes_reclaimed: int = 0
    files_left_unreferenced: int = 0
    bytes_left_unreferenced: int = 0
    procedure_counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _ReleasedFile:
    path: str
    kind: str  # data | delete | manifest | manifest_list
    size: int


def _files_released(spark, catalog: str, table: TableName, snapshots: list[SnapshotInfo],
                    expiring: set[int]) -> list[_ReleasedFile]:
    """Files that only the expiring snapshots reference: what Iceberg deletes when they expire."""
    if not expiring:
        return []
    retained = sorted(s.snapshot_id for s in snapshots if s.snapshot_id not in expiring)
    files_sql = _metadata_table(catalog, table, "files")
    # One query per retained snapshot: Spark resolves several `VERSION AS OF` reads of the same
    # metadata table inside one query to a single version (a UNION of them silently lost files).
    live_in_retained: set[str] = set()
    for sid in retained:
        live_in_retained.update(r["file_path"] for r in spark.sql(
            f"SELECT file_path FROM {files_sql} VERSION AS OF {int(sid)}").collect())
    released = [
        _ReleasedFile(r["file_path"], "data" if r["content"] == 0 else "delete", int(r["file_size_in_bytes"]))
        for r in spark.sql("SELECT DISTINCT content, file_path, file_size_in_bytes "
                           f"FROM {_metadata_table(catalog, table, 'all_files')}").collect()
        if r["file_path"] not in live_in_retained
    ]
    manifests: dict[str, tuple[int, set[int]]] = {}
    for r in spark.sql(f"SELECT path, length, reference_snapshot_id FROM "
                       f"{_metadata_table(catalog, table, 'all_manifests')}").collect():
        entry = manifests.setdefault(r["path"], (int(r["length"]), set()))
        entry[1].add(int(r["reference_snapshot_id"]))
    released += [_ReleasedFile(path, "manifest", length)
                 for path, (length, refs) in sorted(manifests.items()) if refs <= expiring]
    files = _Files(spark)
    for snap in snapshots:
        if snap.snapshot_id in expiring and snap.manifest_list:
            released.append(_ReleasedFile(snap.manifest_list, "manifest_list", files.size(snap.manifest_list) or 0))
    return released


def _check_plan_current(plan: ExpiryPlan, snapshots: list[SnapshotInfo], refs: Mapping[str, SnapshotRef],
                        table: TableName) -> set[int]:
    now_ms = _ms(datetime.now(timezone.utc))
    retained = procedure_retains(snapshots, refs, _ms(plan.older_than), plan.retain_last, now_ms)
    expiring = {s.snapshot_id for s in snapshots} - retained
    if expiring != set(plan.expiring_snapshot_ids):
        raise RetentionError(
            f"the expiry plan for {table.key} is stale: with its arguments Iceberg would now expire "
            f"{sorted(expiring)} instead of the planned {sorted(plan.expiring_snapshot_ids)}; plan again")
    return expiring


def expire_snapshots(spark, catalog: str, table: TableName | str, plan: ExpiryPlan, *,
                     dry_run: bool = False) -> ExpiryResult:
    """Expires the planned snapshots with Iceberg's `expire_snapshots`.

    The table is read again first; if Iceberg would now expire anything other than the planned
    snapshots (the table moved on), nothing runs and `RetentionError` says so. With
    `plan.keep_files` the snapshots are expired through the Java API with
    `cleanExpiredFiles(false)` (the procedure has no such argument): files stay on disk and are
    left to orphan-file removal.

    Args:
        spark: The SparkSession with the Iceberg catalog.
        catalog: Spark catalog name.
        table: The table.
        plan: From `plan_expiry`.
        dry_run: Compute the same numbers and change nothing.

    Returns:
        ExpiryResult with snapshot counts, files deleted per kind and bytes reclaimed.
    """
    table = _table(table)
    catalog_sql = _catalog(catalog)
    _retain_last(plan.retain_last, "plan.retain_last")
    _aware(plan.older_than, "plan.older_than")
    _check_gc_enabled(spark, catalog, table)
    snapshots, refs = read_snapshots(spark, catalog, table)
    expiring = _check_plan_current(plan, snapshots, refs, table)
    released = _files_released(spark, catalog, table, snapshots, expiring)
    base = dict(table=table.key, dry_run=dry_run, keep_files=plan.keep_files, older_than=plan.older_than,
                retain_last=plan.retain_last, snapshots_before=len(snapshots))

    if dry_run or (not expiring and not plan.dropped_refs):
        # Nothing to expire: no call, so no new metadata version either.
        gone = [] if plan.keep_files else released
        left = released if plan.keep_files else []
        return ExpiryResult(**base, snapshots_after=len(snapshots) - len(expiring),
                            expired_snapshot_ids=tuple(sorted(expiring)), **_tally(gone, left))

    counts: dict[str, int] = {}
    if plan.keep_files:
        (_java_table(spark, catalog, table).expireSnapshots()
         .expireOlderThan(_ms(plan.older_than)).retainLast(plan.retain_last)
         .cleanExpiredFiles(False).commit())
    else:
        row = spark.sql(
            f"CALL {catalog_sql}.system.expire_snapshots(table => {table.procedure_arg()}, "
            f"older_than => {_timestamp_literal(plan.older_than)}, retain_last => {int(plan.retain_last)}, "
            "stream_results => true)").collect()[0]
        counts = {k: int(v) for k, v in row.asDict().items()}
    after, _ = read_snapshots(spark, catalog, table)
    expired = {s.snapshot_id for s in snapshots} - {s.snapshot_id for s in after}
    files = _Files(spark)
    gone = [f for f in released if not files.exists(f.path)]
    left = [f for f in released if files.exists(f.path)]
    result = ExpiryResult(**base, snapshots_after=len(after), expired_snapshot_ids=tuple(sorted(expired)),
                          procedure_counts=counts, **_tally(gone, left))
    if expired != expiring:
        raise RetentionError(
            f"expire_snapshots on {table.key} expired {sorted(expired)} but the plan said "
            f"{sorted(expiring)}: a concurrent commit changed the table; result: {result}")
    return result


def _tally(gone: list[_ReleasedFile], left: list[_ReleasedFile]) -> dict[str, int]:
    def count(kind: str) -> int:
        return sum(1 for f in gone if f.kind == kind)
    return dict(data_files_deleted=count("data"), delete_files_deleted=count("delete"),
                manifests_deleted=count("manifest"), manifest_lists_deleted=count("manifest_list"),
                bytes_reclaimed=sum(f.size for f in gone),
                files_left_unreferenced=len(left), bytes_left_unreferenced=sum(f.size for f in left))


# ---- orphans --------------------------------------------------------------------------------

@dataclass(frozen=True)
class OrphanResult:
    """Orphan files found under the table location and what happened to them."""

    table: str
    dry_run: bool
    forced: bool
    older_than: datetime
    table_location: str
    candidates: tuple[str, ...]
    bytes: int
    deleted: tuple[str, ...] = ()
    quarantined_to: str | None = None
    moved: tuple[tuple[str, str], ...] = ()


def remove_orphan_files(spark, catalog: str, table: TableName | str, *, older_than: datetime, now: datetime,
                        force: bool = False, dry_run: bool = False,
                        quarantine_dir: str | None = None) -> OrphanResult:
    """Deletes (or quarantines) files under the table location that no retained snapshot or metadata
    file references and that are older than `older_than`.

    Candidates are listed by Iceberg without deleting anything (the procedure's dry run; for a
    forced cutoff under 24 h, which the procedure refuses, the Java `deleteOrphanFiles` action with
    a collecting, non-deleting delete function). Every candidate is then checked to lie inside the
    table location; if one does not, nothing is touched. Files are deleted, or moved to
    `quarantine_dir/<table>/<UTC stamp>/<path relative to the table location>`.

    Raises:
        RetentionError: a cutoff in the future, a cutoff under 24 h without `force`, a candidate
            outside the table location, or gc.enabled=false on the table.
    """
    table = _table(table)
    catalog_sql = _catalog(catalog)
    now = _aware(now, "now")
    older_than = _aware(older_than, "older_than")
    if older_than > now:
        raise RetentionError(f"older_than={older_than.isoformat()} is after now={now.isoformat()}: "
                             "files still being written would look orphaned")
    if now - older_than < ORPHAN_MIN_AGE and not force:
        raise RetentionError(
            f"older_than={older_than.isoformat()} is less than 24 h before now: files of commits still in "
            "flight would look orphaned and be deleted; use a cutoff of 24 h or more, or force=True "
            "when no writer can be active")
    _check_gc_enabled(spark, catalog, table)
    jtable = _java_table(spark, catalog, table)
    files = _Files(spark)
    location = files.qualify(str(jtable.location()))
    if quarantine_dir is not None and (_relative_under(location, files.qualify(quarantine_dir)) is not None
                                       or _normalized(files.qualify(quarantine_dir)) == _normalized(location)):
        raise RetentionError(f"quarantine_dir {quarantine_dir} is inside the table location {location}: "
                             "quarantined files would be orphans of the table again")

    if force and now - older_than < ORPHAN_MIN_AGE:
        jvm = spark._jvm
        # Stream.builder() is a Consumer<String> that only collects: the action deletes nothing.
        action_result = (jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession)
                         .deleteOrphanFiles(jtable).olderThan(_ms(older_than))
                         .deleteWith(jvm.java.util.stream.Stream.builder()).execute())
        listed = [str(p) for p in action_result.orphanFileLocations()]
    else:
        listed = [r["orphan_file_location"] for r in spark.sql(
            f"CALL {catalog_sql}.system.remove_orphan_files(table => {table.procedure_arg()}, "
            f"older_than => {_timestamp_literal(older_than)}, dry_run => true)").collect()]

    candidates = sorted(files.qualify(p) for p in listed)
    relative = {}
    for path in candidates:
        rel = _relative_under(location, path)
        if rel is None:
            raise RetentionError(f"orphan candidate {path} is not under the table location {location}; "
                                 "nothing was deleted")
        relative[path] = rel
    sizes = {path: files.size(path) or 0 for path in candidates}
    base = dict(table=table.key, dry_run=dry_run, forced=force, older_than=older_than, table_location=location,
                candidates=tuple(candidates), bytes=sum(sizes.values()))
    if dry_run or not candidates:
        return OrphanResult(**base)
    if quarantine_dir is not None:
        target_root = f"{quarantine_dir.rstrip('/')}/{table.key}/{now.strftime(_QUARANTINE_STAMP)}"
        moved = []
        for path in candidates:
            target = f"{target_root}/{relative[path]}"
            files.move(path, target)
            moved.append((path, target))
        return OrphanResult(**base, quarantined_to=target_root, moved=tuple(moved))
    deleted = tuple(path for path in candidates if files.delete(path))
    return OrphanResult(**base, deleted=deleted)


def quarantine_batches(spark, quarantine_dir: str, older_than: datetime) -> dict[str, list[str]]:
    """Quarantine batches (`<dir>/<table>/<stamp>`) quarantined before `older_than`, by table directory name.

    Only directories named with the quarantine stamp count; anything else is left alone.
    """
    older_than = _aware(older_than, "older_than")
    files = _Files(spark)
    found: dict[str, list[str]] = {}
    for table_dir in files.children(quarantine_dir):
        table = table_dir.rstrip("/").rsplit("/", 1)[-1]
        for batch in files.children(table_dir):
            name = batch.rstrip("/").rsplit("/", 1)[-1]
            try:
                stamp = datetime.strptime(name, _QUARANTINE_STAMP).replace(tzinfo=timezone.utc)
            except ValueError:
                continue
            if stamp < older_than:
                found.setdefault(table, []).append(batch)
    return {table: sorted(batches) for table, batches in sorted(found.items())}


def delete_batches(spark, batches: Iterable[str]) -> list[str]:
    """Deletes quarantine batch directories (from `quarantine_batches`); returns those deleted."""
    files = _Files(spark)
    return [batch for batch in batches if files.delete_tree(batch)]


# ---- manifests ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ManifestResult:
    table: str
    dry_run: bool
    manifests_before: int
    bytes_before: int
    manifests_after: int  # in a dry run, an estimate at Iceberg's default 8 MiB target size
    bytes_after: int | None  # unknown in a dry run
    rewritten_manifests: int = 0
    added_manifests: int = 0


def _manifest_stats(spark, catalog: str, table: TableName) -> list:
    return spark.sql(f"SELECT content, partition_spec_id, length FROM "
                     f"{_metadata_table(catalog, table, 'manifests')}").collect()


def rewrite_manifests(spark, catalog: str, table: TableName | str, *, dry_run: bool = False) -> ManifestResult:
    """Rewrites the current snapshot's data manifests into fewer, larger ones (`rewrite_manifests`).

    A dry run reports the current manifests and an estimate of the count afterwards (data
    manifests merged per partition spec up to 8 MiB each; delete manifests are not rewritten).
    """
    table = _table(table)
    catalog_sql = _catalog(catalog)
    before = _manifest_stats(spark, catalog, table)
    base = dict(table=table.key, dry_run=dry_run, manifests_before=len(before),
                bytes_before=sum(int(r["length"]) for r in before))
    if dry_run or not before:
        by_spec: dict[int, int] = {}
        for r in before:
            if r["content"] == 0:
                by_spec[r["partition_spec_id"]] = by_spec.get(r["partition_spec_id"], 0) + int(r["length"])
        estimate = sum(1 for r in before if r["content"] != 0) + sum(
            max(1, math.ceil(total / _MANIFEST_TARGET_BYTES)) for total in by_spec.values())
        return ManifestResult(**base, manifests_after=estimate if before else 0,
                              bytes_after=None if before else 0)
    row = spark.sql(f"CALL {catalog_sql}.system.rewrite_manifests(table => {table.procedure_arg()})").collect()[0]
    after = _manifest_stats(spark, catalog, table)
    return ManifestResult(**base, manifests_after=len(after), bytes_after=sum(int(r["length"]) for r in after),
                          rewritten_manifests=int(row["rewritten_manifests_count"]),
                          added_manifests=int(row["added_manifests_count"]))
