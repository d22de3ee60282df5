"""Compaction at the entrance, the pure part: landing sources, which landed files form a batch, the batch's id,
and whether a batch is already on `main` (the exactly-once decision).

A landing source is a directory or object-store prefix where producers drop small files; `icemaint ingest` appends
them to an Iceberg table as a few large files, once. Nothing here reads a file system or a table: the engine
(`icemaint.engine.landing`) lists and reads, the operation (`icemaint.operations.ingest`) decides with these.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from icemaint.domain.units import format_duration, human_size

FORMATS = ("parquet", "jsonl", "csv")
# The column types a jsonl or csv source's `schema` may name (Spark SQL names).
COLUMN_TYPES = ("string", "int", "long", "float", "double", "boolean", "date", "timestamp")
SOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
# Names a listing skips: hidden and in-progress files (a producer writes `.x.tmp` or `_x` and renames it when done).
IGNORED_PREFIXES = (".", "_")
IGNORED_SUFFIXES = (".tmp", ".inprogress", ".crc")
PROCESSED_DIR = "_processed"
REJECTED_DIR = "_rejected"

# Snapshot summary keys of an ingest append on `main`.
BATCH_ID_KEY = "icemaint.ingest.batch-id"
SOURCE_KEY = "icemaint.ingest.source"
FILES_DIGEST_KEY = "icemaint.ingest.files-digest"
FILE_COUNT_KEY = "icemaint.ingest.file-count"
# The batch's files by name and size, compressed: a retry whose journal is gone (a lost state_dir) still knows which
# landed files the batch appended. Left out above this size (a summary is kept in every metadata file until its
# snapshot expires); the journal is then the only record.
FILES_KEY = "icemaint.ingest.files"
MAX_FILES_VALUE_BYTES = 32 * 1024


def last_batch_property(source: str) -> str:
    """The table property an ingest append sets, in the same commit, to its batch id: unlike the snapshot summary it
    survives snapshot expiry, so a batch whose snapshot expired before a crashed run's retry is still found."""
    return f"icemaint.ingest.{source}.last-batch"


@dataclass(frozen=True)
class LandingSource:
    """One landing source of the config's `landing:` section (validated there)."""

    name: str
    location: str  # a local directory (absolute) or a URI (s3://bucket/prefix)
    format: str
    table: str  # namespace.table
    schema: tuple[tuple[str, str], ...] = ()  # (column, type) for jsonl and csv, in order
    min_files: int = 100
    min_bytes: int = 64 << 20
    max_age_seconds: float = 300.0
    target_file_size: int = 128 << 20
    max_files: int = 10_000  # files at most in one batch
    processed: str | None = None  # where ingested files go; None: <location>/_processed
    delete_processed_after_seconds: float | None = None  # None: processed files are kept

    @property
    def processed_location(self) -> str:
        return self.processed or f"{self.location.rstrip('/')}/{PROCESSED_DIR}"

    @property
    def rejected_location(self) -> str:
        return f"{self.location.rstrip('/')}/{REJECTED_DIR}"


@dataclass(frozen=True, order=True)
class LandedFile:
    """A file in a landing location. Ordered by arrival (modification time), then name."""

    mtime: float  # seconds since the epoch
    name: str  # relative to the source's location
    size: int


def ignored(name: str) -> bool:
    """Whether a listing skips `name` (a relative path): hidden or in-progress files, and anything under a
    folder whose name starts with '.' or '_' (the processed and rejected areas, the producer's temporaries)."""
    parts = name.split("/")
    return any(p.startswith(IGNORED_PREFIXES) for p in parts) or parts[-1].endswith(IGNORED_SUFFIXES) or not parts[-1]


@dataclass(frozen=True)
class Due:
    """Whether a source's landed files make a batch now, and why (or why not)."""

    due: bool
    reason: str
    files: int
    bytes: int
    oldest_age_seconds: float | None


def due(files: Iterable[LandedFile], source: LandingSource, now: dt.datetime) -> Due:
    """A batch is due when any threshold passes: file count, bytes, or the oldest file's age."""
    listed = list(files)
    return due_counts(len(listed), sum(f.size for f in listed), min((f.mtime for f in listed), default=None),
                      source, now)


