"""The real run queue under `dagster dev`'s daemon, shared by the module's tests (one daemon start).

One maintenance run per table (issue 13): a retention backfill of a table (its runs carry only Dagster's
`dagster/partition` tag) and a compaction backfill of two of its dates are launched the way the UI launches
them, with room for several runs at once; their runs never overlap in time, whatever launched them. The
compaction and retention sensors tick once, as the daemon starts (their intervals are a day, the sensors' runs
are tests/test_daemon_e2e.py's): each run is a process with its own Spark, and a sensor ticking every 30-60 s
added one the tests did not look at (an expiry of `events` after its compaction). `events` keeps its last three
snapshots (`retain_last`), the writer's three, so the retention sensor's one tick finds nothing due even when it
comes after the discovery's; the retention backfill's run expires what the compaction's commits left behind when
it runs after it, and otherwise finds nothing to expire: either way it holds the table's slot while it runs.

An agent's requests (issue 45): an MCP client session (the SDK's own client, `icemaint mcp` over stdio) asks for
compaction of two tables only the agent may maintain (`allowed_identities`: the daemon's sensors are refused on
them); each request comes back at once with a run id and status QUEUED, the daemon runs it, and `run_status`
reports what the run's records say: one proven and published, the other's proof failed (the test's code location,
tests/queue_faults.py, changes one value in that table's staged file) with main, rows and refs as they were.
The agent's session starts as soon as the daemon serves the queue, so its two runs share the machine with the
backfills' (as an estate's runs do) instead of waiting for them: the module's wall time is about one test's.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from conftest import write_config
from icemaint.app.instance import ensure_dagster_home
from icemaint.config import load_config
from test_daemon_e2e import dagster_dev
from test_dagster_dev import graphql
from waiting import Patience, Stalled, run_progress

pytestmark = pytest.mark.slow

DATES = ("2026-01-01", "2026-01-02")
# A wait fails after 300 s without progress (waiting.STALL_S), or after CAP_S in all: 6x the fixed 600 s bound that
# a CI machine about 4x slower failed while its runs were still progressing (at 0.3 of a core on a loaded host, a
# run took 6 minutes from launch to start and the daemon test's run over 21 minutes).
CAP_S = 3600
AGENT = "ops-bot"
AGENT_POLICY = {"allowed_identities": [AGENT], "agent_operations": ["compact"]}

LAUNCH_BACKFILL = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""


def launch_backfill(port: int, asset: str, partitions: list[str]) -> str:
    import json
    import urllib.request

    body = {"query": LAUNCH_BACKFILL, "variables": {"params": {
        "assetSelection": [{"path": [asset]}], "partitionNames": partitions, "fromFailure": False}}}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        result = json.loads(response.read())["data"]["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    return result["backfillId"]


@pytest.fixture(scope="module")
def daemon(spark, lake_root, tmp_path_factory, request):
    """Three tables with three small files on each of two dates (`events` for the backfills; `asked` and `faulty` only
    the agent may maintain), and `dagster dev` on their config, serving tests/queue_faults.py as the project's
    code location (a staged rewrite of `faulty` gets one value changed before its proof). When the agent's test
    is to run, its MCP session starts in a thread as soon as the daemon serves the queue (`ask_as_agent`): its
    two runs (other tables; room for four runs at once) run beside the backfills' instead of after them."""
    from dagster import DagsterInstance

    from icemaint.app.queued_runs import heartbeat_age
    from icemaint.app.simulator import StreamingWriter, WorkloadSpec
    from staged_faults import uncompressed

    root = tmp_path_factory.mktemp("queue_e2e")
    namespace = f"queue_{uuid.uuid4().hex[:8]}"
    writers = {}
    for name in ("events", "asked", "faulty"):
        writer = StreamingWriter(spark, "lake", WorkloadSpec(table=f"{namespace}.{name}", days=len(DATES),
                                                             rows_per_day=6, delete_every=0))
        writer.create_table()
        if name == "faulty":  # its staged files too: the corrupted value's bytes appear as they are
            uncompressed(spark, writer.table_sql)
        writer.run(3)
        writers[name] = writer
    faulty = writers["faulty"]
    victim = spark.sql(f"SELECT event_id FROM {faulty.table_sql} WHERE ts >= TIMESTAMP '{DATES[0]} 00:00:00' AND "
                       f"ts < TIMESTAMP '{DATES[1]} 00:00:00' ORDER BY event_id LIMIT 1").first()[0]
    path = write_config(root / "maintenance.yaml", lake_root, state_dir=str(root / "state"),
                        scope={"include": [f"{namespace}.*"]}, max_runs_total=4,
                        defaults={"snapshot_older_than": "0s"}, agents={AGENT: {}},
                        automation={"compaction_interval": "1d", "retention_interval": "1d"},
                        tables={f"{namespace}.asked": AGENT_POLICY, f"{namespace}.faulty": AGENT_POLICY,
                                f"{namespace}.events": {"retain_last": 3}})
    fault = {"ICEMAINT_TEST_CORRUPT_TABLE": f"{namespace}.faulty", "ICEMAINT_TEST_CORRUPT_VALUE": str(victim)}
    with pytest.MonkeyPatch.context() as env, contextlib.ExitStack() as stack:
        env.setenv("DAGSTER_HOME", str(root / "unused"))  # restored after the module: ensure_dagster_home sets it
        home = ensure_dagster_home(load_config(path))
        proc, port, log_path = stack.enter_context(dagster_dev(root / "dev", path, home, module="queue_faults",
                                                               env=fault))
        instance = stack.enter_context(DagsterInstance.from_config(str(home)))
        graphql(port, "{ version }")
        beating = Patience("the run-queue daemon's first heartbeat (it serves the queue from then on)", cap_s=360)
        while heartbeat_age(instance) is None:
            beating.check(log_path.stat().st_size, log_path.read_text()[-2000:])
            time.sleep(1.0)
        ns = SimpleNamespace(path=path, home=home, proc=proc, port=port, log_path=log_path, instance=instance,
                             writers=writers, tables={n: w.name.key for n, w in writers.items()})
        session = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="agent"))  # waited for on the way out
        if any(item.name == AGENT_TEST for item in request.session.items):
            ns.agent = session.submit(ask_as_agent, ns, before(spark, ns))
        yield ns


