"""What an expiry releases: the files only the expiring snapshots reference, predicted before Iceberg expires them.

`files_released` is the prediction `engine.retention.expire_snapshots` makes before its call (a dry run reports
it, a real run checks it against what is gone): the manifests only expiring snapshots list (their manifest lists
read in the driver JVM, or by Spark's aggregate of `all_manifests` for very long histories), the live files of
those manifests that no retained manifest still carries, and the expiring snapshots' manifest lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from icemaint.domain.retention import SnapshotInfo
from icemaint.engine.files import LOOKUP_WORKERS, Files
from icemaint.engine.java import iterate_java, java_class


@dataclass(frozen=True)
class ReleasedFile:
    path: str
    kind: str  # data | delete | manifest | manifest_list
    size: int


# The manifest-list entries the expiry's prediction reads in the driver at most, estimated as snapshots x the
# current snapshot's manifests; above it the Spark aggregate of `all_manifests` shares them among the executors.
# On 3,003 snapshots of one streaming date (4.5 million entries) the driver took 5.6-8.1 s, the aggregate
# 13.7-17.3 s on local[2]; on a small table the driver's few Py4J calls replace two Spark jobs. The estimate is
# low for a table compacted after a long history (that date's current snapshot lists 3 manifests, its older ones
# up to 3,000): the driver then reads more entries than estimated, which costs time, not memory (it holds one
# entry per distinct manifest).
DRIVER_PREDICTION_MAX_ENTRIES = 10_000_000
MANIFEST_LIST_READERS = 4  # Py4J threads reading manifest lists in the driver JVM (more did not help on 2 cores)


@dataclass
class _ManifestSets:
    """The manifests of a table's snapshots, split by the expiry: `released` (only expiring snapshots reference
    them), `carriers()` (the paths of the retained ones that hold EXISTING entries, read only when asked) and
    `total` (distinct manifests in all)."""

    released: list[ReleasedFile]
    carriers: Callable[[], list[str]]
    total: int


def _manifests_in_driver(jtable, expiring: set[int], jvm, workers: int = MANIFEST_LIST_READERS) -> _ManifestSets:
    """Each snapshot's manifest list read in the driver JVM (Iceberg's reader, several at once), the manifests
    kept in two Java sets (a manifest is equal to another by its path): a few Py4J calls a snapshot, and only the
    released manifests (and, when asked, the retained ones) cross to Python. Each snapshot is read from a copy of
    itself (`SnapshotParser`): a table's snapshot keeps the manifests it read, which for n single-file commits
    would hold about n²/2 of them at once."""
    from concurrent.futures import ThreadPoolExecutor

    io = jtable.io()
    parser = java_class(jvm, "org.apache.iceberg.SnapshotParser")
    sets = java_class(jvm, "java.util.concurrent.ConcurrentHashMap")
    kept, candidates = sets.newKeySet(), sets.newKeySet()

    def read(snapshot) -> None:
        listed = parser.fromJson(parser.toJson(snapshot)).allManifests(io)
        (candidates if int(snapshot.snapshotId()) in expiring else kept).addAll(listed)

    snapshots = list(iterate_java(jtable.snapshots()))
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(snapshots))),
                            thread_name_prefix="icemaint-manifest-lists") as pool:
        list(pool.map(read, snapshots))
    candidates.removeAll(kept)
    released = sorted((ReleasedFile(str(m.path()), "manifest", int(m.length())) for m in iterate_java(candidates)),
                      key=lambda f: f.path)

    def carriers() -> list[str]:
        return sorted(str(m.path()) for m in iterate_java(kept) if m.hasExistingFiles())

    return _ManifestSets(released, carriers, kept.size() + candidates.size())


def _manifests_on_spark(spark, all_manifests: str, snapshots: list[SnapshotInfo], expiring: set[int]) -> _ManifestSets:
    """The same sets from one distributed, aggregated query of `all_manifests` (a row per snapshot and
    manifest), for tables whose manifest lists are too many for the driver."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, LongType, StructField, StructType

    # A snapshot not read (a writer's commit since) is retained.
    states = spark.createDataFrame([(s.snapshot_id, s.snapshot_id in expiring) for s in snapshots],
                                   StructType([StructField("sid", LongType()), StructField("expiring", BooleanType())]))
    listed = spark.table(all_manifests)
    manifests = (listed.join(states, listed["reference_snapshot_id"] == states["sid"], "left").groupBy("path").agg(
        F.max("length").alias("length"),
        F.expr("bool_or(expiring IS NULL OR NOT expiring)").alias("kept"),
        # Unknown counts (a manifest written without them) are read.
        F.expr("max(coalesce(existing_data_files_count, 1) + coalesce(existing_delete_files_count, 0) > 0)")
        .alias("carries_existing"))
        .orderBy("path").collect())
    return _ManifestSets([ReleasedFile(r["path"], "manifest", int(r["length"])) for r in manifests if not r["kept"]],
                         lambda: [r["path"] for r in manifests if r["kept"] and r["carries_existing"]],
                         len(manifests))


