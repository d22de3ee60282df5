"""A table's manifests and file entries are read once per metadata file (`observe.catalog.MetadataMemo`).

A metadata file never changes, so what its manifests say is remembered by its location: a sensor tick
re-reading the tables its run budget deferred, or a run re-reading what its decision read, reads no manifest
again; a commit (a new metadata file) is read in full.
"""

from __future__ import annotations

import uuid

from icemaint.observe import catalog as catalog_module
from icemaint.observe.catalog import CatalogReader, MetadataMemo

from conftest import make_config


def test_the_memo_keeps_the_most_recently_used_within_its_bound():
    memo = MetadataMemo(max_entries=10)
    memo.put("a", "A", 4)
    memo.put("b", "B", 4)
    assert memo.get("a") == "A"       # a is now the most recent
    memo.put("c", "C", 4)             # 12 > 10: the least recent (b) goes
    assert (memo.get("a"), memo.get("b"), memo.get("c")) == ("A", None, "C")
    memo.put("huge", "H", 11)         # larger than the bound: never kept, nothing evicted for it
    assert memo.get("huge") is None and memo.get("a") == "A"
    memo.put("a", "other", 1)         # a location's value never changes: the first stays
    assert memo.get("a") == "A"


def test_a_metadata_file_is_read_once_and_a_commit_is_read_in_full(spark, lake_root, monkeypatch):
    config = make_config(lake_root, defaults={"min_input_files": 2})
    table = f"memo_{uuid.uuid4().hex[:8]}.events"
    spark.sql(f"CREATE TABLE lake.{table} (id BIGINT, ts TIMESTAMP) USING iceberg PARTITIONED BY (days(ts))")
    for i in range(3):
        spark.sql(f"INSERT INTO lake.{table} VALUES ({i}, TIMESTAMP '2026-02-01 0{i}:00:00')")
    reads = []
    original = catalog_module.read_file_entries

    def counted(*args, **kwargs):
        reads.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(catalog_module, "read_file_entries", counted)
    reader = CatalogReader(config)
    first = reader.tick_health(table)
    again = reader.tick_health(table)
    assert len(reads) == 1 and again.partitions == first.partitions  # ages are measured anew: they follow now
    assert reader.health(table).partitions == first.partitions and len(reads) == 1  # the run's read, too
    assert [p.data_files for p in first.partitions] == [3]

    spark.sql(f"INSERT INTO lake.{table} VALUES (9, TIMESTAMP '2026-02-01 09:00:00')")
    after = reader.tick_health(table)
    assert len(reads) == 2 and after.metadata_location != first.metadata_location
    assert [p.data_files for p in after.partitions] == [4]
    # an independent reader (a fresh one, nothing remembered) sees the same
    assert CatalogReader(config).tick_health(table).partitions == after.partitions
