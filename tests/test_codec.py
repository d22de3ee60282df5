"""The compression codec a rewrite writes (`icemaint.engine.codec`): the table's own, the session's, else zstd
where Iceberg's Java writer would fall back to gzip for a table that names no codec (pyiceberg's tables, and
Trino's, Flink's or Java's from before Iceberg 1.4).

The codec of the files written is read from their Parquet footers with pyarrow, not from our own report; the
rows by pyiceberg and by a whole-table digest.
"""

from __future__ import annotations

import uuid

import pyarrow.parquet as pq
import pytest

from icemaint.domain.names import TableName
from icemaint.engine.codec import (
    DEFAULT_CODEC, DELETE_FORMAT, DELETE_PARQUET_CODEC, FORMAT, PARQUET_CODEC, WRITE_OPTION, write_codec,
)
from icemaint.engine.validation import full_row_hash
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest

from conftest import current_snapshot, make_config
from test_position_deletes import deletes_table, files_on, pyiceberg_rows, table_config
from test_staged_publish import DATE, run_compaction


# -- the rule --------------------------------------------------------------------------------------

def test_a_table_that_names_no_codec_gets_zstd_through_a_write_option():
    chosen = write_codec({}, None)
    assert (chosen.codec, chosen.options) == (DEFAULT_CODEC, {WRITE_OPTION: "zstd"})
    assert "sets no write.parquet.compression-codec" in chosen.source
    assert write_codec({PARQUET_CODEC: None, FORMAT: None}, None).options == {WRITE_OPTION: "zstd"}
    assert write_codec({FORMAT: "PARQUET"}, "").codec == "zstd"  # an empty session setting is no setting


def test_the_tables_codec_and_the_sessions_win_and_add_no_option():
    table = write_codec({PARQUET_CODEC: "gzip"}, None)
    assert (table.codec, table.options, table.source) == ("gzip", {}, f"the table's {PARQUET_CODEC}")
    session = write_codec({PARQUET_CODEC: "gzip"}, "snappy")
    assert (session.codec, session.options) == ("snappy", {})  # Iceberg's order: the session before the table
    assert "spark.sql.iceberg.compression-codec" in session.source


def test_delete_files_follow_their_own_property_then_the_datas():
    assert write_codec({DELETE_PARQUET_CODEC: "snappy", PARQUET_CODEC: "gzip"}, None, deletes=True).codec == "snappy"
    assert write_codec({PARQUET_CODEC: "gzip"}, None, deletes=True).codec == "gzip"
    assert write_codec({}, None, deletes=True).options == {WRITE_OPTION: "zstd"}
    assert write_codec({DELETE_PARQUET_CODEC: "snappy"}, "lz4", deletes=True).codec == "lz4"


def test_orc_and_avro_files_keep_their_formats_default():
    for props, deletes in (({FORMAT: "orc"}, False), ({FORMAT: "avro"}, False), ({DELETE_FORMAT: "avro"}, True),
                           ({FORMAT: "orc"}, True)):
        chosen = write_codec(props, None, deletes=deletes)
        assert chosen.codec is None and chosen.options == {}, (props, deletes)
    assert write_codec({DELETE_FORMAT: "avro"}, None).codec == "zstd"  # the data files are still Parquet


# -- on real tables ----------------------------------------------------------------------------------

CATALOG = "lake"  # the test estate's catalog (conftest)


def spark_properties(spark, sql: str) -> dict[str, str]:
    return {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {sql}").collect()}


def footer_codecs(paths) -> set[str]:
    return {pq.ParquetFile(p.removeprefix("file:")).metadata.row_group(0).column(c).compression
            for p in paths for c in range(pq.ParquetFile(p.removeprefix("file:")).metadata.num_columns)}


def small_files_table(spark, sql: str, props: str) -> None:
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (days(ts))"
              f" TBLPROPERTIES ('format-version'='2'{props})")
    for k in range(4):
        spark.sql(f"INSERT INTO {sql} SELECT id, TIMESTAMP '{DATE} 01:00:00' + make_interval(0, 0, 0, 0, 0, 0, id), "
                  f"concat('v', id) FROM range({k * 100}, {(k + 1) * 100})")


