"""A staged rewrite into the table's current layout (a date due for its layout drift): its rows clustered by the
current partition spec and sort order, its files recorded under that order.

`icemaint.engine.staging` reads the group's rows and writes them with `output-spec-id` set to the table's current
spec and the fanout writer; this module orders the rows in between, as Iceberg's own rewrite does when a group's
spec is not the output spec (`SparkBinPackFileRewriteRunner`: a RANGE distribution; `SparkShufflingFileRewriteRunner`:
`SortOrderUtil.buildSortOrder`, the output spec's partition transforms before the sort order).
"""

from __future__ import annotations

from icemaint.domain.rewrite_plan import FileGroup, LayoutKey, SortKey, layout_keys, zorder_sql
from icemaint.engine.java import iterate_java, java_class


def into_layout(tbl, catalog: str, rows, group: FileGroup, outputs: int, strategy: str, sort_keys: tuple[SortKey, ...],
                value_ranges):
    """The group's rows clustered into the table's layout (`tbl`: the Java table): range-partitioned into `outputs`
    tasks (one output file each, as the read's splits were) by the output spec's partition values, then the table's
    sort order (or the policy's sort or z-order when the table has none), then the time column of a time partition,
    and each task sorted the same way.

    Returns (rows, the Java sort order the new files are recorded under, or None). The rows are sorted here by the
    table's order whatever the old files record (Iceberg 1.10's Spark writes record none, apache/iceberg#13634).
    `value_ranges(rows, keys, kinds)`: the z-order columns' ranges (`StagingArea._value_ranges`)."""
    from pyspark.sql import functions as F

    from icemaint.engine.staging import zorder_kinds

    schema, spec = tbl.schema(), tbl.specs().get(int(group.spec_id))
    partition = [LayoutKey(str(f.transform()), str(schema.findColumnName(f.sourceId())))
                 for f in iterate_java(spec.fields())]
    layout = group.layout
    order = tbl.sortOrders().get(int(layout.sort_order_id)) if layout is not None and layout.sort_order_id else None
    table_order = [] if order is None else [
        LayoutKey(str(f.transform()), str(schema.findColumnName(f.sourceId())), str(f.direction()) == "DESC",
                  str(f.nullOrder()) == "NULLS_FIRST") for f in iterate_java(order.fields())]
    policy_order = [LayoutKey("identity", k.column, k.descending, k.nulls_first)
                    for k in sort_keys] if strategy == "sort" and order is None else []
    # Last, the time column itself: within a day (an hour) the rows follow time, so a date's files split by the
    # writer hold ranges of time a filtered read can skip, and the range partitioning has distinct values to cut.
    timed = [LayoutKey("identity", k.column) for k in partition if k.transform in ("year", "month", "day", "hour")]
    columns = [_ordered(F.expr(expr), descending, nulls_first)
               for expr, descending, nulls_first in layout_keys(catalog, partition + table_order + policy_order)]
    if strategy == "zorder" and order is None and sort_keys:
        kinds = zorder_kinds(rows.schema, sort_keys)
        columns.append(F.expr(zorder_sql(sort_keys, kinds, value_ranges(rows, sort_keys, kinds))).asc())
    named = {str(c) for c in columns}
    columns += [c for c in (_ordered(F.expr(e), d, n) for e, d, n in layout_keys(catalog, timed)) if str(c) not in named]
    if not columns:
        return rows, order
    return rows.repartitionByRange(max(1, int(outputs)), *columns).sortWithinPartitions(*columns), order


def _ordered(column, descending: bool, nulls_first: bool | None):
    """A Spark sort column with the direction and nulls order (None: Spark's default for the direction)."""
    if descending:
        return column.desc_nulls_first() if nulls_first else column.desc_nulls_last()
    return column.asc_nulls_last() if nulls_first is False else column.asc_nulls_first()


def with_sort_order(jvm, tbl, files: list, order) -> list:
    """The new DataFiles recorded under `order`, which their rows were sorted by: Iceberg 1.10's writer records none
    (1.11 adds the write option `output-sort-order-id`)."""
    data_files = java_class(jvm, "org.apache.iceberg.DataFiles")
    specs = tbl.specs()
    return [data_files.builder(specs.get(int(f.specId()))).copy(f).withSortOrder(order).build() for f in files]
