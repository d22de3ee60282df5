"""A manifest's live entries, read with pyiceberg's Avro reader minus the set-up it repeats for every file.

pyiceberg's `ManifestFile.fetch_manifest_entry` parses the file's embedded Avro schema into an Iceberg schema
and builds a reader tree for it, for every manifest it opens: on small manifests that set-up is most of the
read (3,000 single-file manifests, a streaming writer's date: 5.8 s of 6.3 s in a profile; side by side, all
3,000 read in 2.2 s by pyiceberg and 0.11 s here). Manifests of one partition type
carry the same Avro schema text, so the parsed schema and its reader are kept per schema text (a bounded
cache) and the rest is pyiceberg's own: the header, the blocks, the decoding, the inheritance of snapshot ids
and sequence numbers from the manifest. pyiceberg is pinned (pyproject.toml) for these internals;
tests/test_manifest_reader.py checks the entries equal `fetch_manifest_entry`'s on every table shape it builds.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

# Distinct Avro schemas kept (one per manifest partition type in the estate, and a format version each).
CACHED_SCHEMAS = 256

_lock = threading.Lock()
_readers: OrderedDict[str, tuple] = OrderedDict()


def _cached(schema_text: str, header, read_schema, read_types, read_enums):
    """(file schema, reader) for this schema text, parsed and resolved once."""
    from pyiceberg.avro.resolver import resolve_reader

    with _lock:
        found = _readers.get(schema_text)
        if found is not None:
            _readers.move_to_end(schema_text)
            return found
    schema = header.get_schema()
    found = (schema, resolve_reader(schema, read_schema, read_types, read_enums))
    with _lock:
        _readers[schema_text] = found
        while len(_readers) > CACHED_SCHEMAS:
            _readers.popitem(last=False)
    return found


@functools.cache
def _avro_file_class():
    from pyiceberg.avro.decoder import new_decoder
    from pyiceberg.avro.file import META_SCHEMA, AvroFile, AvroFileHeader
    from pyiceberg.avro.resolver import construct_reader

    header_reader = construct_reader(META_SCHEMA, {-1: AvroFileHeader})  # the same for every Avro file

    class CachedAvroFile(AvroFile):
        __slots__ = ()

        def __enter__(self):
            with self.input_file.open() as f:
                self.decoder = new_decoder(f.read())
            self.header = header_reader.read(self.decoder)
            schema_text = self.header.meta.get("avro.schema")
            if schema_text is None:
                raise ValueError(f"{self.input_file.location}: no schema found in the Avro file's header")
            self.schema, self.reader = _cached(schema_text, self.header, self.read_schema, self.read_types,
                                               self.read_enums)
            return self

    return CachedAvroFile


def _entries(manifest_path: str, io) -> list:
    """Every entry of the manifest at `manifest_path` (ADDED, EXISTING and DELETED), as read."""
    from pyiceberg.manifest import (
        DEFAULT_READ_VERSION, MANIFEST_ENTRY_SCHEMAS, DataFile, DataFileContent, FileFormat, ManifestEntry,
        ManifestEntryStatus,
    )

    with _avro_file_class()(io.new_input(manifest_path), MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION],
                            read_types={-1: ManifestEntry, 2: DataFile},
                            read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}) as reader:
        return list(reader)


def _live(manifest_path: str, io) -> list:
    """The live entries (ADDED and EXISTING) of the manifest at `manifest_path`, as read: nothing inherited
    from the manifest's list entry yet. Only for pyiceberg's manifest-entry read schema: the cache is keyed by
    the file's schema text."""
    from pyiceberg.manifest import ManifestEntryStatus

    return [entry for entry in _entries(manifest_path, io) if entry.status != ManifestEntryStatus.DELETED]


def live_entries(manifest, io) -> list:
    """The manifest's live entries (ADDED and EXISTING), as `manifest.fetch_manifest_entry(io)` returns them."""
    from pyiceberg.manifest import _inherit_from_manifest

    return [_inherit_from_manifest(entry, manifest) for entry in _live(manifest.manifest_path, io)]


def changed_entries(manifest, io) -> list:
    """The manifest's ADDED and DELETED entries (what the snapshot that wrote it changed), with inherited ids."""
    from pyiceberg.manifest import ManifestEntryStatus, _inherit_from_manifest

    return [_inherit_from_manifest(entry, manifest) for entry in _entries(manifest.manifest_path, io)
            if entry.status != ManifestEntryStatus.EXISTING]


def live_files(manifest_path: str, io) -> list[tuple[str, int, int]]:
    """(file path, content, size in bytes) of each live entry of the manifest at `manifest_path`: what a
    cleanup needs of it, read without the manifest's list entry (nothing it holds is inherited).
    Content is Iceberg's: 0 data, 1 position deletes, 2 equality deletes."""
    return [(e.data_file.file_path, int(e.data_file.content), int(e.data_file.file_size_in_bytes))
            for e in _live(manifest_path, io)]
