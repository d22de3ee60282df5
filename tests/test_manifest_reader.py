"""`icemaint.observe.manifest_reader.live_entries` and `live_files` against pyiceberg's own
`fetch_manifest_entry`, on tables of several manifest shapes read one after the other (the reader it keeps
per Avro schema must never serve a file of another schema): format v1 and v2, partitioned two ways and
unpartitioned, a spec that evolved, position deletes, and manifests a rewrite left with deleted entries."""

from __future__ import annotations

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
    table("v2_evolved", "(id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (months(ts)) "
          "TBLPROPERTIES ('format-version'='2')",
          rows, "ALTER TABLE {t} REPLACE PARTITION FIELD months(ts) WITH days(ts)", rows)
    return names


def test_live_entries_equal_pyiceberg_on_every_manifest_shape(spark, config, table_name):
    names = _tables(spark, table_name)
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
