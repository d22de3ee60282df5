"""Orphan-file removal under the operating contract (`Housekeeper.remove_orphans`): files no snapshot references
and older than the cutoff (the policy's orphan age unless the request names one) are deleted, or moved to the
quarantine (`icemaint.operations.quarantine` purges it later).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from icemaint.domain.verdicts import NOOP, REFUSE, RUN
from icemaint.domain.names import TableName
from icemaint.domain.retention import ORPHAN_MIN_AGE, QuarantineMoveFailed, RetentionError
from icemaint.domain.units import format_duration, human_size
from icemaint.engine.orphans import remove_orphan_files
from icemaint.engine.retention import read_snapshots
from icemaint.operations.retention_outcome import MAX_LISTED_PATHS, RetentionOutcome, check_age


@dataclass(frozen=True)
class OrphanRequest:
    """Remove (or quarantine) unreferenced files older than a cutoff (default: the policy's orphan age)."""

    table: str
    dry_run: bool = False
    older_than_seconds: float | None = None
    force: bool = False
    quarantine: bool = False
    trigger: str = "manual"
    run_id: str | None = None
    identity: str | None = None
    agent_reason: str | None = None

    def __post_init__(self) -> None:
        check_age(self.older_than_seconds, "older_than")


def _listed(paths) -> list[str]:
    """At most MAX_LISTED_PATHS of `paths`, then how many more there are."""
    paths = list(paths)
    return paths[:MAX_LISTED_PATHS] + ([f"... and {len(paths) - MAX_LISTED_PATHS} more"]
                                       if len(paths) > MAX_LISTED_PATHS else [])


def act_orphans(keeper, name: TableName, policy, request: OrphanRequest, outcome: RetentionOutcome) -> None:
    """The orphan-removal step of `keeper` (a `Housekeeper`) on one claimed table: fills `outcome`."""
    now = keeper.clock()
    age = policy.orphan_older_than_seconds if request.older_than_seconds is None else request.older_than_seconds
    cutoff = now - dt.timedelta(seconds=age)
    quarantine = keeper.config.quarantine_location if request.quarantine else None
    outcome.settings.update(older_than=cutoff.isoformat(), quarantine_dir=quarantine)
    forced_young = request.force and dt.timedelta(seconds=age) < ORPHAN_MIN_AGE
    refs = read_snapshots(keeper.spark, keeper.catalog, name)[1]
    main = refs.get("main")
    outcome.before_snapshot_id = outcome.after_snapshot_id = main.snapshot_id if main else None
    t0 = time.perf_counter()
    try:
        result = remove_orphan_files(keeper.spark, keeper.catalog, name, older_than=cutoff, now=now,
                                     force=request.force, dry_run=request.dry_run, quarantine_dir=quarantine,
                                     within=keeper.config.catalog.warehouse_root)
    except QuarantineMoveFailed:
        raise  # some files may already be in quarantine: a failure, not a refusal
    except RetentionError as exc:
        outcome.decision, outcome.reason = REFUSE, str(exc)
        return
    outcome.durations["act_seconds"] = round(time.perf_counter() - t0, 3)
    removed = len(result.moved) if result.quarantined_to else len(result.deleted)
    outcome.metrics = {"candidates": len(result.candidates), "removed": removed, "bytes": result.bytes}
    outcome.evidence = {"table_location": result.table_location, "candidates": _listed(result.candidates),
                        "forced_cutoff_under_24h": forced_young, "quarantined_to": result.quarantined_to}
    where = f"files older than {format_duration(age)} ({cutoff.isoformat()})"
    if not result.candidates:
        outcome.decision, outcome.reason = NOOP, f"no orphan {where}"
        return
    outcome.decision = RUN
    verb = "quarantined" if quarantine else "deleted"
    if request.dry_run:
        outcome.reason = (f"dry-run: {len(result.candidates)} orphan {where}, {human_size(result.bytes)}; "
                          "nothing changed")
    else:
        outcome.reason = f"{verb} {removed} orphan {where}, {human_size(result.bytes)}"
    if forced_young:
        outcome.reason += "; FORCED cutoff under 24 h"
