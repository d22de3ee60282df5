"""Compaction at the entrance on the production shape: a landing prefix on the same S3 store as the tables
(SeaweedFS), read on the driver with pyarrow (the cluster has Iceberg's S3FileIO, no hadoop-aws), appended by
`icemaint ingest` on the Spark standalone cluster through the REST catalog while a producer keeps dropping objects.

Witnesses apart from the product: the producer's ledger, a pyiceberg scan and a pyarrow listing of the bucket.
The stack and the deployment fixture are tests/test_cluster.py's (one pytest-xdist worker for both files).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml

from cluster_stack import stack_module
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader
from test_cluster import commands, deployment, objects_under  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.postgres]

BUCKET = "icemaint-landing"  # a plain bucket: the table bucket holds only tables' objects


class Producer:
    """Drops small Parquet objects (5 rows each, ids counting up) under `prefix`, each written under a hidden name
    and then renamed, as a producer that must not be read half-written does. Started, it waits until the run has
    journaled its batch (its listing is done), then drops `late` more, one every 0.2 s: those must wait for the next
    batch. `ids` are the ids dropped (each once)."""

    def __init__(self, fs, prefix: str, journal: Path, late: int = 10):
        self.fs, self.prefix, self.journal, self.late = fs, prefix, journal, late
        self.ids: list[int] = []
        self.next_id = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def drop(self, files: int = 1) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        for _ in range(files):
            ids = list(range(self.next_id, self.next_id + 5))
            table = pa.table({"id": pa.array(ids, pa.int64()), "device": [f"d{i % 3}" for i in ids],
                              "value": [i / 10 for i in ids]})
            name = f"{self.prefix}/r{self.next_id:08d}.parquet"
            hidden = f"{self.prefix}/.r{self.next_id:08d}.parquet.tmp"
            with self.fs.open_output_stream(hidden) as out:
                pq.write_table(table, out)
            self.fs.move(hidden, name)
            self.next_id += 5
            self.ids += ids

    def _loop(self) -> None:
        while not any(self.journal.glob("*.json")):
            if self._stop.wait(0.1):
                return
        for _ in range(self.late):
            self.drop()
            if self._stop.wait(0.2):
                return

    def start(self) -> "Producer":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        assert self._thread is not None
        self._thread.join(timeout=120)  # the late files are dropped whole, even when the run ended first
        self._stop.set()


def main_lineage_is_forward(table) -> bool:
    """Every entry of `main`'s snapshot log is a child of the one before it: nothing moved `main` back."""
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    log = [entry.snapshot_id for entry in table.metadata.snapshot_log]
    return all(by_id[b].parent_snapshot_id == a for a, b in zip(log, log[1:]))


def test_an_s3_landing_prefix_lands_every_row_once_on_the_cluster_while_a_producer_drops(
        production_stack, deployment, commands):  # noqa: F811
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    config_path, env, namespace = deployment
    table_key = f"{namespace}.readings"
    location = f"s3://{BUCKET}/{namespace}/in"
    doc = yaml.safe_load(config_path.read_text())
    doc["landing"] = {"readings": {"location": location, "table": table_key, "min_files": 5, "max_age": "1h"}}
    config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    config = load_config(config_path)
    catalog = CatalogReader(config)._pyiceberg_catalog()
    catalog.create_namespace(namespace)
    table = catalog.create_table(table_key, Schema(NestedField(1, "id", LongType(), required=False),
                                                   NestedField(2, "device", StringType(), required=False),
                                                   NestedField(3, "value", DoubleType(), required=False)))
    fs = stack_module().s3_filesystem(config)
    fs.create_dir(BUCKET)
    prefix = location.split("://", 1)[1]
    producer = Producer(fs, prefix, config.state_path / "ingest-journal" / "readings")
    producer.drop(12)
    with fs.open_output_stream(f"{prefix}/broken.parquet") as out:  # not Parquet: set aside with its reason
        out.write(b"PAR1 this is not a parquet file")
    bad_schema = pa.table({"id": pa.array([1], pa.int64()), "colour": ["red"]})  # a column the table lacks
    with fs.open_output_stream(f"{prefix}/colour.parquet") as out:
        pq.write_table(bad_schema, out)

    producer.start()
    try:
        first = commands("ingest", "readings", "--json", timeout=900)
    finally:
        producer.stop()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    outcome = json.loads(first.stdout)
    assert outcome["decision"] == "run" and outcome["read_by"] == "driver" and outcome["files"] == 12, outcome
    reasons = {r["name"]: r["reason"] for r in outcome["rejected"]}
    assert set(reasons) == {"broken.parquet", "colour.parquet"}, reasons
    assert "cannot be read as parquet" in reasons["broken.parquet"] and "colour" in reasons["colour.parquet"]
    # What landed after the run's listing waited for the next batch; a forced run takes it (below min_files).
    assert len(producer.ids) == 110
    more = commands("ingest", "readings", "--force", "--json", timeout=900)
    assert more.returncode == 0, more.stdout[-2000:] + more.stderr[-3000:]
    assert json.loads(more.stdout)["files"] == 10

    table.refresh()
    ids = sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    assert ids == sorted(producer.ids)  # every landed row, once
    assert main_lineage_is_forward(table)
    on_main = {entry.snapshot_id for entry in table.metadata.snapshot_log}
    batches = [s for s in table.snapshots()
               if s.snapshot_id in on_main and (s.summary or {}).get("icemaint.ingest.batch-id")]
    assert len(batches) == 2 and all(s.summary.operation.value == "append" for s in batches)
    left = objects_under(fs, location)
    processed = {p for p in left if "/_processed/" in p}
    assert len(processed) == len(producer.ids) // 5
    assert {p.rsplit("/", 1)[1] for p in left if "/_rejected/" in p} == {
        "broken.parquet", "broken.parquet.reason.txt", "colour.parquet", "colour.parquet.reason.txt"}
    with fs.open_input_stream(f"{prefix}/_rejected/colour.parquet.reason.txt") as handle:
        assert "colour" in handle.read().decode()
    assert not [p for p in left if "/_" not in p.split(prefix, 1)[1]], "a landed object was left behind"