def compact_and_read(spark, lake_root, tmp_path, table: str):
    config = make_config(lake_root, state_dir=str(tmp_path / "state"))
    sql = TableName.parse(table).sql(config.catalog.name)
    before = full_row_hash(spark, sql, current_snapshot(spark, sql))
    metadata = CatalogReader(config).load(table).metadata_location
    outcome = run_compaction(config, spark, CompactionRequest(table, DATE))
    assert outcome.decision == "run" and outcome.published, outcome.reason
    assert CatalogReader(config).load(table).metadata_location != metadata
    assert full_row_hash(spark, sql, current_snapshot(spark, sql)) == before
    arrow = CatalogReader(config).load(table).scan().to_arrow()
    assert sorted(arrow.column("id").to_pylist()) == list(range(400))
    return outcome, files_on(spark, sql, DATE, 0), sql


@pytest.mark.slow
def test_a_table_without_a_codec_property_is_compacted_into_zstd_not_javas_gzip(spark, lake_root, tmp_path):
    table = f"t.codec_none_{uuid.uuid4().hex[:8]}"
    sql = TableName.parse(table).sql(CATALOG)
    small_files_table(spark, sql, "")
    # What pyiceberg (and Java before Iceberg 1.4) leave: no codec property; Java's writer would use gzip.
    spark.sql(f"ALTER TABLE {sql} UNSET TBLPROPERTIES ('{PARQUET_CODEC}')")
    assert PARQUET_CODEC not in spark_properties(spark, sql)

    outcome, files, sql = compact_and_read(spark, lake_root, tmp_path, table)

    assert len(files) == 1 and footer_codecs(files) == {"ZSTD"}
    assert [(s["codec"], "sets no" in s["codec_source"]) for s in staged_dicts(outcome)] == [("zstd", True)]
    # a write option for our files only: the table's own settings untouched
    assert PARQUET_CODEC not in spark_properties(spark, sql)


@pytest.mark.slow
def test_a_tables_own_codec_is_kept(spark, lake_root, tmp_path):
    table = f"t.codec_snappy_{uuid.uuid4().hex[:8]}"
    small_files_table(spark, TableName.parse(table).sql(CATALOG), f", '{PARQUET_CODEC}'='snappy'")

    outcome, files, _ = compact_and_read(spark, lake_root, tmp_path, table)

    assert len(files) == 1 and footer_codecs(files) == {"SNAPPY"}
    assert [(s["codec"], s["codec_source"]) for s in staged_dicts(outcome)] == [("snappy", f"the table's {PARQUET_CODEC}")]


@pytest.mark.slow
def test_merged_position_deletes_of_a_table_without_codec_properties_are_zstd(spark, lake_root, tmp_path):
    table = f"t.codec_deletes_{uuid.uuid4().hex[:8]}"
    config = table_config(lake_root, tmp_path, table)
    sql = TableName.parse(table).sql(config.catalog.name)
    ledger = deletes_table(spark, sql)
    spark.sql(f"ALTER TABLE {sql} UNSET TBLPROPERTIES ('{PARQUET_CODEC}', '{DELETE_PARQUET_CODEC}')")
    old_deletes = files_on(spark, sql, DATE, 1)

    outcome = run_compaction(config, spark, CompactionRequest(table, DATE))

    assert outcome.decision == "run" and outcome.published, outcome.reason
    assert [s["target"] for s in staged_dicts(outcome)] == ["position_deletes"] and staged_dicts(outcome)[0]["codec"] == "zstd"
    new_deletes = files_on(spark, sql, DATE, 1) - old_deletes
    assert len(new_deletes) == 1 and footer_codecs(new_deletes) == {"ZSTD"}
    assert pyiceberg_rows(config, table) == ledger


def staged_dicts(outcome) -> list[dict]:
    """Each staged group as the audit log and --json show it (its codec and where the codec came from)."""
    return [g.to_dict() for g in outcome.staged]
