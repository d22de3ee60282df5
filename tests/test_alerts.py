"""Alerts: which alerts a finished run deserves, where each goes, the webhook sender against a real HTTP
server on 127.0.0.1 (and a dead and a slow one), and the alert sensors over real Dagster runs, one of
them a real compaction whose proof failed."""

from __future__ import annotations

import datetime as dt
import http.server
import json
from dataclasses import replace
import socket
import threading
import time

import dagster as dg
import pytest

from conftest import streaming_table, write_config
from icemaint.config import load_config
from icemaint.config.alerts import AlertsConfig, OwnerAlerts
from icemaint.config.parse import ConfigError
from icemaint.domain.names import TableName
from icemaint.safety.alerts import AlertRoute, DeliveryStatus, FinishedRun, alerts_for_run, audit_record, \
    configured, deliver, needs_audit, route_for, send_alert
from icemaint.safety.audit import FileAuditLog, open_audit
from sensors.alerts import build_alert_sensors

NOW = dt.datetime(2026, 3, 1, 12, tzinfo=dt.timezone.utc)
DATE = "2026-01-02"
HOOK_ENV = "ICEMAINT_TEST_ALERT_HOOK"
UNSET_ENV = "ICEMAINT_TEST_ALERT_HOOK_UNSET"
OWNERS = {"t.a": "data-platform", "t.b": "sandbox"}


# -- a real webhook on loopback ------------------------------------------------------------------

class Webhook:
    """An HTTP server on 127.0.0.1 that keeps every POSTed JSON body; answers `status` after `delay` s."""

    def __init__(self, status: int = 200, delay: float = 0.0):
        self.messages: list[dict] = []
        self.headers: list[dict] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.headers.append(dict(self.headers))
                hook.messages.append(json.loads(body))
                time.sleep(delay)
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/secret-token-123"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


# -- which alerts a run deserves (pure) ----------------------------------------------------------

def outcome(decision: str, date: str | None = DATE, table: str = "t.a", published: bool = False, **extra) -> dict:
    staged = [{"staged_snapshot_id": 7, "verdict": "not_published"}] if decision == "not_published" else []
    return {"table": table, "date": date, "decision": decision, "reason": f"{decision}: why",
            "before_snapshot_id": 5, "after_snapshot_id": 5, "published": published, "staged": staged,
            "validation": {"passed": decision != "not_published"}, **extra}


def run(failed: bool, *outcomes, failure: str | None = None, job: str = "compaction_job") -> FinishedRun:
    return FinishedRun(run_id="r1", job=job, failed=failed, table="t.a", date=DATE, trigger="cli",
                       outcomes=tuple(outcomes), failure=failure)


@pytest.mark.parametrize("finished, expected", [
    # a failed proof fails its run (blocking checks): one proof_failed alert, no run_failed besides
    (run(True, outcome("not_published")), [("proof_failed", "not_published", DATE)]),
    # a failed proof in a run that stayed green (checks not selected) is still alerted, once
    (run(False, outcome("not_published")), [("proof_failed", "not_published", DATE)]),
    (run(False, outcome("run")), []),
    (run(False, outcome("defer")), []),  # a sensor's deferral does not fail its run: nothing to say
    (run(True, outcome("refuse"), failure="refused: read-only"), [("run_failed", "refuse", DATE)]),
    (run(True, outcome("defer"), failure="not done: claim busy"), [("run_failed", "defer", DATE)]),
    (run(True, failure="StagingError: disk full"), [("run_failed", None, DATE)]),
    (run(True), [("run_failed", None, DATE)]),  # failed with nothing recorded: still alerted
    # a batched backfill: each failed proof, and the run for its refused date
    (run(True, outcome("not_published"), outcome("not_published", "2026-01-03"), outcome("run", "2026-01-04"),
         outcome("refuse", "2026-01-05"), failure="1 of 4 dates not done: 2026-01-05: refused: x"),
     [("proof_failed", "not_published", DATE), ("proof_failed", "not_published", "2026-01-03"),
      ("run_failed", "refuse", "2026-01-05")]),
])
def test_one_alert_per_failed_proof_and_one_per_otherwise_failed_run(finished, expected):
    alerts = alerts_for_run(finished, OWNERS.get, NOW)
    assert [(str(a.kind), a.decision, a.date) for a in alerts] == expected
    assert len({a.alert_id for a in alerts}) == len(alerts)


