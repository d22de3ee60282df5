"""Which files a rewrite replaces: the data files of a snapshot's scan, with the delete files that apply.

Owns planning for `StagingArea` (Iceberg's Java scan API through Py4J): `date_filter` builds the
expression for one date of the time column, `plan_files` turns a scan's planned tasks into the pure
`CandidateFile` rows `icemaint.domain.rewrite_plan` groups, and keeps the Java tasks the staging reads;
`dangling_deletes` finds the position deletes a group's publish removes with the files they apply to.
A snapshot without delete files is described in bulk by one JSON document from the JVM (Iceberg's REST
scan-task serializer) instead of ~10 Py4J calls per file.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from icemaint.domain.rewrite_plan import CandidateFile
from icemaint.engine.java import GUAVA_LISTS, iterate_java, java_class, java_root_message, listed_java

log = logging.getLogger(__name__)


class PlannedTasks(Mapping):
    """path -> Java scan task, over the plan's own Java list: a task crosses Py4J only when asked for, and
    `java_list` hands the Java list itself to a rewrite of all the planned files (one Py4J call where a
    date of 3,000 files made 3,000 to fetch its tasks and 3,000 more to list them again for the read)."""

    def __init__(self, items, paths: list[str]):
        self._items = items
        self._paths = list(paths)
        self._index = {path: i for i, path in enumerate(self._paths)}
        self._fetched: dict[str, object] = {}

    def __getitem__(self, path: str):
        if path not in self._fetched:
            self._fetched[path] = self._items.get(self._index[path])
        return self._fetched[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def java_list(self, paths: Sequence[str]):
        """The planned Java list when `paths` are all of it in its order, else None."""
        return self._items if list(paths) == self._paths else None


def data_files_of(jvm, tasks):
    """The data files of a Java list of scan tasks as a Java set, collected in the JVM (one Py4J call): Iceberg's
    `RewriteFileGroup.rewrittenFiles()`, the set its own `rewrite_data_files` commit replaces; None where that
    class differs (another Iceberg): the caller then takes each task's file itself."""
    from py4j.protocol import Py4JError

    try:
        group = java_class(jvm, "org.apache.iceberg.actions.RewriteFileGroup")(None, tasks, 0, 0, 0, 0)
        return group.rewrittenFiles()
    except Py4JError as exc:
        log.info("collecting a rewrite's replaced files file by file: %s", exc)
        return None


class TasksOf(Sequence):
    """The tasks of `paths`, each fetched from `tasks_by_path` when first read (a `PlannedTasks` crosses Py4J then),
    and `to_java`, the same tasks as one Java list for a read or a commit."""

    def __init__(self, tasks_by_path: Mapping, paths: Sequence[str]):
        self._tasks = tasks_by_path
        self._paths = list(paths)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._tasks[p] for p in self._paths[i]]
        return self._tasks[self._paths[i]]

    def __len__(self) -> int:
        return len(self._paths)

    def to_java(self, jvm):
        """A Java list of these tasks: the plan's own list when they are all of it, else built one by one."""
        if isinstance(self._tasks, PlannedTasks):
            whole = self._tasks.java_list(self._paths)
            if whole is not None:
                return whole
        out = java_class(jvm, "java.util.ArrayList")()
        for path in self._paths:
            out.add(self._tasks[path])
        return out


@dataclass
class PlannedFiles:
    """A scan's data files.

    Attributes:
        candidates: The pure description of each file, for grouping.
        tasks: The Java scan task (file + deletes) of each file by path: what the staging reads (a
            `PlannedTasks` when planned in bulk).
        weights: A file's scan weight in bytes, by path, when planned in bulk (else empty: the task weighs it).
    """

    candidates: list[CandidateFile]
    tasks: Mapping
    weights: dict[str, int] = field(default_factory=dict)


def _bound(value: dt.date, column_type: str) -> str:
    """An Iceberg literal string for the start of `value` in the column's type."""
    if column_type == "date":
        return value.isoformat()
    if column_type in ("timestamptz", "timestamptz_ns"):
        return f"{value.isoformat()}T00:00:00+00:00"
    return f"{value.isoformat()}T00:00:00"


def date_filter(jvm, column: str, column_type: str, start: dt.date, end: dt.date):
    """Iceberg's expression for rows in [start, end) of the time column."""
    expressions = java_class(jvm, "org.apache.iceberg.expressions.Expressions")
    lower = expressions.greaterThanOrEqual(column, _bound(start, column_type))
    upper = expressions.lessThan(column, _bound(end, column_type))
    return getattr(expressions, "and")(lower, upper)


