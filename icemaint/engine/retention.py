"""Retention on Spark: snapshot expiry, and what every retention commit shares (the table, reference and
commit helpers that `icemaint.engine.orphans` and `icemaint.engine.manifests` build on).

Carries out the plans of `icemaint.domain.retention` with Iceberg's procedures and Java API, each with a dry
run that computes the same numbers and changes nothing.

Commits are classified by the Java exception's class, never its message (`java_exception_class`, as a
staged publish is): a writer's conflicting commit raises `RetentionConflict` (nothing changed; plan
again), an unknown commit state is settled by re-reading the table (`RetentionCommitUnknown` when the
commit is not there). Measured under a writer that ignores the claim (appends, and copy-on-write
deletes every other batch, through another catalog instance): 4 of 25 manifest rewrites met a delete
committed while they wrote their manifests and Iceberg refused them (`ValidationException`: "Deleted
manifest ... could not be found in the latest snapshot"); expiry by cutoff alone expired other
snapshots than planned in 6 of 20 calls (a failed run each), which is why the planned snapshot ids are
now named in the call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Mapping

from icemaint.domain.names import TableName
from icemaint.engine.expiry_release import ReleasedFile, files_released
from icemaint.engine.files import Files
from icemaint.engine.java import COMMIT_STATE_UNKNOWN, CONFLICT_CLASSES, java_class, java_exception_class
from icemaint.engine.spark_session import iceberg_table
from icemaint.domain.policy import DEFAULT_CHECKPOINT_MARKERS
from icemaint.domain.retention import (
    ConcurrentExpiry, ExpiryPlan, GcDisabled, RetentionError, SnapshotInfo, SnapshotRef, StaleExpiryPlan, _aware, _ms,
    check_retain_last, expiry_cleanup, marker_keys, procedure_retains,
)
from icemaint.errors import OperationalError, one_line

_CATALOG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Snapshot summary key of a retention commit: found again on `main` when the catalog could not confirm it.
COMMIT_TOKEN_KEY = "icemaint.commit-token"
# Called right before a commit (a test seam: a writer's commit lands between planning and commit).
BeforeCommit = Callable[[], None]


class RetentionConflict(OperationalError, RuntimeError):
    """A writer's commit conflicts with a retention commit and Iceberg refused it; nothing changed.

    Decided by the Java exception's class (`CONFLICT_CLASSES`), never by its message. Plan again.
    """


class RetentionCommitUnknown(OperationalError, RuntimeError):
    """The catalog could not confirm a retention commit and re-reading the table did not find it.

    The commit may still land later; the caller must not retry blindly.
    """


def _java_message(exc: BaseException, cls: str | None) -> str:
    """The first line of the message of the Java exception of class `cls` in `exc`'s cause chain."""
    java, seen = getattr(exc, "java_exception", None), 0
    while java is not None and seen < 10:
        if java.getClass().getName() == cls:
            return one_line(java.getMessage())
        java, seen = java.getCause(), seen + 1
    return ""


def _commit(call: Callable[[], object], before_commit: BeforeCommit | None, landed: Callable[[], bool],
            what: str) -> tuple[object, bool]:
    """Runs one commit; returns (its result, False), or (None, True) when its state was unknown but it landed.

    Raises:
        RetentionConflict: Iceberg refused the commit because of a writer's commit; nothing changed.
        RetentionCommitUnknown: The commit state is unknown and a re-read does not find it.
    """
    from py4j.protocol import Py4JJavaError

    try:
        if before_commit is not None:
            before_commit()
        return call(), False
    except Py4JJavaError as exc:
        cls = java_exception_class(exc)
        first = _java_message(exc, cls)
        if cls in CONFLICT_CLASSES:
            raise RetentionConflict(f"{cls.rsplit('.', 1)[-1]}: {first}") from exc
        if cls == COMMIT_STATE_UNKNOWN:
            if landed():
                return None, True
            raise RetentionCommitUnknown(
                f"the catalog could not confirm the {what} and a re-read of the table does not show it; it may "
                f"still land: {first}") from exc
        raise


# A commit is searched for among `main`'s snapshots no older than this before the call started.
_SEARCH_MARGIN_MS = 300_000