def files_released(spark, catalog: str, jtable, all_manifests: str, snapshots: list[SnapshotInfo],
                   expiring: set[int], io) -> tuple[list[ReleasedFile], int]:
    """Files that only the expiring snapshots reference (what Iceberg deletes when they expire), and how many
    distinct manifests the table's snapshots reference in all (what a cleanup in the driver would read).

    Iceberg deletes the live entries of every manifest no retained snapshot references (a released
    manifest) that are not live in a retained manifest, the released manifests, and the expiring snapshots'
    manifest lists. No query makes Iceberg plan over every snapshot's manifest list in the driver (the
    `all_files` table does: about n²/2 manifest entries held at once for a table of n single-file commits,
    out of memory at 2g on 3,000 of them):

    - the manifest lists say which manifests only expiring snapshots reference, and which a retained one does:
      read in the driver JVM (`_manifests_in_driver`), or for a table with more than
      DRIVER_PREDICTION_MAX_ENTRIES of them by one aggregated query of `all_manifests` (`_manifests_on_spark`);
    - each released manifest is read once, and each retained manifest that holds EXISTING entries (where a
      manifest rewrite or merge carries live files) once, with pyiceberg's reader on `io`, several at a
      time; only the released files are kept.

    Reading the `files` table of the newest expiring snapshot that referenced each released manifest did the
    same work with every manifest of each such snapshot read again: on a table with a writer's deletes every
    few commits (a snapshot to read per delete) that was 33 of an expiry's 60 s on the Spark cluster.
    """
    if not expiring:
        return [], 0
    current = jtable.currentSnapshot()
    current_manifests = 0 if current is None else int(current.allManifests(jtable.io()).size())
    if len(snapshots) * current_manifests <= DRIVER_PREDICTION_MAX_ENTRIES:
        sets = _manifests_in_driver(jtable, expiring, spark._jvm)
    else:
        sets = _manifests_on_spark(spark, all_manifests, snapshots, expiring)
    released = list(sets.released)
    candidates: dict[str, ReleasedFile] = {}
    for files in _read_manifests([f.path for f in released], io):
        for path, content, size in files:
            candidates[path] = ReleasedFile(path, "data" if content == 0 else "delete", size)
    if candidates:
        # A file a released manifest added and that is still live was carried into a retained manifest as an
        # EXISTING entry (a manifest rewrite or merge): only retained manifests holding such entries are read.
        for files in _read_manifests(sets.carriers(), io):
            for path, _, _ in files:
                candidates.pop(path, None)
    released += sorted(candidates.values(), key=lambda f: f.path)
    lists = [s.manifest_list for s in snapshots if s.snapshot_id in expiring and s.manifest_list]
    sizes = Files(spark, catalog).sizes(lists)
    released += [ReleasedFile(path, "manifest_list", sizes[path] or 0) for path in lists]
    return released, sets.total


def _read_manifests(paths: list[str], io, workers: int = LOOKUP_WORKERS):
    """Each manifest's live files (`live_files`), up to `workers` read at once, in the order of `paths`."""
    from icemaint.observe.manifest_reader import live_files

    if len(paths) < 2:
        return [live_files(path, io) for path in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(workers, len(paths)), thread_name_prefix="icemaint-manifests") as pool:
        return list(pool.map(lambda path: live_files(path, io), paths))
