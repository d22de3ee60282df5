"""Orphan-file removal on Spark: files under a table's location that nothing retained references, deleted or
moved to a quarantine; and the quarantine's batches, listed and purged.

Iceberg lists the candidates (its `remove_orphan_files` procedure in dry-run mode, or its action), with
Hadoop's FileSystem where Hadoop has one for the table location's scheme, else through the table's FileIO
(`prefix_listing`: object stores such as S3, where a file's age is its object's modification time). We
delete or move them ourselves (`icemaint.engine.files`), after checking each lies inside the table location.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from icemaint.domain.names import TableName
from icemaint.domain.retention import ORPHAN_MIN_AGE, QuarantineMoveFailed, RetentionError, _aware, _ms
from icemaint.domain.units import format_duration
from icemaint.engine.files import Files, normalized, relative_under
from icemaint.engine.java import java_class
from icemaint.engine.retention import _catalog, _check_gc_enabled, _table, _timestamp_literal
from icemaint.engine.spark_session import iceberg_table

QUARANTINE_STAMP = "%Y%m%dT%H%M%S%fZ"


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
                        quarantine_dir: str | None = None, within: str | None = None) -> OrphanResult:
    """Deletes (or quarantines) files under the table location that no retained snapshot or metadata
    file references and that are older than `older_than`.

    Candidates are listed by Iceberg without deleting anything (the procedure's dry run; for a
    forced cutoff under 24 h, which the procedure refuses, the Java `deleteOrphanFiles` action with
    a collecting, non-deleting delete function). Every candidate is then checked to lie inside the
    table location; if one does not, nothing is touched. Files are deleted, or moved to
    `quarantine_dir/<table>/<UTC stamp>/<path relative to the table location>`. With `within` (the
    catalog's warehouse), a table whose location lies outside it is refused before anything is listed:
    a table registered over another system's files must not have them taken for its orphans.

    Raises:
        RetentionError: a cutoff in the future, a cutoff under 24 h without `force`, a candidate
            outside the table location, a table location outside `within`, or gc.enabled=false on the table.
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
            f"a cutoff of {format_duration((now - older_than).total_seconds())} ({older_than.isoformat()}) is less "
            "than 24 h before now: files of commits still in flight would look orphaned and be deleted; use a "
            "cutoff of 24 h or more, or force it (--force, `force: true`) when no writer can be active")
    jtable = iceberg_table(spark, catalog, table)
    _check_gc_enabled(table, jtable)
    files = Files(spark, catalog, table_io=jtable.io())
    location = files.qualify(str(jtable.location()))
    prefix_listing = not files.on_hadoop(location)
    if within is not None and relative_under(files.qualify(within), location) is None:
        raise RetentionError(f"the table location {location} is outside the warehouse {within}: files there may "
                             "belong to another system; orphan removal lists and deletes only inside the warehouse")
    if quarantine_dir is not None and (relative_under(location, files.qualify(quarantine_dir)) is not None
                                       or normalized(files.qualify(quarantine_dir)) == normalized(location)):
        raise RetentionError(f"quarantine_dir {quarantine_dir} is inside the table location {location}: "
                             "quarantined files would be orphans of the table again")

    if force and now - older_than < ORPHAN_MIN_AGE:
        jvm = spark._jvm
        # Stream.builder() is a Consumer<String> that only collects: the action deletes nothing.
        actions = java_class(jvm, "org.apache.iceberg.spark.actions.SparkActions")
        action_result = (actions.get(spark._jsparkSession)
                         .deleteOrphanFiles(jtable).olderThan(_ms(older_than)).usePrefixListing(prefix_listing)
                         .deleteWith(java_class(jvm, "java.util.stream.Stream").builder()).execute())
        listed = [str(p) for p in action_result.orphanFileLocations()]
    else:
        listed = [r["orphan_file_location"] for r in spark.sql(
            f"CALL {catalog_sql}.system.remove_orphan_files(table => {table.procedure_arg()}, "
            f"older_than => {_timestamp_literal(older_than)}, dry_run => true, "
            f"prefix_listing => {str(prefix_listing).lower()})").collect()]

    # An object store's directory marker (a key ending in "/", e.g. SeaweedFS's entry for a directory) is listed by
    # the prefix listing like a file, but no table ever wrote or referenced it and it is not a file to move: moving
    # one copied it and could not delete it (the directory is not empty), leaving it in both places.
    candidates = sorted(files.qualify(p) for p in listed if not p.endswith("/"))
    relative = {}
    for path in candidates:
        rel = relative_under(location, path)
        if rel is None:
            raise RetentionError(f"orphan candidate {path} is not under the table location {location}; "
                                 "nothing was deleted")
        relative[path] = rel
    sizes = {path: size or 0 for path, size in files.sizes(candidates).items()}
    base = dict(table=table.key, dry_run=dry_run, forced=force, older_than=older_than, table_location=location,
                candidates=tuple(candidates), bytes=sum(sizes.values()))
    if dry_run or not candidates:
        return OrphanResult(**base)
    if quarantine_dir is not None:
        target_root = f"{quarantine_dir.rstrip('/')}/{table.key}/{now.strftime(QUARANTINE_STAMP)}"
        moved = []
        for path in candidates:
            target = f"{target_root}/{relative[path]}"
            try:
                files.move(path, target)
            except QuarantineMoveFailed as exc:
                # One rename a file: each is either still in place or whole in quarantine.
                raise QuarantineMoveFailed(
                    f"{exc}; {len(moved)} of {len(candidates)} orphan files are already in quarantine under "
                    f"{target_root} (each whole), the other {len(candidates) - len(moved)} are still in place; "
                    "nothing is lost: run orphan removal again to finish") from None
            moved.append((path, target))
        return OrphanResult(**base, quarantined_to=target_root, moved=tuple(moved))
    deleted = tuple(path for path in candidates if files.delete(path))
    return OrphanResult(**base, deleted=deleted)


def quarantine_batches(spark, catalog: str, quarantine_dir: str, older_than: datetime) -> dict[str, list[str]]:
    """Quarantine batches (`<dir>/<table>/<stamp>`) quarantined before `older_than`, by table directory name.

    Only directories named as a table (`namespace.table`) holding directories named with the quarantine stamp count;
    anything else is left alone.
    """
    from icemaint.domain.names import InvalidTableName, TableName

    older_than = _aware(older_than, "older_than")
    files = Files(spark, catalog)
    found: dict[str, list[str]] = {}
    for table_dir in files.children(quarantine_dir):
        table = table_dir.rstrip("/").rsplit("/", 1)[-1]
        try:
            if TableName.parse(table).key != table:
                continue
        except InvalidTableName:
            continue  # not a table's quarantine: someone else's directory
        for batch in files.children(table_dir):
            name = batch.rstrip("/").rsplit("/", 1)[-1]
            try:
                stamp = datetime.strptime(name, QUARANTINE_STAMP).replace(tzinfo=timezone.utc)
            except ValueError:
                continue
            if stamp < older_than:
                found.setdefault(table, []).append(batch)
    return {table: sorted(batches) for table, batches in sorted(found.items())}


def delete_batches(spark, catalog: str, batches: Iterable[str]) -> list[str]:
    """Deletes quarantine batch directories (from `quarantine_batches`); returns those deleted."""
    files = Files(spark, catalog)
    return [batch for batch in batches if files.delete_tree(batch)]