def requested_all(backfill) -> bool:
    """Whether the backfill has submitted the runs of every partition it targets (or has completed): once those
    runs have finished it launches no more (the backfill daemon marks it completed on its next pass, up to 30 s
    later, which the test need not wait for)."""
    data = backfill.asset_backfill_data
    if backfill.status.value.startswith("COMPLETED"):
        return True
    return data is not None and not (data.target_subset - data.requested_subset).asset_keys


def test_a_retention_backfill_and_a_date_backfill_of_one_table_never_overlap(spark, daemon):
    from dagster import DagsterRunStatus, RunsFilter

    from maint_assets.partitions import TABLE_TAG

    table, writer = daemon.tables["events"], daemon.writers["events"]
    proc, port, log_path, instance = daemon.proc, daemon.port, daemon.log_path, daemon.instance
    finished = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)

    if not instance.has_dynamic_partition("table", table):
        instance.add_dynamic_partitions("table", [table])
    graphql(port, "{ version }")
    retention = launch_backfill(port, "expired_snapshots", [table])
    dates = launch_backfill(port, "compaction", [f"{d}|{table}" for d in DATES])
    patience = Patience("the backfills", cap_s=CAP_S)
    while True:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited:\n{log_path.read_text()[-3000:]}")
        backfills = [instance.get_backfill(b) for b in (retention, dates)]
        records = instance.get_run_records(RunsFilter(tags={TABLE_TAG: table}))
        ours = [r for r in records if r.dagster_run.tags.get("dagster/backfill") in (retention, dates)]
        if all(requested_all(b) for b in backfills) and ours and \
                all(r.dagster_run.status in finished for r in records):
            break
        patience.check((tuple(requested_all(b) for b in backfills),
                        run_progress(instance, [r.dagster_run.run_id for r in records])),
                       [(r.dagster_run.job_name, r.dagster_run.status.value) for r in records])
        time.sleep(2.0)

    states = {b: (instance.get_backfill(b).status.value, instance.get_backfill(b).failure_count)
              for b in (retention, dates)}
    by_backfill = {}
    for r in records:
        by_backfill.setdefault(r.dagster_run.tags.get("dagster/backfill"), []).append(r)
    assert by_backfill.get(retention) and by_backfill.get(dates), (states, {
        k: [(r.dagster_run.job_name, r.dagster_run.status.value) for r in v] for k, v in by_backfill.items()})
    for r in by_backfill[retention] + by_backfill[dates]:
        assert r.dagster_run.status == DagsterRunStatus.SUCCESS, (r.dagster_run.job_name, r.dagster_run.status)
    # every run of the table, however launched, ran alone
    spans = sorted((r.start_time, r.end_time, r.dagster_run.run_id) for r in records if r.start_time)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        assert start >= end, f"runs {first} and {second} of {table} overlapped ({start} < {end})"
    ids = sorted(r[0] for r in spark.sql(f"SELECT event_id FROM {writer.table_sql}").collect())
    assert ids == sorted(writer.ledger.expected_ids())


