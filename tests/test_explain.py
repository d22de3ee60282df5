"""`icemaint explain` and `icemaint plan`: every gate with its numbers, the estate's next tick ranked,
and nothing written anywhere (metadata locations, audit log, claims and the state dir unchanged)."""

from __future__ import annotations

import json
import uuid

import pytest

from conftest import files_under, run_cli, streaming_table, write_config
from icemaint.config import load_config
from icemaint.domain.names import TableName
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims, table_claim


@pytest.fixture(scope="module")
def estate(spark, lake_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("explain")
    namespace = f"explain_{uuid.uuid4().hex[:8]}"
    busy = streaming_table(spark, "lake", f"{namespace}.busy", batches=4, days=2, rows_per_day=6)
    done = streaming_table(spark, "lake", f"{namespace}.done", batches=4, days=1, rows_per_day=6)
    flat = f"{namespace}.flat"
    sql = TableName.parse(flat).sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, kind STRING) USING iceberg PARTITIONED BY (kind)")
    for i in range(3):
        spark.sql(f"INSERT INTO {sql} VALUES ({i}, 'a')")
    path = write_config(root / "m.yaml", lake_root, state_dir=str(root / "state"),
                        scope={"include": [f"{namespace}.*"]},
                        tables={busy.name.key: {"max_rewrite_bytes": "1KiB"}})
    config = load_config(path)
    # one compaction already done, so its audit record is part of the story
    outcome = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config)).run(
        CompactionRequest(done.name.key, "2026-01-01"))
    assert outcome.published, outcome.reason
    return dict(path=str(path), config=config, root=root, busy=busy.name.key, done=done.name.key, flat=flat,
                compacted=outcome)


def test_explain_names_each_gate_with_its_numbers_and_the_audit(capsys, estate):
    code, out, err = run_cli(capsys, "--config", estate["path"], "explain", estate["busy"], "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["policy_source"].startswith("per-table policy")
    [first, second] = result["compaction"]
    assert first["verdict"] == "defer" and first["kind"] == "awaiting_approval"
    gates = {g["name"]: g for g in first["gates"]}
    assert gates["cost"]["status"] == "blocks" and "max_rewrite_bytes 1 KiB" in gates["cost"]["detail"]
    assert gates["thresholds"]["status"] == "pass" and "small files >= 3" in gates["thresholds"]["detail"]
    assert gates["claim"]["detail"] == "free" and gates["writer idle"]["status"] == "pass"
    assert {r["operation"] for r in result["retention"]} == {"expire", "orphans", "manifests", "statistics"}

    text_code, text, _ = run_cli(capsys, "--config", estate["path"], "explain", estate["done"])
    assert text_code == 0 and "audit (latest first):" in text and " compact " in text
    assert estate["compacted"].decision in text.split("audit (latest first):")[1]


def test_explain_says_when_the_policy_does_not_fit_the_table(capsys, estate, tmp_path, lake_root):
    """A sort order naming no column blocks a due date at the policy gate (the decision refuses it before any
    run); a time_column on a table dated by its partition is named as unused instead of silently ignored."""
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(estate["root"] / "state"),
                        scope={"include": [estate["busy"]]},
                        tables={estate["busy"]: {"time_column": "updated_at", "strategy": "sort",
                                                 "sort_order": "nope DESC"}})
    code, out, err = run_cli(capsys, "--config", str(path), "explain", estate["busy"], "--json")
    assert code == 0, err
    [decision, *_] = json.loads(out)["compaction"]
    gates = {g["name"]: g for g in decision["gates"]}
    assert decision["verdict"] == "refuse" and "'nope' is not a column of the table" in decision["reason"]
    assert gates["policy"]["status"] == "blocks" and "'nope' is not a column" in gates["policy"]["detail"]
    assert "time_column 'updated_at' is not used: the table is dated by its partition" in gates["scope"]["detail"]


def test_explain_says_who_holds_the_claim(capsys, estate):
    with table_claim(estate["config"], estate["flat"], holder="nightly-ingest"):
        code, out, err = run_cli(capsys, "--config", estate["path"], "explain", estate["flat"], "--json")
    [decision] = json.loads(out)["compaction"]
    assert decision["scope"] == "(table)" and decision["verdict"] == "defer"
    gates = {g["name"]: g for g in decision["gates"]}
    assert gates["claim"] == {"name": "claim", "status": "blocks", "detail": "held by nightly-ingest"}
    assert "once the holder releases the table's claim" in decision["hint"], decision  # what lets it go


def test_explain_shows_a_run_in_flight_as_the_wait_before_the_claim(capsys, estate):
    import dagster as dg

    from icemaint.app.instance import get_instance
    from maint_assets.definitions import build_definitions

    instance = get_instance(estate["config"])
    job = build_definitions(estate["path"]).resolve_job_def("table_compaction_job")
    run = instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED, tags={"icemaint/table": estate["flat"]})
    try:
        code, out, err = run_cli(capsys, "--config", estate["path"], "explain", estate["flat"], "--json")
        plan_code, plan_out, _ = run_cli(capsys, "--config", estate["path"], "plan", "--json")
    finally:
        instance.report_run_canceled(run)
    assert code == 0 and plan_code == 0, err
    [decision] = json.loads(out)["compaction"]
    assert decision["verdict"] == "defer" and decision["kind"] == "runs_in_flight"
    gates = {g["name"]: g for g in decision["gates"]}
    assert gates["runs in flight"] == {"name": "runs in flight", "status": "blocks",
                                       "detail": "queued or running: table_compaction_job"}
    held = {(h["table"], h["scope"]): h for h in json.loads(plan_out)["held"]}
    assert held[(estate["flat"], "(table)")]["reason"] == "waiting for runs in flight on the table: table_compaction_job"
    assert "once the table's runs in flight end" in held[(estate["flat"], "(table)")]["hint"]


def test_plan_ranks_the_next_tick_and_writes_nothing(capsys, estate):
    reader = CatalogReader(estate["config"])
    locations = {t: reader.metadata_location(t) for t in (estate["busy"], estate["done"], estate["flat"])}
    before = files_under(estate["root"] / "state")
    code, out, err = run_cli(capsys, "--config", estate["path"], "plan", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["tables"] == 3
    assert [r["table"] for r in result["runs"] if r["operation"] == "compact"] == [estate["flat"]]
    held = {(h["table"], h["scope"]) for h in result["held"]}
    assert all(table == estate["busy"] for table, _ in held if _ != "(table)"), held
    assert files_under(estate["root"] / "state") == before, "plan wrote under the state dir"
    assert {t: reader.metadata_location(t) for t in locations} == locations
    code, text, _ = run_cli(capsys, "--config", estate["path"], "plan")
    assert "due at the next tick: 1 compaction and" in text and f"1. {estate['flat']} (table) compact" in text