def due_counts(count: int, size: int, oldest_mtime: float | None, source: LandingSource, now: dt.datetime) -> Due:
    """`due` over counts: `count` files of `size` bytes, the oldest modified at `oldest_mtime`."""
    age = max(0.0, now.timestamp() - oldest_mtime) if oldest_mtime is not None and count else None
    if not count:
        return Due(False, "no landed files", 0, 0, None)
    if count >= source.min_files:
        return Due(True, f"{count} files >= min_files {source.min_files}", count, size, age)
    if size >= source.min_bytes:
        return Due(True, f"{human_size(size)} >= min_bytes {human_size(source.min_bytes)}", count, size, age)
    if age is not None and age >= source.max_age_seconds:
        return Due(True, f"oldest file waited {format_duration(age)} >= max_age "
                         f"{format_duration(source.max_age_seconds)}", count, size, age)
    return Due(False, f"{count} files, {human_size(size)}, oldest {format_duration(age or 0)}: below every "
                      f"threshold (min_files {source.min_files}, min_bytes {human_size(source.min_bytes)}, "
                      f"max_age {format_duration(source.max_age_seconds)})", count, size, age)


@dataclass(frozen=True)
class Batch:
    """The landed files one run appends, oldest first, and its id."""

    source: str
    files: tuple[LandedFile, ...]
    batch_id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.batch_id:
            object.__setattr__(self, "batch_id", batch_id(self.source, self.files))

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def digest(self) -> str:
        return files_digest(self.files)

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "batch_id": self.batch_id, "digest": self.digest,
                "files": [{"name": f.name, "size": f.size, "mtime": f.mtime} for f in self.files]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "Batch":
        files = tuple(LandedFile(float(f["mtime"]), str(f["name"]), int(f["size"])) for f in doc["files"])
        return cls(str(doc["source"]), files, str(doc["batch_id"]))


def files_digest(files: Iterable[LandedFile]) -> str:
    """sha256 over the files' names and sizes, in name order (the same files give the same digest)."""
    text = "\n".join(f"{f.name}\t{f.size}" for f in sorted(files, key=lambda f: f.name))
    return hashlib.sha256(text.encode()).hexdigest()


def batch_id(source: str, files: Iterable[LandedFile]) -> str:
    """Deterministic from the source and its file list: the same files of the same source, the same id."""
    return hashlib.sha256(f"{source}\n{files_digest(files)}".encode()).hexdigest()[:32]


def choose_batch(files: Iterable[LandedFile], source: LandingSource) -> Batch | None:
    """The oldest landed files, at most `max_files` of them (the rest wait for the next batch); None when none."""
    chosen = tuple(sorted(f for f in files if not ignored(f.name))[:source.max_files])
    return Batch(source.name, chosen) if chosen else None


def find_batch(batch: str, summaries: Iterable[tuple[int, Mapping[str, str]]]) -> int | None:
    """The snapshot of `main` (given as (snapshot id, summary) of its lineage) that appended batch `batch`, or None:
    a batch found there is never appended again, only its bookkeeping (moving the landed files) is finished."""
    for snapshot_id, summary in summaries:
        if summary.get(BATCH_ID_KEY) == batch:
            return int(snapshot_id)
    return None


def batch_committed(batch: Batch, summaries: Iterable[tuple[int, Mapping[str, str]]],
                    properties: Mapping[str, str]) -> tuple[bool, int | None]:
    """Whether `batch` was appended (and by which snapshot of `main`, when its snapshot is still there): its id in a
    summary on `main`, or in the source's last-batch table property (its snapshot expired since)."""
    found = find_batch(batch.batch_id, summaries)
    if found is not None:
        return True, found
    return properties.get(last_batch_property(batch.source)) == batch.batch_id, None


def append_summary(batch: Batch, proof_id: str) -> dict[str, str]:
    """The summary properties an ingest append carries on `main`."""
    summary = {BATCH_ID_KEY: batch.batch_id, SOURCE_KEY: batch.source, FILES_DIGEST_KEY: batch.digest,
               FILE_COUNT_KEY: str(len(batch.files)), "icemaint.proof": "passed", "icemaint.proof-id": proof_id}
    listed = encode_files(batch.files)
    if listed is not None:
        summary[FILES_KEY] = listed
    return summary


def encode_files(files: Iterable[LandedFile]) -> str | None:
    """The files' names and sizes as one summary value (zlib, base64), or None above `MAX_FILES_VALUE_BYTES`."""
    text = "\n".join(f"{f.size}\t{f.name}" for f in sorted(files, key=lambda f: f.name))
    value = base64.b64encode(zlib.compress(text.encode(), 9)).decode("ascii")
    return value if len(value) <= MAX_FILES_VALUE_BYTES else None


def decode_files(value: str) -> dict[str, int]:
    """name -> size of an `encode_files` value; empty when the value cannot be read (nothing is then matched)."""
    try:
        text = zlib.decompress(base64.b64decode(value, validate=True)).decode()
    except (binascii.Error, zlib.error, UnicodeDecodeError, ValueError):
        return {}
    out = {}
    for line in text.splitlines():
        size, _, name = line.partition("\t")
        if name and size.isdigit():
            out[name] = int(size)
    return out


