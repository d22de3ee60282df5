"""Tables without a time column, maintained by default (issue 19): built with plain Spark SQL and
DataFrame writes the way users' notebooks build them, compacted per partition of their layout by one
`icemaint tick` with no policy line, each rewrite proven, rows compared by independent readers.
"""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pytest

from conftest import run_cli, write_config
from icemaint.config import load_config
from icemaint.domain.layout import WHOLE_TABLE
from icemaint.domain.names import TableName
from icemaint.engine.validation import full_row_hash
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims
from staged_faults import main_lineage

EVENT_TYPES = ("click", "view", "buy", "cart", "search")
# Commits per table: the fewest that leave every partition due (the test config's min_input_files is 3).
BATCHES = 3


pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


def notebook_events(spark, sql: str, batches: int = BATCHES) -> None:
    """The notebook's streaming table: micro-batches appended to `partitionedBy("event_type")`."""
    spark.sql(f"CREATE TABLE {sql} (event_id BIGINT, user_id BIGINT, event_type STRING, amount DOUBLE) "
              "USING iceberg PARTITIONED BY (event_type)")
    for b in range(batches):
        rows = [(b * 100 + i, (b * 7 + i) % 13, EVENT_TYPES[i % len(EVENT_TYPES)], float(i) * 1.5) for i in range(10)]
        spark.createDataFrame(rows, "event_id BIGINT, user_id BIGINT, event_type STRING, amount DOUBLE") \
            .sortWithinPartitions("event_type").coalesce(1).writeTo(sql).append()


def upsert_target(spark, sql: str) -> None:
    """The notebook's nightly target: unpartitioned, merge-on-read, upserted by MERGE INTO."""
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, name STRING, score INT) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read', 'write.delete.mode'='merge-on-read')")
    for b in range(BATCHES):
        spark.sql(f"INSERT INTO {sql} VALUES ({b * 10}, 'n{b}', {b}), ({b * 10 + 1}, 'm{b}', {b})")
    for b in range(BATCHES):
        spark.sql(f"MERGE INTO {sql} t USING (SELECT {b * 10} AS id, 'u{b}' AS name, {100 + b} AS score) s "
                  "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")


def bucket_only(spark, sql: str) -> None:
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, v STRING) USING iceberg PARTITIONED BY (bucket(4, id))")
    for b in range(BATCHES):
        spark.sql(f"INSERT INTO {sql} SELECT id, CONCAT('v', id) FROM range({b * 40}, {b * 40 + 40})")


def identity_and_bucket(spark, sql: str) -> None:
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, region STRING, v STRING) USING iceberg "
              "PARTITIONED BY (region, bucket(2, id))")
    for b in range(BATCHES):
        spark.sql(f"INSERT INTO {sql} SELECT id, IF(id % 2 = 0, 'eu', 'us'), CONCAT('v', id) "
                  f"FROM range({b * 20}, {b * 20 + 20})")


SHAPES = {"events": notebook_events, "upserts": upsert_target, "buckets": bucket_only, "regions": identity_and_bucket}


@pytest.fixture(scope="module")
def estate(spark, lake_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("untimed")
    namespace = f"untimed_{uuid.uuid4().hex[:8]}"
    tables = {}
    for name, build in SHAPES.items():
        key = f"{namespace}.{name}"
        sql = TableName.parse(key).sql("lake")
        build(spark, sql)
        head = main_lineage(spark, sql)[0]["snapshot_id"]
        tables[name] = SimpleNamespace(key=key, sql=sql, head=head, hash=full_row_hash(spark, sql, head),
                                       rows=spark.sql(f"SELECT count(*) FROM {sql}").first()[0])
    # no per-table policy: the shipped defaults, with the test suite's idle windows
    path = write_config(root / "maintenance.yaml", lake_root, state_dir=str(root / "state"),
                        scope={"include": [f"{namespace}.*"]})
    return SimpleNamespace(namespace=namespace, root=root, tables=tables, path=str(path), config=load_config(path))


def test_health_reports_each_partition_of_the_layout_and_sums_to_the_table(estate):
    reader = CatalogReader(estate.config)
    events = reader.health(estate.tables["events"].key)
    assert not events.dated and events.data_files == BATCHES * len(EVENT_TYPES)
    assert [p.key for p in events.partitions] == sorted(f"event_type={t}" for t in EVENT_TYPES)
    assert all(p.data_files == BATCHES and p.small_files == BATCHES for p in events.partitions)
    upserts = reader.health(estate.tables["upserts"].key)
    assert [p.key for p in upserts.partitions] == [WHOLE_TABLE]
    assert upserts.delete_files >= BATCHES and upserts.partitions[0].delete_files == upserts.delete_files
    for name in SHAPES:
        h = reader.health(estate.tables[name].key)
        for field in ("data_files", "records", "delete_files", "delete_records", "small_files"):
            assert sum(getattr(p, field) for p in h.partitions) == getattr(h, field), (name, field)


def test_the_cost_ceiling_bounds_one_run_and_the_rest_waits(spark, estate, lake_root):
    """A ceiling that admits two of the five partitions: the run takes the two with the most benefit,
    proves them, and leaves the rest (and its rows) as they were."""
    clone = f"{estate.namespace}_ceiling.regions"  # outside the estate's scope
    clone_sql = TableName.parse(clone).sql("lake")
    identity_and_bucket(spark, clone_sql)
    health = CatalogReader(estate.config).health(clone)
    per_partition = sorted(p.small_bytes for p in health.partitions)
    ceiling = per_partition[0] + per_partition[1] + 1
    path = write_config(estate.root / "ceiling.yaml", lake_root, state_dir=str(estate.root / "ceiling-state"),
                        defaults={"max_rewrite_bytes": ceiling})
    config = load_config(path)
    before = full_row_hash(spark, clone_sql, health.snapshot_id)
    outcome = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config)).run(
        CompactionRequest(clone, None))
    assert outcome.decision == "run" and outcome.published, outcome.reason
    assert len(outcome.partitions) == 2 and "more due partitions wait" in outcome.reason
    assert outcome.validation.passed is True
    after = CatalogReader(config).health(clone)
    assert sorted(p.data_files for p in after.partitions).count(1) == 2
    assert full_row_hash(spark, clone_sql, after.snapshot_id) == before


