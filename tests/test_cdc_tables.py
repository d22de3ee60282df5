"""CDC-shaped tables: equality deletes the way a Flink/Debezium upsert writer leaves them, written through
Iceberg's Java API from the driver (Spark cannot write equality deletes), then health, compaction with its
proof, expiry and orphan removal, the rows checked against the writer's ledger after each step.

pyiceberg 0.12 cannot scan a table with equality deletes ("does not yet support equality deletes"), so the
independent reader here is Spark's own scan, compared with the ledger the writer kept.
"""

from __future__ import annotations

import pytest

from conftest import make_config
from icemaint.domain.names import TableName
from icemaint.engine.spark_session import iceberg_table
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.operations.expiry import ExpiryRequest
from icemaint.operations.housekeeping import Housekeeper
from icemaint.operations.orphans import OrphanRequest
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims

pytestmark = pytest.mark.slow

DAY1, DAY2 = "2026-01-01", "2026-01-02"


class CdcWriter:
    """Appends rows with Spark and deletes keys by equality with Iceberg's Java API, keeping a ledger."""

    def __init__(self, spark, table: str):
        self.spark, self.table = spark, table
        self.sql = TableName.parse(table).sql("lake")
        self.keys_sql = TableName.parse(table + "_keys").sql("lake")
        self.ledger: dict[int, str] = {}
        spark.sql(f"CREATE TABLE {self.sql} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg "
                  "PARTITIONED BY (days(ts)) TBLPROPERTIES ('format-version'='2')")
        spark.sql(f"CREATE TABLE {self.keys_sql} (id BIGINT, ts TIMESTAMP) USING iceberg")

    def insert(self, day: str, ids: range | list[int], value: str) -> None:
        rows = ", ".join(f"({i}, TIMESTAMP '{day} 01:00:00', '{value}')" for i in ids)
        self.spark.sql(f"INSERT INTO {self.sql} VALUES {rows}")
        self.ledger.update({i: value for i in ids})

    def delete(self, day: str, ids: list[int], files_per_commit: int = 20) -> None:
        """One equality-delete file per key (a streaming writer's checkpoint each), committed in batches."""
        jvm = self.spark._jvm
        self.spark.sql(f"DELETE FROM {self.keys_sql}")
        rows = ", ".join(f"({i}, TIMESTAMP '{day} 01:00:00')" for i in ids)
        self.spark.sql(f"INSERT INTO {self.keys_sql} VALUES {rows}")
        table = iceberg_table(self.spark, "lake", TableName.parse(self.table))
        keys = iceberg_table(self.spark, "lake", TableName.parse(self.table + "_keys"))
        schema, spec = table.schema(), table.spec()
        names = jvm.java.util.ArrayList()
        names.add("id")
        names.add("ts")
        key_schema = schema.select(names)
        field_ids = self.spark.sparkContext._gateway.new_array(jvm.int, 1)
        field_ids[0] = schema.findField("id").fieldId()
        factory = jvm.org.apache.iceberg.data.GenericAppenderFactory(schema, spec, field_ids, key_schema, None)
        wrapper = jvm.org.apache.iceberg.data.InternalRecordWrapper(key_schema.asStruct())
        # Py4J hands a Java Long back to Python as an int and sends it on as an Integer: the key records are
        # read as Java records (never crossing into Python) from the scratch table the keys were written to.
        records = jvm.org.apache.iceberg.data.IcebergGenerics.read(keys).build().iterator()
        pending = []
        while records.hasNext():
            record = records.next()
            partition = jvm.org.apache.iceberg.PartitionKey(spec, key_schema)
            partition.partition(wrapper.wrap(record))
            location = table.locationProvider().newDataLocation(
                spec, partition, f"eq-delete-{jvm.java.util.UUID.randomUUID().toString()}.parquet")
            out = jvm.org.apache.iceberg.encryption.EncryptedFiles.plainAsEncryptedOutput(
                table.io().newOutputFile(location))
            writer = factory.newEqDeleteWriter(out, jvm.org.apache.iceberg.FileFormat.PARQUET, partition)
            writer.write(record)
            writer.close()
            pending.append(writer.toDeleteFile())
            if len(pending) == files_per_commit:
                self._commit(table, pending)
                pending = []
        if pending:
            self._commit(table, pending)
        for i in ids:
            self.ledger.pop(i, None)

    @staticmethod
    def _commit(table, delete_files) -> None:
        delta = table.newRowDelta()
        for delete_file in delete_files:
            delta = delta.addDeletes(delete_file)
        delta.commit()
        table.refresh()

    def rows(self, snapshot_id: int | None = None) -> dict[int, str]:
        at = f" VERSION AS OF {int(snapshot_id)}" if snapshot_id else ""
        return {r[0]: r[1] for r in self.spark.sql(f"SELECT id, v FROM {self.sql}{at}").collect()}


def test_a_cdc_table_keeps_exactly_the_ledgers_rows_through_compaction_expiry_and_orphans(
        spark, lake_root, tmp_path, table_name):
    config = make_config(lake_root, state_dir=str(tmp_path / "state"),
                         defaults={"min_input_files": 2})
    cdc = CdcWriter(spark, table_name)
    for batch in range(6):  # small files on both dates
        cdc.insert(DAY1, range(batch * 100, batch * 100 + 100), f"v{batch}")
        cdc.insert(DAY2, range(10_000 + batch * 10, 10_000 + batch * 10 + 10), f"v{batch}")
    cdc.delete(DAY1, list(range(0, 600, 3)))  # 200 small equality-delete files on one date
    cdc.delete(DAY2, [10_001, 10_002])
    cdc.insert(DAY2, [10_001], "back")  # deleted by equality, then inserted again: it must stay
    assert cdc.rows() == cdc.ledger and cdc.ledger[10_001] == "back" and 10_002 not in cdc.ledger

    reader = CatalogReader(config)
    health = reader.health(table_name)
    day1, day2 = health.partition(DAY1), health.partition(DAY2)
    assert (day1.equality_delete_files, day1.equality_delete_records) == (200, 200)
    assert (day2.equality_delete_files, day2.equality_delete_records) == (2, 2)
    assert health.equality_delete_files == 202 and day1.delete_files == 200

    compactor = Compactor(config, spark, reader, open_claims(config), open_audit(config))
    for day in (DAY1, DAY2):
        outcome = compactor.run(CompactionRequest(table_name, day))
        assert outcome.decision == "run" and outcome.validation.passed is True, outcome.reason
        assert cdc.rows() == cdc.ledger, f"rows changed by the compaction of {day}"
    after = reader.health(table_name)
    assert after.partition(DAY1).data_files == 1 and after.partition(DAY2).data_files == 1
    assert cdc.rows()[10_001] == "back"

    keeper = Housekeeper(config, spark, reader, open_claims(config), open_audit(config))
    expired = keeper.expire(ExpiryRequest(table_name, older_than_seconds=0, retain_last=1))
    assert expired.decision == "run", expired.reason
    assert cdc.rows() == cdc.ledger
    orphans = keeper.remove_orphans(OrphanRequest(table_name, older_than_seconds=0, force=True))
    assert orphans.decision in ("run", "noop"), orphans.reason
    assert cdc.rows() == cdc.ledger
    for snap in reader.load(table_name).metadata.snapshots:  # what is retained still reads the ledger's rows
        assert cdc.rows(snap.snapshot_id) == cdc.ledger
