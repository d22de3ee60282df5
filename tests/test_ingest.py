"""Compaction at the entrance on a real Spark session and a real Iceberg table: landed small files become a few
large files, every row exactly once (read back by pyiceberg, an independent reader), through a retry after the
commit, with bad files set aside and late files left for the next batch."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import make_config
from icemaint.domain.landing import BATCH_ID_KEY
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.ingest import IngestRequest, Ingestor
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims

TABLE = "t.landing_events"
SCHEMA = pa.schema([("id", pa.int64()), ("device", pa.string()), ("value", pa.float64())])


def drop(folder: Path, first: int, files: int, rows: int = 5) -> list[int]:
    """Drops `files` small parquet files of `rows` rows each, ids from `first`; the ids dropped."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = []
    for n in range(files):
        start = first + n * rows
        batch = list(range(start, start + rows))
        pq.write_table(pa.table({"id": batch, "device": [f"d{i % 3}" for i in batch],
                                 "value": [i / 10 for i in batch]}, schema=SCHEMA),
                       folder / f"f{start:08d}.parquet")
        ids += batch
    return ids


@pytest.fixture(scope="module")
def estate(spark, lake_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("landing")
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.t")
    spark.sql(f"CREATE TABLE lake.{TABLE} (id bigint, device string, value double) USING iceberg")
    config = make_config(lake_root, state_dir=str(root / "state"), landing={
        "events": {"location": str(root / "in"), "table": TABLE, "min_files": 10, "max_files": 40,
                   "max_age": "1h"},
        "json": {"location": str(root / "json"), "table": TABLE, "format": "jsonl", "min_files": 1,
                 "schema": {"id": "long", "device": "string", "value": "double"}}})
    return config, root


def ingestor(config, spark, **kwargs) -> Ingestor:
    return Ingestor(config, spark, CatalogReader(config), open_claims(config), open_audit(config), **kwargs)


def table_ids(config) -> list[int]:
    table = CatalogReader(config).load(TABLE)
    return sorted(table.scan().to_arrow()["id"].to_pylist())


def test_a_batch_lands_as_few_files_every_row_once_late_files_wait(spark, estate):
    config, root = estate
    landed = drop(root / "in", 0, 30)
    late: list[int] = []

    def hook(step):  # a producer keeps dropping while the run works: those wait for the next batch
        if step == "listed" and not late:
            late.extend(drop(root / "in", 10_000, 3))

    before = table_ids(config)
    out = ingestor(config, spark, hook=hook).run(IngestRequest("events"))
    assert out.decision == "run", out.reason
    assert out.files == 30 and out.rows == 150 and out.new_files == 1
    assert sorted(table_ids(config)) == sorted(before + landed)
    assert sorted(p.name for p in (root / "in").glob("*.parquet")) == [f"f{i:08d}.parquet" for i in (10_000, 10_005, 10_010)]
    assert len(list((root / "in" / "_processed").glob("*.parquet"))) == 30
    snap = CatalogReader(config).load(TABLE).current_snapshot()
    assert snap.summary.additional_properties[BATCH_ID_KEY] == out.batch_id
    assert out.validation["passed"] is True
    record = open_audit(config).records(table=TABLE, operation="ingest")[-1]
    assert record.decision == "run" and record.details["batch_id"] == out.batch_id

    # below every threshold now (3 files, min_files 10, max_age 1h): nothing happens; forced, they go in
    assert ingestor(config, spark).run(IngestRequest("events")).decision == "noop"
    assert ingestor(config, spark).run(IngestRequest("events", force=True)).decision == "run"
    assert sorted(table_ids(config)) == sorted(before + landed + late)


def test_a_retry_after_the_commit_before_the_bookkeeping_appends_nothing_twice(spark, estate):
    config, root = estate
    landed = drop(root / "in", 20_000, 12)
    before = table_ids(config)

    class Crash(Exception):
        pass

    def crash(step):
        if step == "after_commit":
            raise Crash("died between the commit and the bookkeeping")

    with pytest.raises(Crash):
        ingestor(config, spark, hook=crash).run(IngestRequest("events"))
    assert sorted(table_ids(config)) == sorted(before + landed)
    assert len(list((root / "in").glob("*.parquet"))) == 12  # still landed: not moved
    drop(root / "in", 30_000, 1)  # a newcomer: the retry's listing differs, the journal still knows the batch
    out = ingestor(config, spark).run(IngestRequest("events", force=True))
    assert [r["committed"] for r in out.recovered] == [True] and out.recovered[0]["moved"] == 12
    assert out.decision == "run" and out.files == 1
    assert sorted(table_ids(config)) == sorted(before + landed + list(range(30_000, 30_005)))


def test_a_bad_file_is_set_aside_with_its_reason_and_the_rest_goes_on(spark, estate):
    config, root = estate
    folder = root / "json"
    folder.mkdir(exist_ok=True)
    (folder / "good.jsonl").write_text("\n".join(json.dumps({"id": 50_000 + i, "device": "j", "value": 1.5})
                                                 for i in range(4)) + "\n")
    (folder / "bad.jsonl").write_text('{"id": "not a number", "device": "j", "value": 1}\n')
    (folder / "extra.jsonl").write_text('{"id": 1, "device": "j", "value": 1, "colour": "red"}\n')
    before = table_ids(config)
    out = ingestor(config, spark).run(IngestRequest("json"))
    assert out.decision == "run", out.reason
    reasons = {r["name"]: r["reason"] for r in out.rejected}
    assert set(reasons) == {"bad.jsonl", "extra.jsonl"}
    assert "cannot be read as jsonl" in reasons["bad.jsonl"]
    assert (folder / "_rejected" / "bad.jsonl").exists()
    assert "cannot be read" in (folder / "_rejected" / "bad.jsonl.reason.txt").read_text()
    assert sorted(table_ids(config)) == sorted(before + [50_000 + i for i in range(4)])