def discovered(instance, tables: set[str]) -> bool:
    """Whether the daemon's health runs covered `tables` and no run is in flight on them."""
    from dagster import RunsFilter

    from maint_assets.partitions import tables_of
    from maint_assets.retention import in_flight_jobs_by_table

    covered = {t for r in instance.get_run_records(RunsFilter(job_name="health_job"))
               if r.dagster_run.is_finished for t in tables_of(r.dagster_run.tags)}
    return tables <= covered and not tables & set(in_flight_jobs_by_table(instance))


AGENT_TEST = "test_an_agents_requests_wait_in_the_run_queue_and_run_status_reports_what_the_daemon_ran"


def rows(config, table: str) -> list[int]:
    """The table's event ids as pyiceberg's own scan reads them (not the Spark session that compacted)."""
    from icemaint.observe.catalog import CatalogReader

    return sorted(CatalogReader(config).load(table).scan().to_arrow().column("event_id").to_pylist())


def before(spark, daemon) -> SimpleNamespace:
    """`faulty` as the agent's requests find it (the discovery's health run reads it, never writes)."""
    from staged_faults import main_lineage

    faulty = daemon.tables["faulty"]
    return SimpleNamespace(main=main_lineage(spark, daemon.writers["faulty"].table_sql)[0]["snapshot_id"],
                           rows=rows(load_config(daemon.path), faulty))


def ask_as_agent(daemon, faulty_before: SimpleNamespace) -> SimpleNamespace:
    """Over MCP: asks for compaction of `asked` and `faulty` on DATES[0], then polls `run_status` until both runs
    have finished; what the agent was answered, and what it saw on the way."""
    import anyio
    from dagster import DagsterInstance, RunsFilter

    from test_mcp import Seen, results, stdio

    asked, faulty = daemon.tables["asked"], daemon.tables["faulty"]
    day = DATES[0]
    reasons = {t: f"{t}: many small files on {day}" for t in (asked, faulty)}
    # The daemon's discovery sensor registers the tables and runs their health once: a request meanwhile is rightly
    # deferred (a run in flight on the table), so ask once those runs are done.
    with DagsterInstance.from_config(str(daemon.home)) as instance:  # this thread's own
        patience = Patience("the discovery sensor's health runs", cap_s=CAP_S)
        while not discovered(instance, {asked, faulty}):
            health = [r.dagster_run.run_id for r in instance.get_run_records(RunsFilter(job_name="health_job"))]
            patience.check((instance.has_dynamic_partition("table", asked), run_progress(instance, health)))
            time.sleep(1.0)

    async def ask(call):
        answers = {t: results(await call("request_compaction", table=t, dates=[day], reason=reasons[t]))
                   for t in (asked, faulty)}
        for [answer] in answers.values():
            assert answer["decision"] == "requested" and answer["status"] == "QUEUED", answer
        patience, statuses, seen_states, stalled = Patience("the agent's runs", cap_s=CAP_S), {}, set(), ""
        own = DagsterInstance.from_config(str(daemon.home))  # this thread's own
        while len(statuses) < 2:
            assert daemon.proc.poll() is None, daemon.log_path.read_text()[-3000:]
            for table, [answer] in answers.items():
                status = (await call("run_status", run_id=answer["run_id"])).structured_content
                seen_states.add(status.get("status"))
                if status["finished"]:
                    statuses[table] = status
            try:
                patience.check(run_progress(own, [a["run_id"] for [a] in answers.values()]), statuses)
            except Stalled as error:  # reported by the test, not through the MCP session's task group
                stalled = str(error)
                break
            await anyio.sleep(2)
        own.dispose()
        return answers, statuses, seen_states, stalled

    seen, started = Seen(), time.time()
    answers, statuses, seen_states, stalled = stdio(str(daemon.path), AGENT, ask, seen)
    return SimpleNamespace(day=day, reasons=reasons, answers=answers, statuses=statuses, seen_states=seen_states,
                           seen=seen, started=started, faulty_before=faulty_before, stalled=stalled)