def test_a_proof_failed_message_carries_the_evidence():
    [alert] = alerts_for_run(run(True, outcome("not_published")), OWNERS.get, NOW)
    message = alert.to_message()
    assert message == {**message, "kind": "proof_failed", "table": "t.a", "date": DATE, "owner": "data-platform",
                       "run_id": "r1", "job": "compaction_job", "trigger": "cli", "decision": "not_published",
                       "result": "not published, main unchanged", "before_snapshot_id": 5, "after_snapshot_id": 5,
                       "staged_snapshot_ids": [7], "published": False, "validation_passed": False,
                       "ts": NOW.isoformat(), "alert_id": f"r1:proof_failed:t.a:{DATE}"}
    assert "t.a 2026-01-02" in message["text"] and "not published, main unchanged" in message["text"]
    json.dumps(message, allow_nan=False)
    [refusal] = alerts_for_run(run(True, outcome("refuse", table="t.b"), failure="refused: read-only"), OWNERS.get, NOW)
    assert refusal.owner == "sandbox" and refusal.reason == "refused: read-only"
    assert refusal.result == "refused, nothing changed" and refusal.alert_id == "r1:run_failed"


def test_a_failed_run_over_several_tables_alerts_each_owner_of_what_it_left_undone():
    """The catch-up's batches: a refusal and a deferral in a run over four tables alert their owners, once each,
    naming their own tables and reasons; a crash that no outcome explains alerts every owner of the run."""
    owners = {"t.a": "data-platform", "t.b": "sandbox", "t.c": "data-platform", "t.d": "finance"}
    batch = FinishedRun(run_id="r9", job="compaction_job", failed=True, trigger="sensor",
                        tables=("t.a", "t.b", "t.c", "t.d"), failure="2 of 4 table dates not done",
                        outcomes=(outcome("run", table="t.a"), outcome("refuse", table="t.b"),
                                  outcome("defer", table="t.c"), outcome("run", table="t.d")))
    alerts = alerts_for_run(batch, owners.get, NOW)
    assert [(a.owner, a.table, a.tables, a.decision) for a in alerts] == [
        ("sandbox", "t.b", ("t.b",), "refuse"), ("data-platform", "t.c", ("t.c",), "defer")]
    assert [a.reason for a in alerts] == [f"t.b {DATE}: refuse: why", f"t.c {DATE}: defer: why"]
    assert len({a.alert_id for a in alerts}) == 2 and alerts[0].alert_id == "r9:run_failed:sandbox"
    assert alerts[0].to_message()["tables"] == ["t.b"]
    # with a failed proof besides: the proof is alerted on its own, the refusal as before
    proof = replace(batch, outcomes=batch.outcomes + (outcome("not_published", table="t.d"),))
    assert [(str(a.kind), a.owner) for a in alerts_for_run(proof, owners.get, NOW)] == [
        ("proof_failed", "finance"), ("run_failed", "sandbox"), ("run_failed", "data-platform")]
    crashed = replace(batch, outcomes=(), failure="Py4JNetworkError: the JVM went away")
    alerts = alerts_for_run(crashed, owners.get, NOW)
    assert [(a.owner, a.tables) for a in alerts] == [("data-platform", ("t.a", "t.c")), ("sandbox", ("t.b",)),
                                                      ("finance", ("t.d",))]
    assert alerts[0].table is None and alerts[0].reason == "Py4JNetworkError: the JVM went away"
    assert "t.a, t.c" in alerts[0].text()


# -- routing per owner (pure) --------------------------------------------------------------------

ALERTS = AlertsConfig(webhook_url_env="HOOK_DEFAULT", audit=False, owners={
    "data-platform": OwnerAlerts(webhook_url_env="HOOK_PLATFORM"),
    "finance": OwnerAlerts(audit=True),
    "sandbox": OwnerAlerts(enabled=False)})


@pytest.mark.parametrize("owner, route", [
    ("data-platform", AlertRoute("HOOK_PLATFORM", False)),
    ("finance", AlertRoute("HOOK_DEFAULT", True)),   # its own audit, the default webhook
    ("sandbox", AlertRoute(None, False, enabled=False)),
    ("someone-else", AlertRoute("HOOK_DEFAULT", False)),
    (None, AlertRoute("HOOK_DEFAULT", False)),
])
def test_each_owner_gets_its_route(owner, route):
    assert route_for(ALERTS, owner) == route


