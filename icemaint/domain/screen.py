"""The screen a sensor tick applies before reading a table's manifests: can any partition be due at all?

Reading a table's manifests is most of what observing it costs. Its manifest list (one small read)
already says how many live files each manifest holds and, per partition field, the range of values
they span. When those numbers show that no date (no partition) can hold `min_input_files` data files
and there are no delete files, no compaction threshold can pass (`decisions.partition_due` needs
that many small files, or delete files), so the table's manifests need not be read this tick.

Pure: the observer (`icemaint.observe.manifests`) turns a manifest list into `ManifestSummary` rows.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Sequence

from icemaint.domain.drift import LayoutTarget


@dataclass(frozen=True)
class ManifestSummary:
    """One manifest of the current snapshot, as its manifest-list entry describes it."""

    deletes: bool                # a delete manifest (position or equality deletes)
    live_files: int | None       # added + existing files; None when the writer did not record the counts
    first_date: dt.date | None = None  # the dates its files' time partitions span; None: not known
    last_date: dt.date | None = None
    spec_id: int | None = None   # the partition spec its files were written under


@dataclass(frozen=True)
class Screened:
    """A table the tick did not read further: no partition of it can be due (see the module docstring)."""

    table: str
    metadata_location: str
    reason: str
    # what the manifest list and the metadata file tell without reading manifests (None: not known)
    data_files: int | None = None
    snapshots: int | None = None
    manifests: int | None = None


def most_files_on_one_date(manifests: Sequence[ManifestSummary]) -> int | None:
    """An upper bound of the data files on any one date: each manifest's files counted on every date its
    range spans. None when some data manifest's count or range is unknown."""
    events: list[tuple[dt.date, int]] = []
    for m in manifests:
        if m.deletes:
            continue
        if m.live_files is None or m.first_date is None or m.last_date is None:
            return None
        if m.live_files:
            events += [(m.first_date, m.live_files), (m.last_date + dt.timedelta(days=1), -m.live_files)]
    most = running = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # a range's end before another's start
        running += change
        most = max(most, running)
    return most


def screen_compaction(manifests: Sequence[ManifestSummary], min_input_files: int, dated: bool,
                      layout: LayoutTarget | None = None, data_bytes: int | None = None) -> str | None:
    """Why no partition of the table can be due for compaction, or None when its manifests must be read.

    `dated`: the table is time-partitioned, so a per-date bound from the manifests' ranges applies.
    `layout`: the table's layout when the policy looks for layout drift (`icemaint.domain.drift`): data files under
    another spec are seen in the manifest list, so such a table is read. File sizes and sort orders are in the
    manifests only: a table that has a sort order, or whose data (`data_bytes`, the snapshot summary's
    total-files-size; None: not known) passes the oversized-file limit, is read when its data reaches the bytes a
    date needs for drift (`layout.min_bytes`); below that no date of it can be due for drift.
    """
    if any(m.deletes and m.live_files != 0 for m in manifests):
        return None  # delete files can make a date due whatever its file count
    if layout is not None and any(not m.deletes and m.live_files != 0 and m.spec_id is not None
                                  and m.spec_id != layout.spec_id for m in manifests):
        return None  # old-spec files may be due whatever their count
    if layout is not None and (data_bytes is None or data_bytes >= max(layout.min_bytes, 1)) and (
            layout.sort_order_id or layout.max_file_size_bytes is not None
            and (data_bytes is None or data_bytes > layout.max_file_size_bytes)):
        return None  # unsorted or oversized files may be due whatever their count
    counts = [m.live_files for m in manifests if not m.deletes]
    known = [c for c in counts if c is not None]
    if len(known) != len(counts):
        return None
    total = sum(known)
    if total < min_input_files:
        return (f"{total} data files in the whole table < min_input_files {min_input_files} and no delete files "
                "(from the manifest list; manifests not read)")
    if dated:
        most = most_files_on_one_date(manifests)
        if most is not None and most < min_input_files:
            return (f"at most {most} data files on any date < min_input_files {min_input_files} and no delete files "
                    "(from the manifest list; manifests not read)")
    return None
