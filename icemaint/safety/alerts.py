"""Alerts: one JSON message per failed proof and per failed maintenance run, sent to the table owner's
webhook and/or written to the audit log.

Which alerts a finished run deserves (`alerts_for_run`) and where each one goes (`route_for`) are
pure. `send_alert` is the one network call: stdlib `urllib.request`, a bound it enforces on the whole
exchange (name lookup included), and it never raises. A dead or slow webhook costs the alert sensor
at most that bound and never reaches a maintenance run: alerts are sent after the run has ended.
The webhook URL is a secret: it comes from the environment variable the config names, and it is
never logged, audited or repeated in a delivery's detail.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from icemaint.domain.verdicts import DEFER, FAILED, NOT_PUBLISHED, REFUSE, Word
from icemaint.safety.audit import AuditRecord

if TYPE_CHECKING:
    from icemaint.config.alerts import AlertsConfig

DEFAULT_TIMEOUT_SECONDS = 5.0
MAX_REASON_CHARS = 2000


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class AlertKind(Word):
    PROOF_FAILED = "proof_failed"  # a compaction's proof failed: nothing of it was published
    RUN_FAILED = "run_failed"      # a maintenance run failed: a refusal, a person's run not done, an error


@dataclass(frozen=True)
class FinishedRun:
    """What the alert rules need of a finished maintenance run (read from its Dagster events).

    `outcomes` are the maintenance outcomes the run recorded (one per partition it worked on);
    `failure` says why the run failed beyond its failed proofs, None when those explain the failure.
    """

    run_id: str
    job: str
    failed: bool
    table: str | None = None
    date: str | None = None
    trigger: str | None = None
    outcomes: tuple[Mapping[str, Any], ...] = ()
    failure: str | None = None
    tables: tuple[str, ...] = ()  # every table of a run over several (then `table` is None)


@dataclass(frozen=True)
class Alert:
    """One event worth a person's attention, with the evidence a receiver needs to act on it."""

    kind: AlertKind
    run_id: str
    job: str
    reason: str
    table: str | None = None
    date: str | None = None
    owner: str | None = None
    trigger: str | None = None
    decision: str | None = None
    before_snapshot_id: int | None = None
    after_snapshot_id: int | None = None
    staged_snapshot_ids: tuple[int, ...] = ()
    published: bool | None = None
    validation_passed: bool | None = None
    ts: dt.datetime = field(default_factory=_utcnow)
    # A failed run over several tables alerts each owner once, naming that owner's tables it left undone.
    tables: tuple[str, ...] = ()

    @property
    def alert_id(self) -> str:
        """Stable per event, so a receiver can drop a repeat."""
        if self.kind is AlertKind.PROOF_FAILED:
            return f"{self.run_id}:{self.kind}:{self.table}:{self.date or 'partitions'}"
        if self.tables:
            return f"{self.run_id}:{self.kind}:{self.owner or '-'}"
        return f"{self.run_id}:{self.kind}"

    @property
    def result(self) -> str:
        """What the event left on the table, in a few words."""
        if self.kind is AlertKind.PROOF_FAILED:
            if self.published:  # partial progress: groups proven before the failed one were published
                return (f"partly published: the groups proven before it are on main (snapshot "
                        f"{self.after_snapshot_id}); the failed group was not published")
            return "not published, main unchanged"
        return {REFUSE: "refused, nothing changed", DEFER: "not done, nothing changed"}.get(self.decision, "failed")

    def text(self) -> str:
        """One line for a chat channel."""
        where = " ".join(p for p in (self.table, self.date) if p) or ", ".join(self.tables) or self.job
        if self.kind is AlertKind.PROOF_FAILED:
            staged = ", ".join(str(s) for s in self.staged_snapshot_ids) or "?"
            return (f"icemaint: proof failed for {where}: {self.result} (snapshot {self.before_snapshot_id}, "
                    f"staged {staged}; run {self.run_id})")
        return f"icemaint: {self.job} run {self.result} for {where}: {self.reason} (run {self.run_id})"

    def to_message(self) -> dict[str, Any]:
        """The JSON object sent to the webhook (and kept in the audit record)."""
        return {"source": "icemaint", "alert_id": self.alert_id, "kind": str(self.kind), "table": self.table,
                "date": self.date, "owner": self.owner, "run_id": self.run_id, "job": self.job,
                "trigger": self.trigger, "decision": self.decision, "result": self.result, "reason": self.reason,
                "before_snapshot_id": self.before_snapshot_id, "after_snapshot_id": self.after_snapshot_id,
                "staged_snapshot_ids": list(self.staged_snapshot_ids), "published": self.published,
                "validation_passed": self.validation_passed, "ts": self.ts.isoformat(), "text": self.text(),
                **({"tables": list(self.tables)} if self.tables else {})}


