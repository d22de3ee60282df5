"""The landing sensor: lists each landing source's new files from its listing position (the cursor) and requests
an `ingest_job` run of the source when a threshold passes; keeps the `landing_source` partitions equal to the
config's sources. The decision is `icemaint.domain.landing.advance`; the listing `icemaint.engine.landing`."""

import datetime as dt
import json

import dagster as dg

from icemaint.domain.landing import ListingCursor, advance
from icemaint.engine.landing import list_landed
from maint_assets.landing import LANDING_DIMENSION, landing_partitions
from maint_assets.partitions import PARTITION_TAG, TABLE_TAG, TRIGGER_TAG
from maint_assets.retention import runs_in_flight
from resources.settings import MaintenanceSettings


def build_landing_sensor(ingest_job, interval_seconds: int = 30) -> dg.SensorDefinition:
    @dg.sensor(name="landing", job=ingest_job, minimum_interval_seconds=interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Lists new landed files of each landing source (from its listing position) and requests "
                           "an ingest run when its file count, bytes or oldest file's age passes the threshold.")
    def landing(context: dg.SensorEvaluationContext, settings: MaintenanceSettings):
        sources = settings.config.landing
        if not sources:
            return dg.SkipReason("no landing sources in the config (key `landing`)")
        known = set(context.instance.get_dynamic_partitions(LANDING_DIMENSION))
        cursors = json.loads(context.cursor) if context.cursor else {}
        now = dt.datetime.now(dt.timezone.utc)
        running = {run.tags.get(PARTITION_TAG) for run in runs_in_flight(context.instance, ingest_job.name)}
        requests, notes = [], []
        for name, source in sorted(sources.items()):
            cursor = ListingCursor.from_dict(cursors.get(name))
            new = list_landed(source.location, after=cursor.after)
            moved, verdict, request = advance(cursor, new, source, now, in_flight=name in running)
            cursors[name] = moved.to_dict()
            if verdict.due and not request:
                notes.append(f"{name}: due ({verdict.reason}), a run of it is queued or running")
                continue
            if request:
                requests.append(dg.RunRequest(
                    partition_key=name, run_key=f"landing:{name}:{now.isoformat()}",
                    tags={TABLE_TAG: source.table, TRIGGER_TAG: "sensor"}))
            notes.append(f"{name}: {verdict.reason}")
        added = sorted(set(sources) - known)
        return dg.SensorResult(
            run_requests=requests, cursor=json.dumps(cursors, sort_keys=True),
            dynamic_partitions_requests=[landing_partitions.build_add_request(added)] if added else [],
            skip_reason=None if requests else dg.SkipReason("; ".join(notes)))

    return landing
