"""Planning a date's files in bulk (one JSON document from the JVM) gives the same candidates as file by file.

The bulk path serves snapshots whose summary says they hold no delete files; the file-by-file path every
other snapshot. Both are run on the same real tables: evolved partition specs, a string partition that
needs escaping, a table with deletes (which the bulk path must leave to the other).
"""

from __future__ import annotations

import datetime as dt

from conftest import current_snapshot
from icemaint.domain.names import TableName
from icemaint.engine.staging import StagingArea

DAY = dt.date(2024, 5, 1)


def both_ways(spark, config, name: TableName, snapshot: int):
    area = StagingArea(spark, config.catalog.name, name, "bulkplan")
    bulk, bulk_tasks = area.plan_date_files(snapshot, "ts", "timestamptz", DAY, DAY + dt.timedelta(days=1))
    weighed = dict(area._weights)  # filled by a bulk plan only
    scan = area.table().newScan().useSnapshot(snapshot).filter(
        area.date_filter("ts", "timestamptz", DAY, DAY + dt.timedelta(days=1)))
    one_by_one, tasks = area._plan(scan)  # no snapshot id: file by file
    key = lambda c: c.path  # noqa: E731
    return sorted(bulk, key=key), sorted(one_by_one, key=key), set(bulk_tasks) == set(tasks), weighed


def test_evolved_specs_and_escaped_partitions_plan_alike(spark, config, table_name):
    name = TableName.parse(table_name)
    table_sql = name.sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (id BIGINT, s STRING, ts TIMESTAMP) USING iceberg "
              "PARTITIONED BY (days(ts), s) TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {table_sql} VALUES (1, 'a/b c=d', TIMESTAMP '2024-05-01 01:00:00'), "
              "(2, 'x', TIMESTAMP '2024-05-01 02:00:00'), (3, NULL, TIMESTAMP '2024-05-01 03:00:00'), "
              "(4, 'x', TIMESTAMP '2024-05-02 03:00:00')")
    spark.sql(f"ALTER TABLE {table_sql} REPLACE PARTITION FIELD ts_day WITH hours(ts)")
    spark.sql(f"ALTER TABLE {table_sql} ADD PARTITION FIELD bucket(3, id)")
    spark.sql(f"INSERT INTO {table_sql} VALUES (5, 'é ü', TIMESTAMP '2024-05-01 04:00:00'), "
              "(6, 'x', TIMESTAMP '2024-05-01 05:00:00')")
    snapshot = current_snapshot(spark, table_sql)

    bulk, one_by_one, same_tasks, weighed = both_ways(spark, config, name, snapshot)
    assert len(bulk) == 5 and bulk == one_by_one and same_tasks
    assert {c.spec_id for c in bulk} == {0, 2}
    assert any("s=a%2Fb+c%3Dd" in c.partition for c in bulk), [c.partition for c in bulk]
    assert sorted(weighed) == [c.path for c in bulk]  # the bulk path was taken


def test_a_snapshot_with_deletes_is_planned_file_by_file(spark, config, table_name):
    name = TableName.parse(table_name)
    table_sql = name.sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (id BIGINT, ts TIMESTAMP) USING iceberg PARTITIONED BY (days(ts)) "
              "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')")
    for i in range(3):
        spark.sql(f"INSERT INTO {table_sql} VALUES ({2 * i}, TIMESTAMP '2024-05-01 0{i}:00:00'), "
                  f"({2 * i + 1}, TIMESTAMP '2024-05-01 0{i}:30:00')")
    spark.sql(f"DELETE FROM {table_sql} WHERE id = 1")
    snapshot = current_snapshot(spark, table_sql)

    bulk, one_by_one, same_tasks, weighed = both_ways(spark, config, name, snapshot)
    assert bulk == one_by_one and same_tasks
    assert sum(c.delete_files for c in bulk) == 1
    assert not weighed  # the summary counts a delete file: no bulk plan


def test_a_bulk_planned_date_is_staged_and_published_from_its_java_list(spark, config, table_name):
    """All of a bulk plan's files are staged from the plan's own Java list and their data files collected in the
    JVM for the publish (no Py4J call per file, 0.6-1.2 s at 3,000 files), and the publish replaces exactly them."""
    from icemaint.domain.rewrite_plan import FileGroup
    from icemaint.engine.planning import PlannedTasks, data_files_of

    name = TableName.parse(table_name)
    table_sql = name.sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {table_sql} (id BIGINT, ts TIMESTAMP) USING iceberg PARTITIONED BY (days(ts)) "
              "TBLPROPERTIES ('format-version'='2')")
    for i in range(4):
        spark.sql(f"INSERT INTO {table_sql} VALUES ({2 * i}, TIMESTAMP '2024-05-01 0{i}:00:00'), "
                  f"({2 * i + 1}, TIMESTAMP '2024-05-02 0{i}:30:00')")
    snapshot = current_snapshot(spark, table_sql)
    area = StagingArea(spark, config.catalog.name, name, "javalist")
    candidates, tasks = area.plan_date_files(snapshot, "ts", "timestamptz", DAY, DAY + dt.timedelta(days=1))
    assert isinstance(tasks, PlannedTasks) and len(candidates) == 4
    paths = [c.path for c in candidates]
    replaced = data_files_of(area.jvm, tasks.java_list(paths))
    assert replaced is not None and sorted(str(f.location()) for f in replaced) == sorted(paths)

    group = FileGroup(files=tuple(candidates))
    staged = area.stage(group, tasks, snapshot, target_file_size_bytes=128 * 1024 * 1024)
    assert staged._old_java_tasks is tasks.java_list(paths) and not tasks._fetched  # no task fetched one by one
    published = area.publish(staged, {"test": "javalist"})
    area.discard(staged.branch)
    live = {r["file_path"] for r in spark.sql(
        f"SELECT file_path FROM {table_sql}.files WHERE partition.ts_day = DATE '2024-05-01'").collect()}
    assert live == set(staged.new_files) and not live & set(paths)
    assert current_snapshot(spark, table_sql) == published.snapshot_id
    ids = sorted(r["id"] for r in spark.sql(f"SELECT id FROM {table_sql}").collect())
    assert ids == list(range(8))  # the other date's rows untouched, the date's kept
