"""The streaming soak's arithmetic, pure (no Spark, no Java): per date, the lag from the writer's last commit into
it to the published compaction that covered it; the publishes proven; the one-line verdict.

Kept apart from the harness (reliability/soak_streaming.py), like reliability/figures.py for the soak.

A date's compaction *covers* its last writer commit when the compaction planned from a snapshot no older than
that commit: its base snapshot (`before_snapshot_id` of the audit record) was committed at or after the moment
the writer made its last call into the date (`last_begin`). When the base snapshot's time is unknown (expired
before the harness saw it), a compaction published after the last commit returned (`last_end`) is taken as
covering it, and the date says so (`base_known` False). The lag is the time from `last_end` to the covering
compaction's audit record (written once the publish landed).

Each date ends in one of:
- `compacted`: a covering compaction published; its lag counts;
- `settled`: compacted before its last commits, whose files left it below `min_input_files` small files
  (not due again: nothing to wait for);
- `not_due`: never compacted and never had `min_input_files` small files;
- `never_compacted`: at the end it still holds `min_input_files` or more small files (it was due and no
  compaction covered it): the soak fails.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

from reliability.figures import RowCheck

COMPACTED, SETTLED, NOT_DUE, NEVER = "compacted", "settled", "not_due", "never_compacted"


def _ts(value) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return _ts(dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")))


@dataclass(frozen=True)
class Compaction:
    """One compact `run` record of the audit log, as far as the lag needs it."""

    date: str
    at: dt.datetime                  # the record's ts: after the publish landed
    published: bool
    proven: bool                     # validation.passed is True
    base_snapshot_id: int | None
    base_at: dt.datetime | None      # when the base snapshot was committed (None: not known)
    run_id: str | None = None


def compactions_from_audit(records: Iterable[Mapping], snapshot_times_ms: Mapping[int, int]) -> list[Compaction]:
    """The compact `run` records (one per call, as `icemaint audit --json` folds them), oldest first.
    `snapshot_times_ms`: snapshot id -> its timestamp_ms, as the harness saw the table's snapshots."""
    out = []
    for r in records:
        if r.get("operation") != "compact" or r.get("decision") != "run" or not r.get("date"):
            continue
        details, validation = r.get("details") or {}, r.get("validation") or {}
        base = r.get("before_snapshot_id")
        base_ms = snapshot_times_ms.get(int(base)) if base is not None else None
        out.append(Compaction(
            date=str(r["date"]), at=_ts(r["ts"]), published=bool(details.get("published")),
            proven=validation.get("passed") is True, base_snapshot_id=base,
            base_at=dt.datetime.fromtimestamp(base_ms / 1000, dt.timezone.utc) if base_ms is not None else None,
            run_id=r.get("run_id")))
    return sorted(out, key=lambda c: c.at)


@dataclass(frozen=True)
class DateLag:
    date: str
    status: str
    last_commit: str                 # when the writer's last commit into the date returned
    last_kind: str | None
    commits: int                     # appends + late appends + deletes into the date
    late: int
    deletes: int
    compactions: int                 # published compactions of the date
    cold_while_writing: bool         # went idle (writer_idle) before the writer stopped
    lag_minutes: float | None
    compacted_at: str | None
    base_known: bool | None
    small_files_end: int
    data_files_end: int
    delete_files_end: int

    def to_dict(self) -> dict:
        return asdict(self)


def _covers(c: Compaction, last_begin: dt.datetime, last_end: dt.datetime) -> bool:
    if c.base_at is not None:
        return c.base_at >= last_begin
    return c.at > last_end


def date_lags(dates: Mapping[str, Mapping], compactions: Iterable[Compaction], files_end: Mapping[str, Mapping],
              writing_stopped_at: dt.datetime, writer_idle_seconds: float, min_input_files: int) -> list[DateLag]:
    """Each date the writer committed into, against the published compactions of it and its files at the end.

    dates: the writer's ledger per date (`last_begin`, `last_end`, `appends`, `late`, `deletes`, `last_kind`);
    files_end: per date `data_files`, `small_data_files`, `delete_files` read after the final ticks.
    """
    by_date: dict[str, list[Compaction]] = {}
    for c in compactions:
        if c.published:
            by_date.setdefault(c.date, []).append(c)
    out = []
    for date in sorted(dates):
        d = dates[date]
        begin, end = _ts(d["last_begin"]), _ts(d["last_end"])
        mine = sorted(by_date.get(date, []), key=lambda c: c.at)
        covering = next((c for c in mine if _covers(c, begin, end)), None)
        files = files_end.get(date, {})
        small = int(files.get("small_data_files", 0))
        if covering is not None:
            status = COMPACTED
        elif small >= min_input_files:
            status = NEVER
        else:
            status = SETTLED if mine else NOT_DUE
        lag = None if covering is None else round(max((covering.at - end).total_seconds(), 0.0) / 60, 2)
        out.append(DateLag(
            date=date, status=status, last_commit=end.isoformat(timespec="seconds"), last_kind=d.get("last_kind"),
            commits=int(d.get("appends", 0)) + int(d.get("late", 0)) + int(d.get("deletes", 0)),
            late=int(d.get("late", 0)), deletes=int(d.get("deletes", 0)), compactions=len(mine),
            cold_while_writing=(writing_stopped_at - end).total_seconds() >= writer_idle_seconds,
            lag_minutes=lag, compacted_at=covering.at.isoformat(timespec="seconds") if covering else None,
            base_known=None if covering is None else covering.base_at is not None,
            small_files_end=small, data_files_end=int(files.get("data_files", 0)),
            delete_files_end=int(files.get("delete_files", 0))))
    return out


