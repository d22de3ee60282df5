"""The `alerts:` section: where alerts on failed proofs and failed runs go, per table owner. The webhook URL is a
secret: the file only names the environment variable that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from icemaint.config.keys import section_keys
from icemaint.config.parse import ConfigError, env_name, flag, key_name, mapping, only

_URL_IN_FILE = ("the webhook URL is a secret and is not read from the file; set it in the environment and "
                "name the variable in")


@dataclass(frozen=True)
class OwnerAlerts:
    """One owner's alert route: `enabled: false` silences it; an unset key falls back to `alerts`'s."""

    enabled: bool = True
    webhook_url_env: str | None = None
    audit: bool | None = None


@dataclass(frozen=True)
class AlertsConfig:
    """Where alerts on failed proofs and failed runs go (per table owner). The webhook URL is a secret:
    the file only names the environment variable that holds it. No `alerts:` section: no alerts."""

    webhook_url_env: str | None = None
    audit: bool = False
    owners: Mapping[str, OwnerAlerts] = field(default_factory=dict)


def parse_alerts(value: Any) -> AlertsConfig:
    section = mapping(value, "alerts")
    env = _route(section, "alerts", section_keys("alerts"))
    owners = {}
    for owner, route in mapping(section.get("owners"), "alerts.owners").items():
        where = f"alerts.owners.{key_name(owner)}"
        route = mapping(route, where)
        own_env = _route(route, where, section_keys("alerts.owners.<owner>"))
        audit = route.get("audit")
        owners[str(owner)] = OwnerAlerts(flag(route.get("enabled", True), f"{where}.enabled"), own_env,
                                         None if audit is None else flag(audit, f"{where}.audit"))
    return AlertsConfig(env, flag(section.get("audit", False), "alerts.audit"), owners)


def _route(section: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> str | None:
    """Checks one route's keys; returns its webhook_url_env (None when unset)."""
    if "webhook_url" in section:
        raise ConfigError(f"{where}.webhook_url: {_URL_IN_FILE} {where}.webhook_url_env")
    only(section, allowed, where)
    env = section.get("webhook_url_env")
    if env is None:
        return None
    where = f"{where}.webhook_url_env"
    if isinstance(env, str) and "://" in env:  # the URL itself: never repeat it in a message
        raise ConfigError(f"{where}: {_URL_IN_FILE} {where} (a variable name such as ICEMAINT_ALERT_WEBHOOK)")
    return env_name(env, where, "the webhook URL")