def _marked_snapshot(spark, catalog: str, table: TableName, key: str, value: str, since_ms: int):
    """The snapshot on `main`'s lineage (as the catalog has it now) whose summary has `key` = `value`, or None.

    The walk stops at the first snapshot committed before `since_ms`: the commit looked for is newer.
    """
    jtable = iceberg_table(spark, catalog, table)  # loaded afresh: the session's catalog caches no table
    snap = jtable.currentSnapshot()
    while snap is not None and int(snap.timestampMillis()) >= since_ms:
        if str(snap.summary().get(key)) == value:
            return snap
        parent = snap.parentId()
        snap = jtable.snapshot(parent) if parent is not None else None
    return None


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


def _table_properties(spark, catalog: str, table: TableName) -> dict[str, str]:
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES {table.sql(catalog)}").collect()}


_PROPERTY_KEY = re.compile(r"^[a-z][a-z0-9.-]{0,127}$")
_PROPERTY_VALUE = re.compile(r"^[A-Za-z0-9.-]{1,64}$")


def table_properties(spark, catalog: str, table: TableName | str) -> dict[str, str]:
    table = _table(table)
    _catalog(catalog)
    return _table_properties(spark, catalog, table)


def set_table_properties(spark, catalog: str, table: TableName | str, properties: Mapping[str, str]) -> None:
    """Sets table properties (one metadata commit, no snapshot). Only plain keys and values pass: they are
    the policy's own (validated numbers and booleans under Iceberg's property names)."""
    table = _table(table)
    _catalog(catalog)
    for key, value in properties.items():
        if not _PROPERTY_KEY.match(key) or not _PROPERTY_VALUE.match(value):
            raise RetentionError(f"table property {key!r}={value!r} is not a plain key and value")
    pairs = ", ".join(f"'{key}' = '{value}'" for key, value in sorted(properties.items()))
    spark.sql(f"ALTER TABLE {table.sql(catalog)} SET TBLPROPERTIES ({pairs})")


def _check_gc_enabled(table: TableName, jtable) -> None:
    """Refuses a table whose `gc.enabled` is false (`jtable`: its Java table, as loaded for the work)."""
    if str(jtable.properties().get("gc.enabled") or "true").lower() == "false":
        raise GcDisabled(f"table {table.key} has gc.enabled=false: Iceberg refuses to expire snapshots "
                             "or remove files (they may belong to other tables)")


def read_snapshots(spark, catalog: str, table: TableName | str,
                   markers: tuple[str, ...] = DEFAULT_CHECKPOINT_MARKERS) -> tuple[list[SnapshotInfo], dict[str, SnapshotRef]]:
    """The table's snapshots and refs, from its current metadata as the catalog loads it now.

    One Py4J call brings the metadata as Iceberg writes it (`TableMetadataParser.toJson`), read by
    `snapshots_in_metadata`: no Spark job (the `snapshots` and `refs` metadata tables were two per reading, and an
    expiry reads the table three times).
    """
    table = _table(table)
    _catalog(catalog)
    return _snapshots_of(spark, iceberg_table(spark, catalog, table), markers)


def _snapshots_of(spark, jtable, markers: tuple[str, ...] = DEFAULT_CHECKPOINT_MARKERS
                  ) -> tuple[list[SnapshotInfo], dict[str, SnapshotRef]]:
    """`read_snapshots` of a table already loaded (`iceberg_table`)."""
    parser = java_class(spark._jvm, "org.apache.iceberg.TableMetadataParser")
    return snapshots_in_metadata(json.loads(str(parser.toJson(jtable.operations().current()))), markers)


