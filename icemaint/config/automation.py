"""The `automation:` section: what the sensors and `icemaint tick` may start on their own, and how often each
sensor polls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from icemaint.config.keys import section_keys
from icemaint.config.parse import ConfigError, duration, flag, mapping, only


@dataclass(frozen=True)
class AutomationConfig:
    """What the sensors and `icemaint tick` may start on their own beyond compaction, expiry, manifest rewrites and
    statistics. Operations that delete files the table no longer lists are a person's choice: off until the file
    turns them on. (Quarantine purge is never automatic: `icemaint purge-quarantine` is a person's command.)"""

    # Orphan-file removal after each snapshot expiry (else only `icemaint orphans TABLE` or the UI removes orphans).
    orphan_removal: bool = False
    # How often each sensor polls at most (Dagster's minimum interval), in seconds: an estate of many tables may
    # poll less often; a test or a demo more often.
    discovery_interval: int = 60
    compaction_interval: int = 30
    retention_interval: int = 60


def parse_automation(value: Any) -> AutomationConfig:
    auto = mapping(value, "automation")
    if "quarantine_purge" in auto:
        raise ConfigError("automation.quarantine_purge: quarantine purge is never automatic; purge with "
                          "`icemaint purge-quarantine --older-than 7d` (remove the key)")
    only(auto, section_keys("automation"), "automation")
    return AutomationConfig(flag(auto.get("orphan_removal", False), "automation.orphan_removal"),
                            *(_poll_interval(auto.get(key, default), f"automation.{key}") for key, default in (
                                ("discovery_interval", 60), ("compaction_interval", 30), ("retention_interval", 60))))


def _poll_interval(value: Any, where: str) -> int:
    """A sensor's minimum interval in whole seconds, from 1s to 1d (Dagster takes whole seconds)."""
    return max(1, round(duration(value, where, 1, 86400, "1s to 1d")))