def test_an_agents_requests_wait_in_the_run_queue_and_run_status_reports_what_the_daemon_ran(spark, daemon):
    """Over MCP: two requests, each answered at once with a run id and status QUEUED; the daemon runs them.
    `asked`: SUCCESS, proof passed, published, 1 file left on the date, pyiceberg reads the writer's rows.
    `faulty`: FAILURE reported to the agent with the failed proof; main, rows and refs as they were.
    Every audit record of both runs names the agent, trigger `agent` and its reason. (The session ran in a
    thread the module's fixture started, beside the backfills' runs: `ask_as_agent`.)"""
    from icemaint.observe.catalog import CatalogReader
    from icemaint.safety.audit import open_audit
    from staged_faults import main_lineage, staging_refs

    agent: Future = daemon.agent
    got = agent.result(timeout=2 * CAP_S + 120)  # its two waits fail on their own before this
    config = load_config(daemon.path)
    reader = CatalogReader(config)
    asked, faulty = daemon.tables["asked"], daemon.tables["faulty"]
    day, reasons, answers, statuses, seen_states = got.day, got.reasons, got.answers, got.statuses, got.seen_states
    timeline = {t: daemon.instance.get_run_record_by_id(s["run_id"]) for t, s in statuses.items()}
    print("\n[agent queue] since the session's start: " + "; ".join(
        f"{t}: created {r.create_timestamp.timestamp() - got.started:.0f}s, started {r.start_time - got.started:.0f}s, "
        f"ended {r.end_time - got.started:.0f}s" for t, r in timeline.items() if r and r.start_time and r.end_time))
    for [answer] in answers.values():
        assert answer["mode"] == "queued" and "run queue" in answer["mode_reason"], answer
    assert len(statuses) == 2, f"{got.stalled}; seen {seen_states}"
    assert "STARTED" in seen_states or "QUEUED" in seen_states, seen_states

    ok, bad = statuses[asked], statuses[faulty]
    # The daemon's run worker ran it (no process tags of this server), as the agent, trigger agent.
    run = daemon.instance.get_run_by_id(ok["run_id"])
    assert run.tags.get("icemaint/agent") == AGENT and run.tags.get("icemaint/trigger") == "agent", run.tags
    assert run.tags.get("dagster/partition") == f"{day}|{asked}" and ".dagster/icemaint/process_run" not in run.tags
    assert ok["status"] == "SUCCESS" and ok["mode"] == "queued" and ok["agent"] == AGENT, ok
    [done] = ok["outcomes"]
    assert done["decision"] == "run" and done["validation_passed"] and done["published"], done
    assert {p.key: p.data_files for p in reader.health(asked).partitions}[day] == 1
    assert rows(config, asked) == sorted(daemon.writers["asked"].ledger.expected_ids())

    assert bad["status"] == "FAILURE" and bad["finished"], bad
    [failed] = bad["outcomes"]
    assert failed["decision"] == "not_published" and failed["validation_passed"] is False, failed
    assert not failed["published"] and bad["errors"], bad
    assert main_lineage(spark, daemon.writers["faulty"].table_sql)[0]["snapshot_id"] == got.faulty_before.main
    assert rows(config, faulty) == got.faulty_before.rows and staging_refs(config, faulty) == {}

    for table, status in statuses.items():
        records = [r for r in open_audit(config).records(table=table) if r.run_id == status["run_id"]]
        assert {r.decision for r in records} >= {"requested", "run" if table == asked else "not_published"}
        assert all(r.identity == AGENT and r.trigger == "agent" for r in records), records
        assert all((r.details.get("agent_reason")) == reasons[table] for r in records), records
    got.seen.assert_no_secret()