def newest_batch(source: str, summaries: Iterable[tuple[int, Mapping[str, str]]]) -> tuple[int, Mapping[str, str]] | None:
    """(snapshot id, summary) of the newest append of `source` on `main` (its lineage given newest first)."""
    for snapshot_id, summary in summaries:
        if summary.get(SOURCE_KEY) == source and BATCH_ID_KEY in summary:
            return int(snapshot_id), summary
    return None


def appended_leftovers(landed: Iterable[LandedFile], summary: Mapping[str, str], committed_ms: int) -> list[LandedFile]:
    """The landed files an append (its summary, committed at `committed_ms`) already carried: listed there by name
    and size, and last modified before that commit. A dead run appended them and never moved them; they are moved
    to the processed area, never appended again. A file landed again under the same name after the commit is newer
    than it and stays a new file."""
    listed = decode_files(summary.get(FILES_KEY, ""))
    return [f for f in landed if listed.get(f.name) == f.size and f.mtime * 1000 <= committed_ms]


def processed_due(files: Iterable[LandedFile], source: LandingSource, now: dt.datetime) -> list[LandedFile]:
    """Processed files old enough to delete (`delete_processed_after`); none when processed files are kept."""
    keep = source.delete_processed_after_seconds
    if keep is None:
        return []
    return [f for f in files if now.timestamp() - f.mtime >= keep]


# A sensor lists a source whole again at least this often (clamped `max_age`): a name that sorts before its listing
# position (a producer whose names do not follow arrival order, a clock behind the others) is counted within it.
RELIST_MIN_SECONDS = 60.0
RELIST_MAX_SECONDS = 3600.0


def relist_seconds(source: LandingSource) -> float:
    """How long a sensor lists only names after its position before it lists everything again: the source's
    `max_age` (a file that landed out of order then waits at most about twice that), within 1 min .. 1 h."""
    return min(RELIST_MAX_SECONDS, max(RELIST_MIN_SECONDS, source.max_age_seconds))


@dataclass(frozen=True)
class ListingCursor:
    """A sensor's position in one source's listing: the last name it listed, what it has counted since the last run
    it requested, and when it last listed everything. Between whole listings a tick lists only names after `after`
    (producers mostly name files in arrival order, e.g. a timestamp first), so a listing of 100,000 objects is not
    repeated per tick; a whole listing every `relist_seconds` recounts from scratch and so finds a name that landed
    out of order."""

    after: str | None = None
    files: int = 0
    bytes: int = 0
    oldest_mtime: float | None = None
    listed_all_at: float | None = None  # seconds since the epoch of the last whole listing; None: never

    def to_dict(self) -> dict[str, Any]:
        return {"after": self.after, "files": self.files, "bytes": self.bytes, "oldest_mtime": self.oldest_mtime,
                "listed_all_at": self.listed_all_at}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> "ListingCursor":
        doc = doc or {}
        oldest, listed_all = doc.get("oldest_mtime"), doc.get("listed_all_at")
        return cls(doc.get("after"), int(doc.get("files") or 0), int(doc.get("bytes") or 0),
                   float(oldest) if oldest is not None else None,
                   float(listed_all) if listed_all is not None else None)


def listing_after(cursor: ListingCursor, source: LandingSource, now: dt.datetime) -> str | None:
    """Where this tick's listing starts: after the cursor's position, or None (everything) when the source was never
    listed whole, or not for `relist_seconds`."""
    if cursor.listed_all_at is None or now.timestamp() - cursor.listed_all_at >= relist_seconds(source):
        return None
    return cursor.after


def advance(cursor: ListingCursor, new: Iterable[LandedFile], source: LandingSource, now: dt.datetime,
            in_flight: bool = False, whole: bool = False) -> tuple[ListingCursor, Due, bool]:
    """(the cursor after listing `new` files, whether a batch is due, whether to request a run). `new` holds the
    names after `cursor.after` (they add to its counts), or with `whole` every landed file (they replace its counts:
    see `listing_after`). A run is not requested while one of the source's runs is queued or running: the counts go
    on. A requested run starts the listing over (the next tick lists everything once, so files a run left, over
    `max_files` or landed during it, are counted again with their age)."""
    listed = [f for f in new if not ignored(f.name)]
    base = ListingCursor(listed_all_at=now.timestamp()) if whole else cursor
    after = max([base.after or "", *(f.name for f in listed)]) or None
    oldest = min([m for m in (base.oldest_mtime, *(f.mtime for f in listed)) if m is not None], default=None)
    moved = ListingCursor(after, base.files + len(listed), base.bytes + sum(f.size for f in listed), oldest,
                          base.listed_all_at)
    verdict = due_counts(moved.files, moved.bytes, moved.oldest_mtime, source, now)
    request = verdict.due and not in_flight
    return (ListingCursor() if request else moved), verdict, request
