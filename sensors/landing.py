"""The landing sensor: lists each landing source's new files from its listing position (the cursor) and requests
an `ingest_job` run of the source when a threshold passes; keeps the `landing_source` partitions equal to the
config's sources. The decision is `icemaint.domain.landing.advance`, the listing `icemaint.engine.landing`;
`evaluate_landing` is shared with `icemaint tick`."""

import datetime as dt
import json
from dataclasses import dataclass, field

import dagster as dg

from icemaint.domain.landing import ListingCursor, advance, listing_after
from icemaint.engine.landing import list_landed, storage_properties
from maint_assets.landing import LANDING_DIMENSION, landing_partitions
from maint_assets.partitions import PARTITION_TAG, TABLE_TAG, TRIGGER_TAG
from maint_assets.retention import runs_in_flight
from resources.settings import MaintenanceSettings


@dataclass
class LandingPlan:
    due: list = field(default_factory=list)  # (source name, LandingSource, Due) to run now
    cursor: str = "{}"
    notes: list = field(default_factory=list)


def evaluate_landing(config, cursor: str | None, now: dt.datetime, in_flight: frozenset = frozenset()) -> LandingPlan:
    """Lists each source from its position in `cursor` (JSON) and says which sources are due; a source with a run
    queued or running (`in_flight`) keeps counting instead."""
    cursors = json.loads(cursor) if cursor else {}
    plan = LandingPlan()
    store = storage_properties(config)
    for name, source in sorted(config.landing.items()):
        position = ListingCursor.from_dict(cursors.get(name))
        after = listing_after(position, source, now)
        listed = list_landed(source.location, after=after, properties=store)
        moved, verdict, request = advance(position, listed, source, now, in_flight=name in in_flight,
                                          whole=after is None)
        cursors[name] = moved.to_dict()
        if request:
            plan.due.append((name, source, verdict))
        elif verdict.due:
            plan.notes.append(f"{name}: due ({verdict.reason}), a run of it is queued or running")
        else:
            plan.notes.append(f"{name}: {verdict.reason}")
    plan.cursor = json.dumps({k: v for k, v in cursors.items() if k in config.landing}, sort_keys=True)
    return plan


def build_landing_sensor(ingest_job, interval_seconds: int = 30) -> dg.SensorDefinition:
    @dg.sensor(name="landing", job=ingest_job, minimum_interval_seconds=interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Lists new landed files of each landing source (from its listing position) and requests "
                           "an ingest run when its file count, bytes or oldest file's age passes the threshold.")
    def landing(context: dg.SensorEvaluationContext, settings: MaintenanceSettings):
        config = settings.config
        if not config.landing:
            return dg.SkipReason("no landing sources in the config (key `landing`)")
        now = dt.datetime.now(dt.timezone.utc)
        running = frozenset(run.tags.get(PARTITION_TAG) for run in runs_in_flight(context.instance, ingest_job.name))
        plan = evaluate_landing(config, context.cursor, now, running)
        requests = [dg.RunRequest(partition_key=name, run_key=f"landing:{name}:{now.isoformat()}",
                                  tags={TABLE_TAG: source.table, TRIGGER_TAG: "sensor"})
                    for name, source, _ in plan.due]
        known = set(context.instance.get_dynamic_partitions(LANDING_DIMENSION))
        added = sorted(set(config.landing) - known)
        return dg.SensorResult(
            run_requests=requests, cursor=plan.cursor,
            dynamic_partitions_requests=[landing_partitions.build_add_request(added)] if added else [],
            skip_reason=None if requests else dg.SkipReason("; ".join(plan.notes)))

    return landing
