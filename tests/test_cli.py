"""`icemaint` in process: health, compact (and --dry-run), exit codes on bad input, refusals, audit, tick."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from types import SimpleNamespace

import dagster as dg
import pytest

from conftest import run_cli, write_config
from icemaint.safety.audit import open_audit
from icemaint.config import load_config
from icemaint.app.instance import get_instance
from icemaint.observe.catalog import CatalogReader
from icemaint.app.simulator import StreamingWriter, WorkloadSpec

# health numbers that depend on when they are read
CLOCK_FIELDS = ("oldest_snapshot_age_seconds", "seconds_since_writer_commit")


pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


@pytest.fixture(scope="module")
def estate(spark, lake_root, tmp_path_factory):
    """One simulated table with deletes on 3 dates; configs admitting only this module's namespace."""
    root = tmp_path_factory.mktemp("cli")
    namespace = f"cli_{uuid.uuid4().hex[:8]}"
    writer = StreamingWriter(spark, "lake", WorkloadSpec(table=f"{namespace}.events", days=3, rows_per_day=8,
                                                          delete_every=2, deletes_per_batch=3, seed=3))
    writer.create_table()
    writer.run(3)  # 3 small files a date: the test config's min_input_files
    common = {"state_dir": str(root / "state"), "scope": {"include": [f"{namespace}.events"]}}
    path = write_config(root / "maintenance.yaml", lake_root, **common)
    read_only = write_config(root / "read-only.yaml", lake_root, **common,
                             tables={writer.name.key: {"read_only": True}})
    return SimpleNamespace(namespace=namespace, root=root, writer=writer, table=writer.name.key,
                           sql=writer.name.sql("lake"), path=str(path), read_only=str(read_only),
                           config=load_config(path), lake_root=lake_root)


def dagster_runs(estate) -> list:
    return get_instance(estate.config).get_run_records()


def metadata_location(estate) -> str:
    return CatalogReader(estate.config).metadata_location(estate.table)


def event_ids(spark, estate, snapshot_id=None) -> list[int]:
    at = f" VERSION AS OF {int(snapshot_id)}" if snapshot_id else ""
    return sorted(r[0] for r in spark.sql(f"SELECT event_id FROM {estate.sql}{at}").collect())


def test_health_json_equals_the_pyiceberg_health_and_is_materialized(capsys, estate):
    code, out, err = run_cli(capsys, "--config", estate.path, "health", estate.table, "--json")
    assert code == 0, err
    printed = json.loads(out)
    for key in ("table", "snapshot_id", "data_files", "small_files", "total_bytes", "delete_files", "manifests",
                "snapshots", "partitions"):
        assert key in printed, key
    assert printed["table"] == estate.table
    assert [p["date"] for p in printed["partitions"]] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    for part in printed["partitions"]:
        assert {"date", "data_files", "small_files", "total_bytes"} <= set(part)
    expected = json.loads(json.dumps(CatalogReader(estate.config).health(estate.table, measure_metadata=True).to_dict(),
                                     default=str))
    for key in CLOCK_FIELDS:
        assert printed.pop(key) == pytest.approx(expected.pop(key), abs=120)
    for mine, theirs in zip(printed["partitions"], expected["partitions"]):  # each date's last writer commit's age
        assert mine.pop("seconds_since_writer_commit") == pytest.approx(theirs.pop("seconds_since_writer_commit"),
                                                                        abs=120)
    observed = [dt.datetime.fromisoformat(h.pop("observed_at")) for h in (printed, expected)]
    assert abs((observed[0] - observed[1]).total_seconds()) < 120  # when each measured the ages above
    # what compaction would decide now: every date is due on this streaming table
    assert printed.pop("compaction_now").startswith("2026-01-01: run: ")
    assert printed == expected
    assert printed["delete_files"] > 0 and printed["data_files"] == 9
    # the CLI drove the code location: the materialization is in the state dir's instance
    records = get_instance(estate.config).fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("table_health"), asset_partitions=[estate.table]), limit=1).records
    assert records and records[0].asset_materialization.metadata["data_files"].value == printed["data_files"]


