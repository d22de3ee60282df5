"""The order a staged rewrite writes a file group's rows in, and the sort order its new files are recorded under: the
policy's sort or z-order, or for a date due for its layout drift the table's current layout (its rows clustered by the
current partition spec and sort order, its files recorded under that order).

`icemaint.engine.staging` reads the group's rows, orders them here (`ordered_rows`) and writes them with
`output-spec-id` set to the group's spec and the fanout writer. A layout rewrite orders them as Iceberg's own rewrite
does when a group's spec is not the output spec (`SparkBinPackFileRewriteRunner`: a RANGE distribution;
`SparkShufflingFileRewriteRunner`: `SortOrderUtil.buildSortOrder`, the output spec's partition transforms before the
sort order).
"""

from __future__ import annotations

import uuid

from icemaint.domain.rewrite_plan import (FileGroup, LayoutKey, SortKey, layout_keys, order_by_sql, zorder_finite,
                                          zorder_input, zorder_sql)
from icemaint.engine.java import iterate_java, java_class
from icemaint.engine.staging_errors import StagingError


def ordered_rows(spark, tbl, catalog: str, rows, group: FileGroup, outputs: int, strategy: str,
                 sort_keys: tuple[SortKey, ...]):
    """Returns (rows, writer options, recorded order): the group's rows in the order they are written, the options the
    writer needs for it, and the Java sort order the new files are recorded under, or None (`tbl`: the Java table;
    `outputs`: the files the read's splits make).

    A bin-pack keeps the read's splits as they are; a sort or z-order orders the rows itself; a group with a layout (a
    rewrite for layout drift) goes into the table's layout (`into_layout`)."""
    if group.layout is not None:
        rows, recorded = into_layout(tbl, catalog, rows, group, outputs, strategy, sort_keys)
        return rows, {"fanout-enabled": "true"}, recorded  # a task's rows may span several of the spec's partitions
    if strategy == "binpack":
        return rows, {}, None
    if strategy == "sort":
        order = order_by_sql(sort_keys)
    else:
        kinds = zorder_kinds(rows.schema, sort_keys)
        order = zorder_sql(sort_keys, kinds, value_ranges(rows, sort_keys, kinds))
    view = f"icemaint_stage_rows_{uuid.uuid4().hex[:12]}"
    rows.createOrReplaceTempView(view)
    # fanout: else Iceberg adds a partition sort over our order
    return spark.sql(f"SELECT * FROM {view} ORDER BY {order}"), {"fanout-enabled": "true"}, None


def into_layout(tbl, catalog: str, rows, group: FileGroup, outputs: int, strategy: str, sort_keys: tuple[SortKey, ...]):
    """The group's rows clustered into the table's layout (`tbl`: the Java table): range-partitioned into `outputs`
    tasks (one output file each, as the read's splits were) by the output spec's partition values, then the table's
    sort order (or the policy's sort or z-order when the table has none), then the time column of a time partition,
    and each task sorted the same way.

    Returns (rows, the Java sort order the new files are recorded under, or None). The rows are sorted here by the
    table's order whatever the old files record (Iceberg 1.10's Spark writes record none, apache/iceberg#13634)."""
    from pyspark.sql import functions as F

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


def zorder_kinds(schema, keys) -> dict[str, str]:
    """Each z-order column's kind for `rewrite_plan.zorder_input`, from the Spark schema."""
    from pyspark.sql.types import BinaryType, DateType, NumericType, StringType, TimestampNTZType, TimestampType

    types = {f.name: f.dataType for f in schema.fields}
    out = {}
    for key in keys:
        dtype = types.get(key.column)
        if isinstance(dtype, NumericType):
            out[key.column] = "number"
        elif isinstance(dtype, (DateType, TimestampType, TimestampNTZType)):
            out[key.column] = "time"
        elif isinstance(dtype, (StringType, BinaryType)):
            out[key.column] = "text"
        else:
            raise StagingError(f"z-order column {key.column!r} has type {dtype}; z-order takes numbers, "
                               "dates, timestamps and strings")
    return out


def value_ranges(rows, keys: tuple[SortKey, ...], kinds: dict[str, str]) -> dict[str, tuple]:
    """min/max of each z-order column over the group's rows (one small aggregate pass)."""
    exprs = []
    for key in keys:
        value = zorder_finite(zorder_input(key.column, kinds[key.column]))
        exprs += [f"min({value})", f"max({value})"]
    row = rows.selectExpr(*exprs).first()
    return {key.column: (row[2 * i], row[2 * i + 1]) for i, key in enumerate(keys)}
