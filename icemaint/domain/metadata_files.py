"""Old metadata.json files, pure: which files of a table's metadata directory have dropped out of its metadata log.

Every Iceberg commit writes a new metadata.json; the table keeps the newest `write.metadata.previous-versions-max`
(default 100) in its metadata log. Older ones are deleted only when `write.metadata.delete-after-commit.enabled` is
true (default false), and then only by the commit that drops them, by a writer that honours the property (Java
and pyiceberg 0.12 do); failed commit attempts leave theirs behind. Under a writer committing every second that is
~86,000 files a day (the streaming soak: 898-966 files, 163-179 MiB in 20 minutes), which orphan removal would
reclaim only after `orphan_older_than` (3 days).

`stale_metadata_files` picks exactly what Iceberg's delete-after-commit would have deleted, and no more: files of
the metadata directory named as a metadata version (`v12.metadata.json`, `00012-<uuid>.metadata.json`, with or
without `.gz`) whose version is *below* the oldest one the table still lists (its log and its current file). A
commit in flight writes a higher version (or a temporary `<uuid>.metadata.json`, which names no version), so it
is never touched; a stale writer's attempt at a low version fails its commit anyway. Files younger than
`min_age_seconds` stay as a margin.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Iterable, Optional

# Iceberg's names: HadoopTableOperations `v<N>[.gz].metadata.json`; the other catalogs `<%05d>-<uuid>[.gz].metadata.json`;
# old writers `...metadata.json.gz`.
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_METADATA_NAME = re.compile(rf"^(?:v(?P<hadoop>\d+)|(?P<version>\d{{5,}})-{_UUID})(?:\.gz)?\.metadata\.json(?:\.gz)?$")
# A metadata file younger than this is never removed, whatever its version says.
METADATA_MIN_AGE_SECONDS = 60.0


@dataclass(frozen=True)
class ListedFile:
    location: str
    size: int
    modified_ms: int


@dataclass(frozen=True)
class MetadataCleanupPlan:
    remove: tuple[ListedFile, ...]
    kept_listed: int       # metadata.json files the table still lists (its log and its current file)
    kept_young: int        # out of the log but younger than the margin
    kept_unversioned: int  # metadata.json files naming no version below the log's oldest (in flight, newer, foreign)
    oldest_listed_version: Optional[int]

    @property
    def remove_bytes(self) -> int:
        return sum(f.size for f in self.remove)


def metadata_version(name: str) -> Optional[int]:
    """The metadata version a file name carries (`v12.metadata.json` -> 12), None when it names none."""
    match = _METADATA_NAME.match(name)
    if match is None:
        return None
    return int(match.group("hadoop") if match.group("hadoop") is not None else match.group("version"))


def stale_metadata_files(listed: Iterable[ListedFile], current_location: str, log_locations: Iterable[str],
                         now_ms: int, min_age_seconds: float = METADATA_MIN_AGE_SECONDS) -> MetadataCleanupPlan:
    """The metadata.json files of the current metadata file's directory that dropped out of the table's log.

    Args:
        listed: The files found in (or under) the metadata directory.
        current_location: The table's current metadata.json.
        log_locations: The metadata.json files of its metadata log.
        now_ms: Now, epoch milliseconds.
        min_age_seconds: Files younger than this stay whatever their version.
    """
    directory = posixpath.dirname(_path(current_location))
    in_log = {posixpath.basename(_path(loc)) for loc in [*log_locations, current_location]}
    versions = [v for v in (metadata_version(name) for name in in_log) if v is not None]
    oldest = min(versions) if versions else None
    remove: list[ListedFile] = []
    kept_listed = kept_young = kept_unversioned = 0
    for f in listed:
        path = _path(f.location)
        name = posixpath.basename(path)
        if posixpath.dirname(path) != directory or not (name.endswith(".metadata.json")
                                                        or name.endswith(".metadata.json.gz")):
            continue  # manifests, manifest lists, statistics, version-hint.text, other directories
        version = metadata_version(name)
        if name in in_log:
            kept_listed += 1
        elif version is None or oldest is None or version >= oldest:
            kept_unversioned += 1
        elif now_ms - f.modified_ms < min_age_seconds * 1000:
            kept_young += 1
        else:
            remove.append(f)
    remove.sort(key=lambda f: (metadata_version(posixpath.basename(_path(f.location))) or 0, f.location))
    return MetadataCleanupPlan(tuple(remove), kept_listed, kept_young, kept_unversioned, oldest)


def _path(location: str) -> str:
    """The path part of a location (`file:/a/b`, `file:///a/b`, `s3://bucket/a/b`, `/a/b`), for comparisons."""
    match = re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:(//[^/]*)?", location)
    return location[match.end():] if match else location