def test_compact_dry_run_changes_nothing(capsys, spark, estate):
    location = metadata_location(estate)
    records = len(open_audit(estate.config).records(table=estate.table))
    code, out, err = run_cli(capsys, "--config", estate.path, "compact", estate.table, "--date", "2026-01-01",
                             "--dry-run", "--json")
    assert code == 0, err
    [outcome] = json.loads(out)
    assert outcome["decision"] == "run" and outcome["dry_run"] is True
    assert "dry-run" in outcome["reason"] and outcome["after_snapshot_id"] is None
    assert metadata_location(estate) == location
    audit = open_audit(estate.config).records(table=estate.table)
    assert len(audit) == records + 1 and audit[-1].details["dry_run"] is True

    # a date named twice (--date and a range holding it) is decided once
    code, out, err = run_cli(capsys, "--config", estate.path, "compact", estate.table, "--date", "2026-01-01",
                             "--from", "2026-01-01", "--to", "2026-01-02", "--dry-run", "--json")
    assert code == 0, err
    assert [o["date"] for o in json.loads(out)] == ["2026-01-01", "2026-01-02"]

    # a range of years runs the dates that hold data, not a Dagster run per day
    with_data = sorted(p["date"] for p in json.loads(run_cli(capsys, "--config", estate.path, "health", estate.table,
                                                             "--json")[1])["partitions"] if p["data_files"])
    runs_before = len(dagster_runs(estate))
    code, out, err = run_cli(capsys, "--config", estate.path, "compact", estate.table, "--from", "2020-01-01",
                             "--to", "2026-01-05", "--dry-run", "--json")
    assert code == 0, err
    assert [o["date"] for o in json.loads(out)] == [d for d in with_data if "2020-01-01" <= d <= "2026-01-05"]
    days = (dt.date(2026, 1, 5) - dt.date(2020, 1, 1)).days + 1
    assert f"{days - len(with_data)} of the {days} dates from 2020-01-01 to 2026-01-05 hold no data files" in err
    assert len(dagster_runs(estate)) - runs_before == len(with_data)