def lag_summary(lags: Iterable[DateLag]) -> dict:
    """Max and median lag over the dates that went cold while the writer wrote (the dates still live when it
    stopped are compacted by the final ticks: their lag says how long the harness waited, not the product)."""
    lags = list(lags)
    cold = [x for x in lags if x.cold_while_writing]
    measured = [x.lag_minutes for x in cold if x.lag_minutes is not None]
    at_stop = [x.lag_minutes for x in lags if not x.cold_while_writing and x.lag_minutes is not None]
    return {
        "dates": len(lags), "cold_while_writing": len(cold),
        "by_status": dict(sorted(Counter(x.status for x in lags).items())),
        "cold_by_status": dict(sorted(Counter(x.status for x in cold).items())),
        "lag_max_minutes": max(measured) if measured else None,
        "lag_median_minutes": round(statistics.median(measured), 2) if measured else None,
        "lag_dates": len(measured),
        "lag_at_stop_max_minutes": max(at_stop) if at_stop else None,
        "never_compacted": [x.date for x in lags if x.status == NEVER],
        "base_unknown": [x.date for x in lags if x.base_known is False],
    }


def publish_figures(compactions: Iterable[Compaction], audit: Mapping) -> dict:
    """Every publish proven: each published compaction's validation passed; `not_published` (proofs that
    failed, nothing published) from reliability.figures.audit_figures."""
    compactions = list(compactions)
    published = [c for c in compactions if c.published]
    return {"published": len(published), "proven": sum(c.proven for c in published),
            "unproven": [c.run_id or c.date for c in published if not c.proven],
            "runs_not_published": sum(1 for c in compactions if not c.published),
            "not_published": int(audit.get("not_published", 0)), "conflicts": int(audit.get("conflicts", 0)),
            "failed": int(audit.get("failed", 0))}


def _m(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} min"


def streaming_verdict(minutes: float, rows: RowCheck, lags: Mapping, publishes: Mapping, writer: Mapping,
                      metadata: Mapping) -> tuple[bool, str]:
    """(passed, the one line the streaming soak ends with). Fails on any row lost, duplicated, resurrected or
    unexpected, any date left due and never compacted, and any published compaction without a passed proof."""
    ok = not rows.damaged and not lags["never_compacted"] and not publishes["unproven"]
    kinds = ", ".join(f"{k} {v}" for k, v in sorted((writer.get("errors_by_kind") or {}).items()))
    st = lags["by_status"]
    line = (
        f"soak-streaming {minutes:g} min: {'PASS' if ok else 'FAIL'}: rows lost {rows.lost}, duplicated "
        f"{rows.duplicated}, resurrected {rows.resurrected}"
        f"{f', unexpected {rows.unexpected}' if rows.unexpected else ''} ({rows.expected} rows) | dates "
        f"{lags['dates']} (cold while writing {lags['cold_while_writing']}): compacted {st.get(COMPACTED, 0)}, "
        f"settled {st.get(SETTLED, 0)}, not due {st.get(NOT_DUE, 0)}, never compacted {len(lags['never_compacted'])}"
        f"; lag max {_m(lags['lag_max_minutes'])}, median {_m(lags['lag_median_minutes'])} | publishes "
        f"{publishes['published']}, proven {publishes['proven']}, not published {publishes['not_published']}, "
        f"conflicts {publishes['conflicts']} | writer commits {writer.get('commits', 0)}, failed "
        f"{writer.get('commit_errors', 0)}{f' ({kinds})' if kinds else ''} | snapshots {metadata['snapshots_end']} "
        f"(peak {metadata['snapshots_peak']}), manifests {metadata['manifests_end']} (peak {metadata['manifests_peak']})")
    return ok, line