def _no_delete_files(snapshot) -> bool:
    """Whether a Java snapshot's summary says it holds no delete files (False when it does not say)."""
    if snapshot is None:
        return False
    total = snapshot.summary().get("total-delete-files")
    return total is not None and str(total) == "0"


def _sort_order_id(value) -> int | None:
    """A data file's recorded sort order id (None when the file records none)."""
    return None if value is None else int(value)


def plan_files(jvm, tbl, scan, snapshot_id: int | None, what: str) -> PlannedFiles:
    """The scan's planned data files (`tbl`: the Java table; `snapshot_id`: the scan's snapshot, which allows
    the bulk description when its summary says it holds no delete files; `what`: the table, for logs)."""
    iterable = scan.planFiles()
    try:
        items = java_class(jvm, GUAVA_LISTS).newArrayList(iterable)
    finally:
        iterable.close()
    if snapshot_id is not None and _no_delete_files(tbl.snapshot(int(snapshot_id))):
        planned = _plan_in_bulk(jvm, tbl, items, what)
        if planned is not None:
            return planned
    candidates, tasks = [], {}
    specs, java_specs = {}, tbl.specs()
    for task in [items.get(i) for i in range(items.size())]:
        data = task.file()
        path = str(data.location())
        spec_id = int(data.specId())
        if spec_id not in specs:
            specs[spec_id] = java_specs.get(spec_id)
        java_deletes = task.deletes()
        deletes = tuple((str(d.location()), int(d.recordCount()))
                        for d in listed_java(jvm, java_deletes)) if java_deletes.size() else ()
        candidates.append(CandidateFile(
            path=path, size_bytes=int(data.fileSizeInBytes()), record_count=int(data.recordCount()),
            spec_id=spec_id, partition=str(specs[spec_id].partitionToPath(data.partition())),
            delete_files=len(deletes), deletes=deletes, sort_order_id=_sort_order_id(data.sortOrderId())))
        tasks[path] = task
    return PlannedFiles(candidates, tasks)


def _plan_in_bulk(jvm, tbl, items, what: str) -> PlannedFiles | None:
    """The planned tasks of a snapshot without delete files, described by one JSON document from the JVM
    (Iceberg's REST scan-task serializer) instead of ~10 Py4J calls per file, and three per distinct partition
    (its path); the tasks stay in their Java list (`PlannedTasks`).

    None (plan file by file) when the serializer refuses or a task has deletes after all (a summary
    that said none was wrong)."""
    from py4j.protocol import Py4JJavaError

    responses = "org.apache.iceberg.rest.responses."
    specs = tbl.specs()
    try:
        response = java_class(jvm, responses + "FetchScanTasksResponse").builder().withFileScanTasks(items) \
            .withDeleteFiles(java_class(jvm, "java.util.ArrayList")()).withSpecsById(specs).build()
        described = json.loads(str(java_class(jvm, responses + "FetchScanTasksResponseParser").toJson(response)))
    except Py4JJavaError as exc:
        log.info("planning %s file by file: %s", what, java_root_message(exc))
        return None
    described = described.get("file-scan-tasks") or []
    if len(described) != int(items.size()) or any(d.get("delete-file-references") for d in described):
        return None
    candidates, weights, partitions = [], {}, {}
    for i, doc in enumerate(described):
        data = doc["data-file"]
        spec_id = int(data["spec-id"])
        key = (spec_id, json.dumps(data.get("partition"), sort_keys=True))
        if key not in partitions:
            partitions[key] = str(specs.get(spec_id).partitionToPath(items.get(i).file().partition()))
        path = str(data["file-path"])
        candidates.append(CandidateFile(
            path=path, size_bytes=int(data["file-size-in-bytes"]), record_count=int(data["record-count"]),
            spec_id=spec_id, partition=partitions[key], sort_order_id=_sort_order_id(data.get("sort-order-id"))))
        weights[path] = int(doc.get("length", data["file-size-in-bytes"]))
    return PlannedFiles(candidates, PlannedTasks(items, [c.path for c in candidates]), weights)


def dangling_deletes(jvm, tasks: list, replaced: set[str]) -> list:
    """The position-delete files (and DVs) of `tasks` that reference only files in `replaced` (the data files a group
    rewrites): the publish removes them with the files they apply to."""
    util = java_class(jvm, "org.apache.iceberg.util.ContentFileUtil")
    out, seen = [], set()
    for task in tasks:
        for delete in iterate_java(task.deletes()):
            path = str(delete.location())
            if path in seen or delete.content().toString() != "POSITION_DELETES":
                continue
            seen.add(path)
            referenced = util.referencedDataFileLocation(delete)
            if referenced is not None and str(referenced) in replaced:
                out.append(delete)
    return out
