"""Position-delete maintenance: a date whose data files are fine but which carries many small position-delete
files (what writers leave that write one delete file per commit and partition: Spark before Iceberg 1.8, or
any engine with `write.delete.granularity=partition`) gets its delete files merged, staged and proven like a
data rewrite, the data files left as they are.

Judged independently of the code under test: rows by pyiceberg against the writers' ledger, files by
Spark's metadata tables.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from icemaint.domain.verdicts import ReasonKind
from icemaint.domain.names import TableName
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest
from icemaint.safety.audit import open_audit

from staged_faults import corrupt_long, main_lineage, staging_refs
from test_staged_publish import DATE, OTHER_DATE, ClaimIgnoringWriter, compactor, run_compaction

pytestmark = pytest.mark.slow

DELETES = 12  # one position-delete file per DELETE statement: above min_position_delete_files (10)


def deletes_table(spark, sql: str) -> dict[int, str]:
    """Two dates of 2 data files each (1,000 rows a file, so the data files are not due), then 12 single-row
    DELETEs on DATE and 3 on OTHER_DATE, each leaving one small position-delete file; returns the ledger."""
    spark.sql(f"CREATE TABLE {sql} (event_id BIGINT, device_id INT, ts TIMESTAMP, reading DOUBLE, status STRING) "
              "USING iceberg PARTITIONED BY (days(ts)) TBLPROPERTIES ('format-version'='2', "
              "'write.delete.mode'='merge-on-read', 'write.delete.granularity'='partition', "
              "'write.parquet.compression-codec'='uncompressed', "
              "'write.delete.parquet.compression-codec'='uncompressed')")
    ledger = {}
    for day, first in ((DATE, 0), (OTHER_DATE, 10_000)):
        for part in range(2):
            start = first + part * 1000
            spark.sql(f"INSERT INTO {sql} SELECT id, CAST(id % 7 AS INT), TIMESTAMP '{day} 00:00:00' + "
                      f"make_interval(0, 0, 0, 0, 0, 0, id - {start}), id * 0.5, 'ok' "
                      f"FROM range({start}, {start + 1000}) ORDER BY id")
            ledger.update({i: "ok" for i in range(start, start + 1000)})
    for k in range(DELETES):
        victim = (k * 137) % 2000
        spark.sql(f"DELETE FROM {sql} WHERE event_id = {victim}")
        del ledger[victim]
    for k in range(3):
        spark.sql(f"DELETE FROM {sql} WHERE event_id = {10_000 + k * 11}")
        del ledger[10_000 + k * 11]
    return ledger


def table_config(lake_root, tmp_path, table: str):
    """The data files stay below min_input_files, whatever the writer adds during the run: only the
    position deletes are due."""
    from conftest import make_config

    return make_config(lake_root, state_dir=str(tmp_path / "state"), tables={table: {"min_input_files": 50}})


def pyiceberg_rows(config, table: str) -> dict[int, str]:
    arrow = CatalogReader(config).load(table).scan().to_arrow()
    ids = arrow.column("event_id").to_pylist()
    assert not [i for i, n in Counter(ids).items() if n > 1], "duplicated rows"
    return dict(zip(ids, arrow.column("status").to_pylist()))


def files_on(spark, sql: str, day: str, content: int) -> set[str]:
    return {r[0] for r in spark.sql(f"SELECT file_path FROM {sql}.files WHERE content = {content} "
                                    f"AND partition.ts_day = DATE '{day}'").collect()}


def test_many_small_position_delete_files_are_merged_proven_and_published_under_a_writer(spark, lake_root, tmp_path):
    table = f"t.position_deletes_{uuid.uuid4().hex[:8]}"
    config = table_config(lake_root, tmp_path, table)
    sql = TableName.parse(table).sql(config.catalog.name)
    ledger = deletes_table(spark, sql)
    data_before = files_on(spark, sql, DATE, 0)
    old_deletes = files_on(spark, sql, DATE, 1)
    assert len(old_deletes) == DELETES and len(data_before) == 2

    day = CatalogReader(config).health(table).partition(DATE)
    assert day.position_delete_files == DELETES and day.delete_bytes > 0

    with ClaimIgnoringWriter(spark, sql, first_id=500_000) as writer:
        def after_stage(staged):
            # A writer deletes a row of a data file the staged deletes apply to, between S and the publish.
            spark.sql(f"DELETE FROM {sql} WHERE event_id = 1999")
            ledger.pop(1999, None)
            writer.wait_for_more(1)

        outcome = run_compaction(config, spark, CompactionRequest(table, DATE), after_stage=after_stage)
        writer.wait_for_more(1)
    assert not writer.failed, writer.failed[:3]
    assert outcome.decision == "run" and outcome.published, outcome.reason
    assert outcome.decision_detail["kind"] == str(ReasonKind.POSITION_DELETES_DUE)
    assert outcome.reason.startswith(f"{DELETES} position-delete files >= min_position_delete_files 10")
    assert outcome.rewritten_delete_files == DELETES and outcome.added_delete_files == 1
    assert outcome.rewritten_files == 0 and outcome.validation.passed is True
    assert [s["target"] for s in (g.to_dict() for g in outcome.staged)] == ["position_deletes"]

    # Rows: the ledger's and the writer's, the writer's own delete during the run kept.
    expected = {**ledger, **{i: "writer" for i in writer.ledger}}
    assert pyiceberg_rows(config, table) == expected

    # Files: the data files stayed; the 12 delete files became one, the writer's delete file stayed beside it.
    assert data_before <= files_on(spark, sql, DATE, 0)
    after_deletes = files_on(spark, sql, DATE, 1)
    assert not after_deletes & old_deletes and len(after_deletes) == 2
    assert files_on(spark, sql, OTHER_DATE, 1) and len(files_on(spark, sql, OTHER_DATE, 1)) == 3  # not touched

    # main only moved forward: one replace of ours, on top of every writer commit.
    history = main_lineage(spark, sql)
    ours = [s for s in history if s["operation"] == "replace"]
    assert [s["snapshot_id"] for s in ours] == outcome.committed_snapshot_ids
    assert ours[0]["summary"].get("removed-delete-files") == str(DELETES)
    assert outcome.before_snapshot_id in [s["snapshot_id"] for s in history]
    assert not staging_refs(config, table)

    record = open_audit(config).records(table=table, operation="compact")[-1]
    assert record.decision == "run" and record.details["rewritten_delete_files"] == DELETES
    assert record.partition_rationale["trigger"] == "position_deletes"

    # Due no more: the date is below every threshold now.
    again = compactor(config, spark).run(CompactionRequest(table, DATE))
    assert again.decision == "noop" and "position-delete files < min_position_delete_files" in again.reason


def test_a_staged_delete_file_that_deletes_another_row_fails_its_proof_and_main_is_unchanged(spark, lake_root,
                                                                                              tmp_path):
    import pyarrow.parquet as pq

    from staged_faults import local_path

    table = f"t.position_deletes_bad_{uuid.uuid4().hex[:8]}"
    config = table_config(lake_root, tmp_path, table)
    sql = TableName.parse(table).sql(config.catalog.name)
    ledger = deletes_table(spark, sql)
    before = CatalogReader(config).load(table).metadata_location
    corrupted = {}

    def after_stage(staged):
        (path,) = staged.new_files
        positions = pq.read_table(local_path(path), columns=["pos"]).column("pos").to_pylist()
        victim = max(positions)
        corrupted["count"] = corrupt_long([path], victim, victim - 1)  # deletes its neighbour instead

    outcome = compactor(config, spark, after_stage=after_stage).run(CompactionRequest(table, DATE))
    assert corrupted["count"] >= 1
    assert outcome.decision == "not_published" and not outcome.published, outcome.reason
    assert "proof failed" in outcome.reason and "main is unchanged" in outcome.reason
    assert CatalogReader(config).load(table).metadata_location != before  # the staging branch came and went
    assert not [s for s in main_lineage(spark, sql) if s["operation"] == "replace"]
    assert not staging_refs(config, table)
    assert pyiceberg_rows(config, table) == ledger
    assert len(files_on(spark, sql, DATE, 1)) == DELETES
