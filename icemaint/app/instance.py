"""The Dagster instance home under the state dir: storage, telemetry off, and the run queue's limits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from icemaint.config import MaintenanceConfig
from icemaint.config.parse import ConfigError

# How long a launched run's worker may take to start (run monitoring fails it after that), and a code server the
# daemon starts to load. Measured on 2 cores throttled to 0.3 of one (a slow CI machine's share): a run worker
# took up to 286 s from launch to start, a code server over 180 s to load; both were 5-20 s unloaded.
RUN_START_TIMEOUT_S = 900
CODE_SERVER_START_TIMEOUT_S = 600


def storage_settings(config: MaintenanceConfig) -> dict:
    """Dagster's run, event-log and schedule storage: SQLite under the home (the default), or PostgreSQL.
    The DSN stays in the environment: the file names the variable, Dagster reads it at start-up."""
    if config.dagster.storage == "postgres":
        return {"storage": {"postgres": {"postgres_url": {"env": config.dagster.dsn_env}}}}
    return {}


def instance_settings(config: MaintenanceConfig) -> dict:
    return {
        **storage_settings(config),
        # Dagster's local compute logs (steps' stdout and stderr, in the UI), their terminal mirrors deaf to Ctrl-C.
        "compute_logs": {"module": "icemaint.app.compute_logs", "class": "TerminalQuietComputeLogManager",
                         "config": {"base_dir": str(config.dagster_home.resolve() / "storage")}},
        "telemetry": {"enabled": False},
        "nux": {"enabled": False},
        # Dagster's queued coordinator, adding `icemaint/table` to runs Dagster creates (backfills, UI), with one
        # maintenance run per table at a time (every run carries icemaint/table, or for a run over several tables
        # icemaint/tables, and a slot tag per table: sensors and the CLI set them, the coordinator adds them to
        # backfill and UI runs). Its limits are its own (`queue.table_limits`), so this file stays small.
        "run_coordinator": {"module": "icemaint.app.queue", "class": "TableTaggingRunCoordinator"},
        # A run whose worker is slow to start (a loaded machine) is left STARTING, not failed: icemaint.app.launcher.
        "run_launcher": {"module": "icemaint.app.launcher", "class": "PatientRunLauncher"},
        # A code server the daemon (re)starts got 180 s (Dagster's default) to load: one on a loaded machine took
        # longer, and the sensors' ticks and the queue's launches failed meanwhile.
        "code_servers": {"local_startup_timeout": CODE_SERVER_START_TIMEOUT_S},
        # A global cap for the estate.
        "concurrency": {"runs": {"max_concurrent_runs": config.max_runs_total}},
        # Dagster 1.13's DefaultRunLauncher cannot check a run worker's health, so monitoring fails only
        # launched runs that never start (and cancels that never finish); a STARTED run whose process
        # died is the reaper's (sensors/reaper.py). No max runtime: a compaction's length follows its data,
        # and a long run is no proof of a dead one. DefaultRunLauncher cannot resume a run: 0 attempts.
        "run_monitoring": {"enabled": True, "start_timeout_seconds": RUN_START_TIMEOUT_S,
                           "cancel_timeout_seconds": 300, "max_resume_run_attempts": 0, "poll_interval_seconds": 60},
    }


def ensure_dagster_home(config: MaintenanceConfig) -> Path:
    """Create `<state_dir>/dagster/dagster.yaml` (rewritten when settings change) and point DAGSTER_HOME at it."""
    if config.dagster.storage == "postgres" and not os.environ.get(config.dagster.dsn_env):
        raise ConfigError(f"dagster.storage is postgres but ${config.dagster.dsn_env} is not set: export the "
                          "PostgreSQL DSN (postgresql://user:password@host:port/db) in that variable")
    home = config.dagster_home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    text = yaml.safe_dump(instance_settings(config), sort_keys=False)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def get_instance(config: MaintenanceConfig, *, reap: bool = True):
    """The instance under the state dir. With `reap`, first marks failed every run whose process is provably dead
    (killed, its machine rebooted), saying so on standard error: such a run stayed STARTED, holding its table's
    slot in the run queue, until a tick's reaper came by, and a person's `compact` waited behind it."""
    from dagster import DagsterInstance

    from icemaint.app.migration_scripts import pin_migration_scripts

    ensure_dagster_home(config)
    pin_migration_scripts()  # a run's SQLite event log would otherwise leave two exit stacks behind for good
    instance = DagsterInstance.get()
    if reap:
        from sensors.reaper import reap_dead_runs

        for decision in reap_dead_runs(instance):
            if decision.reap:
                print(decision.line(), file=sys.stderr)
    return instance


def allow_runs_in_threads(instance) -> bool:
    """Lets runs of `instance` execute at once in threads of one process (`icemaint tick` runs tables' runs
    concurrently on one Spark session); returns whether they may. Two of Dagster's per-run set-ups act on the
    whole process, and each broke a threaded tick here:

    - Every run re-configures the process's logging (`logging.config.dictConfig`) to collect the handlers of
      dagster.yaml's `python_logs.dagster_handler_config`, even when it names none. dictConfig closes every
      handler of the process while holding logging's module lock, so a run starting while another logs
      deadlocks both (the second run of a threaded tick hung forever). With no such handlers the call yields
      none: this instance answers none without re-configuring logging. With handlers configured, Dagster's
      behaviour is kept and the answer is False (runs one at a time).
    - Every run captures stdout and stderr by pointing the process's file descriptors 1 and 2 at its compute
      log files and back; two runs interleaving leave them pointing at a finished run's file (the tick's own
      report vanished into one). This instance keeps no compute logs for the runs this process executes (the
      steps print nothing: their logs are Dagster events, Spark's log is its own file); runs the daemon
      launches, each in its own process, keep theirs.
    """
    from dagster._core.storage.noop_compute_log_manager import NoOpComputeLogManager

    if instance.get_python_log_dagster_handler_config():
        return False
    instance.get_yaml_python_handlers = lambda: []
    instance._compute_log_manager = NoOpComputeLogManager()
    return True
