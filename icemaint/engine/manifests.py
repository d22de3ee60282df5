"""Manifest rewrites on Spark: the current snapshot's manifests merged into fewer, larger ones, committed
against a writer's concurrent commits the way every retention commit is (`icemaint.engine.retention`)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping

from icemaint.domain.health import MAINTENANCE_TAG
from icemaint.domain.names import TableName
from icemaint.domain.retention import _ms
from icemaint.engine.retention import (
    _SEARCH_MARGIN_MS, COMMIT_TOKEN_KEY, BeforeCommit, _catalog, _commit, _marked_snapshot, _table,
)
from icemaint.engine.java import GUAVA_LISTS, java_class
from icemaint.engine.manifest_list import CurrentManifests, read_current_manifests, snapshot_manifests

# Iceberg's default `commit.manifest.target-size-bytes`, used only to estimate a dry run.
_MANIFEST_TARGET_BYTES = 8 * 2**20


@dataclass(frozen=True)
class ManifestResult:
    table: str
    dry_run: bool
    manifests_before: int
    bytes_before: int
    manifests_after: int  # in a dry run, an estimate at Iceberg's default 8 MiB target size
    bytes_after: int | None  # unknown in a dry run
    rewritten_manifests: int = 0
    added_manifests: int = 0
    snapshot_id: int | None = None  # the rewrite's commit on main (None: nothing committed)
    # The catalog could not confirm the commit; a re-read found it on main (counts from its summary).
    state_was_unknown: bool = False


def _count(jvm, java_iterable) -> int:
    return int(java_class(jvm, GUAVA_LISTS).newArrayList(java_iterable).size())


def rewrite_manifests(spark, catalog: str, table: TableName | str, *, dry_run: bool = False,
                      properties: Mapping[str, str] | None = None,
                      before_commit: BeforeCommit | None = None,
                      current: CurrentManifests | None = None) -> ManifestResult:
    """Rewrites the current snapshot's manifests into fewer, larger ones (Iceberg's RewriteManifests action,
    what the `rewrite_manifests` procedure runs).

    The rewrite is planned on the table as loaded when the call starts (snapshot S) and committed
    against the table as it is then: Iceberg validates that every manifest it replaces is still in
    the table, so a writer's commit since S that rewrote one (a copy-on-write delete or overwrite, a
    compaction by another engine) makes it refuse (`RetentionConflict`); a writer's appends are kept.
    The commit carries `properties`, `icemaint.maintenance=true` and a commit token in its snapshot
    summary, so it is found on `main` again (its snapshot id, and whether it landed when the catalog
    could not confirm it).

    A dry run reports the current manifests and an estimate of the count afterwards (data
    manifests merged per partition spec up to 8 MiB each; delete manifests are not rewritten).

    `current` is the table as the caller loaded it and decided on (`read_current_manifests`): the rewrite plans on
    that snapshot and reports its manifests as the figures before; loaded now when not given. The figures after
    are the committed snapshot's manifests (a writer's later commits are not counted).

    Raises:
        RetentionConflict: Iceberg refused the commit because of a writer's commit; nothing changed.
        RetentionCommitUnknown: The commit state is unknown and the commit is not on `main` after a re-read.
    """
    table = _table(table)
    _catalog(catalog)
    if current is None:
        current = read_current_manifests(spark, catalog, table)
    before = current.manifests
    base = dict(table=table.key, dry_run=dry_run, manifests_before=len(before),
                bytes_before=sum(m.length for m in before))
    if dry_run or not before:
        by_spec: dict[int, int] = {}
        for m in before:
            if m.content == 0:
                by_spec[m.partition_spec_id] = by_spec.get(m.partition_spec_id, 0) + m.length
        estimate = sum(1 for m in before if m.content != 0) + sum(
            max(1, math.ceil(total / _MANIFEST_TARGET_BYTES)) for total in by_spec.values())
        return ManifestResult(**base, manifests_after=estimate if before else 0,
                              bytes_after=None if before else 0)
    marker = {MAINTENANCE_TAG: "true", COMMIT_TOKEN_KEY: uuid.uuid4().hex, **(properties or {})}
    token = str(marker[COMMIT_TOKEN_KEY])
    since_ms = _ms(datetime.now(timezone.utc)) - _SEARCH_MARGIN_MS
    jvm = spark._jvm
    planned = current.table  # S: the action plans on this object's snapshot

    def call():
        actions = java_class(jvm, "org.apache.iceberg.spark.actions.SparkActions").get(spark._jsparkSession)
        action = actions.rewriteManifests(planned)
        for key, value in marker.items():
            action = action.snapshotProperty(str(key), str(value))
        return action.execute()

    def landed() -> bool:
        return _marked_snapshot(spark, catalog, table, COMMIT_TOKEN_KEY, token, since_ms) is not None

    result, state_was_unknown = _commit(call, before_commit, landed, f"manifest rewrite of {table.key}")
    committed = _marked_snapshot(spark, catalog, table, COMMIT_TOKEN_KEY, token, since_ms)
    if state_was_unknown and committed is not None:
        summary = committed.summary()
        rewritten, added = int(summary.get("manifests-replaced") or 0), int(summary.get("manifests-created") or 0)
    elif state_was_unknown:
        rewritten = added = 0
    else:
        rewritten, added = _count(jvm, result.rewrittenManifests()), _count(jvm, result.addedManifests())
    # The committed snapshot's own list (no rewrite committed: S's manifests are still the table's).
    after = before if committed is None else snapshot_manifests(jvm, planned.io(), committed)
    return ManifestResult(**base, manifests_after=len(after), bytes_after=sum(m.length for m in after),
                          rewritten_manifests=rewritten, added_manifests=added,
                          snapshot_id=None if committed is None else int(committed.snapshotId()),
                          state_was_unknown=state_was_unknown)
