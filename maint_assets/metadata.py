"""Turning domain results into Dagster metadata: numbers stay numbers so the UI plots them."""


import json
from typing import Any, Mapping

import dagster as dg


def numeric(values: Mapping[str, Any]) -> dict[str, Any]:
    """The int/float entries (bools excluded) of a mapping, as plottable metadata."""
    out = {}
    for key, value in values.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            out[key] = dg.MetadataValue.int(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(value)
    return out


def as_json(value: Any) -> dg.MetadataValue:
    return dg.MetadataValue.json(json.loads(json.dumps(value, default=str)))


def markdown_table(rows: list[Mapping[str, Any]], columns: list[str]) -> dg.MetadataValue:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |\n" for r in rows)
    return dg.MetadataValue.md(head + body)


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
