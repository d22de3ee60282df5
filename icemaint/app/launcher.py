"""Dagster's run launcher, patient with a loaded machine: a run whose worker is slow to start is not failed for it.

Dagster's `DefaultRunLauncher` asks the code server to start a run worker and waits for the worker to load the code
location, up to Dagster's gRPC timeout (60 s). On a loaded machine (2 cores at a quarter of their speed, several
runs starting at once) a worker took 2-5 minutes to load. The daemon then marked the run FAILURE and dropped it from
the queue, but the code server went on starting the worker: one such run executed after it was marked failed (its
table's slot in the run queue already free for another run of the table), another was ignored by its worker.

Here a start request that outlives its gRPC deadline leaves the run STARTING: its worker moves it on when it
starts, and Dagster's run monitoring fails it if none has within `start_timeout_seconds` (icemaint.app.instance).
Any other failure to reach the code server (nothing listening, the location failed to load) still fails the
launch: no worker was started.
"""

from __future__ import annotations

from dagster import DagsterInstance, DagsterRunStatus, DefaultRunLauncher
from dagster._core.errors import DagsterUserCodeUnreachableError
from dagster._core.launcher import LaunchRunContext


def start_outlived_its_deadline(error: BaseException) -> bool:
    """Whether `error` is a start request the code server may still be carrying out: the client's deadline passed
    (gRPC DEADLINE_EXCEEDED), as opposed to a server that could not be reached at all."""
    import grpc  # type: ignore[import-untyped]

    cause = error.__cause__
    return (isinstance(error, DagsterUserCodeUnreachableError) and isinstance(cause, grpc.RpcError)
            and getattr(cause, "code", lambda: None)() == grpc.StatusCode.DEADLINE_EXCEEDED)


class PatientRunLauncher(DefaultRunLauncher):
    """`DefaultRunLauncher`, leaving a run whose worker is slow to start to run monitoring instead of failing it."""

    def launch_run(self, context: LaunchRunContext) -> None:
        try:
            super().launch_run(context)
        except DagsterUserCodeUnreachableError as error:
            if not start_outlived_its_deadline(error):
                raise
            run = context.dagster_run
            instance: DagsterInstance = self._instance
            timeout = instance.run_monitoring_start_timeout_seconds
            instance.report_engine_event(
                f"The code server did not confirm the run worker's start within Dagster's gRPC timeout (a loaded "
                f"machine): the run stays {DagsterRunStatus.STARTING.value}, goes on when its worker starts, and is "
                f"failed by run monitoring if no worker has started {timeout}s after its launch.", run)
            self._run_ids.add(run.run_id)
