"""The production profile on real parts: JdbcCatalog on PostgreSQL (Spark writes, pyiceberg reads the
same tables), PostgreSQL advisory-lock claims and the PostgreSQL audit log, driving a real compaction."""

import os

import pytest

from conftest import make_config
from icemaint.safety.audit import PostgresAuditLog, open_audit
from icemaint.safety.claims import PostgresClaims, open_claims, table_claim
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.observe.catalog import CatalogReader
from icemaint.app.simulator import StreamingWriter, WorkloadSpec
from icemaint.engine.spark_session import get_spark

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def prod_config(spark, lake_root, tmp_path, postgres_server, monkeypatch):
    if not os.path.exists("/usr/share/java/postgresql.jar"):
        pytest.skip("Debian libpostgresql-jdbc-java is missing: run scripts/ensure_postgres.sh")
    monkeypatch.setenv("ICEMAINT_PG_DSN", postgres_server.dsn)
    monkeypatch.setenv("ICEMAINT_CATALOG_JDBC_PASSWORD", postgres_server.password)
    config = make_config(
        lake_root, state_dir=str(tmp_path / "state"),
        catalog={"name": "prod", "type": "jdbc", "uri": postgres_server.jdbc_url,
                 "warehouse": str(lake_root / "prod_warehouse"),
                 "properties": {"jdbc.user": postgres_server.user}},
        claims={"backend": "postgres"}, audit={"sink": "postgres"})
    get_spark(config)  # adds the `prod` catalog to the running session
    return config


def test_jdbc_catalog_postgres_claims_and_audit_drive_a_proven_compaction(spark, prod_config):
    config = prod_config
    assert isinstance(open_claims(config), PostgresClaims) and isinstance(open_audit(config), PostgresAuditLog)
    table = "ops.events"
    writer = StreamingWriter(spark, "prod", WorkloadSpec(table=table, days=2, rows_per_day=10, delete_every=3),
                             claim_factory=lambda: table_claim(config, table, holder="ingest", wait_seconds=30))
    writer.create_table()
    writer.run(4)

    reader = CatalogReader(config)
    assert table in reader.list_tables()  # pyiceberg SqlCatalog on the same PostgreSQL tables
    health = reader.health(table)
    assert health.partition("2026-01-01").data_files == 4

    with table_claim(config, table, holder="ingest"):
        busy = Compactor(config, spark, reader, open_claims(config), open_audit(config)).run(
            CompactionRequest(table, "2026-01-01"))
    assert busy.decision == "defer" and "ingest" in busy.reason

    outcome = Compactor(config, spark, reader, open_claims(config), open_audit(config)).run(
        CompactionRequest(table, "2026-01-01"))
    assert outcome.decision == "run" and outcome.validation.passed is True
    assert outcome.files_before == 4 and outcome.files_after == 1
    assert reader.metadata_location(table) == reader.load(table).metadata_location
    rows = {r[0] for r in spark.sql("SELECT event_id FROM `prod`.`ops`.`events`").collect()}
    assert rows == writer.ledger.expected_ids()
    decisions = [r.decision for r in open_audit(config).records(table=table)]
    assert decisions == ["defer", "run"]


def test_orphan_removal_refuses_a_table_located_outside_the_warehouse(spark, prod_config, tmp_path):
    """A table registered over another system's files (its location outside the catalog's warehouse) has no
    orphans we may take: refused before anything is listed, the table and a planted stray file untouched."""
    from icemaint.operations.housekeeping import Housekeeper
    from icemaint.operations.orphans import OrphanRequest

    config = prod_config
    elsewhere = tmp_path / "another-system" / "events"
    spark.sql("CREATE NAMESPACE IF NOT EXISTS `prod`.`ops`")
    spark.sql(f"CREATE TABLE `prod`.`ops`.`foreign_events` (id BIGINT) USING iceberg LOCATION 'file:{elsewhere}'")
    spark.sql("INSERT INTO `prod`.`ops`.`foreign_events` VALUES (1), (2)")
    stray = elsewhere / "data" / "not-ours.parquet"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"another system's file")
    os.utime(stray, (0, 0))  # as old as can be: an orphan by age
    reader = CatalogReader(config)
    before = reader.metadata_location("ops.foreign_events")

    keeper = Housekeeper(config, spark, reader, open_claims(config), open_audit(config))
    outcome = keeper.remove_orphans(OrphanRequest("ops.foreign_events"))

    assert outcome.decision == "refuse", outcome.reason
    assert f"{elsewhere}" in outcome.reason and "outside the warehouse" in outcome.reason
    assert stray.exists() and reader.metadata_location("ops.foreign_events") == before
    assert sorted(r[0] for r in spark.sql("SELECT id FROM `prod`.`ops`.`foreign_events`").collect()) == [1, 2]
