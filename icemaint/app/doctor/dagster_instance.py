"""The Dagster instance the CLI opens, and what starts on its own when the definitions load."""

from __future__ import annotations

from icemaint.app.doctor.report import Check, ok
from icemaint.config import MaintenanceConfig


def check_dagster_instance(config: MaintenanceConfig) -> Check:
    from icemaint.app.instance import get_instance

    instance = get_instance(config, reap=False)  # doctor looks, it changes nothing
    try:
        runs = instance.get_runs_count()
        storage = type(instance.run_storage).__name__
    finally:
        instance.dispose()
    return ok("dagster instance", f"{config.dagster_home.resolve()} ({storage}, {runs} runs)")


def check_automation(config: MaintenanceConfig) -> Check:
    """What starts on its own when the UI or the daemon loads the definitions (read from them, as the UI shows)."""
    from maint_assets.definitions import build_definitions
    from sensors.startup import startup_summary

    return ok("automation", startup_summary(config, build_definitions(config.source)))
