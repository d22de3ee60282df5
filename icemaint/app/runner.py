"""Runs the code location's jobs in this process against the instance under the state dir.

The CLI and the demo use this, so every materialization they cause shows up in the Dagster UI
exactly as a sensor- or UI-launched run would.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from dataclasses import dataclass, field

from icemaint.config import MaintenanceConfig
from icemaint.app.instance import get_instance
from icemaint.engine.long_lived import freeze_loaded
from icemaint.observe.catalog import CatalogReader
from icemaint.domain.names import TableName
from icemaint.domain.scope import parse_date
from icemaint.safety import interrupts
from maint_assets.partitions import TABLE_DIMENSION, TABLE_TAG, TRIGGER_TAG, date_range_tags, slot_tags, \
    table_range_tags, tables_of, tables_range_tags

from sensors.reaper import process_tags
from icemaint.errors import one_line

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobCall:
    """One run of a job, before it runs: executed here (`MaintenanceRunner._execute`) or queued (`submit`)."""

    job_name: str
    partition_key: str | None
    run_config: dict
    tags: dict


@dataclass
class RunReport:
    """What one run did: its success and the domain outcome the asset attached to its events.

    `error` is one readable line (the failure's own class and message, not the framework's wrapper);
    the stack trace stays in the run's event log. `table_state` says what the run left on `main`.
    """

    run_id: str
    success: bool
    outcome: dict = field(default_factory=dict)
    error: str | None = None
    table_state: str | None = None
    # A run over several partitions (a batch of dates): each partition key's outcome.
    outcomes: dict = field(default_factory=dict)

    @property
    def failure_line(self) -> str:
        return "; ".join(p for p in (self.error or "the run failed", self.table_state) if p) + \
            f" (run {self.run_id}; stack trace in its Dagster event log)"


def error_line(error) -> str:
    """What failed in a Dagster step, as `Class: first line of its message`: the first error of the
    chain that is not Dagster's own wrapper (its causes, e.g. the Java exception, are in the log)."""
    while (error.cls_name or "").startswith("Dagster") and getattr(error, "cause", None) is not None:
        error = error.cause
    if error.cls_name in ("DagsterExecutionInterruptedError", "KeyboardInterrupt"):
        return "interrupted (Ctrl-C, or the run was terminated) before it finished"
    if error.cls_name == "Py4JJavaError":  # "An error occurred while calling o57.sql." names no cause: the JVM's does
        root = java_cause(error.message or "")
        if root:
            return one_line(root, 400)
    message = one_line(error.message, 400)
    if not message:
        return error.cls_name or "step failed"
    head, _, rest = message.partition(": ")
    if error.cls_name and head.endswith(error.cls_name):  # `pkg.module.Class: text` -> `Class: text`
        return one_line(f"{error.cls_name}: {rest}", 400)
    return message


def java_cause(text: str) -> str | None:
    """The root Java exception in a Py4JJavaError's text, as `Class: message` (the last `Caused by:`, else the
    exception the call raised), or None when the text holds none."""
    lines = text.splitlines()
    causes = [ln[len("Caused by: "):] for ln in lines if ln.startswith("Caused by: ")]
    raised = [ln[2:] for ln in lines if ln.startswith(": ")]
    root = (causes or raised or [None])[-1 if causes else 0]
    if not root:
        return None
    name, sep, rest = root.partition(": ")
    return f"{name.rsplit('.', 1)[-1]}{sep}{rest}".strip()


