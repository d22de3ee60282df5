"""Column statistics under the operating contract: decided from the table's metadata, computed on Spark.

`Housekeeper.compute_statistics` runs this step like its other retention steps (policy gates, the claim, one audit
record). It computes the statistics of the snapshot `main` points at when the policy's stale fraction says they are
due (or always when forced); the commit adds a statistics file to the table's metadata and moves no ref.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from icemaint.domain.verdicts import DEFER, NOOP, REFUSE, RUN
from icemaint.domain.names import TableName
from icemaint.domain.statistics import StatisticsError, statistics_due
from icemaint.domain.units import human_size
from icemaint.engine.retention import RetentionCommitUnknown, RetentionConflict
from icemaint.engine.statistics import StatisticsSnapshotGone, compute_statistics
from icemaint.observe.statistics import read_statistics_state


@dataclass(frozen=True)
class StatisticsRequest:
    """Compute the current snapshot's column statistics when stale (or always with `force`)."""

    table: str
    dry_run: bool = False
    force: bool = False
    columns: tuple[str, ...] | None = None  # None: the policy's statistics_columns, else every primitive column
    trigger: str = "manual"
    run_id: str | None = None
    identity: str | None = None  # who asked, when not the process's identity (an agent's run: the agent)
    agent_reason: str | None = None  # the reason the agent gave for the request that launched the run

    def __post_init__(self) -> None:
        if self.columns is not None and (not isinstance(self.columns, tuple) or not self.columns or not all(
                isinstance(c, str) and c.strip() for c in self.columns)):
            raise StatisticsError(f"columns must be a non-empty list of column names, got {self.columns!r}")


def act_statistics(keeper, name: TableName, policy, request: StatisticsRequest, outcome) -> None:
    """Decides and (when due or forced) computes the statistics; fills `outcome` (a RetentionOutcome)."""
    state = read_statistics_state(keeper.reader.load(name.key))
    outcome.before_snapshot_id = outcome.after_snapshot_id = state.current_snapshot_id
    columns = request.columns or policy.statistics_columns
    due, why = statistics_due(state, policy.statistics_stale_fraction, columns)
    outcome.settings.update(columns=list(columns) if columns else None,
                            statistics_stale_fraction=policy.statistics_stale_fraction)
    outcome.evidence.update(due=due, why=why, statistics_snapshot_id=state.statistics_snapshot_id,
                            changed_rows=state.changed_rows, rows_at_statistics=state.statistics_rows)
    outcome.metrics = {"total_rows": state.total_rows or 0}
    if state.current_snapshot_id is None or (not due and not request.force):
        outcome.decision, outcome.reason = NOOP, f"not due: {why}"
        return
    t0 = time.perf_counter()
    try:
        result = compute_statistics(keeper.spark, keeper.catalog, name, state.current_snapshot_id, columns=columns,
                                    dry_run=request.dry_run, max_attempts=policy.max_commit_retries + 1,
                                    before_commit=None if keeper.before_commit is None else
                                    (lambda attempt: keeper.before_commit(str(outcome.operation), attempt)))
    except StatisticsError as exc:
        outcome.decision, outcome.reason = REFUSE, str(exc)
        return
    except (StatisticsSnapshotGone, RetentionConflict) as exc:
        outcome.decision = DEFER
        outcome.reason = f"{exc}; nothing changed; the next run computes them again"
        return
    except RetentionCommitUnknown as exc:
        outcome.decision, outcome.reason = DEFER, f"{exc}; not retried, the next run decides again"
        return
    outcome.durations["act_seconds"] = round(time.perf_counter() - t0, 3)
    outcome.attempts = result.attempts
    trigger = why if due else f"forced ({why})"
    outcome.decision = RUN
    outcome.metrics["columns"] = len(result.columns)
    outcome.evidence.update(snapshot_id=result.snapshot_id, columns=list(result.columns), ndv=dict(result.ndv),
                            statistics_file=result.path)
    if request.dry_run:
        outcome.reason = (f"dry-run: would compute statistics of {len(result.columns)} columns for snapshot "
                          f"{result.snapshot_id}: {trigger}; nothing changed")
        return
    outcome.metrics["file_size_bytes"] = result.file_size_bytes
    outcome.reason = (f"computed statistics of {len(result.columns)} columns for snapshot {result.snapshot_id} "
                      f"({human_size(result.file_size_bytes)}): {trigger}")
    if result.attempts > 1:
        outcome.reason += f" [committed at attempt {result.attempts}: writers committed meanwhile]"
    if result.state_was_unknown:
        outcome.reason += "; the catalog could not confirm the commit, a re-read found the statistics file"