def test_no_alerts_section_means_no_alerts():
    assert not configured(AlertsConfig())
    assert not configured(AlertsConfig(owners={"x": OwnerAlerts(enabled=False, webhook_url_env="X")}))
    assert configured(ALERTS) and configured(AlertsConfig(audit=True))


def test_an_unset_variable_sends_nothing_and_is_audited_and_a_disabled_owner_gets_nothing(tmp_path):
    [alert] = alerts_for_run(run(True, outcome("not_published")), OWNERS.get, NOW)
    route = AlertRoute(UNSET_ENV, audit=False)
    delivery = deliver(alert, route, environ={})
    assert delivery.status is DeliveryStatus.NO_URL and UNSET_ENV in delivery.detail
    assert needs_audit(route, delivery)  # audit is off, but an alert that went nowhere is recorded
    log = FileAuditLog(tmp_path)
    log.append(audit_record(alert, delivery, "maint"))
    [record] = log.records(operation="alert")
    assert record.decision == "proof_failed" and record.table == "t.a" and record.date == DATE
    assert record.run_id == "r1" and record.before_snapshot_id == 5
    assert record.details["delivery"]["status"] == "no_url" and record.details["alert_id"] == alert.alert_id

    off = AlertRoute(None, False, enabled=False)
    assert deliver(alert, off, environ={UNSET_ENV: "http://127.0.0.1:9/"}) is None and not needs_audit(off, None)
    assert deliver(alert, AlertRoute(None, audit=True), environ={}) is None
    assert needs_audit(AlertRoute(None, audit=True), None)


def test_the_alerts_section_is_validated_and_never_holds_the_url(tmp_path, lake_root):
    path = write_config(tmp_path / "ok.yaml", lake_root, alerts={
        "webhook_url_env": "ICEMAINT_ALERT_WEBHOOK", "audit": True,
        "owners": {"data-platform": {"webhook_url_env": "ICEMAINT_ALERT_WEBHOOK_PLATFORM"},
                   "sandbox": {"enabled": False}}})
    alerts = load_config(path).alerts
    assert alerts.webhook_url_env == "ICEMAINT_ALERT_WEBHOOK" and alerts.audit is True
    assert alerts.owners["data-platform"] == OwnerAlerts(True, "ICEMAINT_ALERT_WEBHOOK_PLATFORM", None)
    assert alerts.owners["sandbox"].enabled is False
    assert load_config(write_config(tmp_path / "none.yaml", lake_root)).alerts == AlertsConfig()

    for section, expected in [
        ({"webhook_url": "https://hooks.example.com/T0/secret"}, "alerts.webhook_url: the webhook URL is a secret"),
        ({"webhook_url_env": "https://hooks.example.com/T0/secret"}, "alerts.webhook_url_env: the webhook URL is a"),
        ({"webhook_url_env": "ICEMAINT HOOK"}, "alerts.webhook_url_env: 'ICEMAINT HOOK' is not an environment"),
        ({"audit": "yes"}, "alerts.audit: 'yes' is not a boolean"),
        ({"slack": True}, "alerts.slack: unknown key; allowed: webhook_url_env, audit, owners"),
        ({"owners": {"ops": {"enabled": "no"}}}, "alerts.owners.ops.enabled: 'no' is not a boolean"),
        ({"owners": {"ops": {"webhook_url": "http://x"}}},
         "alerts.owners.ops.webhook_url: the webhook URL is a secret"),
        ({"owners": {"ops": "off"}}, "alerts.owners.ops: expected a mapping"),
        ("on", "alerts: expected a mapping"),
    ]:
        bad = write_config(tmp_path / "bad.yaml", lake_root, alerts=section)
        with pytest.raises(ConfigError) as err:
            load_config(bad)
        assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert "hooks.example.com" not in str(err.value)


# -- the sender against real sockets -------------------------------------------------------------

def test_the_sender_posts_one_json_message(webhook):
    [alert] = alerts_for_run(run(True, outcome("not_published")), OWNERS.get, NOW)
    delivery = deliver(alert, AlertRoute(HOOK_ENV), environ={HOOK_ENV: webhook.url})
    assert delivery.sent and delivery.detail == "HTTP 200" and delivery.webhook_url_env == HOOK_ENV
    assert webhook.messages == [alert.to_message()]
    assert webhook.headers[0]["Content-Type"] == "application/json"


