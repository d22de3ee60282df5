"""Layout drift on a real table that evolved (Spark SQL, Iceberg): health counts the files of each date written
under the old partition spec and outside the sort order, as Iceberg's own `files` metadata table reports them."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from icemaint.domain.decisions import Gates, decide_compaction
from icemaint.domain.verdicts import RUN, ReasonKind
from icemaint.domain.names import TableName
from icemaint.observe.catalog import CatalogReader


def test_health_reports_drift_per_date_after_the_spec_and_sort_order_evolved(spark, config, table_name):
    sql = TableName.parse(table_name).sql(config.catalog.name)
    spark.sql(f"CREATE TABLE {sql} (id BIGINT, ts TIMESTAMP, v STRING) USING iceberg PARTITIONED BY (days(ts))")
    for i, ts in enumerate(["2026-01-02 01:00:00", "2026-01-02 02:00:00", "2026-01-03 01:00:00"]):
        spark.sql(f"INSERT INTO {sql} VALUES ({i}, TIMESTAMP '{ts}', 'v{i}')")
    spark.sql(f"ALTER TABLE {sql} REPLACE PARTITION FIELD days(ts) WITH hours(ts)")
    spark.sql(f"INSERT INTO {sql} VALUES (10, TIMESTAMP '2026-01-02 10:00:00', 'new spec')")
    spark.sql(f"ALTER TABLE {sql} WRITE ORDERED BY id")
    spark.sql(f"INSERT INTO {sql} VALUES (20, TIMESTAMP '2026-01-02 11:00:00', 'sorted'), "
              "(21, TIMESTAMP '2026-01-02 11:30:00', 'sorted')")

    health = CatalogReader(config).health(table_name)
    # Iceberg's own metadata table, read by Spark: the truth health must agree with
    truth = {(r["spec_id"], r["sort_order_id"], r["day"]): r["n"] for r in spark.sql(f"""
        SELECT spec_id, sort_order_id, CAST(CAST(readable_metrics.ts.lower_bound AS DATE) AS STRING) AS day,
               count(*) AS n FROM {sql}.files WHERE content = 0 GROUP BY 1, 2, 3""").collect()}
    table_spec, table_order = health.spec_id, health.sort_order_id
    assert (table_spec, table_order) == (1, 1)

    def drifted(day, spec=None, order=None):
        return sum(n for (s, o, d), n in truth.items() if d == day and (spec is None or s != table_spec)
                   and (order is None or o != table_order))

    day, other = health.partition("2026-01-02"), health.partition("2026-01-03")
    assert day.data_files == 4 and day.old_spec_ids == (0,)
    assert day.old_spec_files == drifted("2026-01-02", spec=True) == 2
    # Iceberg 1.10's Spark writes record no sort order (0), even the sorted insert: all are not in the table's order
    # as far as anyone can tell, and all are due for it (`health.rewrite_drift`)
    assert day.unsorted_files == drifted("2026-01-02", order=True) == 4
    assert (day.drift_files, day.drift_bytes) == (4, day.total_bytes)
    assert (other.old_spec_files, other.unsorted_files, other.drift_files) == (1, 1, 1)
    assert day.oversized_files == 0 and health.old_spec_files == 3
    assert health.to_dict()["partitions"][0]["drift_bytes"] == day.drift_bytes > 0

    policy = replace(config.policy(table_name), drift_min_bytes=1, min_input_files=10,
                     hot_partition_age_seconds=0)
    decision = decide_compaction(health, "2026-01-02", policy,
                                 Gates(now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1), identity="svc",
                                       layout_rewrite=True))
    assert (decision.verdict, decision.kind) == (RUN, ReasonKind.LAYOUT_DRIFT), decision.reason
    assert "in 2 files under spec 0 (day(ts)), table spec 1 (hour(ts))" in decision.reason