class MaintenanceRunner:
    # Dagster's console shows only critical events: a failed step's stack trace belongs in the run's
    # event log (the UI shows it), not on an operator's terminal, which gets `RunReport.failure_line`.
    def __init__(self, config: MaintenanceConfig, config_path: str | None = None, log_level: str = "CRITICAL",
                 reap: bool = True):
        """`reap`: mark failed the runs of dead processes as the instance opens (`get_instance`); a dry run does not."""
        # A run that materialized nothing (a dry run, a deferral) has no proof to gate on: Dagster says so
        # on the Python root logger, which would print it on the operator's terminal.
        logging.getLogger("dagster._core.execution.plan.active").setLevel(logging.ERROR)
        from maint_assets.definitions import build_definitions

        self.log_level = log_level
        self.config = config
        self.instance = get_instance(config, reap=reap)
        self.defs = build_definitions(config_path or config.source)
        self.reader = CatalogReader(config)
        freeze_loaded("runner")  # Dagster, the definitions and the catalog readers are loaded for good

    # -- inputs ------------------------------------------------------------------------------
    def check_table(self, table: str) -> str:
        """The validated key of an existing table, registered as a `table` partition."""
        key = TableName.parse(table).key
        self.reader.metadata_location(key)  # raises TableNotFound with the catalog named
        if not self.instance.has_dynamic_partition("table", key):
            self.instance.add_dynamic_partitions("table", [key])
        return key

    def check_date(self, date: str) -> str:
        today = dt.datetime.now(dt.timezone.utc).date()
        return parse_date(date, self.config.dates_start, today + dt.timedelta(days=1)).isoformat()

    # -- runs --------------------------------------------------------------------------------
    def _execute(self, job_name: str, partition_key: str | None, run_config: dict | None = None,
                 tags: dict | None = None, outcome_key: str = "outcome", run_id: str | None = None) -> RunReport:
        """Executes the job in this process; `run_id`: the id to give the run (a caller that answers with it
        before the run ends, `icemaint mcp`), else a new one."""
        interrupts.before_run()  # after an operator's Ctrl-C no further run starts (a tick's lanes, batches, ticks)
        job = self.defs.resolve_job_def(job_name)
        # The queue's slot tags: a daemon-launched run of one of these tables waits while this one runs.
        tags = {**(tags or {}), **slot_tags(tables_of(tags or {}))}
        table = tags.get(TABLE_TAG)
        before = self._main(table)
        run_config = {**(run_config or {}), "loggers": {"console": {"config": {"log_level": self.log_level}}}}
        # This process executes the run: its pid, host and start let the reaper prove it dead if it dies.
        run_id = run_id or str(uuid.uuid4())
        result = job.execute_in_process(instance=self.instance, partition_key=partition_key, run_id=run_id,
                                        run_config=run_config, tags={**tags, **process_tags(run_id)},
                                        raise_on_error=False)
        outcome, outcomes, error = {}, {}, None
        for event in result.all_events:
            if event.is_step_materialization or event.event_type_value == "ASSET_OBSERVATION":
                data = event.event_specific_data
                entry = getattr(data, "materialization", None) or getattr(data, "asset_observation", None)
                if entry is not None and outcome_key in entry.metadata:
                    outcome = entry.metadata[outcome_key].value
                    if entry.partition is not None:
                        outcomes[str(entry.partition)] = outcome
            if event.is_step_failure:
                error = error_line(event.event_specific_data.error) if event.event_specific_data.error else "step failed"
                # A refusal fails its step on purpose and carries its outcome: report the decision it is.
                failure = event.event_specific_data.user_failure_data
                if not outcome and failure is not None and outcome_key in failure.metadata:
                    outcome = failure.metadata[outcome_key].value
        return RunReport(result.run_id, result.success, outcome, error,
                         self._state(before, self._main(table)) if before else None, outcomes)

    def _main(self, table: str | None) -> tuple | None:
        """(snapshot id,) of the table's `main`, or None when it cannot be read."""
        if not table:
            return None
        try:
            snapshot = self.reader.load(table).current_snapshot()
        except Exception:  # the state line is evidence, not a step: a failing read leaves it unknown
            return None
        return (snapshot.snapshot_id if snapshot else None,)

    @staticmethod
    def _state(before: tuple, after: tuple | None) -> str | None:
        if after is None:
            return None
        if before == after:
            return f"main is unchanged (snapshot {before[0]})"
        return f"main moved from snapshot {before[0]} to {after[0]} during the run (see icemaint audit)"

    def health(self, table: str) -> RunReport:
        key = self.check_table(table)
        return self._execute("health_job", key, tags={TABLE_TAG: key, TRIGGER_TAG: "cli"},
                             outcome_key="health")

    def compact(self, table: str, date: str | None, *, dry_run: bool = False, approved: bool = False,
                trigger: str = "cli", tags: dict | None = None, run_id: str | None = None) -> RunReport:
        """Materialize `compaction` for (date, table), or with no date `table_compaction` for the table (`tags`:
        more run tags, e.g. the agent of an agent's run; `run_id`: as `_execute`'s)."""
        return self.execute(self.compaction_call(table, date, dry_run=dry_run, approved=approved, trigger=trigger,
                                                 tags=tags), run_id)

    def execute(self, call: JobCall, run_id: str | None = None) -> RunReport:
        """Executes `call` in this process (`run_id`: as `_execute`'s)."""
        return self._execute(call.job_name, call.partition_key, call.run_config, tags=call.tags, run_id=run_id)

    def compaction_call(self, table: str, date: str | None, *, dry_run: bool = False, approved: bool = False,
                        trigger: str = "cli", tags: dict | None = None) -> JobCall:
        """The run `compact` executes: `compaction_job` on (date, table), or `table_compaction_job` on the table."""
        key = self.check_table(table)
        config = {"config": {"dry_run": dry_run, "approved": approved}}
        tags = {**(tags or {}), TABLE_TAG: key, TRIGGER_TAG: trigger}
        if date is None:
            return JobCall("table_compaction_job", key, {"ops": {"table_compaction": config}}, tags)
        day = self.check_date(date)
        return JobCall("compaction_job", f"{day}|{key}", {"ops": {"compaction": config}}, tags)

    def submit(self, call: JobCall, origin, run_id: str):
        """Submits `call` to the instance's run queue for the daemon's code location `origin` (`queued_runs`),
        with the queue's slot tags; returns the QUEUED run."""
        from icemaint.app.queued_runs import submit

        tags = {**call.tags, **slot_tags(tables_of(call.tags))}
        return submit(self.instance, self.defs.resolve_job_def(call.job_name), origin, run_id=run_id,
                      partition_key=call.partition_key, run_config=call.run_config, tags=tags)

    def ingest(self, source: str, *, force: bool = False, dry_run: bool = False, trigger: str = "cli") -> RunReport:
        """Materialize `landed_batches` for one landing source (one batch), registered as its partition."""
        from maint_assets.landing import INGEST_JOB, LANDING_DIMENSION
        from icemaint.operations.ingest import UnknownSource

        found = self.config.landing.get(source)
        if found is None:
            known = ", ".join(sorted(self.config.landing)) or "none configured (config key `landing`)"
            raise UnknownSource(f"landing source {source!r} is not in the config; sources: {known}")
        self.reader.metadata_location(found.table)  # TableNotFound before a run
        if not self.instance.has_dynamic_partition(LANDING_DIMENSION, source):
            self.instance.add_dynamic_partitions(LANDING_DIMENSION, [source])
        return self._execute(INGEST_JOB, source, {"ops": {"landed_batches": {"config": {
            "dry_run": dry_run, "force": force}}}}, tags={TABLE_TAG: found.table, TRIGGER_TAG: trigger})

    def compact_dates(self, table: str, dates: list[str], *, trigger: str = "cli") -> RunReport:
        """Materialize `compaction` for consecutive dates of one table in one run: the partition range a
        batched backfill run covers (one run record and Spark session; each date its own request, claim,
        proof, audit record and materialization, its outcome in `RunReport.outcomes` by partition key)."""
        key = self.check_table(table)
        days = self._consecutive(dates)
        if len(days) == 1:
            return self.compact(key, days[0], trigger=trigger)
        tags = {TABLE_TAG: key, TRIGGER_TAG: trigger, **date_range_tags(key, days[0], days[-1])}
        config = {"config": {"dry_run": False, "approved": False}}
        return self._execute("compaction_job", None, {"ops": {"compaction": config}}, tags=tags)

    def compact_tables(self, tables: list[str], dates: list[str], *, trigger: str = "cli") -> RunReport:
        """Materialize `compaction` for the same consecutive dates of several tables in one run: tables next to
        each other in the `table` partitions' order, since the run's partition range covers every table between
        its first and last (`tick.table_batches` forms such batches). One run record and Spark session; each
        table-date its own request, claim, proof, audit record and materialization, its outcome in
        `RunReport.outcomes`."""
        keys = [self.check_table(t) for t in tables]
        days = self._consecutive(dates)
        if not keys:
            raise ValueError("no tables to compact")
        if len(keys) == 1:
            return self.compact_dates(keys[0], days, trigger=trigger)
        self._neighbours(keys)
        tags = {TRIGGER_TAG: trigger, **table_range_tags(keys, days[0], days[-1])}
        config = {"config": {"dry_run": False, "approved": False}}
        return self._execute("compaction_job", None, {"ops": {"compaction": config}}, tags=tags)

    def _neighbours(self, keys: list[str]) -> None:
        """Raises ValueError unless the tables of one run are neighbours in the `table` partitions' order (a run's
        range covers every table between its first and last) in different queue slots (one slot tag each)."""
        position = {t: i for i, t in enumerate(self.instance.get_dynamic_partitions(TABLE_DIMENSION))}
        first = position[keys[0]]
        if [position[k] for k in keys] != list(range(first, first + len(keys))):
            raise ValueError(f"the tables of one run must be neighbours in the table partitions' order, without "
                             f"gaps or repeats: {', '.join(keys)} are not")
        slot_tags(keys)  # raises when two of them share a queue slot

    def _consecutive(self, dates: list[str]) -> list[str]:
        """The validated dates of one run: at least one, consecutive and ascending."""
        days = [self.check_date(d) for d in dates]
        if not days:
            raise ValueError("no dates to compact")
        if any(parse_date(b) - parse_date(a) != dt.timedelta(days=1) for a, b in zip(days, days[1:])):
            raise ValueError(f"the dates of one run must be consecutive and ascending, got {', '.join(days)}")
        return days

    # -- retention ---------------------------------------------------------------------------
    def _retention(self, job_name: str, asset: str, table: str, settings: dict, trigger: str,
                   tags: dict | None = None, run_id: str | None = None) -> RunReport:
        return self.execute(self._retention_call(job_name, asset, table, settings, trigger, tags), run_id)

    def _retention_call(self, job_name: str, asset: str, table: str, settings: dict, trigger: str,
                        tags: dict | None = None) -> JobCall:
        key = self.check_table(table)
        config = {k: v for k, v in settings.items() if v is not None}
        return JobCall(job_name, key, {"ops": {asset: {"config": config}}},
                       {**(tags or {}), TABLE_TAG: key, TRIGGER_TAG: trigger})

    def retention_call(self, operation: str, table: str, *, trigger: str, tags: dict | None = None) -> JobCall:
        """The run `retention` executes."""
        from icemaint.domain.retention_tick import RETENTION_JOBS
        from maint_assets.retention import RETENTION_ASSET_OF

        return self._retention_call(RETENTION_JOBS[operation], RETENTION_ASSET_OF[operation], table, {}, trigger,
                                    tags)

    def retention(self, operation: str, table: str, *, trigger: str, tags: dict | None = None,
                  run_id: str | None = None) -> RunReport:
        """One retention operation ("expire", "manifests", "statistics", "orphans") on one table by its policy."""
        from icemaint.domain.retention_tick import RETENTION_JOBS
        from maint_assets.retention import RETENTION_ASSET_OF

        return self._retention(RETENTION_JOBS[operation], RETENTION_ASSET_OF[operation], table, {}, trigger,
                               tags=tags, run_id=run_id)

    def expire(self, table: str, *, older_than: str | None = None, retain_last: int | None = None,
               keep_files: bool | None = None, dry_run: bool = False, trigger: str = "cli") -> RunReport:
        """Materialize `expired_snapshots` for the table (older_than: a duration such as "7d")."""
        return self._retention("expiry_job", "expired_snapshots", table,
                               {"dry_run": dry_run, "older_than": older_than, "retain_last": retain_last,
                                "keep_files": keep_files}, trigger)

    def orphans(self, table: str, *, older_than: str | None = None, force: bool = False, quarantine: bool = False,
                dry_run: bool = False, trigger: str = "cli") -> RunReport:
        """Materialize `orphan_files` for the table (older_than: a duration such as "72h")."""
        return self._retention("orphans_job", "orphan_files", table,
                               {"dry_run": dry_run, "older_than": older_than, "force": force,
                                "quarantine": quarantine}, trigger)

    def manifests(self, table: str, *, force: bool = False, dry_run: bool = False, trigger: str = "cli") -> RunReport:
        """Materialize `rewritten_manifests` for the table."""
        return self._retention("manifests_job", "rewritten_manifests", table,
                               {"dry_run": dry_run, "force": force}, trigger)

    def statistics(self, table: str, *, force: bool = False, dry_run: bool = False,
                   columns: list[str] | None = None, trigger: str = "cli") -> RunReport:
        """Materialize `column_statistics` for the table."""
        return self._retention("statistics_job", "column_statistics", table,
                               {"dry_run": dry_run, "force": force, "columns": columns}, trigger)

    def retention_tables(self, operation: str, tables: list[str], *, trigger: str = "cli") -> RunReport:
        """One run of a retention operation ("expire", "orphans", "manifests") by each table's policy over several
        tables, neighbours in the `table` partitions' order (the tick's batches, as the retention sensor's): each
        table under its own claim, audit record and materialization, its outcome in `RunReport.outcomes` by table."""
        from icemaint.domain.retention_tick import RETENTION_JOBS
        from maint_assets.retention import RETENTION_ASSET_OF

        if operation not in RETENTION_JOBS:
            raise ValueError(f"unknown retention operation {operation!r}: one of {', '.join(RETENTION_JOBS)}")
        keys = [self.check_table(t) for t in tables]
        if not keys:
            raise ValueError("no tables to maintain")
        job_name, asset = RETENTION_JOBS[operation], RETENTION_ASSET_OF[operation]
        if len(keys) == 1:
            return self._retention(job_name, asset, keys[0], {}, trigger)
        self._neighbours(keys)
        return self._execute(job_name, None, {"ops": {asset: {"config": {}}}},
                             tags={TRIGGER_TAG: trigger, **tables_range_tags(keys)})