@pytest.mark.parametrize("status, detail", [(500, "HTTP 500"), (404, "HTTP 404"), (302, "HTTP 302")])
def test_a_webhook_that_says_no_is_a_failed_delivery(status, detail):
    hook = Webhook(status=status)
    try:
        delivery = send_alert(hook.url, {"kind": "run_failed"}, timeout=2.0)
    finally:
        hook.close()
    assert delivery.status is DeliveryStatus.FAILED and delivery.detail.startswith(detail)
    assert "secret-token" not in delivery.detail


def test_a_dead_or_slow_webhook_fails_within_the_bound_and_never_raises():
    started = time.monotonic()
    dead = send_alert(closed_port_url(), {"kind": "run_failed"}, timeout=1.0)
    assert dead.status is DeliveryStatus.FAILED and "refused" in dead.detail.lower(), dead.detail
    assert time.monotonic() - started < 1.5

    slow = Webhook(delay=3.0)
    try:
        started = time.monotonic()
        late = send_alert(slow.url, {"kind": "run_failed"}, timeout=0.5)
        elapsed = time.monotonic() - started
    finally:
        slow.close()
    assert late.status is DeliveryStatus.FAILED and elapsed < 1.2, (late, elapsed)
    assert "secret-token" not in late.detail

    for url in ("file:///etc/passwd", "not a url", ""):
        assert send_alert(url, {"kind": "run_failed"}, timeout=0.5).status is DeliveryStatus.FAILED
    assert send_alert(closed_port_url(), {"bad": float("nan")}).status is DeliveryStatus.FAILED


# -- the sensors over real Dagster runs ----------------------------------------------------------

def tick(sensor, instance, resources, cursor):
    """One evaluation as the daemon does it; returns the new cursor. The sensor's code must not raise."""
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        data = sensor.evaluate_tick(context)
    errors = [r.error for r in data.dagster_run_reactions or [] if r.error]
    assert not errors, errors
    return data.cursor


def ticks(sensors, instance, resources, cursors=None) -> dict:
    return {s.name: tick(s, instance, resources, (cursors or {}).get(s.name)) for s in sensors}


def fake_compaction_job(result: dict, refusal: str | None = None) -> dg.JobDefinition:
    """A job named like the maintenance job whose asset reports `result` as `compaction` does (without Spark)."""
    from maint_assets.metadata import as_json, report_outcome

    @dg.asset(partitions_def=dg.StaticPartitionsDefinition([f"{DATE}|t.a"]), name="compaction",
              output_required=False)
    def compaction(context):
        yield from report_outcome(context, "compaction", {"outcome": as_json(result)},
                                  materialize=result["decision"] in ("run", "not_published"), refusal=refusal)

    return dg.Definitions(assets=[compaction], jobs=[dg.define_asset_job("compaction_job", [compaction])]
                          ).resolve_job_def("compaction_job")


def test_sensors_alert_each_run_once_and_a_dead_webhook_is_audited_not_raised(tmp_path, lake_root, webhook,
                                                                             monkeypatch):
    monkeypatch.setenv(HOOK_ENV, webhook.url)
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        tables={"t.a": {"owner": "data-platform"}}, alerts={"webhook_url_env": HOOK_ENV})
    config = load_config(path)
    from resources.claims import AuditResource
    from resources.settings import MaintenanceSettings

    settings = MaintenanceSettings(config_path=str(path))
    resources = {"settings": settings, "audit": AuditResource(settings=settings)}
    green_proof_failure = fake_compaction_job(outcome("not_published"))  # as if its checks were not selected
    refusal = fake_compaction_job(outcome("refuse"), refusal="refused: t.a is read-only")
    sensors = build_alert_sensors([green_proof_failure])
    with dg.DagsterInstance.ephemeral() as instance:
        cursors = ticks(sensors, instance, resources)  # the daemon starts the sensors: no alert for the past
        green = green_proof_failure.execute_in_process(instance=instance, partition_key=f"{DATE}|t.a")
        failed = refusal.execute_in_process(instance=instance, partition_key=f"{DATE}|t.a", raise_on_error=False)
        fine = fake_compaction_job(outcome("run")).execute_in_process(
            instance=instance, partition_key=f"{DATE}|t.a")
        assert green.success and not failed.success and fine.success
        cursors = ticks(sensors, instance, resources, cursors)
        cursors = ticks(sensors, instance, resources, cursors)  # the cursors moved past them: no repeat
        by_run = {m["run_id"]: m for m in webhook.messages}
        assert len(webhook.messages) == 2 and set(by_run) == {green.run_id, failed.run_id}
        assert by_run[green.run_id]["kind"] == "proof_failed" and by_run[green.run_id]["published"] is False
        assert by_run[failed.run_id]["kind"] == "run_failed"
        assert by_run[failed.run_id]["reason"] == "refused: t.a is read-only"
        assert by_run[failed.run_id]["decision"] == "refuse" and by_run[failed.run_id]["owner"] == "data-platform"

        # the webhook is dead now: the tick still completes, the alert is audited with the reason
        monkeypatch.setenv(HOOK_ENV, closed_port_url())
        again = refusal.execute_in_process(instance=instance, partition_key=f"{DATE}|t.a", raise_on_error=False)
        ticks(sensors, instance, resources, cursors)
    [record] = open_audit(config).records(operation="alert")
    assert record.run_id == again.run_id and record.decision == "run_failed"
    assert record.details["delivery"]["status"] == "failed" and "127.0.0.1" not in record.details["delivery"]["detail"]
    assert len(webhook.messages) == 2