def test_compact_dry_run_of_a_due_date_needs_no_spark_and_leaves_a_dead_runs_staging(spark, estate, tmp_path):
    """A dry run decides from metadata alone: it runs with no Java on PATH (Spark could not start), names a
    staging branch a dead run left and removes nothing."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    spark.sql(f"ALTER TABLE {estate.sql} CREATE BRANCH icemaint_stage_deadrun_1")
    try:
        location = metadata_location(estate)
        bin_dir = tmp_path / "bin"  # python and nothing else: no java
        bin_dir.mkdir()
        (bin_dir / "python").symlink_to(sys.executable)
        env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
        env.update(PATH=f"{bin_dir}:/usr/bin/does-not-exist", DAGSTER_HOME=str(tmp_path / "dagster"))
        Path(env["DAGSTER_HOME"]).mkdir()
        proc = subprocess.run([str(Path(sys.executable).parent / "icemaint"), "--config", estate.path, "compact",
                               estate.table, "--date", "2026-01-01", "--dry-run", "--json"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        [outcome] = json.loads(proc.stdout)
        assert outcome["decision"] == "run" and outcome["dry_run"] is True, outcome["reason"]
        assert "would first remove staging left by a dead run: icemaint_stage_deadrun_1" in outcome["reason"]
        assert metadata_location(estate) == location
        assert open_audit(estate.config).records(table=estate.table)[-1].details["spark_app_id"] is None
    finally:
        spark.sql(f"ALTER TABLE {estate.sql} DROP BRANCH icemaint_stage_deadrun_1")


def test_compact_json_reports_the_proof_and_keeps_every_row(capsys, spark, estate):
    date = "2026-01-02"
    ids_before = event_ids(spark, estate)
    assert ids_before == sorted(estate.writer.ledger.expected_ids())
    # its own dry run first (the module's tests may run on two workers, each with its own estate)
    code, out, err = run_cli(capsys, "--config", estate.path, "compact", estate.table, "--date", date, "--dry-run",
                             "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "--config", estate.path, "compact", estate.table, "--date", date, "--json")
    assert code == 0, err
    [outcome] = json.loads(out)
    for key in ("table", "date", "decision", "reason", "before_snapshot_id", "after_snapshot_id", "files_before",
                "files_after", "validation", "published"):
        assert key in outcome, key
    assert (outcome["table"], outcome["date"], outcome["decision"]) == (estate.table, date, "run"), outcome["reason"]
    assert outcome["validation"]["passed"] is True and outcome["published"] is True
    assert outcome["files_before"] == 3 and outcome["files_after"] == 1
    assert outcome["before_snapshot_id"] != outcome["after_snapshot_id"]
    assert CatalogReader(estate.config).load(estate.table).current_snapshot().snapshot_id == outcome["after_snapshot_id"]
    assert event_ids(spark, estate) == ids_before
    assert event_ids(spark, estate, outcome["before_snapshot_id"]) == ids_before
    # the three proofs are check evaluations attached to the (date, table) partition they proved
    from dagster._core.events import DagsterEventType

    checks = [e.dagster_event.event_specific_data for e in get_instance(estate.config).all_logs(
        outcome["run_id"], of_type=DagsterEventType.ASSET_CHECK_EVALUATION)]
    assert sorted((c.check_name, c.passed, c.partition) for c in checks) == [
        (name, True, f"{date}|{estate.table}") for name in ("column_aggregates", "row_count_parity", "sample_comparison")]

    code, out, err = run_cli(capsys, "--config", estate.path, "audit", "--table", estate.table, "--json")
    assert code == 0, err
    records = json.loads(out)
    [run] = [r for r in records if r["run_id"] == outcome["run_id"]]
    assert run["decision"] == "run" and run["operation"] == "compact" and run["date"] == date
    assert run["after_snapshot_id"] == outcome["after_snapshot_id"] and run["validation"]["passed"] is True
    dry_runs = [r["decision"] for r in records if r["details"].get("dry_run")]
    assert dry_runs and set(dry_runs) == {"run"}  # the dry runs are there too


@pytest.mark.parametrize("argv, message", [
    (["compact", "not a table", "--date", "2026-01-03"], "not a table"),
    (["compact", "x.y;DROP", "--date", "2026-01-03"], "x.y;DROP"),
    (["compact", "{table}", "--date", "2026-02-30"], "not a calendar date"),
    (["compact", "{table}", "--date", "03/01/2026"], "not a calendar date"),
    (["compact", "{table}", "--date", "2019-12-31"], "dates_start"),
    (["compact", "{namespace}.missing", "--date", "2026-01-03"], "not found"),
    (["health", "{namespace}.missing"], "not found"),
    (["compact", "{table}", "--from", "2026-01-03", "--to", "2026-01-01"], "before"),
    (["tick", "--max-ticks", "3"], "--max-ticks bounds --until-idle"),
])
def test_bad_input_exits_2_with_a_message_and_mutates_nothing(capsys, estate, argv, message):
    location = metadata_location(estate)
    audit = len(open_audit(estate.config).records())
    runs = get_instance(estate.config).get_runs_count()
    argv = [a.format(table=estate.table, namespace=estate.namespace) for a in argv]
    code, out, err = run_cli(capsys, "--config", estate.path, *argv)
    assert code == 2
    assert err.startswith("error: ") and message.format(namespace=estate.namespace) in err, err
    assert metadata_location(estate) == location
    assert len(open_audit(estate.config).records()) == audit
    assert get_instance(estate.config).get_runs_count() == runs


def test_read_only_table_is_refused_with_a_failing_exit_code(capsys, estate):
    location = metadata_location(estate)
    code, out, err = run_cli(capsys, "--config", estate.read_only, "compact", estate.table, "--date", "2026-01-03",
                             "--json")
    assert code not in (0, 2)
    [outcome] = json.loads(out)
    assert outcome["decision"] == "refuse" and "read-only" in outcome["reason"], outcome
    assert outcome["after_snapshot_id"] is None and outcome["validation"]["passed"] is None
    assert metadata_location(estate) == location
    code, out, err = run_cli(capsys, "--config", estate.read_only, "audit", "--table", estate.table,
                             "--operation", "compact", "--json")
    last = json.loads(out)[0]  # newest first
    assert (last["decision"], last["date"]) == ("refuse", "2026-01-03") and "read-only" in last["reason"]


def test_tick_defers_while_the_writer_is_active_then_compacts_and_validates(capsys, spark, estate):
    """An estate of one streaming table; the writer's last commit is within its 15 s idle window. Then the window
    the hint names is cut to 1 s (no 15 s wait): the next tick, on the same state, compacts."""
    idle, later = 15, 1
    writer = StreamingWriter(spark, "lake", WorkloadSpec(table=f"{estate.namespace}.stream", days=1, rows_per_day=6,
                                                          delete_every=0, seed=9))
    writer.create_table()
    writer.run(3)
    path = write_config(estate.root / "tick.yaml", estate.lake_root, state_dir=str(estate.root / "tick-state"),
                        scope={"include": [writer.name.key]}, tables={writer.name.key: {"writer_idle": f"{idle}s"}})
    config = load_config(path)
    last_commit = dt.datetime.fromisoformat(CatalogReader(config).health(writer.name.key).last_writer_commit_at)

    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["discovered"] == [writer.name.key]
    [deferred] = [d for d in report["decisions"] if d.get("operation") == "compact"]
    assert (dt.datetime.now(dt.timezone.utc) - last_commit).total_seconds() < idle, "the tick came too late"
    assert deferred["decision"] == "defer" and deferred["reason"].startswith("writer active"), deferred
    assert "run_id" not in deferred
    assert any("writer active" in line for line in report["lines"])
    # what lets it go: the window's end and the key that sets it, in the JSON and under the printed line
    assert deferred["kind"] == "writer_active" and f"after {idle}s without writer commits on 2026-01-01" in \
        deferred["hint"] and f"tables.{writer.name.key}.writer_idle" in deferred["hint"], deferred
    assert f"    hint: {deferred['hint']}" in report["lines"]
    assert [r.decision for r in open_audit(config).records(table=writer.name.key, operation="compact")] == ["defer"]
    assert CatalogReader(config).health(writer.name.key).partition("2026-01-01").data_files == 3

    path = write_config(estate.root / "tick.yaml", estate.lake_root, state_dir=str(estate.root / "tick-state"),
                        scope={"include": [writer.name.key]}, tables={writer.name.key: {"writer_idle": f"{later}s"}})
    time.sleep(max(0.0, later + 0.5 - (dt.datetime.now(dt.timezone.utc) - last_commit).total_seconds()))
    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--json")
    assert code == 0, err
    [ran] = [d for d in json.loads(out)["decisions"] if d.get("operation") == "compact"]
    assert ran["decision"] == "run" and ran["success"] is True and ran["result"] == "run", ran
    assert ran["validation"] is True and ran["published"] is True
    assert (ran["files_before"], ran["files_after"]) == (3, 1)
    assert sorted(r[0] for r in spark.sql(f"SELECT event_id FROM {writer.table_sql}").collect()) == \
        sorted(writer.ledger.expected_ids())
    # the partition's own history: the deferral (with its reason) before the compaction
    instance, key = get_instance(config), f"2026-01-01|{writer.name.key}"
    records = dg.AssetRecordsFilter(asset_key=dg.AssetKey("compaction"), asset_partitions=[key])
    [observed] = instance.fetch_observations(records, limit=10).records
    [materialized] = instance.fetch_materializations(records, limit=10).records
    assert observed.asset_observation.metadata["reason"].value.startswith("writer active")
    assert observed.storage_id < materialized.storage_id
    decisions = [r.decision for r in open_audit(config).records(table=writer.name.key, operation="compact")]
    assert decisions == ["defer", "run"]


def test_a_compaction_run_that_finds_the_claim_busy_fails_naming_the_holder(capsys, spark, estate):
    """A run a person launched never ends green without its work: the run fails, the holder is named."""
    from icemaint.safety.claims import table_claim

    location = metadata_location(estate)
    with table_claim(estate.config, estate.table, holder="ingest-7"):
        code, out, err = run_cli(capsys, "--config", estate.path, "compact", estate.table, "--date", "2026-01-03",
                                 "--json")
    assert code == 1, out
    [outcome] = json.loads(out)
    assert outcome["decision"] == "defer" and "held by ingest-7" in outcome["reason"]
    runs = get_instance(estate.config).get_run_records(dg.RunsFilter(run_ids=[outcome["run_id"]]))
    assert runs[0].dagster_run.status == dg.DagsterRunStatus.FAILURE
    assert metadata_location(estate) == location


def test_a_run_that_fails_inside_spark_reaches_the_terminal_as_one_line_naming_the_state(
        capsys, spark, lake_root, tmp_path):
    """A data file the rewrite cannot read (bad disk, a truncated upload): one line on stderr saying
    what failed, the table, the date and that `main` is unchanged; the traces go to the logs."""
    import glob

    from conftest import current_snapshot

    namespace = f"fail_{uuid.uuid4().hex[:8]}"
    sql = f"lake.{namespace}.t"
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP) USING iceberg PARTITIONED BY (days(ts))")
    for i in range(3):  # the test config's min_input_files
        spark.sql(f"INSERT INTO {sql} VALUES ({i}, TIMESTAMP '2026-01-02 0{i}:00:00')")
    head = current_snapshot(spark, sql)
    victim = sorted(glob.glob(str(lake_root / "warehouse" / namespace / "t" / "data" / "*" / "*.parquet")))[0]
    with open(victim, "wb") as f:
        f.write(b"not parquet")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"))
    code, out, err = run_cli(capsys, "--config", str(path), "compact", f"{namespace}.t", "--date", "2026-01-02")
    assert code == 1 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith(f"{namespace}.t 2026-01-02: failed: StagingError: staging the rewrite")
    assert "is not a Parquet file" in line and f"main is unchanged (snapshot {head})" in line
    assert "Traceback" not in err and "Dagster" not in line.split("(run ")[0]
    assert current_snapshot(spark, sql) == head
    # the audit says the same, and the run's event log in the instance keeps the stack trace
    [record] = [r for r in open_audit(load_config(path)).records(table=f"{namespace}.t") if r.operation == "compact"]
    assert record.decision == "failed" and "is not a Parquet file" in record.reason
    run_id = line.split("(run ")[1].split(";")[0]
    failures = [e for e in get_instance(load_config(path)).all_logs(run_id) if e.is_dagster_event
                and e.dagster_event.is_step_failure]
    assert failures and "Traceback" not in failures[0].dagster_event.step_failure_data.error.message
    assert failures[0].dagster_event.step_failure_data.error.stack, "the stack trace is in the run's log"


def test_an_interrupted_run_reads_as_interrupted_not_as_an_empty_error():
    from dagster._utils.error import SerializableErrorInfo

    from icemaint.app.runner import error_line

    interrupted = SerializableErrorInfo("dagster._core.errors.DagsterExecutionInterruptedError\n", [],
                                        "DagsterExecutionInterruptedError", None)
    assert error_line(interrupted).startswith("interrupted (Ctrl-C")
    wrapped = SerializableErrorInfo("Error in step", [], "DagsterExecutionStepExecutionError",
                                    SerializableErrorInfo("ValueError: bad\nmore", [], "ValueError", None))
    assert error_line(wrapped) == "ValueError: bad"


def test_output_cut_short_by_its_reader_ends_without_a_traceback(tmp_path, lake_root):
    """`icemaint audit --json | head`: the reader leaves, the command stops writing with the shell's SIGPIPE
    status (never 0: a mutating command's answer may be what was cut) and no Python traceback."""
    import subprocess
    import sys
    from pathlib import Path

    from icemaint.safety.audit import AuditRecord

    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"))
    audit = open_audit(load_config(path))
    for i in range(600):  # well over a pipe's buffer of JSON
        audit.append(AuditRecord(table="db.events", operation="compact", decision="defer", date="2026-01-01",
                                 reason=f"writer active: record {i} " + "x" * 200))
    proc = subprocess.Popen([str(Path(sys.executable).parent / "icemaint"), "--config", str(path), "audit", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(100).startswith(b"[")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err


def test_a_ctrl_c_outside_any_run_is_one_line_and_the_shells_status(capsys, monkeypatch):
    import icemaint.app.cli as cli

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_config", interrupted)
    assert cli.main(["audit"]) == 130
    assert capsys.readouterr().err == "error: interrupted (Ctrl-C)\n"


def test_once_a_run_answered_an_interrupt_the_command_starts_no_further_run(capsys, tmp_path, lake_root,
                                                                           isolated_dagster_home):
    """A run that recorded itself as interrupted stops the rest of its command (`safety.interrupts`): the runner
    starts no run and a tick does not even evaluate. A tick's lanes, next batches and next ticks went on before."""
    from icemaint.safety import interrupts

    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    assert interrupts.install()
    assert not interrupts.stopping()
    interrupts.acknowledge()  # what the contract does as an interrupted run ends
    assert interrupts.stopping()
    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--until-idle")
    assert (code, out) == (130, "") and err == "error: interrupted (Ctrl-C): no further run was started\n", err
    with pytest.raises(interrupts.Stopped):  # what the runner asks before every run
        interrupts.before_run()
    assert get_instance(load_config(path)).get_runs() == []
    interrupts.reset()
    assert not interrupts.stopping()


def test_a_missing_warehouse_is_an_error_not_an_empty_estate(capsys, tmp_path, isolated_dagster_home):
    """A mistyped or unmounted warehouse listed no table, so the tick removed every known table from the `table`
    partitions and exited 0."""
    path = write_config(tmp_path / "maintenance.yaml", tmp_path, state_dir=str(tmp_path / "state"),
                        catalog={"warehouse": str(tmp_path / "not-mounted")})
    instance = get_instance(load_config(path))
    instance.add_dynamic_partitions("table", ["db.events", "db.orders"])
    code, out, err = run_cli(capsys, "--config", str(path), "tick")
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: catalog 'lake': its warehouse {tmp_path / 'not-mounted'} does not exist"), err
    assert sorted(get_instance(load_config(path)).get_dynamic_partitions("table")) == ["db.events", "db.orders"]


def test_an_empty_warehouse_removes_no_known_table_and_a_fresh_one_is_no_error(capsys, tmp_path,
                                                                              isolated_dagster_home):
    """An empty warehouse directory (a volume not mounted) looked like "every table dropped": the tick removed every
    `table` partition and exited 0. A deployment with no table yet (no warehouse yet) is not an error."""
    (tmp_path / "empty").mkdir()
    path = write_config(tmp_path / "maintenance.yaml", tmp_path, state_dir=str(tmp_path / "state"),
                        catalog={"warehouse": str(tmp_path / "empty")})
    get_instance(load_config(path)).add_dynamic_partitions("table", ["db.events"])
    code, out, err = run_cli(capsys, "--config", str(path), "tick")
    assert code == 1 and "lists no table while 1 are registered" in err and "none was removed" in err, err
    assert get_instance(load_config(path)).get_dynamic_partitions("table") == ["db.events"]

    fresh = write_config(tmp_path / "fresh.yaml", tmp_path, state_dir=str(tmp_path / "fresh-state"),
                         catalog={"warehouse": str(tmp_path / "not-yet")})
    code, out, err = run_cli(capsys, "--config", str(fresh), "tick")
    assert code == 0 and "0 tables evaluated" in out, out + err
    # ... and says why it sees none, in case the path is a typo
    assert f"discovery: catalog 'lake': its warehouse {tmp_path / 'not-yet'} does not exist yet: no table" in out, out


def test_a_dry_run_tick_decides_what_a_tick_would_and_writes_nothing(capsys, spark, tmp_path, lake_root):
    """On a fresh instance a dry run evaluated no table (discovery's additions were not applied, so nothing was
    there to decide) while `plan` listed them due; and its deferrals were written to the audit."""
    from conftest import streaming_table

    name = f"dry_{uuid.uuid4().hex[:8]}"
    streaming_table(spark, "lake", f"{name}.due", batches=3, days=1, rows_per_day=6, delete_every=0)
    streaming_table(spark, "lake", f"{name}.busy", batches=3, days=1, rows_per_day=6, delete_every=0)
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [f"{name}.*"]}, tables={f"{name}.busy": {"writer_idle": "1h"}})
    code, out, err = run_cli(capsys, "--config", str(path), "tick", "--dry-run")
    assert code == 0, err
    assert "2 tables evaluated" in out and "1 table-date due (dry run: nothing launched)" in out, out
    assert f"{name}.busy" in out and "writer active" in out
    config = load_config(path)
    assert get_instance(config).get_dynamic_partitions("table") == []
    assert open_audit(config).records() == []
    assert not (tmp_path / "state" / "tick_cursor.json").exists()


def test_stored_text_is_printed_on_its_own_line_and_notes_are_bounded(capsys, tmp_path, lake_root, estate):
    """An approval's note and an identity are stored text: `explain` prints them escaped, as `audit` does (a note
    could forge an audit line or send terminal escapes), and a note is at most 1,000 characters."""
    name = estate.table  # approving writes to the state dir, its own here: the table is only read
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    forged = "evil\n2026-01-01 00:00:00 db.events compact run FAKE\x1b[31m"
    code, out, err = run_cli(capsys, "--config", str(path), "approve", name, "--date", "2026-01-01",
                             "--note", forged)
    assert code == 0, err
    code, out, err = run_cli(capsys, "--config", str(path), "explain", name, "--date", "2026-01-01")
    assert code == 0, err
    assert "\x1b" not in out and not any(line.startswith("2026-01-01 00:00:00") for line in out.splitlines())
    assert "evil\\n2026-01-01 00:00:00 db.events compact run FAKE\\x1b[31m" in out
    code, out, err = run_cli(capsys, "--config", str(path), "approve", name, "--date", "2026-01-01",
                             "--note", "x" * 1001)
    assert code == 2 and "a note is at most 1000 characters (this one has 1001)" in err


@pytest.mark.parametrize("port", ["-1", "0", "65536", "http"])
def test_a_webserver_port_outside_1_to_65535_is_refused_before_anything_starts(capsys, port):
    code, out, err = run_cli(capsys, "ui", "--port", port)
    assert code == 2 and f"{port!r} is not a TCP port (1-65535)" in err


def test_a_webserver_port_in_use_is_refused_before_dagster_starts_its_daemon(capsys, tmp_path, lake_root,
                                                                             isolated_dagster_home):
    """Dagster's webserver failed on it while `dagster dev` kept its daemon running, maintaining with no UI."""
    import socket

    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run_cli(capsys, "--config", str(path), "ui", "--port", str(port))
    assert code == 2 and f"error: port {port} on 127.0.0.1 cannot be used (Address already in use)" in err, err
    assert "Dagster UI on" not in out


def test_a_java_failure_is_named_by_its_root_cause_not_by_py4j():
    from icemaint.app.runner import java_cause

    raised = ("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
              ": org.apache.spark.SparkException: Could not parse Master URL: 'local[abc]'\n\tat org.apache.x(y:1)")
    assert java_cause(raised) == "SparkException: Could not parse Master URL: 'local[abc]'"
    caused = raised + "\nCaused by: java.lang.NumberFormatException: For input string: \"9\"\n\tat z"
    assert java_cause(caused) == 'NumberFormatException: For input string: "9"'
    assert java_cause("no Java here") is None


def test_a_termination_signal_is_named_as_one_not_as_a_ctrl_c(capsys, monkeypatch):
    import os
    import signal

    import icemaint.app.cli as cli
    from icemaint.safety import interrupts

    def terminated(path):
        os.kill(os.getpid(), signal.SIGTERM)  # the wakeup pipe records it; here a handler raises as Dagster's does
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_config", terminated)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        assert cli.main(["audit"]) == 128 + signal.SIGTERM  # 143, the shell's status for it
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capsys.readouterr().err == "error: terminated (SIGTERM)\n"
    interrupts.reset()


def test_an_interrupt_python_drops_in_a_finalizer_is_not_reported_and_others_still_are(monkeypatch):
    """Python reports an exception raised in a finalizer through sys.unraisablehook: an interrupt there (which the
    run honours at its next step boundary) is not printed as a traceback; any other exception still is."""
    import sys
    import types

    from icemaint.engine.java import handle_swallowed_interrupts

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_type))
    handle_swallowed_interrupts()

    def finalizer():
        pass

    finalizer.__module__ = "py4j.java_gateway"
    for exc in (KeyboardInterrupt(), ValueError("a real error")):
        sys.unraisablehook(types.SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None,
                                                 err_msg=None, object=finalizer))
    assert reported == [ValueError]


