"""Retention planning, pure: which snapshots an expiry removes, and when expiry, orphan removal and a
manifest rewrite are due (`plan_expiry`, `procedure_retains`, `expiry_due`, `manifests_due`,
`orphan_cutoff`). `icemaint.engine.retention` carries the plans out on Spark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable, Mapping

from icemaint.domain.policy import ORPHAN_MIN_AGE_SECONDS, TablePolicy
from icemaint.domain.units import human_duration, human_size
from icemaint.errors import OperationalError, UserError

MAIN_BRANCH = "main"
# Iceberg's remove_orphan_files procedure refuses younger cutoffs: files of a commit still in
# flight look like orphans until that commit lands.
ORPHAN_MIN_AGE = timedelta(seconds=ORPHAN_MIN_AGE_SECONDS)
# Longer ages overflow date arithmetic (a cutoff before year 1): refused as settings, not crashed on.
MAX_AGE_SECONDS = 100 * 366 * 86400
# Iceberg's retainLast takes a Java int.
MAX_RETAIN_LAST = 2**31 - 1


class RetentionError(UserError, ValueError):
    """A retention setting or request that is not allowed; the message names the setting."""


class StaleExpiryPlan(OperationalError, RetentionError):
    """The table moved since the expiry was planned: a planned snapshot is now kept by a ref, or gone."""


class ConcurrentExpiry(OperationalError, RetentionError):
    """The expiry ran, but other snapshots are gone than planned (a concurrent commit changed the table).

    `result` is what the call did (the engine's measured result), for the caller's record.
    """

    def __init__(self, message: str, result: object = None):
        super().__init__(message)
        self.result = result


class GcDisabled(RetentionError):
    """The table has gc.enabled=false: Iceberg refuses to expire snapshots or remove files."""


class QuarantineMoveFailed(OperationalError, RetentionError):
    """An orphan could not be moved into quarantine; earlier ones of the batch may already be there."""


# --------------------------------------------------------------------------------------------
# Table history as planning sees it
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: int
    parent_id: int | None
    timestamp_ms: int
    operation: str | None = None
    manifest_list: str | None = None
    # The summary entries that name a streaming writer's checkpoint (policy `checkpoint_markers`).
    markers: Mapping[str, str] = field(default_factory=dict)

    @property
    def committed_at(self) -> datetime:
        return _from_ms(self.timestamp_ms)


@dataclass(frozen=True)
class SnapshotRef:
    """A branch or tag with the ref's own retention settings (None: the table's defaults apply)."""

    snapshot_id: int
    kind: str = "BRANCH"  # "BRANCH" or "TAG"
    min_snapshots_to_keep: int | None = None
    max_snapshot_age_ms: int | None = None
    max_ref_age_ms: int | None = None

    @classmethod
    def branch(cls, snapshot_id: int, **settings: int | None) -> "SnapshotRef":
        return cls(snapshot_id, "BRANCH", **settings)

    @classmethod
    def tag(cls, snapshot_id: int, **settings: int | None) -> "SnapshotRef":
        return cls(snapshot_id, "TAG", **settings)

    @property
    def is_branch(self) -> bool:
        return self.kind == "BRANCH"


# --------------------------------------------------------------------------------------------
# Pure planning
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpiryPlan:
    """What one expire_snapshots call will do.

    `expiring_snapshot_ids` is exactly the set Iceberg removes with `older_than` and `retain_last` on
    the planned table state (the engine names these ids in its call, so a later commit cannot add
    others); `protected` says why each remaining snapshot stays. `notes` records every adjustment made
    to the request.
    """

    older_than: datetime
    retain_last: int
    keep_files: bool
    expiring_snapshot_ids: tuple[int, ...]
    protected: Mapping[int, str]
    requested_older_than: datetime
    snapshot_count: int
    dropped_refs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def is_noop(self) -> bool:
        return not self.expiring_snapshot_ids and not self.dropped_refs


def _aware(value: datetime, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise RetentionError(f"{what} must be a timezone-aware datetime (e.g. datetime.now(timezone.utc)), got {value!r}")
    return value.astimezone(timezone.utc)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)


# Integer arithmetic, not float timestamps: the cutoff literal must hit a snapshot's millisecond exactly.
def _ms(value: datetime) -> int:
    return (value - _EPOCH) // _ONE_MS


def _from_ms(ms: int) -> datetime:
    return _EPOCH + ms * _ONE_MS


def check_seconds(value: float, setting: str) -> float:
    """A validated age in seconds.

    Raises:
        RetentionError: not a finite number of zero or more seconds, at most 100 years.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RetentionError(f"{setting}={value!r} is not a number of seconds")
    if value < 0:
        raise RetentionError(f"{setting}={value!r} is negative; an age must be zero or more seconds")
    if value > MAX_AGE_SECONDS:
        raise RetentionError(f"{setting}={value:g} seconds is more than 100 years; an age must be at most that")
    return float(value)


