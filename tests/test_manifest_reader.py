"""`icemaint.observe.manifest_reader.live_entries` and `live_files` against pyiceberg's own
`fetch_manifest_entry`, on tables of several manifest shapes read one after the other (the reader it keeps
per Avro schema must never serve a file of another schema): format v1 and v2, partitioned two ways and
unpartitioned, a spec that evolved, position deletes, and manifests a rewrite left with deleted entries.
On the same tables, `icemaint.engine.manifest_list`'s Spark-free read of a manifest list against the
`manifests` metadata table."""

from __future__ import annotations

import uuid

import pytest

from icemaint.domain.names import TableName
from icemaint.engine import manifest_list
from icemaint.observe import manifest_reader
from icemaint.observe.catalog import CatalogReader
from icemaint.observe.manifest_reader import live_entries, live_files


def _tables(spark, base: str) -> list[str]:
    names = []

    def table(suffix: str, ddl: str, *statements: str) -> None:
        name = f"{base}_{suffix}"
        spark.sql(f"CREATE TABLE lake.{name} {ddl}")
        for statement in statements:
            spark.sql(statement.format(t=f"lake.{name}", n=name))
        names.append(name)

    rows = "INSERT INTO {t} VALUES (1, TIMESTAMP '2024-01-01 01:00:00', 'a'), (2, TIMESTAMP '2024-01-02 02:00:00', 'b')"
    table("v2_days", "(id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (days(ts)) "
          "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')",
          rows, "INSERT INTO {t} SELECT /*+ REPARTITION(1) */ * FROM VALUES (3, TIMESTAMP '2024-01-01 03:00:00', 'c'), "
          "(4, TIMESTAMP '2024-01-01 04:00:00', 'd') AS x(id, ts, v)",
          "DELETE FROM {t} WHERE id = 3")  # one of a file's two rows: a position delete
    table("v1_ident", "(id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (v) "
          "TBLPROPERTIES ('format-version'='1')", rows, rows)
    table("v2_none", "(id BIGINT, ts TIMESTAMP, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')",
          rows, rows, "CALL lake.system.rewrite_data_files(table => '{n}', options => map('min-input-files', '2'))",
          rows)
    # Data and delete manifests of two specs: the delete reaches files written before and after the evolution.
    table("v2_evolved", "(id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (months(ts)) "
          "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')",
          rows, "ALTER TABLE {t} REPLACE PARTITION FIELD months(ts) WITH days(ts)", rows,
          "DELETE FROM {t} WHERE id = 1")
    table("empty", "(id BIGINT) USING iceberg TBLPROPERTIES ('format-version'='2')")  # no snapshot
    return names


@pytest.fixture(scope="module")
def shapes(spark) -> list[str]:
    return _tables(spark, f"t.manifest_shapes_{uuid.uuid4().hex[:8]}")


def test_live_entries_equal_pyiceberg_on_every_manifest_shape(spark, config, shapes):
    names = shapes
    reader = CatalogReader(config)
    manifests = []
    for name in names:
        tbl = reader.load(name)
        for snapshot in tbl.metadata.snapshots:
            manifests += [(tbl, m) for m in snapshot.manifests(tbl.io)]
    manifest_reader._readers.clear()
    deleted_entries = 0
    for tbl, manifest in manifests:  # tables interleaved: each snapshot's manifests, table after table
        ours = live_entries(manifest, tbl.io)
        theirs = manifest.fetch_manifest_entry(tbl.io, discard_deleted=True)
        assert ours == theirs, manifest.manifest_path
        assert live_files(manifest.manifest_path, tbl.io) == [
            (e.data_file.file_path, int(e.data_file.content), e.data_file.file_size_in_bytes) for e in theirs]
        deleted_entries += len(manifest.fetch_manifest_entry(tbl.io, discard_deleted=False)) - len(theirs)
    assert deleted_entries > 0  # the rewrite and the delete left entries that must be skipped
    assert {int(m.content) for _, m in manifests} == {0, 1}  # data and delete manifests
    # one parsed schema per distinct manifest schema, not per file
    assert 4 <= len(manifest_reader._readers) < len(manifests)
    assert sum(len(live_entries(m, t.io)) for t, m in manifests) == sum(
        len(m.fetch_manifest_entry(t.io)) for t, m in manifests) > 0


def test_manifest_list_read_equals_the_manifests_metadata_table(spark, shapes):
    seen = set()
    for name in shapes:
        table = TableName.parse(name)
        current = manifest_list.read_current_manifests(spark, "lake", table)
        listed = tuple(manifest_list.ManifestStat(r["path"], r["content"], r["partition_spec_id"], r["length"])
                       for r in spark.sql(f"SELECT path, content, partition_spec_id, length "
                                          f"FROM {table.sql('lake')}.`manifests`").collect())
        assert current.manifests == listed, name
        snapshot = current.table.currentSnapshot()
        assert current.snapshot_id == (None if snapshot is None else snapshot.snapshotId()), name
        if snapshot is not None:  # the Java snapshot's own list, the read for encrypted or list-less snapshots
            assert current.manifests == manifest_list.java_snapshot_manifests(
                spark._jvm, current.table.io(), snapshot), name
        seen |= {(name.rsplit("_", 1)[-1], m.content, m.partition_spec_id) for m in current.manifests}
    assert {("evolved", 0, 0), ("evolved", 0, 1), ("evolved", 1, 0), ("evolved", 1, 1)} <= seen
    assert not manifest_list.read_current_manifests(spark, "lake", TableName.parse(shapes[-1])).manifests
