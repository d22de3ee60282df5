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