def _snapshot_id(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def _alert(kind: AlertKind, run: FinishedRun, outcome: Mapping[str, Any], reason: str,
           owner_of: Callable[[str], str | None], now: dt.datetime) -> Alert:
    table = outcome.get("table") or run.table
    validation = outcome.get("validation")
    staged = tuple(i for i in (_snapshot_id(s.get("staged_snapshot_id")) for s in outcome.get("staged") or ()
                               if isinstance(s, Mapping) and s.get("verdict") == str(NOT_PUBLISHED))
                   if i is not None)
    published = outcome.get("published")
    return Alert(
        kind=kind, run_id=run.run_id, job=run.job, reason=_clip(reason), table=table,
        date=outcome.get("date") if outcome else run.date,
        owner=owner_of(table) if table else None, trigger=run.trigger,
        decision=str(outcome["decision"]) if outcome.get("decision") else None,
        before_snapshot_id=_snapshot_id(outcome.get("before_snapshot_id")),
        after_snapshot_id=_snapshot_id(outcome.get("after_snapshot_id")), staged_snapshot_ids=staged,
        published=published if isinstance(published, bool) else None,
        validation_passed=validation.get("passed") if isinstance(validation, Mapping) else None, ts=now)


def alerts_for_run(run: FinishedRun, owner_of: Callable[[str], str | None], now: dt.datetime | None = None
                   ) -> list[Alert]:
    """The alerts a finished run deserves: one per failed proof (whatever the run's status), and one for
    the run itself when it failed for any other reason (a failure its failed proofs explain is not
    alerted twice).

    Args:
        owner_of: the owner of a table (its policy's `owner`), or None.
    """
    now = now or _utcnow()
    alerts = [_alert(AlertKind.PROOF_FAILED, run, o, str(o.get("reason") or "the proof failed"), owner_of, now)
              for o in run.outcomes if str(o.get("decision")) == NOT_PUBLISHED]
    if run.failed and (run.failure is not None or not alerts):
        others = [o for o in run.outcomes if str(o.get("decision")) != NOT_PUBLISHED]
        failing = [o for o in others if str(o.get("decision")) in (REFUSE, DEFER, FAILED)]
        if len(run.tables) > 1:
            return alerts + _failed_by_owner(run, failing, owner_of, now)
        # The evidence of the one outcome that explains the failure; a run of many dates names them in `reason`.
        detail = failing[0] if len(failing) == 1 else (others[0] if len(others) == 1 else {})
        alerts.append(_alert(AlertKind.RUN_FAILED, run, detail, run.failure or str(detail.get("reason") or "")
                             or "the run failed", owner_of, now))
    return alerts


def _failed_by_owner(run: FinishedRun, failing: list[Mapping[str, Any]], owner_of: Callable[[str], str | None],
                     now: dt.datetime) -> list[Alert]:
    """A failed run over several tables: one run_failed alert per owner of a table it left undone (the tables whose
    outcome failed, or every table of the run when no outcome says which: a crash), naming that owner's tables
    and, where outcomes say why, each of their table-dates' reasons."""
    undone = list(dict.fromkeys(str(o["table"]) for o in failing if o.get("table"))) or list(run.tables)
    by_owner: dict[str | None, list[str]] = {}
    for table in undone:
        by_owner.setdefault(owner_of(table), []).append(table)
    alerts = []
    for owner, tables in by_owner.items():
        mine = [o for o in failing if o.get("table") in tables]
        said = [" ".join(str(p) for p in (o.get("table"), o.get("date")) if p) + f": {o.get('reason') or o.get('decision')}"
                for o in mine]
        reason = ("; ".join(said) if said else run.failure) or "the run failed"
        alert = _alert(AlertKind.RUN_FAILED, run, mine[0] if len(mine) == 1 else {}, reason, owner_of, now)
        alerts.append(replace(alert, owner=owner, table=tables[0] if len(tables) == 1 else None, tables=tuple(tables)))
    return alerts


# -- routing -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AlertRoute:
    """Where one owner's alerts go: a webhook (named by the variable holding its URL) and/or the audit log."""

    webhook_url_env: str | None = None
    audit: bool = False
    enabled: bool = True


def configured(alerts: "AlertsConfig") -> bool:
    """Whether any alert can go anywhere (no `alerts:` section: none can)."""
    return bool(alerts.webhook_url_env or alerts.audit or any(
        o.enabled and (o.webhook_url_env or o.audit) for o in alerts.owners.values()))


def route_for(alerts: "AlertsConfig", owner: str | None) -> AlertRoute:
    """The owner's own route where it has one (each unset key falls back to the default route)."""
    own = alerts.owners.get(owner) if owner is not None else None
    if own is None:
        return AlertRoute(alerts.webhook_url_env, alerts.audit)
    if not own.enabled:
        return AlertRoute(None, False, enabled=False)
    return AlertRoute(own.webhook_url_env or alerts.webhook_url_env,
                      alerts.audit if own.audit is None else own.audit)


# -- delivery ------------------------------------------------------------------------------------

class DeliveryStatus(Word):
    SENT = "sent"
    FAILED = "failed"
    NO_URL = "no_url"  # the route's environment variable is unset or empty: nothing was sent


@dataclass(frozen=True)
class Delivery:
    """How one webhook delivery went; `detail` never contains the URL."""

    status: DeliveryStatus
    detail: str
    seconds: float = 0.0
    webhook_url_env: str | None = None

    @property
    def sent(self) -> bool:
        return self.status is DeliveryStatus.SENT

    def to_dict(self) -> dict[str, Any]:
        return {"status": str(self.status), "detail": self.detail, "seconds": round(self.seconds, 3),
                "webhook_url_env": self.webhook_url_env}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would repeat a redirected POST as a GET without its body and report success.
    def redirect_request(self, *args, **kwargs):
        return None


def send_alert(url: str, message: Mapping[str, Any], timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Delivery:
    """POSTs `message` as JSON to `url`. Never raises; returns within about `timeout` seconds.

    Any 2xx answer is `sent`; a refused connection, a timeout, a non-2xx answer (redirects are not
    followed) or a bad URL is `failed`, with the reason.
    """
    started = time.monotonic()

    def failed(detail: str) -> Delivery:
        return Delivery(DeliveryStatus.FAILED, detail.replace(url, "<webhook URL>") if url else detail,
                        time.monotonic() - started)

    try:
        body = json.dumps(dict(message), sort_keys=True, allow_nan=False, default=str).encode()
        scheme = urllib.parse.urlsplit(url).scheme
    except (TypeError, ValueError) as exc:
        return failed(f"{type(exc).__name__}: {exc}")
    if scheme not in ("http", "https"):
        return failed("the webhook URL is not an http(s) URL")
    answer: list[Delivery] = []

    def post() -> None:
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "icemaint-alerts"})
        try:
            with urllib.request.build_opener(_NoRedirect).open(request, timeout=timeout) as response:
                status = response.status
            if 200 <= status < 300:
                answer.append(Delivery(DeliveryStatus.SENT, f"HTTP {status}", time.monotonic() - started))
            else:
                answer.append(failed(f"HTTP {status}"))
        except urllib.error.HTTPError as exc:
            answer.append(failed(f"HTTP {exc.code} {exc.reason}"))
        except urllib.error.URLError as exc:
            answer.append(failed(f"{type(exc.reason).__name__}: {exc.reason}"))
        except Exception as exc:  # a sender that raised would take the alert sensor's tick with it
            answer.append(failed(f"{type(exc).__name__}: {exc}"))

    # In a thread so that the bound covers the whole exchange: urlopen's timeout is per socket
    # operation and does not cover the name lookup.
    worker = threading.Thread(target=post, name="icemaint-alert", daemon=True)
    worker.start()
    worker.join(timeout)
    if answer:
        return answer[0]
    return failed(f"no answer within {timeout:g} s")


