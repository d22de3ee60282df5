"""The shape matrix (issue 11): every table shape an estate holds, built with plain Spark SQL, run
through compaction of one date, snapshot expiry and a manifest rewrite with the product's own classes.

Each shape is judged independently of the code under test, before and after:
- a whole-table digest (`full_row_hash`'s: row count and an order-independent hash of every row), every
  snapshot pictured at one moment in one Spark job;
- pyiceberg's read of the table (`CatalogReader.load(...).scan().to_arrow()`, not Spark): row count,
  sorted ids and every row;
- time travel to the snapshot before compaction still reads the old rows (checked right after the
  compaction, before expiry removes that snapshot);
- health's per-date breakdown adds up to its table totals (data files and records).

A shape the product declines (nothing to rewrite, no time column) must say so in one line and leave the
table's metadata exactly where it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from icemaint.domain.names import TableName
from icemaint.engine.digest import row_hash_args
from icemaint.observe.catalog import CatalogReader
from icemaint.operations.compaction import CompactionRequest, Compactor
from icemaint.operations.expiry import ExpiryRequest
from icemaint.operations.housekeeping import Housekeeper
from icemaint.operations.manifests import ManifestRequest
from icemaint.safety.audit import open_audit
from icemaint.safety.claims import open_claims

from own_statements import own_statements

pytestmark = pytest.mark.slow

DATE = "2026-01-02"
OTHER = "2026-01-03"


# -- shapes --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """A table built by `statements` (each with `{t}` for the table's SQL name), then compacted on `date`.

    expect: the compaction's decisions accepted ("run", "noop", "refuse").
    time_column: whether the table has a time column (health's per-date breakdown applies).
    refs: branches and tags that must still exist and read the same rows after the run.
    """

    statements: tuple[str, ...]
    date: str | None = DATE  # None: a table without a time column, compacted per partition
    expect: tuple[str, ...] = ("run",)  # the decisions accepted (a fix may run or clearly refuse)
    period_key: str | None = None
    time_column: bool = True
    id_column: str = "id"
    refs: tuple[str, ...] = ()
    date_files: tuple[int, int] | None = None  # (data files, small files) on the date before the run
    files_after: int | None = None  # data files on the date after the compaction
    applies_deletes: bool = False  # the date carries delete files that the compaction applies


BASE_COLUMNS = "id BIGINT, ts TIMESTAMP, v STRING"


def create(partitioning: str | None, columns: str = BASE_COLUMNS, props: str = "") -> str:
    parts = f" PARTITIONED BY ({partitioning})" if partitioning else ""
    tbl = f" TBLPROPERTIES ({props})" if props else ""
    return f"CREATE TABLE {{t}} ({columns}) USING iceberg{parts}{tbl}"


def ts(stamp: str, kind: str = "TIMESTAMP") -> str:
    return f"{kind} '{stamp}'"


def inserts(stamps, start: int = 0, kind: str = "TIMESTAMP", other: bool = True) -> tuple[str, ...]:
    """One INSERT (one small file on the compacted date) per stamp; the first also puts a row on OTHER."""
    out = []
    for i, stamp in enumerate(stamps):
        rows = [f"({start + i}, {ts(stamp, kind)}, 'v{start + i}')"]
        if other and i == 0:
            rows.append(f"({start + 900}, {ts(OTHER + ' 12:00:00', kind)}, 'other')")
        out.append(f"INSERT INTO {{t}} VALUES {', '.join(rows)}")
    return tuple(out)


def on_date(n: int, date: str = DATE, hour0: int = 1) -> list[str]:
    return [f"{date} {hour0 + h:02d}:{h:02d}:00" for h in range(n)]


THREE = on_date(3)

SHAPES = {
    # -- time types and transforms -----------------------------------------------------------
    "timestamptz_days": Shape((create("days(ts)"), *inserts(THREE))),
    "timestamp_ntz_days": Shape((create("days(ts)", "id BIGINT, ts TIMESTAMP_NTZ, v STRING"),
                                 *inserts(THREE, kind="TIMESTAMP_NTZ"))),
    "date_identity": Shape((create("d", "id BIGINT, d DATE, v STRING"),
                            *(f"INSERT INTO {{t}} VALUES ({i}, DATE '{DATE}', 'v{i}')" for i in range(3)),
                            f"INSERT INTO {{t}} VALUES (9, DATE '{OTHER}', 'other')")),
    # hour partitions: two hours of the date with two files each (a lone file in an hour is left alone)
    "timestamptz_hours": Shape((create("hours(ts)"),
                                *inserts([f"{DATE} 01:00:00", f"{DATE} 01:30:00", f"{DATE} 02:00:00",
                                          f"{DATE} 02:30:00", f"{DATE} 05:00:00"])), files_after=3),
    # a month partition is compacted whole for any date inside it, keyed by its first day
    "timestamptz_months": Shape((create("months(ts)"),
                                 *inserts(["2025-03-02 10:00:00", "2025-03-09 10:00:00", "2025-03-31 23:59:59"],
                                          other=False),
                                 "INSERT INTO {t} VALUES (99, TIMESTAMP '2025-04-01 00:00:00', 'april')"),
                                date="2025-03-17", period_key="2025-03-01", files_after=1),
    "timestamptz_years": Shape((create("years(ts)"),
                                *inserts(["2024-01-01 00:00:00", "2024-06-15 10:00:00", "2024-12-31 23:59:59"],
                                         other=False),
                                "INSERT INTO {t} VALUES (99, TIMESTAMP '2025-01-01 00:00:00', 'next year')"),
                               date="2024-06-15", period_key="2024-01-01", files_after=1),
    # -- other transforms beside the time one ------------------------------------------------
    # bucket: rows of the date in two buckets, each bucket with two or more files
    "bucket_beside_days": Shape((create("days(ts), bucket(4, id)"),
                                 *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} 0{n}:00:00', 'v'), "
                                   f"({i + 1}, TIMESTAMP '{DATE} 0{n}:30:00', 'w')"
                                   for n, i in enumerate((0, 10, 20))))),
    "truncate_beside_days": Shape((create("days(ts), truncate(2, v)"),
                                   *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} 0{i}:00:00', 'ab{i}'), "
                                     f"({i + 10}, TIMESTAMP '{DATE} 0{i}:30:00', 'xy{i}')" for i in range(3))), files_after=2),
    # -- no time column: compacted per partition of the layout (no date) --------------------
    "unpartitioned": Shape((create(None), *inserts(THREE)), date=None, time_column=False, files_after=1),
    # eight ids per insert land in both buckets: each bucket gets three small files
    "bucket_only": Shape((create("bucket(2, id)"),
                          *(f"INSERT INTO {{t}} SELECT id, TIMESTAMP '{DATE} 01:00:00', 'v' FROM range({8 * i}, {8 * i + 8})"
                            for i in range(3))), date=None, time_column=False, files_after=2),
    # -- schema evolution between writes of the compacted date -------------------------------
    "add_column": Shape((create("days(ts)"), *inserts(on_date(2)),
                         "ALTER TABLE {t} ADD COLUMN extra DOUBLE",
                         f"INSERT INTO {{t}} VALUES (10, TIMESTAMP '{DATE} 10:00:00', 'v10', 1.5)",
                         f"INSERT INTO {{t}} VALUES (11, TIMESTAMP '{DATE} 11:00:00', 'v11', NULL)")),
    "rename_column": Shape((create("days(ts)"), *inserts(on_date(2)),
                            "ALTER TABLE {t} RENAME COLUMN v TO renamed",
                            f"INSERT INTO {{t}} (id, ts, renamed) VALUES (10, TIMESTAMP '{DATE} 10:00:00', 'r10')",
                            f"INSERT INTO {{t}} (id, ts, renamed) VALUES (11, TIMESTAMP '{DATE} 11:00:00', 'r11')")),
    "drop_column": Shape((create("days(ts)", "id BIGINT, ts TIMESTAMP, v STRING, gone STRING"),
                          *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} 0{i}:00:00', 'v{i}', 'g{i}')"
                            for i in range(2)),
                          "ALTER TABLE {t} DROP COLUMN gone",
                          *inserts(on_date(2, hour0=10), start=10, other=False))),
    "widen_int_to_bigint": Shape((create("days(ts)", "id BIGINT, ts TIMESTAMP, x INT"),
                                  *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} 0{i}:00:00', {2**31 - 1 - i})"
                                    for i in range(2)),
                                  "ALTER TABLE {t} ALTER COLUMN x TYPE BIGINT",
                                  *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} {i}:00:00', {2**40 + i})"
                                    for i in range(10, 12)))),
    "reorder_columns": Shape((create("days(ts)"), *inserts(on_date(2)),
                              "ALTER TABLE {t} ALTER COLUMN v FIRST",
                              "ALTER TABLE {t} ALTER COLUMN ts AFTER v",
                              f"INSERT INTO {{t}} VALUES ('v10', TIMESTAMP '{DATE} 10:00:00', 10)",
                              f"INSERT INTO {{t}} (id, ts, v) VALUES (11, TIMESTAMP '{DATE} 11:00:00', 'v11')")),
    # -- partition evolution both ways -------------------------------------------------------
    "days_to_hours": Shape((create("days(ts)"), *inserts(THREE),
                            "ALTER TABLE {t} REPLACE PARTITION FIELD days(ts) WITH hours(ts)",
                            *inserts([f"{DATE} 20:00:00", f"{DATE} 20:30:00"], start=20, other=False)),
                           files_after=2),
    "hours_to_days": Shape((create("hours(ts)"),
                            *inserts([f"{DATE} 01:00:00", f"{DATE} 01:30:00"]),
                            "ALTER TABLE {t} REPLACE PARTITION FIELD hours(ts) WITH days(ts)",
                            *inserts([f"{DATE} 20:00:00", f"{DATE} 21:00:00", f"{DATE} 22:00:00"], start=20,
                                     other=False)),
                           files_after=2),
    # -- values --------------------------------------------------------------------------------
    "nested_struct_map_array": Shape((
        create("days(ts)", "id BIGINT, ts TIMESTAMP, st STRUCT<a: INT, b: STRING, inner: STRUCT<c: DOUBLE>>, "
                           "m MAP<STRING, INT>, arr ARRAY<DOUBLE>, ms ARRAY<STRUCT<k: STRING, n: MAP<INT, STRING>>>"),
        f"INSERT INTO {{t}} VALUES (0, TIMESTAMP '{DATE} 01:00:00', named_struct('a', 1, 'b', 'x', 'inner', "
        f"named_struct('c', CAST('NaN' AS DOUBLE))), map('k', 1, 'j', 2), array(1.0D, CAST('NaN' AS DOUBLE), NULL), "
        f"array(named_struct('k', 'a', 'n', map(1, 'one'))))",
        f"INSERT INTO {{t}} VALUES (1, TIMESTAMP '{DATE} 02:00:00', named_struct('a', NULL, 'b', NULL, 'inner', NULL), "
        f"map(), array(), array())",
        f"INSERT INTO {{t}} VALUES (2, TIMESTAMP '{DATE} 03:00:00', NULL, NULL, NULL, NULL)",
        f"INSERT INTO {{t}} VALUES (3, TIMESTAMP '{DATE} 04:00:00', named_struct('a', -1, 'b', '', 'inner', "
        f"named_struct('c', -0.0D)), map('z', NULL), array(-0.0D), array(named_struct('k', NULL, 'n', NULL)))")),
    "decimal_binary_nan_nulls": Shape((
        create("days(ts)", "id BIGINT, ts TIMESTAMP, dec DECIMAL(38,10), bin BINARY, d DOUBLE, f FLOAT, s STRING, "
                           "b BOOLEAN"),
        f"INSERT INTO {{t}} VALUES (0, TIMESTAMP '{DATE} 01:00:00', "
        f"CAST('9999999999999999999999999999.9999999999' AS DECIMAL(38,10)), X'00FF10', CAST('NaN' AS DOUBLE), "
        f"CAST('NaN' AS FLOAT), 'a', true)",
        f"INSERT INTO {{t}} VALUES (1, TIMESTAMP '{DATE} 02:00:00', "
        f"CAST('-0.0000000001' AS DECIMAL(38,10)), X'', CAST('-Infinity' AS DOUBLE), CAST('-0.0' AS FLOAT), '', false)",
        # NULL in every column but the time column (the id too)
        f"INSERT INTO {{t}} VALUES (NULL, TIMESTAMP '{DATE} 03:00:00', NULL, NULL, NULL, NULL, NULL, NULL)",
        f"INSERT INTO {{t}} VALUES (3, TIMESTAMP '{DATE} 04:00:00', 0, X'7F', 1.5D, CAST('NaN' AS FLOAT), NULL, NULL)")),
    # -- identifiers ----------------------------------------------------------------------------
    "reserved_and_upper_case_identifiers": Shape((
        create("days(`Timestamp`)",
               "id BIGINT, `Timestamp` TIMESTAMP, `Select` STRING, `ORDER` INT, `Mixed_Case` DOUBLE, `from` STRING"),
        *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} 0{i}:00:00', 'sel{i}', {i * 10}, {i}.5D, 'f{i}')"
          for i in range(3)),
        f"INSERT INTO {{t}} VALUES (9, TIMESTAMP '{OTHER} 01:00:00', 'sel9', 90, 9.5D, 'f9')")),
    # -- table formats and write modes ----------------------------------------------------------
    "format_v1": Shape((create("days(ts)", props="'format-version'='1'"), *inserts(THREE))),
    "copy_on_write_delete": Shape((
        create("days(ts)", props="'format-version'='2', 'write.delete.mode'='copy-on-write'"),
        *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} 0{i}:00:00', 'v{i}'), "
          f"({i + 10}, TIMESTAMP '{DATE} 0{i}:30:00', 'w{i}')" for i in range(4)),
        "DELETE FROM {t} WHERE id = 11")),
    "merge_on_read_delete": Shape((
        create("days(ts)", props="'format-version'='2', 'write.delete.mode'='merge-on-read'"),
        *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} 0{i}:00:00', 'v{i}'), "
          f"({i + 10}, TIMESTAMP '{DATE} 0{i}:30:00', 'w{i}')" for i in range(3)),
        f"INSERT INTO {{t}} VALUES (9, TIMESTAMP '{OTHER} 01:00:00', 'other')",
        "DELETE FROM {t} WHERE id = 11"), applies_deletes=True, files_after=1),
    "write_order": Shape((create("days(ts)"), "ALTER TABLE {t} WRITE ORDERED BY id",
                          *inserts([f"{DATE} 05:00:00", f"{DATE} 03:00:00", f"{DATE} 01:00:00"], start=0))),
    # -- refs -----------------------------------------------------------------------------------
    "branch_and_tag": Shape((create("days(ts)"), *inserts(THREE),
                             "ALTER TABLE {t} CREATE TAG tg",
                             "ALTER TABLE {t} CREATE BRANCH b",
                             f"INSERT INTO {{t}}.branch_b VALUES (50, TIMESTAMP '{DATE} 15:00:00', 'on branch')",
                             *inserts([f"{DATE} 16:00:00"], start=60, other=False)),
                            refs=("b", "tg")),
    # -- nothing to do: noop, nothing touched ---------------------------------------------------
    "empty_date": Shape((create("days(ts)"), *inserts(THREE)), date="2026-01-05", expect=("noop",)),
    "one_large_file": Shape((create("days(ts)"),
                             "INSERT INTO {t} SELECT /*+ COALESCE(1) */ id, TIMESTAMP '2026-01-05 10:00:00', "
                             "concat(sha2(CAST(id AS STRING), 256), sha2(CAST(-id AS STRING), 256)) "
                             "FROM range(0, 30000)",
                             *inserts(THREE)),
                            date="2026-01-05", expect=("noop",), date_files=(1, 0)),
    # -- beyond the brief: shapes real estates hold that the probes above led to ----------------
    # a time field inside a struct (days(st.ts)), alone and shadowed by a top-level column named like its leaf
    "time_column_in_struct": Shape((
        create("days(st.ts)", "id BIGINT, st STRUCT<ts: TIMESTAMP, x INT>"),
        *(f"INSERT INTO {{t}} VALUES ({i}, named_struct('ts', TIMESTAMP '{DATE} 0{i}:00:00', 'x', {i}))"
          for i in range(3))), expect=("run", "refuse")),
    # (3 files of DATE, and 3 files of 2026-01-04 whose top-level `ts` is on DATE)
    "time_column_in_struct_shadowed": Shape((
        create("days(st.ts)", "id BIGINT, ts TIMESTAMP, st STRUCT<ts: TIMESTAMP, x INT>"),
        *(f"INSERT INTO {{t}} VALUES ({i}, TIMESTAMP '{DATE} 0{i}:00:00', "
          f"named_struct('ts', TIMESTAMP '{DATE} 0{i}:00:00', 'x', {i}))" for i in range(3)),
        *(f"INSERT INTO {{t}} VALUES ({i + 10}, TIMESTAMP '{DATE} 0{i}:00:00', "
          f"named_struct('ts', TIMESTAMP '2026-01-04 0{i}:00:00', 'x', {i}))" for i in range(3))),
        expect=("run", "refuse"), files_after=1),
    # a time column whose name is not a plain identifier
    "time_column_not_a_plain_identifier": Shape((
        create("days(`event-time`)", "id BIGINT, `event-time` TIMESTAMP, v STRING"), *inserts(THREE)),
        expect=("run", "refuse")),
    "format_v3": Shape((create("days(ts)", props="'format-version'='3'"), *inserts(THREE))),
    # a row whose time value is NULL lands in the null partition: on no date
    "null_in_time_column": Shape((create("days(ts)"), *inserts(THREE),
                                  "INSERT INTO {t} VALUES (99, NULL, 'no time')")),
}

# Shapes where the product has a bug: the case fails until it is fixed. (The five this matrix found
# first, a time field inside a struct, one shadowed by a top-level column, a time column that is not a
# plain identifier, format v3 and a NULL time value, are fixed or refused in one line.)
KNOWN_BUGS: dict[str, str] = {}


def cases():
    for key, shape in SHAPES.items():
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[key])] if key in KNOWN_BUGS else []
        yield pytest.param(shape, id=key, marks=marks)


# -- independent judges ----------------------------------------------------------------------------

def canonical_rows(arrow) -> list[str]:
    """Every row as text, sorted (NaN reads as 'nan' on both sides; maps keep their entry order)."""
    return sorted(repr(sorted(row.items())) for row in arrow.to_pylist())


@dataclass(frozen=True)
class Picture:
    """What the independent judges see of one snapshot."""

    digest: tuple[int, int]
    rows: int
    ids: list
    canonical: list[str]


def digests(spark, sql: str, versions) -> list[tuple[int, int]]:
    """`full_row_hash` (row count, order-independent hash of every row) of each version, a snapshot id or a ref's
    name, in one Spark job: one query per snapshot pictured cost a job each, and a shape pictures up to five."""
    parts = []
    for i, version in enumerate(versions):
        source = f"SELECT * FROM {sql} VERSION AS OF {version if isinstance(version, int) else repr(version)}"
        schema = spark.sql(source).schema  # the version's own schema (a snapshot's, after schema evolution)
        parts.append(f"SELECT {i} AS k, count(*) AS n, "
                     f"sum(CAST(xxhash64({row_hash_args(schema)}) AS DECIMAL(38,0))) AS h FROM ({source})")
    with own_statements(spark):
        rows = {r["k"]: (int(r["n"]), int(r["h"] or 0)) for r in spark.sql(" UNION ALL ".join(parts)).collect()}
    return [rows[i] for i in range(len(versions))]


def pictures(spark, config, table: str, sql: str, snapshot_ids, id_column: str, ref_names=()) -> list:
    """Each snapshot as both judges see it, Spark's digest (one job for all) and pyiceberg's rows; then the
    digest of each ref named in `ref_names`, read by its name (in the same job)."""
    loaded = CatalogReader(config).load(table)
    out: list = []
    found = digests(spark, sql, [*snapshot_ids, *ref_names])
    for snapshot_id, digest in zip(snapshot_ids, found):
        arrow = loaded.scan(snapshot_id=snapshot_id).to_arrow()
        ids = sorted(arrow.column(id_column).to_pylist(), key=lambda v: (v is None, v if v is not None else 0))
        out.append(Picture(digest, arrow.num_rows, ids, canonical_rows(arrow)))
    return out + found[len(snapshot_ids):]


def refs(config, table: str) -> dict[str, int]:
    """The table's branches and tags (`main` too): name -> snapshot id, read by pyiceberg (Spark's `refs` metadata
    table cost a job, 0.1 CPU-s, and a shape read it five times)."""
    return {name: ref.snapshot_id for name, ref in CatalogReader(config).load(table).metadata.refs.items()}


def main_lineage(config, table: str) -> list[tuple[int, str]]:
    """`main`'s snapshots, newest first: (snapshot id, operation), read by pyiceberg."""
    loaded = CatalogReader(config).load(table)
    out, cursor = [], loaded.metadata.refs["main"].snapshot_id
    while cursor is not None and (snap := loaded.snapshot_by_id(cursor)) is not None:
        out.append((snap.snapshot_id, snap.summary.operation.value))
        cursor = snap.parent_snapshot_id
    return out


def assert_health_adds_up(config, table: str, time_column: bool):
    h = CatalogReader(config).health(table)
    if time_column or h.partitions:
        # every data file is on a date, or counted as undated (a NULL time value)
        assert sum(p.data_files for p in h.partitions) + h.undated_files == h.data_files, \
            [(p.date, p.data_files) for p in h.partitions]
        assert sum(p.records for p in h.partitions) + h.undated_records == h.records, \
            [(p.date, p.records) for p in h.partitions]
    return h


def assert_one_line(outcome, what: str):
    reason = outcome.reason
    assert reason and "\n" not in reason and "Traceback" not in reason, f"{what}: reason is not one line: {reason!r}"


# -- the matrix ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", cases())
def test_shape_compact_expire_rewrite_manifests(spark, config, table_name, shape: Shape):
    sql = TableName.parse(table_name).sql(config.catalog.name)
    with own_statements(spark):
        for statement in shape.statements:
            spark.sql(statement.format(t=sql))

    reader = CatalogReader(config)
    health = assert_health_adds_up(config, table_name, shape.time_column)
    refs_at_start = refs(config, table_name)
    before_snapshot = refs_at_start["main"]
    location = reader.metadata_location(table_name)
    ref_names = sorted(shape.refs)
    assert set(refs_at_start) - {"main"} == set(ref_names), refs_at_start
    before, *ref_pictures = pictures(spark, config, table_name, sql,
                                     [before_snapshot, *(refs_at_start[n] for n in ref_names)], shape.id_column)
    assert before.rows > 0 and before.digest[0] == before.rows
    if shape.date_files is not None:
        part = health.partition(shape.date)
        assert part is not None and (part.data_files, part.small_files) == shape.date_files, part
    refs_before = {name: (refs_at_start[name], seen) for name, seen in zip(ref_names, ref_pictures)}

    # 1. compaction of one date
    compactor = Compactor(config, spark, reader, open_claims(config), open_audit(config))
    outcome = compactor.run(CompactionRequest(table_name, shape.date))
    assert_one_line(outcome, "compaction")
    assert outcome.decision in shape.expect, outcome.reason
    if outcome.decision == "run":
        part = health.partition(shape.period_key or shape.date)
        assert part is not None and part.small_files >= 3, "the shape must have >= 3 small files on its date"
        assert outcome.published and outcome.validation.passed is True, outcome.reason
        assert outcome.rewritten_files >= 2 and outcome.files_after < outcome.files_before, outcome.to_dict()
        # a compaction of one date rewrites only files of that date (of its period)
        assert outcome.rewritten_files <= outcome.files_before, outcome.to_dict()
        if shape.files_after is not None:
            assert outcome.files_after == shape.files_after, outcome.to_dict()
        if shape.applies_deletes:
            assert outcome.delete_files_before >= 1 and outcome.delete_files_after == 0, outcome.to_dict()
        lineage = main_lineage(config, table_name)
        after_snapshot = lineage[0][0]
        assert after_snapshot != before_snapshot
        assert before_snapshot in [sid for sid, _ in lineage], "main moved forward from the snapshot S"
        assert lineage[0][1] == "replace", lineage
        # time travel to the snapshot before compaction still reads the old rows (before expiry removes it)
        assert pictures(spark, config, table_name, sql, [before_snapshot, after_snapshot], shape.id_column) \
            == [before, before]
    else:
        assert not outcome.published and not outcome.committed_snapshot_ids
        assert reader.metadata_location(table_name) == location, "a declined compaction changed the metadata"
        assert refs(config, table_name)["main"] == before_snapshot
    if shape.period_key:
        assert outcome.period_key == shape.period_key, outcome.reason
    assert_health_adds_up(config, table_name, shape.time_column)

    # 2. snapshot expiry: everything but the current snapshot (and the refs' heads)
    housekeeper = Housekeeper(config, spark, reader, open_claims(config), open_audit(config))
    expired = housekeeper.expire(ExpiryRequest(table_name, older_than_seconds=0, retain_last=1))
    assert_one_line(expired, "expiry")
    assert expired.decision in ("run", "noop"), expired.reason

    # 3. manifest rewrite
    manifests = housekeeper.rewrite_manifests(ManifestRequest(table_name, force=True))
    assert_one_line(manifests, "manifests")
    assert manifests.decision in ("run", "noop"), manifests.reason

    # the table reads exactly the rows it held before, by both judges; branches and tags still exist, at the
    # same snapshots, and read their rows (by id, and by name through Spark)
    refs_after = refs(config, table_name)
    for name, (sid, _) in refs_before.items():
        assert refs_after.get(name) == sid, f"ref {name} moved or vanished: {refs_after}"
    final, *rest = pictures(spark, config, table_name, sql, [refs_after["main"], *(sid for sid, _ in refs_before.values())],
                            shape.id_column, ref_names)
    ref_pictures, by_name = rest[:len(ref_names)], rest[len(ref_names):]
    assert final == before
    arrow = CatalogReader(config).load(table_name).scan().to_arrow()
    assert arrow.num_rows == before.rows and canonical_rows(arrow) == before.canonical
    assert_health_adds_up(config, table_name, shape.time_column)
    for (name, (_, seen)), now, (rows_by_name, _) in zip(refs_before.items(), ref_pictures, by_name):
        assert now == seen, f"ref {name} reads other rows"
        assert rows_by_name == seen.rows, f"ref {name} read by name: {rows_by_name} rows, not {seen.rows}"
