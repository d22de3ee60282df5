"""Stage, prove, publish: a rewrite that reaches `main` only as one forward, OCC-validated commit.

Every Spark and JVM call of a staged rewrite starts here (Iceberg's public Java API through Py4J); apart are the order
its rows are written in (`icemaint.engine.relayout`), a commit made again after a lost race (`icemaint.engine.commits`)
and its errors (`icemaint.engine.staging_errors`):

- `plan_date_files` / `plan_table_files`: the data files of one date (or of the whole table) as of the
  planned snapshot S (every partition spec the table has had), each with the delete files that apply
  (the scan is turned into files by `icemaint.engine.planning`).
- `StagingArea.stage`: creates the staging branch at S, reads exactly the chosen files as of S
  (Iceberg's scan-task-set read: deletes as of S applied, no predicate that could drop a row) and
  writes the replacement files to the branch, in the table's codec or zstd where it names none
  (`icemaint.engine.codec`); a bin-pack of files without deletes digests the rows on their way to the
  writer for the proof (`feed`). `main` does not move.
- `StagingArea.before_rows` / `after_rows`: the two sides of the proof, read the same exact way.
- `StagingArea.publish`: one `replace` commit on `main` that swaps exactly the proven old files
  for exactly the proven new files, validated from S with S's data sequence number, with the
  proof's evidence in the snapshot summary, committed until it lands (`icemaint.engine.publish`).
  A writer's conflicting commit raises `PublishConflict`.
- `StagingArea.discard`: removes the staging branch (also of runs that died: `stale_branches`).

Nothing here ever moves a ref backwards: no rollback, no set-current, no cherry-pick.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from icemaint.domain.health import MAINTENANCE_TAG, STAGE_PREFIX
from icemaint.domain.names import TableName
from icemaint.domain.rewrite_plan import CandidateFile, FileGroup, SortKey, read_splits
from icemaint.engine.codec import PROPERTIES as CODEC_PROPERTIES, SESSION_CODEC, WriteCodec, write_codec
from icemaint.engine.commits import commit_racing, commit_ref_change, publish_backoff, publish_race
from icemaint.engine.digest import can_feed
from icemaint.engine.java import (CONFLICT_CLASSES, COMMIT_STATE_UNKNOWN, _java_list, _with_files,
                                  dropping_interrupted_call, find_on_main, is_interrupt, iterate_java, java_class,
                                  java_exception_class, java_root_message, listed_java, one_java_line)
from icemaint.engine.planning import TasksOf, dangling_deletes, data_files_of, date_filter, plan_files
from icemaint.engine.publish import PendingPublish, PublishBaseMoved
from icemaint.engine.relayout import ordered_rows, with_sort_order
from icemaint.engine.spark_session import iceberg_table
from icemaint.engine.staging_errors import PublishConflict, PublishStateUnknown, StagingError

log = logging.getLogger(__name__)

# Snapshot summary keys: the evidence a published rewrite carries in the table itself.
RUN_ID_KEY = "icemaint.run-id"
PROOF_KEY = "icemaint.proof"
PROOF_ID_KEY = "icemaint.proof-id"
STAGED_SNAPSHOT_KEY = "icemaint.staged-snapshot-id"
STAGE_KEY = "icemaint.stage"


@dataclass
class StagedRewrite:
    """One file group written to a staging branch, not yet published.

    Attributes:
        table: The table key.
        branch: The staging branch's name.
        base_snapshot_id: S, the snapshot the group was planned on and staged from.
        staged_snapshot_id: The branch's snapshot holding the new files.
        replaced_files: Paths of the files the group replaces (as of S): data files, or with target
            "position_deletes" the position-delete files.
        new_files: Paths of the staged replacement files.
        dangling_deletes: Paths of position-delete files that apply only to replaced data files.
        target: "data" (data files rewritten, their deletes applied) or "position_deletes" (only the
            position-delete files rewritten; the data files stay).
    """

    table: str
    branch: str
    base_snapshot_id: int
    base_sequence_number: int
    staged_snapshot_id: int
    replaced_files: tuple[str, ...]
    new_files: tuple[str, ...]
    dangling_deletes: tuple[str, ...]
    replaced_bytes: int
    target: str = "data"
    # The scan tasks of the rows the proof compares, as of S: the replaced data files, or the data files
    # the replaced position deletes apply to.
    _old_tasks: Sequence = field(default_factory=list, repr=False)
    _new_files: list = field(default_factory=list, repr=False)  # DataFiles, or DeleteFiles
    _removed_deletes: list = field(default_factory=list, repr=False)  # DeleteFiles the publish removes
    _scan_filter: object = field(default=None, repr=False)  # the date's filter (position deletes' after side)
    _old_task_set: str | None = field(default=None, repr=False)  # the staged scan-task set of `_old_tasks`
    _old_java_tasks: object = field(default=None, repr=False)  # `_old_tasks` as the Java list staged, when kept
    applied_deletes: int = 0  # delete files that applied to the replaced data files (their rewrite applies them)
    # The old rows' digest taken by the read that fed the writer (`digest.digest_feed`), with the replaced
    # files' record counts from their manifests, which that read must account for; None when not fed.
    feed: object = field(default=None, repr=False)
    replaced_rows: dict = field(default_factory=dict, repr=False)
    codec: WriteCodec | None = None  # the new files' compression codec and who chose it
    # Written into the table's current layout (a rewrite for layout drift): publishing gains even when it writes
    # as many files as it replaces, or more (a day's file into its hours, an oversized file split).
    relayout: bool = False


@dataclass(frozen=True)
class Published:
    snapshot_id: int
    sequence_number: int
    # The catalog answered CommitStateUnknownException and a re-read found the commit: it landed, but
    # the audit must say the outcome was first unknown.
    state_was_unknown: bool = False
    # seconds of each commit attempt, the last one the commit that landed (earlier ones lost races)
    attempts: tuple[float, ...] = ()


class StagingArea:
    """Stage, read, publish and discard rewrites of one table (one instance per run)."""

    def __init__(self, spark, catalog: str, name: TableName, run_token: str, race_timeout_seconds: float = 120.0):
        self.spark = spark
        # how long a staging or publish commit that only loses races keeps trying (policy `publish_timeout`)
        self.race_timeout_seconds = race_timeout_seconds
        self.catalog = catalog
        self.name = name
        self.run_token = "".join(c for c in run_token.lower() if c.isalnum())[:24] or uuid.uuid4().hex[:12]
        self._table = None
        self._task_sets: list[str] = []
        self._weights: dict[str, int] = {}  # a planned file's scan weight (bytes), when planned in bulk
        self._removed_by_publish: set[str] = set()  # staging branches a landed publish's swap removed

    @property
    def jvm(self):
        """The session's JVM (a lazily started session starts on first use, not when the area is made)."""
        return self.spark._jvm

    # -- table -----------------------------------------------------------------------------
    def table(self, refresh: bool = True):
        if self._table is None:
            self._table = iceberg_table(self.spark, self.catalog, self.name)
        elif refresh:
            self._table.refresh()
        return self._table

    def current_snapshot_id(self) -> int | None:
        snap = self.table().currentSnapshot()
        return None if snap is None else int(snap.snapshotId())

    # -- planning --------------------------------------------------------------------------
    def plan_date_files(self, snapshot_id: int, column: str, column_type: str, start: dt.date, end: dt.date
                        ) -> tuple[list[CandidateFile], Mapping]:
        """The data files holding rows in [start, end) as of `snapshot_id`, across every partition spec.

        Returns:
            (candidates, tasks by path): the pure description for planning, and the Java scan tasks
            (file + deletes) the staging reads.
        """
        # ignoreResiduals: a file that also holds rows of other dates (a table dated by its time column's
        # bounds, or a file of an older spec without the time field) is rewritten and replaced whole, so its
        # tasks must read it whole; with the date's residual Iceberg's Parquet reader skips the row groups
        # outside the date, and the publish would drop their rows (the proof, reading the same tasks, with them).
        return self._plan(self.table().newScan().useSnapshot(int(snapshot_id))
                          .filter(self.date_filter(column, column_type, start, end)).ignoreResiduals(), snapshot_id)

    def date_filter(self, column: str, column_type: str, start: dt.date, end: dt.date):
        """Iceberg's expression for rows in [start, end) of the time column."""
        return date_filter(self.jvm, column, column_type, start, end)

    def plan_table_files(self, snapshot_id: int) -> tuple[list[CandidateFile], Mapping]:
        """Every data file of the table as of `snapshot_id` (a table maintained per partition, not per date)."""
        return self._plan(self.table().newScan().useSnapshot(int(snapshot_id)), snapshot_id)

    def current_spec_id(self) -> int:
        return int(self.table(refresh=False).spec().specId())

    def _plan(self, scan, snapshot_id: int | None = None) -> tuple[list[CandidateFile], Mapping]:
        planned = plan_files(self.jvm, self.table(refresh=False), scan, snapshot_id, self.name.key)
        self._weights = planned.weights  # a re-plan (after a publish conflict) weighs its own tasks
        return planned.candidates, planned.tasks

    def write_codec(self, deletes: bool = False) -> WriteCodec:
        """The codec the rewrite's files get: the table's or the session's, else zstd (`icemaint.engine.codec`)."""
        props = self.table(refresh=False).properties()
        return write_codec({key: props.get(key) for key in CODEC_PROPERTIES},
                           self.spark.conf.get(SESSION_CODEC, None), deletes=deletes)

    def sequence_number(self, snapshot_id: int) -> int:
        return int(self.table(refresh=False).snapshot(int(snapshot_id)).sequenceNumber())

    # -- staging ---------------------------------------------------------------------------
    def read_tasks(self, tasks: Sequence, split_size: int | None = None):
        """A DataFrame over exactly these scan tasks (deletes attached to them applied; on a format v3
        table with the row-lineage columns `_row_id` and `_last_updated_sequence_number`)."""
        return self._read_set(self._stage_tasks(tasks), split_size)

    def _stage_tasks(self, tasks: Sequence) -> str:
        """Stages the tasks as a scan-task set: a Java list as it is (one Py4J call), else listed one by one."""
        from py4j.java_collections import JavaList
        from py4j.java_gateway import JavaObject

        set_id = f"icemaint-{uuid.uuid4().hex}"
        manager = java_class(self.jvm, "org.apache.iceberg.spark.ScanTaskSetManager").get()
        manager.stageTasks(self.table(refresh=False), set_id,
                           tasks if isinstance(tasks, (JavaList, JavaObject)) else _java_list(self.jvm, tasks))
        self.track_task_set(set_id)
        return set_id

    def _read_set(self, set_id: str, split_size: int | None = None, lookback: int | None = None):
        reader = self.spark.read.format("iceberg").option("scan-task-set-id", set_id)
        if split_size:
            reader = reader.option("split-size", str(int(split_size))).option("file-open-cost", "0")
        if lookback:
            reader = reader.option("lookback", str(int(lookback)))
        return reader.load(self.name.sql(self.catalog))

    def _write_replacements(self, rows, set_id: str, options: dict[str, str]) -> list:
        """Writes `rows` as the replacement of task set `set_id` and returns the new DataFiles.

        Iceberg's rewrite write (the one `rewrite_data_files` uses) writes the files without committing
        them and carries a format v3 table's row lineage (`_row_id`, `_last_updated_sequence_number`)
        into them, so the rows keep their identity; the files are then committed by us, to the branch.
        """
        writer = rows.write.format("iceberg").option("rewritten-file-scan-task-set-id", set_id)
        for key, value in options.items():
            writer = writer.option(key, value)
        coordinator = java_class(self.jvm, "org.apache.iceberg.spark.FileRewriteCoordinator").get()
        tbl = self.table(refresh=False)
        try:
            writer.mode("append").save(self.name.sql(self.catalog))
            return listed_java(self.jvm, coordinator.fetchNewFiles(tbl, set_id))
        finally:
            coordinator.clearRewrite(tbl, set_id)

    def commit_to_branch(self, branch: str, update, create_at: int | None = None) -> int:
        """One commit to the staging branch, built by `update(table or transaction)` (marked as maintenance's
        staging); the branch's new snapshot id. With `create_at`, the branch is created at that snapshot in the same
        table commit: every commit moves the table's metadata and sequence number under its writers, so staging
        makes one, not two (a branch, then an append to it).

        A commit that lost a race is made again on the fresh table (`commit_racing`): the files are written once,
        only the commit is repeated."""
        def attempt() -> None:
            tbl = self.table()
            if create_at is None:
                update(tbl).set(MAINTENANCE_TAG, "true").set(STAGE_KEY, branch).commit()
                return
            txn = tbl.newTransaction()
            txn.manageSnapshots().createBranch(branch, int(create_at)).commit()
            update(txn).set(MAINTENANCE_TAG, "true").set(STAGE_KEY, branch).commit()
            txn.commitTransaction()

        commit_racing(attempt, "staging", self.name.key, self.race_timeout_seconds)
        return int(self.table().refs().get(branch).snapshotId())

    def branch_name(self, index: int) -> str:
        """This run's `index`-th staging branch (created by its staged commit, `commit_to_branch(create_at=S)`)."""
        return f"{STAGE_PREFIX}{self.run_token}_{index}"

    def track_task_set(self, set_id: str) -> None:
        """A scan-task set staged elsewhere (e.g. of a metadata table), released with this area's reads."""
        self._task_sets.append(set_id)

    def stage(self, group: FileGroup, tasks_by_path: Mapping, base_snapshot_id: int, *, target_file_size_bytes: int,
              strategy: str = "binpack", sort_keys: tuple[SortKey, ...] = (), index: int = 0,
              feed=None) -> StagedRewrite:
        """Writes the group's replacement files to a new staging branch at `base_snapshot_id`.

        `feed(rows, planned rows) -> (rows, FeedDigest)` digests the old rows on their way to the writer; used for a
        bin-pack of files without deletes (the read counts each file's rows, which only then are its
        manifest's record counts), whose writer reads its input exactly once.

        The branch is opened only once the rows to write are planned (read, digested, ordered): a table or a policy
        the read or the order cannot take fails before it, with the table's metadata untouched; a failure from the
        branch on removes the branch again."""
        paths = [f.path for f in group.files]
        tasks = TasksOf(tasks_by_path, paths)  # a task crosses Py4J only if read: the read and commit use the Java list
        # A task's size counts its delete files too: split by what the reader will weigh.
        splits = read_splits([self._weights[f.path] if f.path in self._weights else int(tasks_by_path[f.path].sizeBytes())
                              for f in group.files], group.total_bytes, target_file_size_bytes)
        old_java_tasks = tasks.to_java(self.jvm)
        set_id = self._stage_tasks(old_java_tasks)
        rows = self._read_set(set_id, split_size=splits.split_bytes, lookback=splits.lookback)
        fed = None
        # A layout rewrite range-partitions its rows, whose sampling reads them once more: it is not fed.
        if feed is not None and strategy == "binpack" and group.layout is None \
                and not any(f.delete_files for f in group.files):
            try:
                if can_feed(rows):
                    rows, fed = feed(rows, sum(f.record_count for f in group.files))
            except Exception as exc:  # the proof then reads the old side itself
                log.warning("digesting %s's rewrite as it is read failed, the proof reads it again: %s",
                            self.name.key, java_root_message(exc))
        # No distribution of our own: a bin-pack keeps the read's splits, a sort orders them itself.
        codec = self.write_codec()
        rows, order_options, recorded = ordered_rows(self.spark, self.table(refresh=False), self.catalog, rows, group,
                                                     splits.files, strategy, sort_keys)
        options = {"target-file-size-bytes": str(splits.writer_target),
                   "output-spec-id": str(group.spec_id), "distribution-mode": "none", **codec.options, **order_options}
        branch = self.branch_name(index)
        with self.branch_removed_on_failure(branch, "the rewrite"):
            new_files = self._write_replacements(rows, set_id, options)
            if recorded is not None:
                new_files = with_sort_order(self.jvm, self.table(refresh=False), new_files, recorded)
            staged = self.commit_to_branch(branch, lambda t: _with_files(t.newFastAppend().toBranch(branch),
                                                                        "appendFile", new_files),
                                           create_at=base_snapshot_id)
            dangling = dangling_deletes(self.jvm, [tasks_by_path[f.path] for f in group.files if f.delete_files],
                                        {f.path for f in group.files})
            return StagedRewrite(
                table=self.name.key, branch=branch, base_snapshot_id=int(base_snapshot_id),
                base_sequence_number=self.sequence_number(base_snapshot_id), staged_snapshot_id=int(staged),
                replaced_files=tuple(f.path for f in group.files),
                new_files=tuple(str(f.location()) for f in new_files),
                dangling_deletes=tuple(str(d.location()) for d in dangling),
                replaced_bytes=group.total_bytes, applied_deletes=sum(f.delete_files for f in group.files),
                _old_tasks=tasks, _new_files=new_files, _removed_deletes=dangling, _old_task_set=set_id,
                _old_java_tasks=old_java_tasks,
                feed=fed, replaced_rows={f.path: f.record_count for f in group.files} if fed is not None else {},
                codec=codec, relayout=group.layout is not None)

    @contextmanager
    def branch_removed_on_failure(self, branch: str, what: str):
        """Until the caller holds the StagedRewrite (and so the branch, which it removes from then on), any failure or
        interrupt removes the branch here: an interrupt goes on up as it is, an error as a StagingError."""
        try:
            with dropping_interrupted_call(self.spark):  # the interrupted call's answer is still on the connection
                yield
        except BaseException as exc:
            self.discard(branch)
            if is_interrupt(exc):
                raise
            raise StagingError(f"staging {what} of {self.name.key} failed: {java_root_message(exc)}") from exc

    # -- the proof's two sides ---------------------------------------------------------------
    def before_rows(self, staged: StagedRewrite):
        """The replaced files' rows as of S (deletes as of S applied): the task set the staging read, staged
        once (the same tasks, so the proof compares what was rewritten)."""
        if staged._old_task_set is not None:
            return self._read_set(staged._old_task_set)
        return self.read_tasks(staged._old_tasks)

    def after_rows(self, staged: StagedRewrite):
        """The staged files' rows, as the staging branch holds them (the files its append added to S); for
        rewritten position deletes, the same data files as `before_rows` with the branch's deletes applied."""
        tbl = self.table(refresh=False)
        if staged.target == "position_deletes":
            return self._rows_as_staged(staged)
        wanted = set(staged.new_files)
        scan = tbl.newIncrementalAppendScan().fromSnapshotExclusive(int(staged.base_snapshot_id)) \
            .toSnapshot(int(staged.staged_snapshot_id))
        return self.read_tasks(self._wanted_tasks(scan, wanted, staged, "its new files"))

    def _rows_as_staged(self, staged: StagedRewrite):
        wanted = {str(t.file().location()) for t in staged._old_tasks}
        scan = self.table(refresh=False).newScan().useSnapshot(int(staged.staged_snapshot_id))
        if staged._scan_filter is not None:
            scan = scan.filter(staged._scan_filter).ignoreResiduals()  # whole files, as the before side reads them
        return self.read_tasks(self._wanted_tasks(scan, wanted, staged, "the data files its deletes apply to"))

    def _wanted_tasks(self, scan, wanted: set[str], staged: StagedRewrite, what: str) -> list:
        """The scan's tasks of exactly the `wanted` files; StagingError when the staged snapshot lacks any."""
        iterable = scan.planFiles()
        try:
            tasks = [t for t in listed_java(self.jvm, iterable) if str(t.file().location()) in wanted]
        finally:
            iterable.close()
        if len(tasks) != len(wanted):
            raise StagingError(f"staged snapshot {staged.staged_snapshot_id} of {self.name.key} holds "
                               f"{len(tasks)} of {what} ({len(wanted)})")
        return tasks

    # -- publish / discard -----------------------------------------------------------------
    def publish(self, staged: StagedRewrite, properties: dict[str, str], *, sleep=time.sleep) -> Published:
        """One forward `replace` commit on `main`: exactly the proven old files for the proven new ones (the caller
        removes the staging branch after, `discard`).

        The `replace` is built once (`icemaint.engine.publish.PendingPublish`); an attempt that lost a race (another
        commit landed first, nothing conflicts: the catalog's `CommitFailedException`, or a REST catalog's
        sequence-number race) is made again on the fresh table, with jittered backoff, until `race_timeout_seconds`
        have passed, reusing the manifests the earlier attempts filtered and validating only the snapshots they have
        not: the files are written and proven once, only the commit is repeated. Each attempt's duration is in
        `Published.attempts`; the files of lost attempts are removed once the outcome is known.

        Raises:
            PublishConflict: A writer's commit since S conflicts (Iceberg's validation), or the races went on
                past `race_timeout_seconds`; nothing changed.
            PublishStateUnknown: The catalog could not confirm the commit and it was not found after.
        """
        from py4j.protocol import Py4JJavaError

        pending = self._pending_publish(staged, properties)
        try:
            self._prepare_publish(pending)  # outside the race and its time budget
            attempts = commit_racing(lambda: self._commit_publish(pending), "publish", self.name.key,
                                     self.race_timeout_seconds, sleep, backoff=publish_backoff)
        except Py4JJavaError as exc:
            cls, first, tried = java_exception_class(exc), one_java_line(exc), getattr(exc, "attempts", ())
            if cls in CONFLICT_CLASSES or publish_race(exc):
                pending.abandon()
                raise PublishConflict(f"{(cls or '').rsplit('.', 1)[-1]}: {first}", attempts=tried) from exc
            if cls == COMMIT_STATE_UNKNOWN:  # its files may be committed: nothing is removed
                found = self.find_published(staged.staged_snapshot_id)
                if found is not None:
                    log.warning("publish of %s reported an unknown commit state; the commit landed (%s)",
                                self.name.key, found.snapshot_id)
                    return Published(found.snapshot_id, found.sequence_number, state_was_unknown=True,
                                     attempts=tried)
                raise PublishStateUnknown(
                    f"the catalog could not confirm the publish of {self.name.key} and the commit is not in "
                    f"the table after a re-read: {first}") from exc
            raise
        except PublishBaseMoved as exc:
            pending.abandon()
            raise StagingError(f"publish of {self.name.key}: {exc}") from exc
        if pending.committed_snapshot_id is not None:
            pending.landed()
            if pending.remove_branch is not None:  # the swap that landed left the branch out of main's metadata
                self._removed_by_publish.add(pending.remove_branch)
        found = self.find_published(staged.staged_snapshot_id)
        if found is None:
            raise PublishStateUnknown(f"publish of {self.name.key} returned but its snapshot is not in the table")
        return Published(found.snapshot_id, found.sequence_number, attempts=tuple(attempts))

    def _pending_publish(self, staged: StagedRewrite, properties: dict[str, str]) -> PendingPublish:
        """The publish's `replace` on main, built once (`icemaint.engine.publish`): exactly the proven old files for
        the proven new ones, validated from S, the new data files at S's data sequence number (deletes a writer
        commits after S still apply to them), the proof's evidence in the snapshot summary."""
        tbl = self.table()
        rewrite = tbl.newRewrite().validateFromSnapshot(staged.base_snapshot_id)
        if staged.target == "data":
            rewrite = rewrite.dataSequenceNumber(staged.base_sequence_number)
            replaced = None if staged._old_java_tasks is None else data_files_of(self.jvm, staged._old_java_tasks)
            if replaced is not None:  # one Py4J call, not two a file (0.3-0.9 s for 3,000 files)
                empty = java_class(self.jvm, "java.util.HashSet")
                rewrite = rewrite.rewriteFiles(replaced, empty(), empty(), empty())
            else:
                for task in staged._old_tasks:
                    rewrite = rewrite.deleteFile(task.file())
        for delete in staged._removed_deletes:
            rewrite = rewrite.deleteFile(delete)
        for new in staged._new_files:
            rewrite = rewrite.addFile(new)
        marker = {**properties, MAINTENANCE_TAG: "true", STAGED_SNAPSHOT_KEY: str(staged.staged_snapshot_id)}
        for key, value in marker.items():
            rewrite = rewrite.set(key, str(value))
        pending = PendingPublish(self.jvm, self.spark.sparkContext._gateway, tbl, rewrite, staged.base_snapshot_id,
                                 remove_branch=staged.branch)
        pending.skip_manifest_merge()
        return pending

    def _prepare_publish(self, pending: PendingPublish) -> None:
        """The publish applied once before its first attempt (`PendingPublish.prepare`): a date of 3,000 single-file
        commits took 59 s here on a loaded machine (every manifest listing a replaced file read and filtered), each
        attempt after it 1 s."""
        pending.prepare()

    def _commit_publish(self, pending: PendingPublish) -> None:
        """One attempt of the publish: the pending `replace` applied to the refreshed table and swapped in.

        Alone, not in a transaction with the branch's removal (a transaction holding a ref change cannot be
        re-applied: "Table metadata refresh is required" at the first race). Not Iceberg's `commit()` either: once
        its own retries are spent it cleans the pending rewrite up, and the next attempt filtered every manifest
        listing a replaced file again (33-126 s for a date of 3,000 files on a loaded machine,
        benchmarks/publish_race.py); here an attempt after a lost race reuses them. The staging branch goes in the
        same metadata swap (`PendingPublish.remove_branch`): a publish is one catalog commit, and `discard` after it
        finds the branch gone."""
        pending.attempt()

    def find_published(self, staged_snapshot_id: int) -> Published | None:
        """The `main` snapshot that published `staged_snapshot_id`, searched on main's lineage."""
        snap = find_on_main(self.table(), STAGED_SNAPSHOT_KEY, str(staged_snapshot_id))
        return None if snap is None else Published(int(snap.snapshotId()), int(snap.sequenceNumber()))

    def discard(self, branch: str) -> None:
        """Removes a staging branch (no-op when it is gone); its files are reclaimed by expiry. A branch the publish's
        swap removed is known gone without reading the table again."""
        if branch in self._removed_by_publish:
            return
        commit_ref_change(self.table, lambda t: t.manageSnapshots().removeBranch(branch)
                          if t.refs().containsKey(branch) else None)

    def release_reads(self) -> None:
        if not self._task_sets:
            return
        manager = java_class(self.jvm, "org.apache.iceberg.spark.ScanTaskSetManager").get()
        tbl = self.table(refresh=False)
        for set_id in self._task_sets:
            manager.removeTasks(tbl, set_id)
        self._task_sets.clear()

    def stale_branches(self) -> list[tuple[str, int]]:
        """Staging branches left on the table (by a run that died): (name, snapshot id)."""
        refs = self.table().refs()
        out = []
        for name in iterate_java(refs.keySet()):
            if str(name).startswith(STAGE_PREFIX):
                out.append((str(name), int(refs.get(name).snapshotId())))
        return sorted(out)