def test_a_crashed_run_over_several_tables_reaches_each_owner_through_the_sensor(tmp_path, lake_root, webhook,
                                                                                 monkeypatch):
    """A batch the sensor launched over two tables of two owners dies before recording any outcome: the run
    failure sensor sends each owner one run_failed message naming its own table."""
    from maint_assets.partitions import table_range_tags
    from resources.claims import AuditResource
    from resources.settings import MaintenanceSettings

    monkeypatch.setenv(HOOK_ENV, webhook.url)
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        tables={"t.a": {"owner": "data-platform"}, "t.b": {"owner": "finance"}},
                        alerts={"webhook_url_env": HOOK_ENV})
    settings = MaintenanceSettings(config_path=str(path))
    resources = {"settings": settings, "audit": AuditResource(settings=settings)}

    @dg.asset(partitions_def=dg.StaticPartitionsDefinition([f"{DATE}|t.a", f"{DATE}|t.b"]), name="compaction")
    def compaction(context):
        raise RuntimeError("the JVM went away")

    crashing = dg.Definitions(assets=[compaction], jobs=[dg.define_asset_job("compaction_job", [compaction])]
                              ).resolve_job_def("compaction_job")
    sensors = build_alert_sensors([crashing])
    with dg.DagsterInstance.ephemeral() as instance:
        cursors = ticks(sensors, instance, resources)
        result = crashing.execute_in_process(instance=instance, tags=table_range_tags(["t.a", "t.b"], DATE, DATE),
                                             raise_on_error=False)
        assert not result.success
        ticks(sensors, instance, resources, cursors)
    by_owner = {m["owner"]: m for m in webhook.messages}
    assert len(webhook.messages) == 2 and set(by_owner) == {"data-platform", "finance"}
    assert [by_owner[o]["tables"] for o in ("data-platform", "finance")] == [["t.a"], ["t.b"]]
    assert [by_owner[o]["table"] for o in ("data-platform", "finance")] == ["t.a", "t.b"]
    assert all(m["kind"] == "run_failed" and "the JVM went away" in m["reason"] for m in webhook.messages)
    assert all(m["run_id"] == result.run_id for m in webhook.messages)