def deliver(alert: Alert, route: AlertRoute, environ: Mapping[str, str] | None = None,
            timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Delivery | None:
    """Sends the alert to the route's webhook; None when the route has none."""
    if not route.enabled or route.webhook_url_env is None:
        return None
    url = (os.environ if environ is None else environ).get(route.webhook_url_env, "").strip()
    if not url:
        return Delivery(DeliveryStatus.NO_URL, f"${route.webhook_url_env} is not set: nothing was sent",
                        webhook_url_env=route.webhook_url_env)
    return replace(send_alert(url, alert.to_message(), timeout), webhook_url_env=route.webhook_url_env)


def needs_audit(route: AlertRoute, delivery: Delivery | None) -> bool:
    """The route asks for the audit log, or its webhook did not take the alert (so it is not lost)."""
    return route.enabled and (route.audit or (delivery is not None and not delivery.sent))


def audit_record(alert: Alert, delivery: Delivery | None, identity: str | None = None) -> AuditRecord:
    """The alert as an `alert` audit record, with how its delivery went."""
    return AuditRecord(
        ts=alert.ts, table=alert.table or "(no table)", operation="alert", decision=str(alert.kind),
        reason=alert.reason, date=alert.date, trigger="sensor", identity=identity, run_id=alert.run_id,
        before_snapshot_id=alert.before_snapshot_id, after_snapshot_id=alert.after_snapshot_id,
        validation={} if alert.validation_passed is None else {"passed": alert.validation_passed},
        details={"alert_id": alert.alert_id, "job": alert.job, "owner": alert.owner, "run_trigger": alert.trigger,
                 "decision": alert.decision, "result": alert.result, "published": alert.published,
                 "staged_snapshot_ids": list(alert.staged_snapshot_ids),
                 **({"tables": list(alert.tables)} if alert.tables else {}),
                 "delivery": delivery.to_dict() if delivery else None})
