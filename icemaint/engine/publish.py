"""The publish commit of a staged rewrite: one pending `replace`, built once and committed until it lands.

Iceberg's `SnapshotProducer.commit()` retries a lost race itself (`commit.retry.*`, 4 retries by default), keeping
the manifests it already filtered; once those retries are spent it cleans everything up (`cleanAll`) and a new
attempt must build the rewrite again: the replaced files' deletes over Py4J and the filtering of every manifest that
lists them, read and written again (minutes for a date of 3,000 single-file commits on a loaded machine,
benchmarks/publish_race.py), far longer than a streaming writer's interval, so the publish starved.

`PendingPublish` drives the same steps as `SnapshotProducer.commit()` through Iceberg's public API, one attempt at a
time: `apply()` (refresh, validate, filter and merge manifests, write the manifest list) then
`TableOperations.commit(base, metadata)` (the catalog's atomic swap). The pending rewrite is never cleaned up between
attempts, so its filtered manifests stay cached and an attempt after a lost race costs the refresh, the validation,
the manifest list and the metadata write only. The uncommitted files are removed once the outcome is known, as
Iceberg removes them (`cleanUncommitted`).

The validation window moves forward over the snapshots an attempt has already validated (`validateFromSnapshot`):
without it every lost race makes the next attempt validate more (a death spiral against a writer that commits
deletes). This is equivalent to validating from S, the staging base: Iceberg's check of a rewrite
(`BaseRewriteFiles.validate`) is, besides the replaced files still being there (checked on the current manifests at
every attempt, not per window), "no `overwrite` or `delete` snapshot on main since the start added a position
delete (or DV) that applies to a replaced file, counting deletes whose data sequence number is above the start's".
A union over the windows (S, P1], (P1, P2], ...: an attempt fails only at the swap after its `apply()` validated its
window. A delete file added by an `overwrite` or `delete` snapshot takes that snapshot's sequence number (RowDelta,
OverwriteFiles and DeleteFiles have no way to set another; only RewriteFiles, a `replace`, can), which is above
every earlier snapshot's on main's lineage, so it passes the threshold of S and of P1 alike and is found or not in
either window the same way. A main that moved back past P1 fails the check ("Cannot determine history") and the
publish re-plans, as on a real conflict.
"""

from __future__ import annotations

import logging

from icemaint.engine.java import COMMIT_FAILED, java_class, java_exception_class

log = logging.getLogger(__name__)

MAIN = "main"


def before_swap(pending: "PendingPublish") -> None:
    """Test seam: called by every attempt between its `apply()` and its swap (where a writer's commit makes it lose
    the race)."""


class PublishBaseMoved(RuntimeError):
    """The table's operations were refreshed between an attempt's `apply()` and its swap (a bug: nothing else may
    use them meanwhile); nothing was committed."""