def test_a_forced_proof_failure_sends_exactly_one_webhook_message(spark, tmp_path, lake_root, table_name, webhook,
                                                                  monkeypatch, isolated_dagster_home):
    """Acceptance: a real compaction run (compaction_job, in process) whose proof fails -> one message with
    table, date, snapshot ids and the result; main unchanged."""
    import maint_assets.compaction
    from icemaint.app.runner import MaintenanceRunner
    from staged_faults import corrupt_long, uncompressed

    monkeypatch.setenv(HOOK_ENV, webhook.url)
    monkeypatch.delenv(UNSET_ENV, raising=False)
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        tables={table_name: {"owner": "data-platform"}},
                        alerts={"webhook_url_env": UNSET_ENV, "audit": True,  # the owner's own route is used
                                "owners": {"data-platform": {"webhook_url_env": HOOK_ENV}}})
    streaming_table(spark, "lake", table_name, batches=4, rows_per_day=10)
    sql = TableName.parse(table_name).sql("lake")
    uncompressed(spark, sql)
    victim = spark.sql(f"SELECT event_id FROM {sql} WHERE ts >= TIMESTAMP '{DATE} 00:00:00' AND "
                       f"ts < TIMESTAMP '{DATE} 23:59:59' ORDER BY event_id LIMIT 1").first()[0]
    main_before = spark.sql(f"SELECT snapshot_id FROM {sql}.`refs` WHERE name = 'main'").first()[0]
    staged_ids = []

    def corrupt(staged):  # bad memory or a buggy writer: one value changed in the staged file
        staged_ids.append(staged.staged_snapshot_id)
        assert corrupt_long(staged.new_files, victim, 77_000_001) >= 1

    real = maint_assets.compaction.Compactor
    monkeypatch.setattr(maint_assets.compaction, "Compactor", lambda *a, **kw: real(*a, after_stage=corrupt, **kw))

    runner = MaintenanceRunner(load_config(path), str(path))
    sensors = [s for s in runner.defs.sensors if s.name in ("alert_on_failed_run", "alert_on_unpublished_proof")]
    assert len(sensors) == 2
    resources = dict(runner.defs.resources)
    cursors = ticks(sensors, runner.instance, resources)

    report = runner.compact(table_name, DATE)

    assert not report.success and report.outcome["decision"] == "not_published", report
    assert "main is unchanged" in report.failure_line
    # the partition is not materialized (it showed green before): observed, with its proofs failed on it
    partition = f"{DATE}|{table_name}"
    assert partition not in runner.instance.get_materialized_partitions(dg.AssetKey("compaction"))
    events = runner.instance.all_logs(report.run_id)
    [observed] = [e.dagster_event.event_specific_data.asset_observation for e in events
                  if e.dagster_event and e.dagster_event.event_type_value == "ASSET_OBSERVATION"]
    assert observed.partition == partition and observed.metadata["published"].value is False
    checks = [e.dagster_event.event_specific_data for e in events
              if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert {c.check_name for c in checks if not c.passed} >= {"column_aggregates"}
    cursors = ticks(sensors, runner.instance, resources, cursors)
    ticks(sensors, runner.instance, resources, cursors)
    assert len(webhook.messages) == 1, webhook.messages
    [message] = webhook.messages
    assert message["kind"] == "proof_failed" and message["table"] == table_name and message["date"] == DATE
    assert message["before_snapshot_id"] == main_before and message["after_snapshot_id"] == main_before
    assert message["staged_snapshot_ids"] == staged_ids and message["published"] is False
    assert message["result"] == "not published, main unchanged" and message["decision"] == "not_published"
    assert message["run_id"] == report.run_id and message["job"] == "compaction_job"
    assert message["owner"] == "data-platform" and message["validation_passed"] is False
    assert spark.sql(f"SELECT snapshot_id FROM {sql}.`refs` WHERE name = 'main'").first()[0] == main_before
    [record] = open_audit(load_config(path)).records(operation="alert")
    assert record.decision == "proof_failed" and record.details["delivery"]["status"] == "sent"
    assert record.details["alert_id"] == message["alert_id"]


def test_a_refused_run_sends_one_run_failed_message(spark, tmp_path, lake_root, table_name, webhook, monkeypatch,
                                                    isolated_dagster_home):
    from icemaint.app.runner import MaintenanceRunner

    monkeypatch.setenv(HOOK_ENV, webhook.url)
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        tables={table_name: {"read_only": True, "owner": "ops"}},
                        alerts={"webhook_url_env": HOOK_ENV})
    spark.sql(f"CREATE TABLE {TableName.parse(table_name).sql('lake')} (id BIGINT, ts TIMESTAMP) USING iceberg "
              "PARTITIONED BY (days(ts))")
    runner = MaintenanceRunner(load_config(path), str(path))
    sensors = [s for s in runner.defs.sensors if s.name.startswith("alert_on_")]
    resources = dict(runner.defs.resources)
    cursors = ticks(sensors, runner.instance, resources)

    refused = runner.compact(table_name, DATE)
    expired = runner.expire(table_name)  # the same policy refuses retention too: a second failed run

    assert not refused.success and not expired.success
    ticks(sensors, runner.instance, resources, cursors)
    by_run = {m["run_id"]: m for m in webhook.messages}
    assert len(webhook.messages) == 2 and set(by_run) == {refused.run_id, expired.run_id}
    message = by_run[refused.run_id]
    assert message["kind"] == "run_failed" and message["decision"] == "refuse" and message["owner"] == "ops"
    assert message["table"] == table_name and message["date"] == DATE and "read-only" in message["reason"]
    assert message["result"] == "refused, nothing changed" and message["job"] == "compaction_job"
    assert by_run[expired.run_id]["job"] == "expiry_job" and by_run[expired.run_id]["date"] is None