def test_an_operators_approval_lets_the_next_run_rewrite_a_partition_over_the_ceiling(capsys, spark, estate,
                                                                                      lake_root):
    """`icemaint approve TABLE` (no --date) for a table without a time column: the next `compact` rewrites the
    partition over the ceiling (its plan once chose partitions with the launch flag alone, so it found nothing)."""
    clone = f"{estate.namespace}_approve.flat"  # outside the estate's scope
    clone_sql = TableName.parse(clone).sql("lake")
    spark.sql(f"CREATE TABLE {clone_sql} (id BIGINT, v STRING) USING iceberg")
    for b in range(BATCHES):
        spark.sql(f"INSERT INTO {clone_sql} SELECT id, CONCAT('v', id) FROM range({b * 10}, {b * 10 + 10})")
    path = write_config(estate.root / "approve.yaml", lake_root, state_dir=str(estate.root / "approve-state"),
                        defaults={"max_rewrite_bytes": "1KiB"})
    config = load_config(path)
    before = CatalogReader(config).health(clone)
    expected = full_row_hash(spark, clone_sql, before.snapshot_id)
    code, out, err = run_cli(capsys, "--config", str(path), "compact", clone, "--json")
    assert out, err
    [held] = json.loads(out)
    assert code == 1 and held["decision"] == "defer" and "awaiting approval" in held["reason"], held
    assert CatalogReader(config).metadata_location(clone) == before.metadata_location

    code, _, err = run_cli(capsys, "--config", str(path), "approve", clone)
    assert code == 0, err
    code, out, err = run_cli(capsys, "--config", str(path), "compact", clone, "--json")
    [done] = json.loads(out)
    assert code == 0 and done["decision"] == "run" and done["published"], done
    after = CatalogReader(config).health(clone)
    assert after.data_files == 1 and full_row_hash(spark, clone_sql, after.snapshot_id) == expected


def test_one_tick_with_the_default_policy_compacts_every_shape_with_a_passing_proof(capsys, spark, estate):
    code, out, err = run_cli(capsys, "--config", estate.path, "tick", "--json")
    report = json.loads(out)
    compactions = {d["table"]: d for d in report["decisions"] if d["operation"] == "compact"}
    assert set(compactions) == {t.key for t in estate.tables.values()}, "every table has a decision in the tick"
    for name, table in estate.tables.items():
        d = compactions[table.key]
        assert (d["decision"], d["date"]) == ("run", None), (name, d["reason"])
        assert d["success"] and d["result"] == "run" and d["validation"] is True and d["published"], (name, d)
        head = main_lineage(spark, table.sql)[0]["snapshot_id"]
        assert head != table.head
        assert full_row_hash(spark, table.sql, head) == table.hash, f"{name}: rows changed"
        # an independent reader (pyiceberg, no Spark) counts the same rows
        assert CatalogReader(estate.config).load(table.key).scan().to_arrow().num_rows == table.rows, name
        # time travel to the snapshot before compaction still reads the old rows
        assert full_row_hash(spark, table.sql, table.head) == table.hash
    assert code == 0, err
    reader = CatalogReader(estate.config)
    events = reader.health(estate.tables["events"].key)
    assert events.data_files == 5 and [p.data_files for p in events.partitions] == [1] * 5, f"{BATCHES * 5} -> 5 files"
    upserts = reader.health(estate.tables["upserts"].key)
    assert upserts.data_files == 1 and upserts.delete_files == 0, "the upsert table to one file, deletes applied"

    # the next tick: every table appears again, now with nothing to do
    code, out, err = run_cli(capsys, "--config", estate.path, "tick")
    for table in estate.tables.values():
        assert any(line.startswith(f"{table.key} ") for line in out.splitlines()), (table.key, out)


def test_compact_without_a_date_on_a_dated_table_names_the_fix(capsys, spark, estate, lake_root):
    key = f"{estate.namespace}.dated"
    sql = TableName.parse(key).sql("lake")
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP) USING iceberg PARTITIONED BY (days(ts))")
    spark.sql(f"INSERT INTO {sql} VALUES (1, TIMESTAMP '2026-01-02 01:00:00')")
    location = CatalogReader(estate.config).metadata_location(key)
    code, out, err = run_cli(capsys, "--config", estate.path, "compact", key)
    assert code == 2 and "maintained per date" in err and "--date" in err and len(err.strip().splitlines()) == 1
    assert CatalogReader(estate.config).metadata_location(key) == location
