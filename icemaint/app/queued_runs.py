"""Runs submitted to the instance's run queue instead of executed in this process (`icemaint mcp`'s agents' runs).

A run submitted here is the run a sensor would request: the same job, partition, run config and tags, created with
its job and plan snapshots and the origin of the daemon's code location, then handed to the instance's run
coordinator (`queue.TableTaggingRunCoordinator`). It shows in the UI as QUEUED, waits behind the per-table limits,
and the daemon launches it in a run worker of its code location: the project's `workspace.yaml`, which `icemaint
ui` serves (location `maint_assets.definitions`). The run worker loads the definitions under the daemon's config
(its `ICEMAINT_CONFIG`), as every sensor's run does.

Whether a daemon serves the instance is read from its run-queue heartbeat (`domain.agents.launch_mode`); without
one the caller executes the run itself, as `icemaint compact` does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from icemaint.domain.agents import LaunchMode, launch_mode

# The Definitions of the code location: `maint_assets.definitions.defs` (a `@dg.definitions` function).
DEFINITIONS_ATTRIBUTE = "defs"


def workspace_file() -> Path:
    """The project's workspace.yaml, beside the code location's package (the file `icemaint ui` serves)."""
    import maint_assets

    return Path(maint_assets.__file__).resolve().parents[1] / "workspace.yaml"


def code_location_origin(workspace: Path | None = None):
    """The origin of the code location the daemon serves (the workspace's first), or None without a workspace."""
    from dagster._core.workspace.load import location_origins_from_yaml_paths

    path = workspace or workspace_file()
    if not path.is_file():
        return None
    origins = location_origins_from_yaml_paths([str(path)])
    return origins[0] if origins else None


def heartbeat_age(instance, now: float | None = None) -> float | None:
    """Seconds since the run-queue daemon's last heartbeat on `instance`, or None when it never beat."""
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

    beat = instance.get_daemon_heartbeats().get(QueuedRunCoordinatorDaemon.daemon_type())
    return None if beat is None else (now if now is not None else time.time()) - beat.timestamp


def current_mode(instance, origin) -> LaunchMode:
    """How a run launched now on `instance` would run (`origin`: `code_location_origin()`)."""
    from dagster._core.run_coordinator import QueuedRunCoordinator

    return launch_mode(isinstance(instance.run_coordinator, QueuedRunCoordinator), heartbeat_age(instance),
                       origin.location_name if origin is not None else None)


def submit(instance, job_def, origin, *, run_id: str, partition_key: str | None, run_config: dict[str, Any],
           tags: dict[str, str]):
    """Creates the run of `job_def` (on `partition_key`, with Dagster's partition tags added to `tags`) for the
    code location `origin` and submits it to the instance's run coordinator; returns the run (QUEUED)."""
    from dagster._core.code_pointer import CodePointer
    from dagster._core.definitions.repository_definition.valid_definitions import SINGLETON_REPOSITORY_NAME
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.storage.dagster_run import DagsterRunStatus

    target = origin.loadable_target_origin
    code = RepositoryPythonOrigin(
        executable_path=target.executable_path or sys.executable,
        code_pointer=CodePointer.from_module(target.module_name, DEFINITIONS_ATTRIBUTE, target.working_directory))
    if partition_key is not None:
        tags = {**job_def.get_tags_for_partition_key(partition_key, None), **tags}
    run = instance.create_run_for_job(
        job_def, run_id=run_id, run_config=run_config, tags=tags, status=DagsterRunStatus.NOT_STARTED,
        remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(origin, SINGLETON_REPOSITORY_NAME), job_def.name),
        job_code_origin=JobPythonOrigin(job_def.name, code))
    return instance.submit_run(run.run_id, workspace=None)
