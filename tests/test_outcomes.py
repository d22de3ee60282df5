"""Typed run outcomes: groups and proofs are dataclasses with enum verdicts inside, and the dicts they become at
the boundary (audit log, --json, Dagster metadata) keep the shape readers of those have always had."""

from __future__ import annotations

import json

from icemaint.engine.validation import CheckOutcome, ValidationResult, failure_summary
from icemaint.operations.outcomes import GroupVerdict, ReadEvidence, RunProof, StagedGroup


def proof(passed: bool = True, before_rows: int = 10, after_rows: int = 10, fed: bool = False) -> ValidationResult:
    check = CheckOutcome("row_count_parity", passed, {"before_row_count": before_rows, "after_row_count": after_rows},
                         {})
    before = {"planning_ms": 0.0, "scan_ms": 0.0, "rows": before_rows, "fed_by_rewrite": True, "rewrite_ms": 80.0} \
        if fed else {"planning_ms": 3.0, "scan_ms": 9.5, "rows": before_rows}
    return ValidationResult(passed, 1, 2, "ts >= DATE '2026-01-01'", (check,), 0.4,
                            reads={"before": before, "after": {"planning_ms": 2.0, "scan_ms": 4.0, "rows": after_rows}})


def test_a_staged_group_is_typed_inside_and_flat_at_the_boundary():
    group = StagedGroup("data", "icemaint_stage_x_1", 1, 2, replaced_files=12, new_files=1, dangling_deletes=0,
                        codec={"codec": "zstd", "codec_source": "the table's write.parquet.compression-codec"})
    assert group.verdict is GroupVerdict.STAGED
    group.verdict, group.published_snapshot_id, group.publish_attempts = GroupVerdict.PUBLISHED, 3, 2
    doc = group.to_dict()
    assert doc["verdict"] == "published" and type(doc["verdict"]) is str
    assert doc["codec"] == "zstd" and doc["publish_attempts"] == 2 and "note" not in doc
    assert json.loads(json.dumps(doc)) == doc


def test_the_run_proof_passes_only_when_every_group_passed_and_keeps_the_audit_shape():
    run = RunProof(scope="ts >= DATE '2026-01-01'")
    assert run.passed is None and run.to_dict() == {"passed": None, "commits": [], "scope": run.scope}
    run.add(proof(fed=True))
    assert run.passed is True
    assert run.read_before == ReadEvidence(rows=10, fed_by_rewrite=True, rewrite_ms=80.0)
    assert run.read_after == ReadEvidence(planning_ms=2.0, scan_ms=4.0, rows=10)
    run.add(proof(passed=False, after_rows=9))
    assert run.passed is False
    doc = run.to_dict()
    assert [c["passed"] for c in doc["commits"]] == [True, False] and "error" not in doc["commits"][0]
    assert doc["commits"][1]["checks"][0]["name"] == "row_count_parity"
    assert failure_summary(run.proofs[1]) == "rows 10 before vs 9 staged"


def test_a_proof_that_could_not_run_failed_and_says_why():
    failed = ValidationResult.could_not_run(1, 2, None, RuntimeError("injected\nsecond line"))
    assert failed.passed is False and failed.checks == ()
    assert failure_summary(failed) == "the proof could not run: RuntimeError: injected"
    assert failed.to_dict()["error"].startswith("the proof could not run")


def test_read_evidence_of_a_side_the_proof_read_itself_has_no_rewrite_fields():
    assert ReadEvidence.of({}) is None
    assert ReadEvidence.of({"planning_ms": 1, "scan_ms": 2, "rows": 3}).to_dict() == \
        {"planning_ms": 1.0, "scan_ms": 2.0, "rows": 3}