def test_a_range_runs_each_period_with_data_once_from_inside_the_range(capsys):
    """Month partitions: a range that starts mid-month runs January as its first day in the range (the month's
    key may be before dates_start, which the run date is not), a named date of the same month does not run it
    twice, and the months without data are counted."""
    from icemaint.app.cli_tables import _range_with_data

    part = lambda key, n: SimpleNamespace(key=key, data_files=n)  # noqa: E731
    health = SimpleNamespace(dated=True, table="db.m", maintained_as="per month", time_transform="month",
                             partitions=[part("2024-01-01", 4), part("2024-02-01", 0), part("2024-03-01", 2),
                                         part("2024-05-01", 1)])
    dates = _range_with_data(health, ["2024-03-15"], dt.date(2024, 1, 10), dt.date(2024, 4, 20))
    assert dates == ["2024-03-15", "2024-01-10"]
    assert "2 of the 4 months from 2024-01-10 to 2024-04-20 hold no data files of db.m" in capsys.readouterr().err
    days = SimpleNamespace(**{**vars(health), "time_transform": "day",
                              "partitions": [part("2024-01-09", 1), part("2024-01-10", 1), part("2024-01-12", 3)]})
    assert _range_with_data(days, [], dt.date(2024, 1, 10), dt.date(2024, 1, 12)) == ["2024-01-10", "2024-01-12"]
    with pytest.raises(ValueError, match="has no dates"):
        _range_with_data(SimpleNamespace(dated=False, table="db.f", maintained_as="per partition"), [],
                         dt.date(2024, 1, 1), dt.date(2024, 1, 2))
