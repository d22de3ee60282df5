"""Turning domain results into Dagster events: numbers stay numbers so the UI plots them, and one rule
says which outcome materializes and which fails its run."""


import json
from typing import Any, Mapping

import dagster as dg

from icemaint.domain.verdicts import DEFER, NOOP, REFUSE, launched_by_a_person
from icemaint.domain.units import human_duration, human_size
from icemaint.errors import one_line


def readable_key(key: str) -> str | None:
    """The label of a number's readable twin: sizes (`*bytes*` -> `*size*`) and durations (`*_seconds` ->
    `*_duration`, an age keeps its name); None for a number that reads as it is (a count, a ratio)."""
    if "bytes" in key:
        return key.replace("_size_bytes", "_size") if "_size_bytes" in key else key.replace("bytes", "size")
    if key.startswith("seconds_since_"):
        return "time_since_" + key[len("seconds_since_"):]
    if key.endswith("_seconds"):
        stem = key[:-len("_seconds")]
        return stem if stem.endswith("_age") else f"{stem}_duration"
    return None


def readable(key: str, value: float) -> str:
    """`4.6 KiB`, `0.8s`, `1.5h`: a size or a duration as people read it."""
    if "bytes" in key:
        return human_size(value)
    return f"{value:.1f}s" if abs(value) < 60 else human_duration(value)


def numeric(values: Mapping[str, Any]) -> dict[str, Any]:
    """The int/float entries (bools excluded) of a mapping, as plottable metadata; each size and duration followed
    by its readable twin as text (`avg_file_bytes_before` 4712.3, then `avg_file_size_before` "4.6 KiB"): Dagster
    has no byte or duration metadata type, and its UI shows numbers raw."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            out[key] = dg.MetadataValue.int(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(value)
        else:
            continue
        twin = readable_key(key)
        if twin and twin not in values:
            out[twin] = dg.MetadataValue.text(readable(key, value))
    return out


def as_json(value: Any) -> dg.MetadataValue:
    return dg.MetadataValue.json(json.loads(json.dumps(value, default=str)))


def markdown_table(rows: list[Mapping[str, Any]], columns: list[str]) -> dg.MetadataValue:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |\n" for r in rows)
    return dg.MetadataValue.md(head + body)


def materializes(trigger: str | None, decision: str, dry_run: bool, *, done: bool) -> bool:
    """Whether an outcome is reported as a materialization (else it is only observed).

    Work done materializes. So does "nothing to do" in a run a person or a backfill asked for: the
    partition as it is, so its state is known (a backfill fails a partition left unmaterialized); a
    scheduled or sensor run's NOOP does not. A dry run never materializes.
    """
    return not dry_run and (done or (decision == NOOP and launched_by_a_person(trigger)))


def run_failure(trigger: str | None, decision: str, *, refused: str, not_done: str) -> str | None:
    """The failure an outcome ends its run with, or None.

    A refusal always fails. A run a person or a backfill asked for never ends green without doing its
    work, so a deferral fails it with the reason (a busy claim names its holder); a scheduled or sensor
    run that defers is tried again later and does not fail.
    """
    if decision == REFUSE:
        return refused
    if decision == DEFER and launched_by_a_person(trigger):
        return not_done
    return None


def partition_error(exc: BaseException) -> str:
    """`Class: first line` of an error that stopped one partition of a run over several (the run goes on with the
    others and fails at the end naming it)."""
    return f"{type(exc).__name__}: {one_line(exc)}"


def report_outcome(context: dg.AssetExecutionContext, asset_key: str, metadata: dict, *, materialize: bool,
                   refusal: str | None = None):
    """Yields the outcome as the asset's materialization, or observes it and fails when it was refused.

    Yielded, not logged: events logged with `context.log_event` are lost when the step then fails.
    """
    if materialize:
        yield dg.MaterializeResult(asset_key=asset_key, metadata=metadata)
        return
    yield dg.AssetObservation(asset_key=asset_key, partition=context.partition_key, metadata=metadata)
    if refusal is not None:
        raise dg.Failure(description=refusal, metadata=metadata)
