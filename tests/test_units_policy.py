"""Units, policy keys, table and column names, and date scopes: the checks user text passes before SQL."""

from __future__ import annotations

import datetime as dt
from dataclasses import fields

import pytest

from icemaint.domain.names import InvalidTableName, TableName, check_column, quote_column
from icemaint.domain.policy import POLICY_KEYS, PolicyError, TablePolicy, apply_overrides
from icemaint.domain.scope import DateScope, InvalidDate, parse_date
from icemaint.domain.units import format_duration, parse_duration, parse_size


@pytest.mark.parametrize("text, seconds", [
    ("30m", 1800.0), ("72h", 259200.0), ("7d", 604800.0), ("45s", 45.0), ("1w", 604800.0),
    ("1.5h", 5400.0), (" 10 m ", 600.0), ("0s", 0.0), (90, 90.0), (2.5, 2.5), (0, 0.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text, message", [
    ("5 fortnights", "is not a duration"), ("72", "is not a duration"), ("h", "is not a duration"),
    ("7D", "is not a duration"), ("", "is not a duration"), ("1e3s", "is not a duration"),
    (True, "is not a duration"), (None, "is not a duration"), (float("nan"), "finite"),
    (-1, "negative"), ("-30m", "negative"), (-0.5, "negative"),
])
def test_parse_duration_refuses(text, message):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert message in str(info.value) and repr(text) in str(info.value)


@pytest.mark.parametrize("text, size", [
    ("128MiB", 128 * 2**20), ("512MB", 512 * 10**6), ("1GiB", 2**30), ("2KB", 2000), ("10B", 10),
    ("4096", 4096), (4096, 4096), ("0.5MiB", 2**19), (" 8 KiB ", 8192),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text, message", [
    ("128 mib", "is not a size"), ("12 parsecs", "is not a size"), ("MiB", "is not a size"),
    (False, "is not a size"), ("-1MiB", "negative"), (-5, "negative"), (float("inf"), "finite"),
])
def test_parse_size_refuses(text, message):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    assert message in str(info.value)


@pytest.mark.parametrize("seconds, text", [(86400, "1d"), (7200, "2h"), (90, "90s"), (600, "10m"), (0.5, "0.5s")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_every_policy_key_names_a_policy_field():
    names = {f.name for f in fields(TablePolicy)}
    assert {attr for attr, _ in POLICY_KEYS.values()} <= names


@pytest.mark.parametrize("key, value, attr, parsed", [
    ("writer_idle", "10m", "writer_idle_seconds", 600.0),
    ("hot_partition_age", "2h", "hot_partition_age_seconds", 7200.0),
    ("snapshot_older_than", "7d", "snapshot_older_than_seconds", 604800.0),
    ("max_rewrite_bytes", "1GiB", "max_rewrite_bytes", 2**30),
    ("allowed_operations", ["compact", "expire"], "allowed_operations", frozenset({"compact", "expire"})),
    ("allowed_identities", ["alice"], "allowed_identities", frozenset({"alice"})),
    ("time_column", "event_ts", "time_column", "event_ts"),
    ("owner", None, "owner", None),
    ("sample_fraction", 1, "sample_fraction", 1.0),
])
def test_apply_overrides_parses_each_kind(key, value, attr, parsed):
    assert getattr(apply_overrides(TablePolicy(), {key: value}, "t"), attr) == parsed


@pytest.mark.parametrize("overrides, message", [
    ({"enabled": None}, "t.enabled: None is not a boolean"),
    ({"enabled": "yes"}, "t.enabled: 'yes' is not a boolean"),
    ({"sample_fraction": 0}, "t.sample_fraction: 0 is not a fraction in (0, 1]"),
    ({"allowed_identities": "alice"}, "t.allowed_identities: 'alice' is not a list of identity names"),
    ({"max_commit_retries": 1.5}, "t.max_commit_retries: 1.5 is not a whole number"),
])
def test_apply_overrides_refuses(overrides, message):
    with pytest.raises(PolicyError) as info:
        apply_overrides(TablePolicy(), overrides, "t")
    assert message in str(info.value)


def test_policy_allows():
    open_policy = TablePolicy()
    assert open_policy.allows_operation("compact") and open_policy.allows_identity("anyone")
    closed = TablePolicy(allowed_operations=frozenset({"expire"}), allowed_identities=frozenset({"alice"}))
    assert not closed.allows_operation("compact") and closed.allows_operation("expire")
    assert not closed.allows_identity("bob") and closed.allows_identity("alice")


@pytest.mark.parametrize("text, namespace, name, sql, arg", [
    ("a.b", ("a",), "b", "`lake`.`a`.`b`", "'a.b'"),
    ("a.b.c", ("a", "b"), "c", "`lake`.`a`.`b`.`c`", "'a.b.c'"),
    ("_x.T_1", ("_x",), "T_1", "`lake`.`_x`.`T_1`", "'_x.T_1'"),
])
def test_table_name_accepts(text, namespace, name, sql, arg):
    parsed = TableName.parse(text)
    assert (parsed.namespace, parsed.name, parsed.key, str(parsed)) == (namespace, name, text, text)
    assert parsed.sql("lake") == sql
    assert parsed.procedure_arg() == arg


@pytest.mark.parametrize("text, message", [
    ("", "is empty"), (None, "is empty"), ("a", "has no namespace"),
    ("a.b;drop", "part 'b;drop'"), ("a.b'", "part \"b'\""), ("a/b.c", "part 'a/b'"),
    ("../x.y", "part ''"), ("a. b", "part ' b'"), ("a.b\n", "part 'b\\n'"), ("a..b", "part ''"),
    ("a.`b`", "part '`b`'"), ("1a.b", "part '1a'"), ("a.b c", "part 'b c'"),
])
def test_table_name_refuses(text, message):
    with pytest.raises(InvalidTableName) as info:
        TableName.parse(text)
    assert message in str(info.value)


@pytest.mark.parametrize("name, ok", [
    ("ts", True), ("event_ts_2", True), ("_c", True), ("ts\n", False), ("a b", False), ("a`b", False),
    ("1ts", False), ("", False), ("ts;", False),
])
def test_columns(name, ok):
    if ok:
        assert quote_column(name) == f"`{name}`"
    else:
        with pytest.raises(ValueError, match="is not a plain identifier"):
            check_column(name)


START = dt.date(2024, 1, 1)


@pytest.mark.parametrize("text, expected", [
    ("2024-06-01", dt.date(2024, 6, 1)), ("2024-01-01", START), ("2024-02-29", dt.date(2024, 2, 29)),
])
def test_parse_date_valid(text, expected):
    assert parse_date(text, START, dt.date(2024, 12, 31)) == expected


@pytest.mark.parametrize("text, message", [
    ("2024-6-1", "not a calendar date in the form YYYY-MM-DD"),
    ("2023-02-29", "not a calendar date"),
    ("20240601", "not a calendar date"),
    ("2024-W01-1", "not a calendar date"),
    ("2024-06-01'; --", "not a calendar date"),
    ("", "not a calendar date"),
    (None, "not a calendar date"),
    ("2023-12-31", "before the maintained range, which starts at 2024-01-01 (dates_start)"),
    ("2025-01-01", "after the maintained range, which ends at 2024-12-31"),
])
def test_parse_date_refuses(text, message):
    with pytest.raises(InvalidDate) as info:
        parse_date(text, START, dt.date(2024, 12, 31))
    assert message in str(info.value)


@pytest.mark.parametrize("column_type, predicate", [
    ("date", "`day` = DATE '2024-06-01'"),
    ("timestamp", "`day` >= TIMESTAMP_NTZ '2024-06-01 00:00:00' AND `day` < TIMESTAMP_NTZ '2024-06-02 00:00:00'"),
    ("timestamptz", "`day` >= TIMESTAMP '2024-06-01 00:00:00' AND `day` < TIMESTAMP '2024-06-02 00:00:00'"),
    ("timestamp_ns", "`day` >= TIMESTAMP_NTZ '2024-06-01 00:00:00' AND `day` < TIMESTAMP_NTZ '2024-06-02 00:00:00'"),
])
def test_date_scope_predicate(column_type, predicate):
    assert DateScope("day", column_type, dt.date(2024, 6, 1)).predicate() == predicate


def test_date_scope_month_end_and_ends_at():
    scope = DateScope("ts", "timestamp", dt.date(2024, 12, 31))
    assert "< TIMESTAMP_NTZ '2025-01-01 00:00:00'" in scope.predicate()
    assert scope.ends_at == dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("column, column_type, message", [
    ("ts", "string", "has type string; a date scope needs a date or timestamp"),
    ("ts", "long", "has type long"),
    ("ts`; drop", "date", "is not a plain identifier"),
])
def test_date_scope_refuses(column, column_type, message):
    with pytest.raises(ValueError) as info:
        DateScope(column, column_type, dt.date(2024, 6, 1)).predicate()
    assert message in str(info.value)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (35.7492, "36s"), (60, "1m"), (100, "1.7m"), (5400, "1.5h"),
                                           (604800, "7d"), (1_000_000, "11.6d"), (-30, "-30s")])
def test_human_duration(seconds, text):
    from icemaint.domain.units import human_duration

    assert human_duration(seconds) == text


@pytest.mark.parametrize("size, text", [(0, "0 B"), (512, "512 B"), (8388608, "8 MiB"), (1.5 * 2**30, "1.5 GiB"),
                                        (300 * 1024, "300 KiB")])
def test_human_size(size, text):
    from icemaint.domain.units import human_size

    assert human_size(size) == text
