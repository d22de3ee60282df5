"""A long-lived process keeps nothing per run for Dagster's migration scripts (`icemaint.app.migration_scripts`):
each run's SQLite event log, opened on a real instance, left two callbacks at exit (and their exit stacks) until
the location became a path."""

from __future__ import annotations

import atexit
import os
import uuid

import pytest
from dagster import DagsterInstance
from dagster._core.storage import sql

from icemaint.app.migration_scripts import pin_migration_scripts, scripts_path

RESOURCE = "dagster:_core/storage/alembic"


def test_a_package_location_names_its_directory_and_anything_else_none():
    path = scripts_path(RESOURCE)
    assert path is not None and os.path.isabs(path) and os.path.isfile(os.path.join(path, "env.py"))
    assert scripts_path(path) is None  # already a path
    assert scripts_path("icemaint_no_such_package:alembic") is None
    assert scripts_path("dagster:_core/no_such_dir") is None
    assert scripts_path("alembic") is None  # no package:dir


def kept_at_exit(instance, runs: int) -> int:
    """Callbacks registered at exit while `runs` new runs' event logs open (each creates its SQLite database)."""
    before = atexit._ncallbacks()
    for _ in range(runs):
        instance.all_logs(str(uuid.uuid4()))
    return atexit._ncallbacks() - before


def test_a_run_s_event_log_keeps_nothing_once_the_scripts_are_found_by_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sql, "ALEMBIC_SCRIPTS_LOCATION", RESOURCE)  # as Dagster ships it; restored afterwards
    # An earlier test in this process pinned the location: its cached alembic configs name the path, and opening an
    # event log with them would keep nothing whatever Dagster ships (the test skipped so in the whole suite).
    sql.get_alembic_config.cache_clear()
    instance = DagsterInstance.local_temp(str(tmp_path))
    try:
        if kept_at_exit(instance, 1) == 0:
            pytest.skip("this alembic keeps nothing per resource location: the pin is no longer needed")
        assert pin_migration_scripts() is True
        assert sql.ALEMBIC_SCRIPTS_LOCATION == scripts_path(RESOURCE)
        assert kept_at_exit(instance, 1) == 0
        assert pin_migration_scripts() is True  # again: nothing changes
    finally:
        instance.dispose()
        sql.get_alembic_config.cache_clear()  # no config naming the resource outlives the test