def snapshots_in_metadata(doc: Mapping, markers: tuple[str, ...] = DEFAULT_CHECKPOINT_MARKERS
                          ) -> tuple[list[SnapshotInfo], dict[str, SnapshotRef]]:
    """Snapshots (oldest first) and refs of a table metadata document (the JSON of a `metadata.json`).

    The table-wide `history.expire.max-ref-age-ms` is folded into refs that have no own setting, so planning sees
    the same ref ages Iceberg applies. Each snapshot carries the summary entries the checkpoint `markers` read
    (and no others).
    """
    keys = marker_keys(markers)

    def number(value) -> int | None:
        return None if value is None else int(value)

    snaps = []
    for snap in doc.get("snapshots") or []:
        summary = dict(snap.get("summary") or {})
        snaps.append(SnapshotInfo(int(snap["snapshot-id"]), number(snap.get("parent-snapshot-id")),
                                  int(snap["timestamp-ms"]), summary.get("operation"), snap.get("manifest-list"),
                                  {k: v for k, v in summary.items() if k in keys}))
    table_max_ref_age = number((doc.get("properties") or {}).get("history.expire.max-ref-age-ms"))
    refs = {}
    for name, ref in (doc.get("refs") or {}).items():
        max_ref_age = number(ref.get("max-ref-age-ms"))
        refs[name] = SnapshotRef(int(ref["snapshot-id"]), str(ref["type"]).upper(),
                                 number(ref.get("min-snapshots-to-keep")), number(ref.get("max-snapshot-age-ms")),
                                 table_max_ref_age if max_ref_age is None else max_ref_age)
    return sorted(snaps, key=lambda s: (s.timestamp_ms, s.snapshot_id)), refs


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
    # The catalog could not confirm the commit; a re-read found the planned snapshots gone. The files
    # they released were not deleted (counted as left unreferenced, for orphan removal).
    state_was_unknown: bool = False
    # Where the released files were (or, in a dry run, would be) deleted: `driver` or `distributed`
    # (`domain.retention.expiry_cleanup`); `none` when the files are kept.
    cleanup: str = "none"


def _check_plan_current(plan: ExpiryPlan, snapshots: list[SnapshotInfo], refs: Mapping[str, SnapshotRef],
                        table: TableName) -> set[int]:
    """The planned snapshots, when Iceberg's rule with the plan's arguments still expires every one of them.

    A writer's commits since planning only add snapshots on top of main; the rule may then expire more than
    was planned (a newer head moves the `retain_last` window), but the call names the planned ids, so only
    those go. A planned snapshot the rule now keeps (a tag or branch made on it since) or that is gone
    makes the plan stale: nothing runs, the caller plans again.
    """
    now_ms = _ms(datetime.now(timezone.utc))
    retained = procedure_retains(snapshots, refs, _ms(plan.older_than), plan.retain_last, now_ms)
    expirable = {s.snapshot_id for s in snapshots} - retained
    planned = set(plan.expiring_snapshot_ids)
    if not planned <= expirable:
        kept = planned - expirable
        raise StaleExpiryPlan(
            f"the expiry plan for {table.key} is stale: planned snapshots {sorted(kept)} are now kept by a ref or "
            "gone; plan again")
    return planned


