"""The alert sensors: one message per failed proof and per failed maintenance run, routed by table owner.

A failed proof observes its `not_published` outcome and fails its run (the blocking GX checks fail;
without them in the selection the step fails itself), so `alert_on_failed_run` sees it;
`alert_on_unpublished_proof` covers any run that still ends green with one (a job of another shape). A run
ends in one status and each sensor's cursor moves past it, so every failed proof gives one message, and a
run whose failure is only its failed proofs gets no second, `run_failed` one (`icemaint.safety.alerts.alerts_for_run`).
"""


import datetime as dt

import dagster as dg

from icemaint.safety.alerts import Alert, FinishedRun, alerts_for_run, audit_record, configured, deliver, \
    needs_audit, route_for
from maint_assets.partitions import TRIGGER_TAG, split_table_date, tables_of
from maint_assets.retention import run_table
from resources.claims import AuditResource
from resources.settings import MaintenanceSettings
from icemaint.errors import one_line

# The implicit job that UI materializations and asset backfills run.
ASSET_JOB = "__ASSET_JOB"
# A blocking check that failed: the proof's own verdict, alerted as `proof_failed` per date.
CHECK_FAILED = "DagsterAssetCheckFailedError"
_RUN_EVENTS = {dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.ASSET_OBSERVATION,
               dg.DagsterEventType.STEP_FAILURE}


def _error_line(error) -> str:
    """`Class: first line` of the first error in the chain that is not Dagster's own wrapper."""
    while (error.cls_name or "").startswith("Dagster") and getattr(error, "cause", None) is not None:
        error = error.cause
    head = one_line(error.message, 400)
    prefix, _, rest = head.partition(": ")
    if error.cls_name and prefix.endswith(error.cls_name):
        return f"{error.cls_name}: {rest}"
    return head or error.cls_name or "step failed"


def finished_run(instance: dg.DagsterInstance, run: dg.DagsterRun, failed: bool,
                 run_failure: str | None = None) -> FinishedRun:
    """The run's outcomes (one per asset partition it recorded) and why it failed, from its event log."""
    outcomes, fallback, failures, checks_failed = {}, [], [], False
    for entry in instance.all_logs(run.run_id, of_type=_RUN_EVENTS):
        event = entry.dagster_event
        if event is None:
            continue
        if event.is_step_failure:
            data = event.event_specific_data
            error = getattr(data, "error", None)
            if error is not None and error.cls_name == CHECK_FAILED:
                checks_failed = True
                continue
            user = getattr(data, "user_failure_data", None)
            if user is not None and "outcome" in user.metadata:
                fallback.append(user.metadata["outcome"].value)  # a refusal's outcome rides on its Failure
            failures.append((user.description if user is not None and user.description else None)
                            or (_error_line(error) if error is not None else f"step {event.step_key} failed"))
            continue
        recorded = entry.asset_materialization or entry.asset_observation
        if recorded is not None and "outcome" in recorded.metadata:
            outcomes[(recorded.asset_key, recorded.partition)] = recorded.metadata["outcome"].value
    partition = run.tags.get("dagster/partition")
    if failures:
        failure = "; ".join(failures[:3]) + (f" (and {len(failures) - 3} more)" if len(failures) > 3 else "")
    else:
        failure = None if checks_failed or not failed else (run_failure or "the run failed")
    return FinishedRun(
        run_id=run.run_id, job=run.job_name, failed=failed, table=run_table(run),
        tables=tables_of(run.tags) if len(tables_of(run.tags)) > 1 else (),
        date=split_table_date(partition)[1] if partition and "|" in partition else None,
        trigger=run.tags.get(TRIGGER_TAG), outcomes=tuple(outcomes.values()) or tuple(fallback[-1:]),
        failure=failure if failed else None)


def send_run_alerts(context: dg.RunStatusSensorContext, settings: MaintenanceSettings, audit: AuditResource,
                    failed: bool, run_failure: str | None = None) -> list[Alert]:
    """Sends (and audits) the alerts of the context's run; returns them. A failed delivery is logged and
    audited, never raised."""
    config = settings.config
    if not configured(config.alerts):
        return []
    run = finished_run(context.instance, context.dagster_run, failed, run_failure)
    alerts = alerts_for_run(run, lambda table: config.policy(table).owner, dt.datetime.now(dt.timezone.utc))
    for alert in alerts:
        route = route_for(config.alerts, alert.owner)
        if not route.enabled:
            context.log.info(f"alert {alert.alert_id}: alerts are off for owner {alert.owner}")
            continue
        delivery = deliver(alert, route)
        if needs_audit(route, delivery):
            audit.append(audit_record(alert, delivery, config.identity()))
        if delivery is None:
            context.log.info(f"alert {alert.alert_id}: audit only")
        elif delivery.sent:
            context.log.info(f"alert {alert.alert_id}: sent to ${delivery.webhook_url_env} ({delivery.detail})")
        else:
            context.log.warning(f"alert {alert.alert_id}: not delivered to ${delivery.webhook_url_env}: "
                                f"{delivery.detail}; recorded in the audit log")
    return alerts


def build_alert_sensors(jobs) -> list[dg.SensorDefinition]:
    """The two alert sensors over the location's maintenance jobs (and the implicit asset job)."""
    watched = frozenset(job.name for job in jobs) | {ASSET_JOB}

    # All code locations: runs the CLI, `icemaint maintain` and the demo execute in process carry no
    # code-location origin, so a sensor limited to its own location would never see them. The
    # instance under the state dir is icemaint's own; `watched` keeps the sensors to its jobs.
    @dg.run_failure_sensor(
        name="alert_on_failed_run", monitor_all_code_locations=True, default_status=dg.DefaultSensorStatus.RUNNING,
        description="Sends one JSON alert per failed maintenance run (a refusal, a person's run that was not done, "
                    "an error) and per failed proof in it, to the table owner's webhook and/or the audit log "
                    "(config `alerts`). A failing webhook is logged and audited; it never fails a run.")
    def alert_on_failed_run(context: dg.RunFailureSensorContext, settings: MaintenanceSettings,
                            audit: AuditResource) -> None:
        # Returns None: a returned value would end the tick after the first run (Dagster's run status loop).
        if context.dagster_run.job_name in watched:
            send_run_alerts(context, settings, audit, failed=True, run_failure=context.failure_event.message)

    @dg.run_status_sensor(
        name="alert_on_unpublished_proof", run_status=dg.DagsterRunStatus.SUCCESS, monitor_all_code_locations=True,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Sends one JSON alert per failed proof (compaction `not_published`) in a run that still "
                    "succeeded because its blocking checks were not selected; failed runs are alerted by "
                    "alert_on_failed_run, so no proof is alerted twice.")
    def alert_on_unpublished_proof(context: dg.RunStatusSensorContext, settings: MaintenanceSettings,
                                   audit: AuditResource) -> None:
        if context.dagster_run.job_name in watched:
            send_run_alerts(context, settings, audit, failed=False)

    return [alert_on_failed_run, alert_on_unpublished_proof]