def check_retain_last(value: int, setting: str = "retain_last") -> int:
    """A validated retain_last.

    Raises:
        RetentionError: not a whole number from 1 to MAX_RETAIN_LAST.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RetentionError(f"{setting}={value!r} is not allowed; it must be a whole number of at least 1 "
                             "(the current snapshot is always kept)")
    if value > MAX_RETAIN_LAST:
        raise RetentionError(f"{setting}={value} is not allowed; it must be at most {MAX_RETAIN_LAST} "
                             "(Iceberg counts snapshots in a Java int)")
    return value


def _ancestry(head: int, by_id: Mapping[int, SnapshotInfo]) -> list[SnapshotInfo]:
    """The head and its ancestors, newest first, stopping where history was already expired."""
    chain: list[SnapshotInfo] = []
    seen: set[int] = set()
    current: int | None = head
    while current is not None and current in by_id and current not in seen:
        seen.add(current)
        chain.append(by_id[current])
        current = by_id[current].parent_id
    return chain


def _kept_refs(refs: Mapping[str, SnapshotRef], by_id: Mapping[int, SnapshotInfo], now_ms: int) -> dict[str, SnapshotRef]:
    """Refs Iceberg keeps: main always; others while their snapshot exists and is within max_ref_age."""
    kept = {}
    for name, ref in refs.items():
        if name == MAIN_BRANCH:
            kept[name] = ref
            continue
        snap = by_id.get(ref.snapshot_id)
        if snap is None:
            continue
        if ref.max_ref_age_ms is None or now_ms - snap.timestamp_ms <= ref.max_ref_age_ms:
            kept[name] = ref
    return kept


def procedure_retains(snapshots: Iterable[SnapshotInfo], refs: Mapping[str, SnapshotRef], older_than_ms: int,
                      retain_last: int, now_ms: int) -> set[int]:
    """The snapshot ids Iceberg's expire_snapshots keeps for these arguments.

    A transcription of `org.apache.iceberg.RemoveSnapshots` (1.10): kept refs' snapshots; per branch,
    the ancestors walked newest first while fewer than min-snapshots-to-keep are kept or the
    ancestor is not older than the cutoff (the walk stops at the first one that is); snapshots on
    no branch's ancestry that are not older than the cutoff. Per-ref settings override the defaults.
    """
    by_id = {s.snapshot_id: s for s in snapshots}
    kept_refs = _kept_refs(refs, by_id, now_ms)
    retained = {ref.snapshot_id for ref in kept_refs.values()}
    on_a_branch: set[int] = set()
    for ref in kept_refs.values():
        if not ref.is_branch:
            on_a_branch.add(ref.snapshot_id)
            continue
        cutoff = now_ms - ref.max_snapshot_age_ms if ref.max_snapshot_age_ms is not None else older_than_ms
        keep = ref.min_snapshots_to_keep if ref.min_snapshots_to_keep is not None else retain_last
        chain = _ancestry(ref.snapshot_id, by_id)
        # The whole ancestry counts as referenced, also beyond where the retention walk stops.
        on_a_branch.update(s.snapshot_id for s in chain)
        walked: set[int] = set()
        for snap in chain:
            if len(walked) < keep or snap.timestamp_ms >= cutoff:
                walked.add(snap.snapshot_id)
            else:
                break
        retained |= walked
    retained |= {s.snapshot_id for s in by_id.values()
                 if s.snapshot_id not in on_a_branch and s.timestamp_ms >= older_than_ms}
    return retained & set(by_id)


def _cutoff_to_keep(snapshot_id: int, by_id: Mapping[int, SnapshotInfo], refs: Mapping[str, SnapshotRef],
                    retain_last: int) -> int | None:
    """The newest cutoff (ms) at which the procedure keeps `snapshot_id`, or None if no cutoff can."""
    best: int | None = None
    on_branch = False
    for ref in refs.values():
        if not ref.is_branch:
            continue
        chain = _ancestry(ref.snapshot_id, by_id)
        ids = [s.snapshot_id for s in chain]
        if snapshot_id not in ids:
            continue
        on_branch = True
        if ref.max_snapshot_age_ms is not None:
            continue  # this branch ignores our cutoff
        keep = ref.min_snapshots_to_keep if ref.min_snapshots_to_keep is not None else retain_last
        position = ids.index(snapshot_id)
        if position < keep:
            return by_id[snapshot_id].timestamp_ms + 1  # kept at any cutoff
        # Every ancestor between the retained head and this one must pass the cutoff.
        needed = min(s.timestamp_ms for s in chain[keep:position + 1])
        best = needed if best is None else max(best, needed)
    if not on_branch:
        return by_id[snapshot_id].timestamp_ms
    return best


def marker_keys(markers: Iterable[str]) -> set[str]:
    """The snapshot summary keys the markers read: `MARKER` or `MARKER@JOB_KEY` (see `checkpoint_snapshots`)."""
    return {k for m in markers for k in m.split("@", 1)}


def checkpoint_snapshots(snapshots: Iterable[SnapshotInfo], markers: Iterable[str]) -> dict[int, str]:
    """The newest snapshot of each streaming writer job that carries its checkpoint marker.

    A marker is a summary key (`flink.max-committed-checkpoint-id`), optionally with the key naming the
    writer's job after `@` (`...@flink.job-id`): each job's newest such snapshot is where it resumes
    after a restart, so expiry must keep it. Returns snapshot id -> why it stays.
    """
    newest: dict[tuple[str, str], SnapshotInfo] = {}
    for snap in snapshots:
        for marker in markers:
            key, _, job_key = marker.partition("@")
            if key not in snap.markers:
                continue
            job = snap.markers.get(job_key, "") if job_key else ""
            current = newest.get((marker, job))
            if current is None or (snap.timestamp_ms, snap.snapshot_id) > (current.timestamp_ms, current.snapshot_id):
                newest[(marker, job)] = snap
    out: dict[int, str] = {}
    for (marker, job), snap in sorted(newest.items()):
        key = marker.partition("@")[0]
        out.setdefault(snap.snapshot_id, f"the newest checkpoint of writer job {job or '(unnamed)'} "
                                         f"({key}={snap.markers[key]})")
    return out


def plan_expiry(snapshots: list[SnapshotInfo], refs: Mapping[str, SnapshotRef], now: datetime, policy: TablePolicy, *,
                older_than_seconds: float | None = None, retain_last: int | None = None,
                keep_files: bool | None = None, in_flight_snapshot_ids: Iterable[int] = frozenset()) -> ExpiryPlan:
    """Plans which snapshots one expire_snapshots call removes, never the ones that must stay.

    Kept always: the current snapshot, every branch head and tagged snapshot, the newest
    `retain_last` of each branch, snapshots younger than the owner's `snapshot_min_age`, and
    snapshots an in-flight maintenance run is based on. The procedure takes a cutoff, not ids,
    so the cutoff is lowered to the newest one at which all of these survive; the plan's
    expiring ids are then exactly what Iceberg expires with the plan's arguments.

    Overrides: an explicit `older_than_seconds` inside the owner's window is refused. The
    policy's own `snapshot_older_than` is clamped to the window (noted in the plan). Without an
    explicit override, more than `snapshot_max_count` snapshots raises the cutoff so that only
    the newest `snapshot_max_count` remain, again never inside the window.

    Args:
        snapshots: The table's snapshots (see `read_snapshots`).
        refs: Branches and tags by name, with their own retention settings.
        now: The planning time (timezone-aware).
        policy: The table's policy.
        older_than_seconds: Expire snapshots older than this; default the policy's.
        retain_last: Snapshots of each branch always kept; default the policy's.
        keep_files: Expire the snapshots but leave their files on disk; default the policy's.
        in_flight_snapshot_ids: Snapshots running maintenance is based on.

    Raises:
        RetentionError: read-only policy, retain_last < 1, negative ages, an override inside the
            owner's window, or a snapshot that must stay but that no cutoff can keep.
    """
    now = _aware(now, "now")
    if policy.read_only:
        raise RetentionError("the table's policy is read_only: snapshot expiry is not allowed")
    min_age = check_seconds(policy.snapshot_min_age_seconds, "snapshot_min_age")
    policy_older = check_seconds(policy.snapshot_older_than_seconds, "snapshot_older_than")
    keep = check_retain_last(policy.snapshot_retain_last if retain_last is None else retain_last)
    max_count = policy.snapshot_max_count
    if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
        raise RetentionError(f"snapshot_max_count={max_count!r} must be a whole number of at least 1")
    notes: list[str] = []
    if older_than_seconds is not None:
        older = check_seconds(older_than_seconds, "older_than")
        if older < min_age:
            raise RetentionError(
                f"older_than={human_duration(older)} is inside the owner's retention window "
                f"snapshot_min_age={human_duration(min_age)}: snapshots younger than that are never expired; ask for "
                f"{human_duration(min_age)} or more")
    else:
        older = policy_older

    by_id = {s.snapshot_id: s for s in snapshots}
    now_ms = _ms(now)
    window_ms = now_ms - int(min_age * 1000)
    requested_ms = now_ms - int(older * 1000)
    cutoff = requested_ms
    if older_than_seconds is None and len(by_id) > max_count:
        newest = sorted((s.timestamp_ms for s in by_id.values()), reverse=True)
        if newest[max_count - 1] > cutoff:
            cutoff = newest[max_count - 1]
            notes.append(f"{len(by_id)} snapshots exceed snapshot_max_count={max_count}: cutoff raised to keep the "
                         f"newest {max_count}")
    if cutoff > window_ms:
        cutoff = window_ms
        notes.append(f"cutoff clamped to the owner's retention window snapshot_min_age={human_duration(min_age)}")

    kept_refs = _kept_refs(refs, by_id, now_ms)
    dropped = tuple(sorted(set(refs) - set(kept_refs)))
    if dropped:
        notes.append(f"Iceberg drops refs past their max-ref-age or pointing at missing snapshots: {', '.join(dropped)}")
    must_keep: dict[int, list[str]] = {}

    def require(sid: int, why: str) -> None:
        if sid in by_id:
            must_keep.setdefault(sid, []).append(why)

    main = refs.get(MAIN_BRANCH)
    if main is not None:
        require(main.snapshot_id, "current snapshot")
    for name, ref in sorted(kept_refs.items()):
        if name != MAIN_BRANCH:
            require(ref.snapshot_id, f"head of branch {name!r}" if ref.is_branch else f"tagged {name!r}")
    for sid in in_flight_snapshot_ids:
        require(int(sid), "an in-flight maintenance run is based on it")
    for sid, why in checkpoint_snapshots(by_id.values(), policy.checkpoint_markers).items():
        require(sid, why)
    for s in by_id.values():
        if s.timestamp_ms > window_ms:
            require(s.snapshot_id, f"younger than the owner's retention window ({human_duration(min_age)})")

    first_cutoff = cutoff
    retained = procedure_retains(by_id.values(), kept_refs, cutoff, keep, now_ms)
    lowered_for: list[int] = []
    for _ in range(len(by_id) + 1):
        missing = sorted(set(must_keep) - retained)
        if not missing:
            break
        for sid in missing:
            needed = _cutoff_to_keep(sid, by_id, kept_refs, keep)
            if needed is None:
                raise RetentionError(
                    f"snapshot {sid} must stay ({'; '.join(must_keep[sid])}) but a branch's own "
                    "max-snapshot-age setting expires it whatever the cutoff; change that branch's retention first")
            if needed < cutoff:
                cutoff = needed
                lowered_for.append(sid)
        retained = procedure_retains(by_id.values(), kept_refs, cutoff, keep, now_ms)
    else:  # pragma: no cover - lowering the cutoff only ever keeps more
        raise RetentionError("could not find a cutoff that keeps every protected snapshot")
    if lowered_for:
        notes.append(f"cutoff lowered from {_from_ms(first_cutoff).isoformat()} to {_from_ms(cutoff).isoformat()} "
                     f"so that protected snapshots {sorted(set(lowered_for))} survive")

    protected: dict[int, str] = {}
    branch_newest = {s.snapshot_id for ref in kept_refs.values() if ref.is_branch
                     for s in _ancestry(ref.snapshot_id, by_id)[:keep]}
    for sid in sorted(retained):
        if sid in must_keep:
            protected[sid] = "; ".join(must_keep[sid])
        elif sid in branch_newest:
            protected[sid] = f"one of the newest {keep} snapshots of a branch (retain_last)"
        elif by_id[sid].timestamp_ms < first_cutoff:
            protected[sid] = "kept by the cutoff lowered for a protected snapshot"
        else:
            protected[sid] = "not older than the cutoff"
    return ExpiryPlan(
        older_than=_from_ms(cutoff),
        retain_last=keep,
        keep_files=policy.keep_files if keep_files is None else bool(keep_files),
        expiring_snapshot_ids=tuple(sorted(set(by_id) - retained)),
        protected=protected,
        requested_older_than=_from_ms(requested_ms),
        snapshot_count=len(by_id),
        dropped_refs=dropped,
        notes=tuple(notes),
    )


def expiry_due(snapshot_count: int, oldest_snapshot_age_seconds: float, policy: TablePolicy) -> tuple[bool, str]:
    """Whether snapshot expiry is worth a run, and why (or why not)."""
    if isinstance(snapshot_count, bool) or not isinstance(snapshot_count, int) or snapshot_count < 0:
        raise RetentionError(f"snapshot_count={snapshot_count!r} must be a whole number of zero or more")
    age = check_seconds(oldest_snapshot_age_seconds, "oldest_snapshot_age_seconds")
    if policy.read_only:
        return False, "the table's policy is read_only"
    if snapshot_count <= policy.snapshot_retain_last:
        return False, f"{snapshot_count} snapshots, retain_last={policy.snapshot_retain_last} keeps them all"
    if age <= policy.snapshot_min_age_seconds:
        return False, (f"the oldest snapshot is {human_duration(age)} old, inside the owner's retention window "
                       f"snapshot_min_age={human_duration(policy.snapshot_min_age_seconds)}")
    if snapshot_count > policy.snapshot_max_count:
        return True, f"{snapshot_count} snapshots exceed snapshot_max_count={policy.snapshot_max_count}"
    cutoff = max(policy.snapshot_older_than_seconds, policy.snapshot_min_age_seconds)
    if age > cutoff:
        return True, f"the oldest snapshot is {human_duration(age)} old, older than snapshot_older_than={human_duration(cutoff)}"
    return False, (f"{snapshot_count} snapshots (max {policy.snapshot_max_count}), the oldest {human_duration(age)} old "
                   f"(expiry after {human_duration(cutoff)})")


# Where an expiry's file cleanup runs. `driver`: Iceberg's core `ExpireSnapshots` with `cleanExpiredFiles`, which
# reads the snapshots' manifest lists and the manifests in the driver JVM's worker pool and holds the released
# files' paths there. `distributed`: Iceberg's `expire_snapshots` procedure, whose Spark action reads every
# reachable file before and after on the executors. Both delete exactly the same files (tests/test_retention.py
# runs each); on 3,002 snapshots of one streaming date (3,001 manifests, local[2]) the driver took 4.6-8.8 s and
# the procedure 41.8-49.4 s. Above these sizes the driver's reads and memory grow with the table, and the
# executors share them.
CLEANUP_MODES = ("auto", "driver", "distributed")
DRIVER_CLEANUP_MAX_MANIFESTS = 20_000
DRIVER_CLEANUP_MAX_FILES = 1_000_000


def expiry_cleanup(manifests: int, released_files: int, requested: str = "auto") -> str:
    """`driver` or `distributed`: where an expiry over a table of `manifests` distinct manifests (in all its
    snapshots) that releases `released_files` files cleans them up; `requested` other than `auto` decides."""
    if requested not in CLEANUP_MODES:
        raise RetentionError(f"cleanup={requested!r} must be one of {', '.join(CLEANUP_MODES)}")
    if requested != "auto":
        return requested
    small = manifests <= DRIVER_CLEANUP_MAX_MANIFESTS and released_files <= DRIVER_CLEANUP_MAX_FILES
    return "driver" if small else "distributed"


def manifests_due(manifest_count: int, small_manifest_count: int, policy: TablePolicy) -> tuple[bool, str]:
    """Whether rewriting manifests is worth a run: enough manifests and at least two small ones to merge."""
    for name, value in (("manifest_count", manifest_count), ("small_manifest_count", small_manifest_count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RetentionError(f"{name}={value!r} must be a whole number of zero or more")
    if small_manifest_count > manifest_count:
        raise RetentionError(f"small_manifest_count={small_manifest_count} exceeds manifest_count={manifest_count}")
    if policy.read_only:
        return False, "the table's policy is read_only"
    if manifest_count < policy.manifest_min_count:
        return False, f"{manifest_count} manifests, below manifest_min_count={policy.manifest_min_count}"
    if small_manifest_count < 2:
        return False, (f"{manifest_count} manifests but {small_manifest_count} smaller than "
                       f"manifest_small_bytes={human_size(policy.manifest_small_bytes)}: nothing to merge")
    return True, (f"{manifest_count} manifests (manifest_min_count={policy.manifest_min_count}), "
                  f"{small_manifest_count} smaller than {human_size(policy.manifest_small_bytes)}")


def orphan_cutoff(now: datetime, policy: TablePolicy) -> datetime:
    """The policy's orphan cutoff: files older than this and unreferenced are orphans."""
    return _aware(now, "now") - timedelta(seconds=check_seconds(policy.orphan_older_than_seconds, "orphan_older_than"))
