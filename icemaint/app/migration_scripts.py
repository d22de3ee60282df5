"""Dagster's storage migrations found by path, so a long-lived process keeps nothing per run for them.

Dagster's SQLite storage (the embedded default) keeps one database per run and, as a run's database opens, loads
its migration scripts twice through alembic, from the package resource `dagster:_core/storage/alembic`. alembic
turns a resource location into a file path inside an `ExitStack` that it closes only at exit (`atexit.register`),
so every run left two stacks, their generators and paths in the process for good: `icemaint serve`'s objects
grew by ~9 a load, the resident set by ~20 KiB a run (benchmarks/RESULTS.md, "A long-lived engine over hours").
An absolute path is used as it is: the same scripts, with nothing registered.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path


def scripts_path(location: str) -> str | None:
    """The directory an alembic `package:sub/dir` location names, when it is one on disk (not in a zip); else None."""
    package, sep, sub = location.partition(":")
    if not sep or not package or os.path.isabs(location):
        return None
    try:
        found = importlib.resources.files(package)
    except (ModuleNotFoundError, TypeError):
        return None
    for part in sub.split("/"):
        found = found / part
    return str(found) if isinstance(found, Path) and found.is_dir() else None


def pin_migration_scripts() -> bool:
    """Points Dagster's migration-script location at its directory (once a process; later calls do nothing).
    True when the location now is a path; False where it stays a resource (Dagster installed in a zip)."""
    from dagster._core.storage import sql

    path = scripts_path(sql.ALEMBIC_SCRIPTS_LOCATION)
    if path is not None:
        sql.ALEMBIC_SCRIPTS_LOCATION = path
        # Dagster keeps the storages' alembic configs (`lru_cache`): ones made before this still name the resource.
        getattr(sql.get_alembic_config, "cache_clear", lambda: None)()
    return os.path.isabs(sql.ALEMBIC_SCRIPTS_LOCATION)
