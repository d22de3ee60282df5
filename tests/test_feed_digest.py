"""The proof's old side digested by the read that feeds the writer, and that read proven complete.

A staged bin-pack reads the replaced files once: the same pass writes the new files and digests the old
rows, so the proof reads only the new files. Because the old side then has no read of its own, the feeding
read is checked against the manifests, file by file; when it does not add up (a file missing from it, a
filter that picked other rows) the proof reads the old side itself, and the rewrite fails its proof.
The faults here are injected into that feeding read only.
"""

from __future__ import annotations

import pytest

from icemaint.engine.staging import StagingArea
from icemaint.operations.compaction import CompactionRequest

from staged_faults import main_lineage, staging_refs
from test_staged_publish import DATE, compactor, reader_ids, simulate, sql_of

pytestmark = pytest.mark.slow


def old_side(outcome) -> dict:
    (proof,) = outcome.validation["commits"]
    return proof["old_side"]


def test_a_bin_pack_proof_digests_the_old_side_in_the_staging_read(spark, config, table_name):
    writer = simulate(spark, config, table_name)
    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    assert outcome.decision == "run" and outcome.published, outcome.reason
    side = old_side(outcome)
    assert side["digested_by"] == "the staging read", side
    check = side["feed_check"]
    assert check["complete"] and check["fed_rows"] == check["expected_rows"] > 0
    # the simulator deletes rows: some replaced files carried deletes, their live rows came from metadata
    assert outcome.delete_files_before > 0
    assert sorted(reader_ids(config, table_name)) == sorted(writer.ledger.expected_ids())


@pytest.mark.parametrize("fault", ["a file missing from the read", "a filter that picks other rows"])
def test_an_incomplete_feeding_read_is_caught_and_nothing_is_published(spark, config, table_name, monkeypatch, fault):
    writer = simulate(spark, config, table_name)
    sql = sql_of(config, table_name)
    head = main_lineage(spark, sql)[0]["snapshot_id"]
    if fault == "a file missing from the read":
        monkeypatch.setattr(StagingArea, "_feed", staticmethod(lambda tasks: tasks[:-1]))
    else:
        read_set, calls = StagingArea._read_set, []

        def filtered(self, set_id, split_size=None):
            rows = read_set(self, set_id, split_size)
            calls.append(set_id)
            return rows.where("event_id % 2 = 0") if len(calls) == 1 else rows  # only the feeding read

        monkeypatch.setattr(StagingArea, "_read_set", filtered)

    outcome = compactor(config, spark).run(CompactionRequest(table_name, DATE))
    side = old_side(outcome)
    assert side["digested_by"] == "the proof's own read" and not side["feed_check"]["complete"], side
    assert side["feed_check"]["fed_rows"] < side["feed_check"]["expected_rows"]
    assert outcome.decision == "not_published" and not outcome.published, outcome.reason
    assert main_lineage(spark, sql)[0]["snapshot_id"] == head and not staging_refs(config, table_name)
    assert sorted(reader_ids(config, table_name)) == sorted(writer.ledger.expected_ids())
