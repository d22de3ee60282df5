"""Pure planning of a staged rewrite: which files of a date are rewritten, in which groups, in what order.

No Spark here: `icemaint.engine.staging` lists the date's files as `CandidateFile`s and executes the
`FileGroup`s chosen by `plan_groups`. The rules follow Iceberg's bin-pack planner in spirit:
a file is rewritten when it is small or carries enough deletes; a partition's files are rewritten
together only when that merges two or more files or applies deletes; with partial progress a
large date is split into groups, each staged, proven and published on its own.
"""

from __future__ import annotations

import math

import re
from dataclasses import dataclass
from typing import Any, Callable

from icemaint.domain.drift import LayoutTarget, drifted
from icemaint.domain.names import quote_column
from icemaint.errors import UserError


@dataclass(frozen=True)
class CandidateFile:
    path: str
    size_bytes: int
    record_count: int
    spec_id: int
    partition: str  # the partition as a path, e.g. "ts_day=2026-01-02"
    delete_files: int = 0
    deletes: tuple[tuple[str, int], ...] = ()  # (path, record count) of the delete files that apply
    sort_order_id: int | None = None  # the sort order the file was written in (0: unsorted; None: not said)


@dataclass(frozen=True)
class FileGroup:
    """Files rewritten (and published) together; with `layout` (a rewrite for layout drift) written in the table's
    current spec and sort order, whatever spec each file was written in."""

    files: tuple[CandidateFile, ...]
    layout: LayoutTarget | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def records(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def spec_id(self) -> int:
        """The partition spec the group is written in: the layout's, else its files' own (which they all share)."""
        return self.layout.spec_id if self.layout is not None else self.files[0].spec_id


@dataclass(frozen=True)
class DeleteRef:
    """One position-delete file (not a deletion vector, not equality deletes) as it applies to one data file."""

    path: str
    spec_id: int
    partition: str
    size_bytes: int
    data_file: str


@dataclass(frozen=True)
class DeleteGroup:
    """The position-delete files of one partition, rewritten (and published) together."""

    spec_id: int
    partition: str
    delete_files: tuple[str, ...]
    data_files: tuple[str, ...]  # the data files they apply to: the proof reads these, before and after
    total_bytes: int


def plan_delete_groups(refs: list[DeleteRef]) -> list[DeleteGroup]:
    """The position-delete files of each partition, most files first; a partition with a single one is left
    (nothing to merge). Iceberg applies a partition's position deletes only to that partition's data files,
    so a group's deletes and the data files they touch never reach beyond its partition."""
    by_partition: dict[tuple[int, str], dict[str, Any]] = {}
    for ref in refs:
        group = by_partition.setdefault((ref.spec_id, ref.partition), {"deletes": {}, "data": set()})
        group["deletes"][ref.path] = ref.size_bytes
        group["data"].add(ref.data_file)
    groups = [DeleteGroup(spec_id=spec, partition=partition, delete_files=tuple(sorted(g["deletes"])),
                          data_files=tuple(sorted(g["data"])), total_bytes=sum(g["deletes"].values()))
              for (spec, partition), g in by_partition.items() if len(g["deletes"]) >= 2]
    return sorted(groups, key=lambda g: (-len(g.delete_files), g.spec_id, g.partition))


def plan_groups(files: list[CandidateFile], *, small_file_size_bytes: int, delete_file_threshold: int,
                partial_progress: bool, max_group_bytes: int, layout: LayoutTarget | None = None) -> list[FileGroup]:
    """The groups to rewrite, largest benefit first; empty when nothing is worth rewriting.

    Args:
        files: The date's data files as of the planned snapshot.
        small_file_size_bytes: Files below this size are rewritten for their size.
        delete_file_threshold: Files with at least this many delete files are rewritten to apply them.
        partial_progress: Split a date into groups of at most `max_group_bytes`, each published alone.
        max_group_bytes: The group size limit with partial progress.
        layout: The table's layout (a date due for its layout drift): a file outside it is rewritten even alone
            and not small (`icemaint.domain.drift.drifted`).
    """
    def off_layout(f: CandidateFile) -> bool:
        return layout is not None and drifted(f.spec_id, f.sort_order_id, f.size_bytes, layout)

    def worth(f: CandidateFile) -> bool:
        return f.size_bytes < small_file_size_bytes or f.delete_files >= delete_file_threshold or off_layout(f)

    if layout is not None and any(off_layout(f) for f in files):
        # Into the table's layout: the date's drifted files with its small ones and those with deletes, of every
        # spec, in one group (a day file of the old spec writes into the same hours as the new spec's small files,
        # which a group per spec would leave beside the rewritten ones).
        relaid = sorted((f for f in files if worth(f)), key=lambda f: (f.spec_id, f.partition, f.path))
        return _split(relaid, partial_progress, max_group_bytes, layout, off_layout)
    by_partition: dict[tuple[int, str], list[CandidateFile]] = {}
    for f in files:
        if worth(f):
            by_partition.setdefault((f.spec_id, f.partition), []).append(f)
    chosen: list[CandidateFile] = []
    for key in sorted(by_partition):
        members = by_partition[key]
        if len(members) >= 2 or any(f.delete_files >= delete_file_threshold for f in members):
            chosen.extend(sorted(members, key=lambda f: f.path))
    if not chosen:
        return []
    # One group per partition spec: a group is written in its files' own spec (after partition
    # evolution, old-spec files merge into old-spec files instead of fanning out into the new spec).
    by_spec: dict[int, list[CandidateFile]] = {}
    for f in chosen:
        by_spec.setdefault(f.spec_id, []).append(f)
    return [group for spec_id in sorted(by_spec)
            for group in _split(by_spec[spec_id], partial_progress, max_group_bytes, None, off_layout)]


def _split(files: list[CandidateFile], partial_progress: bool, max_group_bytes: int, layout: LayoutTarget | None,
           off_layout: Callable[[CandidateFile], bool]) -> list[FileGroup]:
    """`files` as one group, or with partial progress as groups of at most `max_group_bytes`; a lone file is kept
    only when it has deletes to apply or drifted from the layout."""
    if not files:
        return []
    if not partial_progress:
        return [FileGroup(tuple(files), layout)]
    groups: list[FileGroup] = []
    current: list[CandidateFile] = []
    size = 0
    for f in files:
        if current and size + f.size_bytes > max_group_bytes:
            groups.append(FileGroup(tuple(current), layout))
            current, size = [], 0
        current.append(f)
        size += f.size_bytes
    if current:
        groups.append(FileGroup(tuple(current), layout))
    # A lone small file without deletes is not worth a commit of its own; a drifted one is.
    return [g for g in groups if len(g.files) >= 2 or any(f.delete_files or off_layout(f) for f in g.files)]


# ---------------------------------------------------------------------------------------------
# The table's layout as a Spark ordering


@dataclass(frozen=True)
class LayoutKey:
    """One field of a partition spec or a sort order: an Iceberg transform ("identity", "day", "bucket[16]", ...)
    of a column, with the sort order's direction and nulls order (None: Spark's default for the direction)."""

    transform: str
    column: str
    descending: bool = False
    nulls_first: bool | None = None


_TIME_FUNCTIONS = {"year": "years", "month": "months", "day": "days", "hour": "hours"}
_PARAMETERISED = re.compile(r"(bucket|truncate)\[(\d+)\]")


def layout_keys(catalog: str, keys: list[LayoutKey]) -> list[tuple[str, bool, bool | None]]:
    """Spark SQL expressions that order rows by `keys` (Iceberg's transforms through the catalog's `system`
    functions), each with its direction and nulls order, without repeats. A transform Spark cannot name (void, or
    one unknown here) is left out: the order only clusters the rows, the writer places each row by its own value."""
    out: list[tuple[str, bool, bool | None]] = []
    seen = set()
    system = f"`{catalog}`.system"
    for key in keys:
        column = quote_column(key.column)
        param = _PARAMETERISED.fullmatch(key.transform)
        if key.transform == "identity":
            expr = column
        elif key.transform in _TIME_FUNCTIONS:
            expr = f"{system}.{_TIME_FUNCTIONS[key.transform]}({column})"
        elif param:
            expr = f"{system}.{param.group(1)}({int(param.group(2))}, {column})"
        else:
            continue
        if expr not in seen:
            seen.add(expr)
            out.append((expr, key.descending, key.nulls_first))
    return out


# ---------------------------------------------------------------------------------------------
# Read splits: one read task per output file


@dataclass(frozen=True)
class ReadSplits:
    """How a group's read is cut into Spark tasks, one output file each (`read_splits`)."""

    files: int           # output files the group's bytes call for at the target size
    split_bytes: int     # the read's split size (Iceberg packs the planned files' weights into splits of it)
    writer_target: int   # the writer's target-file-size-bytes: a split's rows do not roll into a second file
    lookback: int | None = None  # the packer's lookback: 1 when the splits were balanced for next-fit packing


def read_splits(weights: list[int], total_bytes: int, target_file_size_bytes: int) -> ReadSplits:
    """The split size that cuts a group's files (`weights`, in read order) into balanced read tasks, as many as
    it has output files.

    Iceberg packs whole files into a split until the next one does not fit: with splits of total / files
    (what this did before), 54 files of 20,971 bytes at 5 outputs went 10 to a split, 6 splits, and the sixth
    wrote a 61 KB file, small by the policy that had just compacted them (11, 11, 11, 11 and 10 now). Packed
    next-fit (lookback 1), the smallest split size that needs no more than `files` splits gives the fewest,
    most even splits one size can: found by bisection between a share + 1 and a share + the largest weight
    (enough: every split then closes above a share). Files of one size still leave a shorter last split when
    their count does not divide (1,000 files at 32 outputs: 31 splits of 32 and one of 8), as before, but
    never one split more than the outputs. A group with a file larger than a share keeps the plain share:
    Iceberg cuts that file at its row groups, which this cannot weigh.

    The writer rolls a new file when its estimate of the bytes written (buffered pages counted uncompressed)
    passes its target, so a split of exactly the target still ended in a second, tiny file. Like Iceberg's own
    rewrite (`writeMaxFileSize`: the target plus half the way to its 1.8x maximum), the writer's target is
    1.4x the policy's, or the split when that is larger: each split's rows stay one file.
    """
    target = max(1, int(target_file_size_bytes))
    files = max(1, -(-int(total_bytes) // target))
    sizes = [max(1, int(w)) for w in weights]
    share = sum(sizes) // files + 1
    writer = target + 2 * target // 5
    if files == 1 or not sizes or max(sizes) > share:
        return ReadSplits(files=files, split_bytes=share, writer_target=max(writer, share))
    low, high = share, share + max(sizes)
    while low < high:
        middle = (low + high) // 2
        if next_fit_splits(sizes, middle) <= files:
            high = middle
        else:
            low = middle + 1
    return ReadSplits(files=files, split_bytes=low, writer_target=max(writer, low), lookback=1)


def next_fit_splits(sizes: list[int], split_bytes: int) -> int:
    """How many splits Iceberg's packer makes of `sizes` with lookback 1: a split closes when the next size
    does not fit."""
    splits, filled = 0, split_bytes
    for size in sizes:
        if filled + size > split_bytes:
            splits, filled = splits + 1, 0
        filled += size
    return splits


# ---------------------------------------------------------------------------------------------
# Sort and z-order


@dataclass(frozen=True)
class SortKey:
    column: str
    descending: bool = False
    nulls_first: bool | None = None  # None: Spark's default for the direction


_SORT_ITEM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)(?:\s+(ASC|DESC))?(?:\s+NULLS\s+(FIRST|LAST))?\s*$",
                        re.IGNORECASE)


class SortOrderError(UserError, ValueError):
    """A policy sort_order that is not a list of plain columns with optional direction and nulls order."""


def parse_sort_order(text: str, strategy: str) -> tuple[SortKey, ...]:
    """The policy's `sort_order` as sort keys: 'a DESC NULLS LAST, b' for sort; 'a, b' or 'zorder(a, b)' for zorder."""
    body = text.strip()
    if strategy == "zorder":
        match = re.fullmatch(r"zorder\s*\((.*)\)", body, re.IGNORECASE)
        body = match.group(1) if match else body
    keys = []
    for item in body.split(","):
        m = _SORT_ITEM.fullmatch(item)
        if not m:
            raise SortOrderError(f"sort_order item {item.strip()!r} is not 'column [ASC|DESC] [NULLS FIRST|LAST]'")
        if strategy == "zorder" and (m.group(2) or m.group(3)):
            raise SortOrderError(f"zorder takes plain columns, got {item.strip()!r}")
        keys.append(SortKey(m.group(1), (m.group(2) or "").upper() == "DESC",
                            None if not m.group(3) else m.group(3).upper() == "FIRST"))
    return tuple(keys)


# Iceberg types a z-order key can interleave (`engine.relayout.zorder_kinds` reads them from Spark's schema).
_ZORDER_TYPE = re.compile(r"(int|long|float|double|decimal\(.*\)|date|timestamp(tz)?(_ns)?|string|binary|fixed\[\d+\]|uuid)")


def sort_order_problem(columns: dict[str, str], strategy: str, sort_order: str | None) -> str | None:
    """Why the policy's sort order cannot be applied to a table with these columns (each column or struct field
    path with its Iceberg type), else None: a key naming no column, or a z-order key that is nested, named in
    another case or of a type z-order cannot interleave. Found before a run is launched, so a table whose policy
    does not fit it is refused, instead of failing a run at every tick."""
    if strategy == "binpack" or not sort_order:
        return None
    folded = {name.lower(): name for name in columns}
    for key in parse_sort_order(sort_order, strategy):
        name = key.column if key.column in columns else folded.get(key.column.lower())
        if name is None:
            shown = ", ".join(sorted(n for n in columns if "." not in n)[:8])
            return (f"policy sort_order column {key.column!r} is not a column of the table ({shown}"
                    f"{', ...' if len([n for n in columns if '.' not in n]) > 8 else ''}): name one of its columns, "
                    "or set strategy: binpack")
        if strategy == "sort" and columns[name].startswith(("map<", "variant")):
            return f"policy sort_order column {key.column!r} has type {columns[name]}, which Spark cannot order by"
        if strategy == "zorder":
            if name != key.column or "." in name:
                return (f"policy sort_order z-order key {key.column!r} must name a top-level column exactly as the "
                        f"table does ({name!r})")
            if not _ZORDER_TYPE.fullmatch(columns[name]):
                return (f"policy sort_order z-order key {key.column!r} has type {columns[name]}; z-order takes "
                        "numbers, dates, timestamps, strings and binary")
    return None


def order_by_sql(keys: tuple[SortKey, ...]) -> str:
    parts = []
    for k in keys:
        part = f"{quote_column(k.column)} {'DESC' if k.descending else 'ASC'}"
        if k.nulls_first is not None:
            part += " NULLS FIRST" if k.nulls_first else " NULLS LAST"
        parts.append(part)
    return ", ".join(parts)


ZORDER_KINDS = ("number", "time", "text")


def zorder_input(column: str, kind: str) -> str:
    """The column as a number whose order follows the column's.

    kind: "number" (integers, decimals, floats), "time" (dates and timestamps: epoch microseconds)
    or "text" (strings and binaries: the number formed by their first 7 bytes).
    """
    col = quote_column(column)
    if kind == "number":
        return f"CAST({col} AS DOUBLE)"
    if kind == "time":
        return f"CAST(unix_micros(CAST({col} AS TIMESTAMP)) AS DOUBLE)"
    if kind == "text":
        return f"CAST(conv(hex(substring(CAST({col} AS BINARY), 1, 7)), 16, 10) AS DOUBLE)"
    raise ValueError(f"z-order kind {kind!r} is not one of {ZORDER_KINDS}")


def zorder_finite(value: str) -> str:
    """`value` (a `zorder_input`) where it is a finite number, else NULL: the range a z-order scales by is taken over
    finite values, so a NaN or an infinity in the data does not make the range itself NaN or infinite."""
    return f"(CASE WHEN isnan({value}) OR abs({value}) = CAST('Infinity' AS DOUBLE) THEN NULL ELSE {value} END)"


def zorder_sql(keys: tuple[SortKey, ...], kinds: dict[str, str], ranges: dict[str, tuple[Any, Any]]) -> str:
    """A Morton (z-order) value over the keys, each scaled by its min/max to the same bit width.

    Iceberg's own z-order interleaves raw byte prefixes; scaling each column to its range first
    spreads narrow ranges over all bits, which clusters at least as well. Only the file layout
    depends on it: the rows written are the rows read.

    `ranges` are each column's finite min and max (`zorder_finite`); a value outside them (an infinity) is clamped to
    the nearest end, a NaN goes to the top, NULL to the bottom. The scaling works on halves, so a range as wide as
    the doubles (max - min overflows) stays finite.
    """
    n = len(keys)
    bits = max(1, min(20, 62 // max(1, n)))
    scaled = []
    for k in keys:
        lo, hi = ranges.get(k.column, (None, None))
        value = zorder_input(k.column, kinds[k.column])
        if lo is None or hi is None or not math.isfinite(float(lo)) or not math.isfinite(float(hi)) or hi <= lo:
            scaled.append("CAST(0 AS BIGINT)")
            continue
        top = 2 ** bits - 1
        half_lo, half_span = float(lo) / 2, float(hi) / 2 - float(lo) / 2
        scaled.append(f"CAST(coalesce(least(greatest(({value} / 2 - ({half_lo!r})) / ({half_span!r}), 0.0), 1.0), "
                      f"0.0) * {top} AS BIGINT)")
    terms = []
    for bit in range(bits):
        for j, expr in enumerate(scaled):
            terms.append(f"shiftleft(shiftright({expr}, {bit}) & 1, {bit * n + j})")
    return "(" + " + ".join(terms) + ")"
