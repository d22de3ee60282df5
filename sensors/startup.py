"""What starts on its own when the code location loads (`make ui`, `icemaint ui`, a daemon): the sensors and
schedules whose default status is running, and whether the deleting automation is on. Read from the definitions
themselves, so `icemaint doctor`, the UI's start-up lines and the sensors' descriptions cannot disagree.
"""

from __future__ import annotations

import dagster as dg

from icemaint.config import MaintenanceConfig


def running_at_start(defs: dg.Definitions) -> tuple[list[str], list[str]]:
    """(names running at start, names stopped until a person starts them), sensors then schedules."""
    running: list[str] = []
    stopped: list[str] = []
    for sensor in defs.sensors or ():
        (running if sensor.default_status == dg.DefaultSensorStatus.RUNNING else stopped).append(sensor.name)
    for schedule in defs.schedules or ():
        (running if schedule.default_status == dg.DefaultScheduleStatus.RUNNING else stopped).append(schedule.name)
    return running, stopped


def deleting_automation(config: MaintenanceConfig) -> str:
    """One phrase: which deleting operations run on their own (snapshot expiry follows each table's policy)."""
    orphans = ("orphan removal ON after each expiry (automation.orphan_removal: true)" if config.automation.orphan_removal
               else "orphan removal off (automation.orphan_removal: false)")
    return f"snapshot expiry by policy; {orphans}; quarantine purge never"


def startup_summary(config: MaintenanceConfig, defs: dg.Definitions) -> str:
    """One line: what runs when the UI (or the daemon) starts on this config."""
    running, stopped = running_at_start(defs)
    text = f"running at start: {', '.join(running) or 'nothing'}; {deleting_automation(config)}"
    return text + (f"; stopped until started in the UI: {', '.join(stopped)}" if stopped else "")
