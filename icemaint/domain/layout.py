"""Partitions of a table without a time column: how they are keyed and measured.

A table partitioned only by identity/bucket/truncate fields (or not at all) is maintained per partition
of its layout instead of per date. A file's key is its partition path (`event_type=click/id_bucket=3`,
as Iceberg writes it); files written under an older spec keep that spec in their key, and the key of an
unpartitioned table is the empty string: the whole table.

Pure: the observer (pyiceberg) and the stager (Iceberg's Java scan) both produce keys with these helpers.
"""

from __future__ import annotations

from typing import Any, Iterable

from icemaint.domain.health import PartitionHealth
from icemaint.domain.rewrite_plan import CandidateFile

WHOLE_TABLE = ""


def partition_key(spec_id: int, path: str, current_spec_id: int) -> str:
    """The key of a file's partition: its path, prefixed by its spec when that is not the current one."""
    if spec_id == current_spec_id:
        return path
    return f"spec {spec_id}: {path or '(unpartitioned)'}"


def describe(key: str) -> str:
    """A partition key as people read it."""
    return key if key != WHOLE_TABLE else "(whole table)"


def describe_all(keys: Iterable[str], limit: int = 5) -> str:
    keys = list(keys)
    shown = ", ".join(describe(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def partitions_of(candidates: Iterable[CandidateFile], current_spec_id: int,
                  small_file_size_bytes: int) -> list[PartitionHealth]:
    """Per-partition health from a planned scan's files (what a run measures on the snapshot it plans on).

    A delete file is counted once per partition however many of its data files it applies to.
    """
    per_key: dict[str, dict[str, Any]] = {}
    for f in candidates:
        key = partition_key(f.spec_id, f.partition, current_spec_id)
        part = per_key.setdefault(key, {"data_files": 0, "small_files": 0, "total_bytes": 0, "small_bytes": 0,
                                        "records": 0, "deletes": {}})
        small = f.size_bytes < small_file_size_bytes
        part["data_files"] += 1
        part["total_bytes"] += f.size_bytes
        part["records"] += f.record_count
        part["small_files"] += small
        part["small_bytes"] += f.size_bytes if small else 0
        part["deletes"].update(dict(f.deletes))
    return [PartitionHealth(key=key, data_files=v["data_files"], small_files=v["small_files"],
                            total_bytes=v["total_bytes"], small_bytes=v["small_bytes"], records=v["records"],
                            delete_files=len(v["deletes"]), delete_records=sum(v["deletes"].values()))
            for key, v in sorted(per_key.items())]
