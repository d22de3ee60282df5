"""A snapshot's manifest list read without a Spark job: what the `manifests` metadata table says of each manifest
(path, content, partition spec id, length), for the manifest rewrite's decision and its before/after figures.

The list file's bytes come through the table's own Java FileIO in one call (its credentials, its scheme) and are
decoded by pyiceberg's Avro reader, so a list of any length costs the same few Py4J calls; the metadata table
ran a Spark job for it (0.1-0.3 CPU-s each, three of them per manifest rewrite, most of them to say "not due").
A list Iceberg would have to decrypt (a snapshot with a key id), or a format-v1 snapshot that lists its manifests
in the metadata instead of a list file, is read through the Java snapshot, a few calls per manifest.
"""

from __future__ import annotations

import functools
import io as _io
from dataclasses import dataclass

from icemaint.domain.names import TableName
from icemaint.engine.java import listed_java
from icemaint.engine.spark_session import iceberg_table


@dataclass(frozen=True)
class ManifestStat:
    """One manifest of a snapshot, as the `manifests` metadata table has it."""

    path: str
    content: int  # 0 data, 1 deletes
    partition_spec_id: int
    length: int  # bytes


@dataclass(frozen=True)
class CurrentManifests:
    """A table loaded once and its current snapshot's manifests: what a manifest rewrite decides on and plans on.

    Attributes:
        table: The Java `Table` (the snapshot a rewrite plans on is its current one).
        snapshot_id: Its current snapshot (None: a table without snapshots, which has no manifests).
        manifests: That snapshot's manifests, in the manifest list's order.
    """

    table: object
    snapshot_id: int | None
    manifests: tuple[ManifestStat, ...]


def read_current_manifests(spark, catalog: str, table: TableName) -> CurrentManifests:
    """The table as the catalog loads it now, and its current snapshot's manifests (`snapshot_manifests`)."""
    jtable = iceberg_table(spark, catalog, table)
    snapshot = jtable.currentSnapshot()
    if snapshot is None:
        return CurrentManifests(jtable, None, ())
    return CurrentManifests(jtable, int(snapshot.snapshotId()), snapshot_manifests(spark._jvm, jtable.io(), snapshot))


def snapshot_manifests(jvm, file_io, snapshot) -> tuple[ManifestStat, ...]:
    """The manifests of a Java `Snapshot` (`file_io`: its table's Java FileIO), in its manifest list's order."""
    location = snapshot.manifestListLocation()
    if location is None or snapshot.keyId() is not None:
        return java_snapshot_manifests(jvm, file_io, snapshot)
    stream = file_io.newInputFile(location).newStream()
    try:
        data = bytes(stream.readAllBytes())
    finally:
        stream.close()
    return manifests_in_list(str(location), data)


def java_snapshot_manifests(jvm, file_io, snapshot) -> tuple[ManifestStat, ...]:
    """`snapshot_manifests` through Iceberg's own reader (decryption included): four Py4J calls a manifest."""
    return tuple(ManifestStat(str(m.path()), int(m.content().id()), int(m.partitionSpecId()), int(m.length()))
                 for m in listed_java(jvm, snapshot.allManifests(file_io)))


def manifests_in_list(location: str, data: bytes) -> tuple[ManifestStat, ...]:
    """The manifests of a manifest list file's bytes (Avro, any format version)."""
    from pyiceberg.manifest import read_manifest_list

    return tuple(ManifestStat(m.manifest_path, int(m.content), int(m.partition_spec_id), int(m.manifest_length))
                 for m in read_manifest_list(_bytes_input_class()(location, data)))


@functools.cache
def _bytes_input_class():
    """pyiceberg's `InputFile` over bytes in memory (a class made on first use: pyiceberg is slow to import)."""
    from pyiceberg.io import InputFile

    class BytesInput(InputFile):
        def __init__(self, location: str, data: bytes):
            super().__init__(location)
            self._data = data

        def __len__(self) -> int:
            return len(self._data)

        def exists(self) -> bool:
            return True

        def open(self, seekable: bool = True):
            return _io.BytesIO(self._data)

    return BytesInput