def expire_snapshots(spark, catalog: str, table: TableName | str, plan: ExpiryPlan, *, io,
                     dry_run: bool = False, before_commit: BeforeCommit | None = None,
                     cleanup: str = "auto") -> ExpiryResult:
    """Expires exactly the planned snapshots with Iceberg's `ExpireSnapshots`, which deletes the files only they
    reference.

    The table is read again first; if Iceberg's rule with the plan's arguments no longer expires every
    planned snapshot (one was tagged or branched since, or is gone), nothing runs and `StaleExpiryPlan`
    says so. A writer's commits on top since planning do not make the plan stale. The call names the
    planned snapshot ids (with a cutoff that expires nothing else), so a writer's commit before or during
    the call cannot make Iceberg expire a snapshot the plan kept (the current snapshot of the planning
    moment, an in-flight run's base).
    Iceberg decides which files go; the prediction made before the call (`expiry_release.files_released`) is then checked
    against what is gone. The cleanup runs in the driver (Iceberg's core `ExpireSnapshots` with
    `cleanExpiredFiles(true)`) on tables up to `domain.retention.DRIVER_CLEANUP_MAX_MANIFESTS` manifests, else
    as Iceberg's `expire_snapshots` procedure, whose Spark action finds the reachable files on the executors;
    `cleanup` forces one. With `plan.keep_files` the snapshots are expired with `cleanExpiredFiles(false)` (the
    procedure has no such argument): files stay on disk and are left to orphan-file removal.

    Args:
        spark: The SparkSession with the Iceberg catalog.
        catalog: Spark catalog name.
        table: The table.
        plan: From `plan_expiry`.
        io: The table's pyiceberg FileIO (`CatalogReader.load(table).io`): reads the manifests the expiry
            releases, to say which files go.
        dry_run: Compute the same numbers and change nothing.
        before_commit: Called right before the commit (a test seam).
        cleanup: `auto`, `driver` or `distributed` (`domain.retention.expiry_cleanup`).

    Returns:
        ExpiryResult with snapshot counts, files deleted per kind and bytes reclaimed.

    Raises:
        StaleExpiryPlan: A planned snapshot is now kept by a ref, or gone; nothing changed.
        RetentionConflict: Iceberg refused the commit because of a writer's commit; nothing changed.
        RetentionCommitUnknown: The catalog could not confirm the commit and the planned snapshots are
            still there after a re-read.
        ConcurrentExpiry: The commit landed but other snapshots are gone than planned (its `result`
            says what the call did).
        RetentionError: Bad plan arguments, or gc.enabled=false.
    """
    table = _table(table)
    catalog_sql = _catalog(catalog)
    check_retain_last(plan.retain_last, "plan.retain_last")
    _aware(plan.older_than, "plan.older_than")
    jtable = iceberg_table(spark, catalog, table)  # one load: the checks and the prediction read the same state
    _check_gc_enabled(table, jtable)
    snapshots, refs = _snapshots_of(spark, jtable)
    expiring = _check_plan_current(plan, snapshots, refs, table)
    released, manifests = files_released(spark, catalog, jtable, _metadata_table(catalog, table, "all_manifests"),
                                         snapshots, expiring, io)
    where = "none" if plan.keep_files else expiry_cleanup(manifests, len(released), cleanup)
    base = dict(table=table.key, dry_run=dry_run, keep_files=plan.keep_files, older_than=plan.older_than,
                retain_last=plan.retain_last, snapshots_before=len(snapshots), cleanup=where)

    if dry_run or (not expiring and not plan.dropped_refs):
        # Nothing to expire: no call, so no new metadata version either.
        gone = [] if plan.keep_files else released
        left = released if plan.keep_files else []
        return ExpiryResult(**base, snapshots_after=len(snapshots) - len(expiring),
                            expired_snapshot_ids=tuple(sorted(expiring)), **_tally(gone, left))

    ids = sorted(expiring)

    def call() -> dict[str, int]:
        if where != "distributed":
            # expireOlderThan(0): no snapshot is older, so only the named ones (and refs Iceberg drops) go. Named
            # ids make Iceberg clean up by reachability (every retained snapshot's manifests read), not by
            # main's ancestry alone.
            update = iceberg_table(spark, catalog, table).expireSnapshots().expireOlderThan(0)
            for sid in ids:
                update = update.expireSnapshotId(int(sid))
            update.cleanExpiredFiles(where == "driver").commit()
            return {}
        named = f"snapshot_ids => array({', '.join(f'{int(sid)}L' for sid in ids)}), " if ids else ""
        row = spark.sql(
            f"CALL {catalog_sql}.system.expire_snapshots(table => {table.procedure_arg()}, "
            f"older_than => TIMESTAMP '1970-01-01 00:00:00.000Z', {named}stream_results => true)").collect()[0]
        return {k: int(v) for k, v in row.asDict().items()}

    def landed() -> bool:
        now = {s.snapshot_id for s in read_snapshots(spark, catalog, table)[0]}
        return bool(ids) and not (set(ids) & now)

    counts, state_was_unknown = _commit(call, before_commit, landed, f"expiry of {table.key}")
    after, _ = read_snapshots(spark, catalog, table)
    expired = {s.snapshot_id for s in snapshots} - {s.snapshot_id for s in after}
    still_there = Files(spark, catalog).sizes(f.path for f in released)
    gone = [f for f in released if still_there[f.path] is None]
    left = [f for f in released if still_there[f.path] is not None]
    result = ExpiryResult(**base, snapshots_after=len(after), expired_snapshot_ids=tuple(sorted(expired)),
                          procedure_counts=counts or {}, state_was_unknown=state_was_unknown, **_tally(gone, left))
    if expired != expiring:
        raise ConcurrentExpiry(
            f"expire_snapshots on {table.key} expired {sorted(expired)} but the plan said "
            f"{sorted(expiring)}: a concurrent commit changed the table; result: {result}", result=result)
    return result


def _tally(gone: list[ReleasedFile], left: list[ReleasedFile]) -> dict[str, int]:
    def count(kind: str) -> int:
        return sum(1 for f in gone if f.kind == kind)
    return dict(data_files_deleted=count("data"), delete_files_deleted=count("delete"),
                manifests_deleted=count("manifest"), manifest_lists_deleted=count("manifest_list"),
                bytes_reclaimed=sum(f.size for f in gone),
                files_left_unreferenced=len(left), bytes_left_unreferenced=sum(f.size for f in left))