class PendingPublish:
    """One staged rewrite's `replace` on main, built once, committed by `attempt()` until it lands.

    Attributes:
        validated_from: The snapshot the next attempt validates from: S at first, then the main head the last
            attempt validated up to (its lost race found no conflict up to there).
        attempts_made: attempts so far (each an `apply()` and a swap).
    """

    def __init__(self, jvm, gateway, table, rewrite, base_snapshot_id: int, remove_branch: str | None = None):
        self.jvm = jvm
        # the staging branch the swap removes in the same metadata commit (one catalog commit, not two): each
        # attempt builds its metadata from the fresh base, so a lost race re-applies the removal too
        self.remove_branch = remove_branch
        self.gateway = gateway
        self.table = table
        self.rewrite = rewrite
        self.validated_from = int(base_snapshot_id)
        self.attempts_made = 0
        self._manifest_lists: list[str] = []  # written by each attempt's apply()
        self._prepared = None  # `prepare`'s snapshot, which the first attempt swaps in as it is
        self.committed_snapshot_id: int | None = None

    def skip_manifest_merge(self) -> bool:
        """Turns off manifest merging for this rewrite only; True when done.

        A streaming writer's fast appends add a small manifest per commit and never merge them; past
        `commit.manifest.min-count-to-merge` (100) of them, a `replace` merges them all into one, and since each
        writer's commit adds one more, the merged set differs at every attempt and is read and written again: measured
        on the 3,000-commit date under a writer every 0.5 s, attempts grew from 2 to 5 s as the writer's manifests
        piled up, longer than the writer's interval. Merging changes how manifests are laid out, never which files
        are live (the manifest rewrite maintenance merges them later). Iceberg offers no per-operation setting (the
        table property is read when the operation is made), so the operation's merge managers' `mergeEnabled` is set
        by reflection; where the fields are not there (another Iceberg), merging stays on and this says so."""
        try:
            producer = self._merging_producer_class()
            for name in ("mergeManager", "deleteMergeManager"):
                holder = producer.getDeclaredField(name)
                holder.setAccessible(True)
                manager = holder.get(self.rewrite)
                klass = manager.getClass()
                while klass is not None and klass.getName() != "org.apache.iceberg.ManifestMergeManager":
                    klass = klass.getSuperclass()
                if klass is None:
                    raise RuntimeError(f"{manager.getClass().getName()} is not a ManifestMergeManager")
                enabled = klass.getDeclaredField("mergeEnabled")
                enabled.setAccessible(True)
                enabled.setBoolean(manager, False)
            return True
        except Exception as exc:  # noqa: BLE001 (another Iceberg: the publish merges, slower, still correct)
            log.warning("could not turn manifest merging off for the publish (it merges, and each attempt may take "
                        "longer): %s", exc)
            return False

    def _merging_producer_class(self):
        producer = self.rewrite.getClass()  # Iceberg's classes come from Spark's loader, not the system one
        while producer is not None and producer.getName() != "org.apache.iceberg.MergingSnapshotProducer":
            producer = producer.getSuperclass()
        if producer is None:
            raise RuntimeError(f"{self.rewrite.getClass().getName()} is not a MergingSnapshotProducer")
        return producer

    def prepare(self) -> None:
        """Applies the rewrite once without committing: the slow part of a first attempt (every manifest listing a
        replaced file read and filtered) happens before the race, and every attempt after reuses it. Raises Iceberg's
        `ValidationException` on a conflict already there."""
        self.rewrite.validateFromSnapshot(self.validated_from)
        snapshot = self.rewrite.apply()
        self._manifest_lists.append(str(snapshot.manifestListLocation()))
        if snapshot.parentId() is not None:  # validated up to there, as after a lost race
            self.validated_from = int(snapshot.parentId())
        self._prepared = snapshot

    def attempt(self) -> int:
        """Applies the rewrite to the refreshed table and swaps main to it; the new snapshot's id.

        Raises the catalog's `CommitFailedException` (Py4JJavaError) when another commit landed between the refresh
        and the swap (then the window validated so far is remembered), Iceberg's `ValidationException` on a real
        conflict, `CommitStateUnknownException` when the catalog cannot tell."""
        from py4j.protocol import Py4JJavaError

        self.attempts_made += 1
        snapshot, self._prepared = self._prepared, None
        if snapshot is None:
            self.rewrite.validateFromSnapshot(self.validated_from)
            snapshot = self.rewrite.apply()  # refreshes the table's operations: their current() is this base
            self._manifest_lists.append(str(snapshot.manifestListLocation()))
        # else `prepare` applied it just now on these operations' current() (nothing refreshed them since): applying
        # it again read the table and wrote a manifest list once more for the same snapshot. The swap below is the
        # catalog's compare-and-swap from that base either way: a commit that landed meanwhile makes it fail (a lost
        # race), and the next attempt applies afresh.
        ops = self.table.operations()
        base = ops.current()
        parent = snapshot.parentId()
        head = base.ref(MAIN)
        if (None if head is None else int(head.snapshotId())) != (None if parent is None else int(parent)):
            # only another refresh of these operations between apply() and here could do it: never commit a
            # snapshot whose parent is not main's head (that would drop the commits in between)
            raise PublishBaseMoved(f"main moved between the publish's apply and its commit (parent {parent}, "
                                   f"head {None if head is None else head.snapshotId()})")
        builder = java_class(self.jvm, "org.apache.iceberg.TableMetadata").buildFrom(base) \
            .setBranchSnapshot(snapshot, MAIN)
        if self.remove_branch is not None and base.ref(self.remove_branch) is not None:
            builder = builder.removeRef(self.remove_branch)
        updated = builder.build()
        before_swap(self)
        try:
            ops.commit(base, updated.withUUID())
        except Py4JJavaError as exc:
            if java_exception_class(exc) == COMMIT_FAILED and parent is not None:
                # apply() validated (validated_from, parent] and found no conflict: the next attempt starts there
                self.validated_from = int(parent)
            raise
        self.committed_snapshot_id = int(snapshot.snapshotId())
        return self.committed_snapshot_id

    def landed(self) -> None:
        """After the commit landed: removes the files the lost attempts wrote (as `SnapshotProducer.commit` does).
        With one `apply()` made, every file it wrote is in the committed snapshot: there is nothing to remove, and
        the table is not read again for it."""
        if len(self._manifest_lists) <= 1:
            self._manifest_lists.clear()
            return
        saved = self.table.operations().refresh().snapshot(self.committed_snapshot_id)
        if saved is None:  # not readable yet (an eventually consistent store): keep the files, as Iceberg does
            return
        committed = java_class(self.jvm, "java.util.HashSet")(saved.allManifests(self.table.io()))
        self._clean(committed, keep=str(saved.manifestListLocation()))

    def abandon(self) -> None:
        """After a real conflict or the time budget: removes every file the attempts wrote (nothing was committed)."""
        self._clean(java_class(self.jvm, "java.util.HashSet")(), keep=None)

    def _clean(self, committed, keep: str | None) -> None:
        io = self.table.io()
        for path in self._manifest_lists:
            if path != keep:
                _best_effort(lambda p=path: io.deleteFile(p), "a manifest list")
        self._manifest_lists.clear()
        _best_effort(lambda: self._clean_uncommitted(committed), "the uncommitted manifests")

    def _clean_uncommitted(self, committed) -> None:
        """`MergingSnapshotProducer.cleanUncommitted(committed)`: protected in Iceberg's API, the clean-up its own
        `commit()` makes; reached by reflection (a class on the class path, no module barrier)."""
        klass = java_class(self.jvm, "java.lang.Class")
        params = self.gateway.new_array(self.jvm.java.lang.Class, 1)
        params[0] = klass.forName("java.util.Set")
        method = self._merging_producer_class().getDeclaredMethod("cleanUncommitted", params)
        method.setAccessible(True)
        args = self.gateway.new_array(self.jvm.java.lang.Object, 1)
        args[0] = committed
        method.invoke(self.rewrite, args)


def _best_effort(call, what: str) -> None:
    """A clean-up that fails leaves unreferenced files (orphan removal takes them); the publish's outcome stands."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 (any failure of a clean-up is only logged)
        log.warning("removing %s of a publish's lost attempts failed (orphan removal will take it): %s", what, exc)
