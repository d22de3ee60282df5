"""Landing sources without Spark: which files form a batch, its id, the exactly-once decision, and the config's
one-line errors."""

from __future__ import annotations

import datetime as dt

import pytest

from conftest import make_config
from icemaint.config.parse import ConfigError
from icemaint.domain.landing import BATCH_ID_KEY, Batch, LandedFile, LandingSource, choose_batch, due, find_batch, \
    ignored, processed_due

NOW = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.timezone.utc)
SOURCE = LandingSource("events", "/land", "parquet", "t.events", min_files=3, min_bytes=1000, max_age_seconds=600,
                       max_files=2)


def landed(name: str, size: int = 10, age: float = 1.0) -> LandedFile:
    return LandedFile(NOW.timestamp() - age, name, size)


@pytest.mark.parametrize("files, is_due, words", [
    ([], False, "no landed files"),
    ([landed("a"), landed("b")], False, "below every threshold"),
    ([landed("a"), landed("b"), landed("c")], True, "min_files"),
    ([landed("a", size=1000)], True, "min_bytes"),
    ([landed("a", age=601)], True, "max_age"),
])
def test_a_batch_is_due_when_any_threshold_passes(files, is_due, words):
    verdict = due(files, SOURCE, NOW)
    assert verdict.due is is_due and words in verdict.reason


def test_the_oldest_files_form_the_batch_capped_and_its_id_is_deterministic():
    files = [landed("c", age=1), landed("a", age=3), landed("b", age=2), landed("_tmp/x", age=9)]
    batch = choose_batch(files, SOURCE)
    assert batch is not None and [f.name for f in batch.files] == ["a", "b"]
    assert batch.batch_id == choose_batch(list(reversed(files)), SOURCE).batch_id
    assert batch.batch_id != Batch("other", batch.files).batch_id
    assert batch.batch_id != Batch("events", (landed("a", age=3), landed("b", size=11, age=2))).batch_id
    assert Batch.from_dict(batch.to_dict()) == batch
    assert choose_batch([], SOURCE) is None


@pytest.mark.parametrize("name, skipped", [("a.parquet", False), ("d/a.parquet", False), (".a.parquet", True),
                                           ("_processed/a.parquet", True), ("a.parquet.tmp", True), ("x/_y/a", True)])
def test_hidden_in_progress_and_processed_files_are_not_landed(name, skipped):
    assert ignored(name) is skipped


def test_a_batch_on_main_is_found_by_its_id():
    lineage = [(3, {"other": "x"}), (2, {BATCH_ID_KEY: "abc"}), (1, {})]
    assert find_batch("abc", lineage) == 2
    assert find_batch("abd", lineage) is None


def test_processed_files_are_purged_only_when_configured():
    old, new = landed("a", age=90_000), landed("b", age=10)
    assert processed_due([old, new], SOURCE, NOW) == []
    keep = LandingSource("e", "/l", "parquet", "t.e", delete_processed_after_seconds=86_400)
    assert processed_due([old, new], keep, NOW) == [old]


def test_a_landing_source_is_parsed_with_units(tmp_path):
    config = make_config(tmp_path, landing={"events": {
        "location": "in", "table": "iot.events", "min_bytes": "8 MiB", "max_age": "2m", "target_file_size": "256 MiB",
        "delete_processed_after": "7d", "format": "csv", "schema": {"id": "long", "ts": "timestamp"}}})
    source = config.landing["events"]
    assert source.location == str(tmp_path / "in") and source.table == "iot.events"
    assert (source.min_bytes, source.max_age_seconds, source.target_file_size) == (8 << 20, 120, 256 << 20)
    assert source.delete_processed_after_seconds == 7 * 86400 and source.schema == (("id", "long"), ("ts", "timestamp"))
    assert source.processed_location == f"{tmp_path / 'in'}/_processed"


@pytest.mark.parametrize("landing, error", [
    ({"9x": {"location": "in", "table": "a.b"}}, "landing.9x: a source's name"),
    ({"s": {"table": "a.b"}}, "landing.s.location: required"),
    ({"s": {"location": "in"}}, "landing.s.table: required"),
    ({"s": {"location": "in", "table": "nodot"}}, "landing.s.table"),
    ({"s": {"location": "in", "table": "a.b", "format": "xml"}}, "landing.s.format: 'xml' is not allowed"),
    ({"s": {"location": "in", "table": "a.b", "format": "jsonl"}}, "landing.s.schema: required for format 'jsonl'"),
    ({"s": {"location": "in", "table": "a.b", "format": "csv", "schema": {"id": "uuid"}}}, "landing.s.schema.id"),
    ({"s": {"location": "in", "table": "a.b", "min_files": 0}}, "landing.s.min_files"),
    ({"s": {"location": "in", "table": "a.b", "min_bytes": "lots"}}, "landing.s.min_bytes"),
    ({"s": {"location": "in", "table": "a.b", "max_age": "soon"}}, "landing.s.max_age"),
    ({"s": {"location": "in", "table": "a.b", "processed": "in"}}, "landing.s.processed: is the landing location"),
    ({"s": {"location": "ftp://x/y", "table": "a.b"}}, "landing.s.location"),
    ({"s": {"location": "in", "table": "a.b", "colour": 1}}, "landing.s.colour: unknown key"),
])
def test_a_bad_landing_source_is_one_line_naming_the_key(tmp_path, landing, error):
    with pytest.raises(ConfigError) as exc:
        make_config(tmp_path, landing=landing)
    assert error in str(exc.value) and "\n" not in str(exc.value)


def test_the_sensor_cursor_counts_new_names_and_resets_when_a_run_is_due():
    from icemaint.domain.landing import ListingCursor, advance

    cursor, verdict, request = advance(ListingCursor(), [landed("a"), landed("b")], SOURCE, NOW)
    assert not verdict.due and not request and (cursor.after, cursor.files) == ("b", 2)
    cursor = ListingCursor.from_dict(cursor.to_dict())
    held, verdict, request = advance(cursor, [landed("c")], SOURCE, NOW, in_flight=True)
    assert verdict.due and not request and (held.after, held.files) == ("c", 3)  # a run of it is in flight: counting
    cursor, verdict, request = advance(cursor, [landed("c")], SOURCE, NOW)
    assert verdict.due and request and "min_files" in verdict.reason
    assert cursor == ListingCursor()  # requested: the next tick lists everything once (what the run left included)
    cursor, verdict, request = advance(ListingCursor("c"), [], SOURCE, NOW)
    assert not verdict.due and cursor == ListingCursor("c")


def test_the_how_to_configuration_parses(tmp_path):
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).parent.parent / "docs" / "how-to" / "landing.md").read_text()
    doc = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    config = make_config(tmp_path, landing=doc["landing"])
    assert config.landing["app_logs"].location == "s3://landing/app-logs"
    assert config.landing["sensor_events"].delete_processed_after_seconds == 7 * 86400


def test_a_batch_whose_snapshot_expired_is_found_by_the_table_property():
    from icemaint.domain.landing import batch_committed, last_batch_property

    batch = Batch("events", (landed("a"),))
    assert batch_committed(batch, [(5, {BATCH_ID_KEY: batch.batch_id})], {}) == (True, 5)
    assert batch_committed(batch, [(6, {})], {last_batch_property("events"): batch.batch_id}) == (True, None)
    assert batch_committed(batch, [(6, {})], {last_batch_property("other"): batch.batch_id}) == (False, None)


def test_an_append_lists_its_files_and_a_retry_moves_only_those_landed_before_its_commit():
    from icemaint.domain.landing import FILES_KEY, SOURCE_KEY, append_summary, appended_leftovers, decode_files, \
        encode_files, newest_batch

    files = (LandedFile(100.0, "a/1.parquet", 10), LandedFile(101.0, "b\tc.parquet", 20))
    batch = Batch("events", files)
    summary = append_summary(batch, "p")
    assert decode_files(summary[FILES_KEY]) == {"a/1.parquet": 10, "b\tc.parquet": 20}
    lineage = [(9, {}), (8, summary), (7, {**summary, BATCH_ID_KEY: "older"}), (6, {SOURCE_KEY: "other"})]
    assert newest_batch("events", lineage) == (8, summary) and newest_batch("nope", lineage) is None
    landed_now = [LandedFile(100.0, "a/1.parquet", 10),  # the batch's own, never moved
                  LandedFile(101.0, "b\tc.parquet", 21),  # same name, another size: a new file
                  LandedFile(500.0, "z.parquet", 5)]  # a newcomer
    assert appended_leftovers(landed_now, summary, committed_ms=200_000) == landed_now[:1]
    # landed again under the same name and size after the commit: a new file, appended as such
    assert appended_leftovers([LandedFile(300.0, "a/1.parquet", 10)], summary, committed_ms=200_000) == []
    assert decode_files("not base64!") == {} and appended_leftovers(landed_now, {}, 10**15) == []
    many = [LandedFile(1.0, f"{i:09d}-{i * 7919 % 10**9:09d}.parquet", i) for i in range(60_000)]
    assert encode_files(many) is None and FILES_KEY not in append_summary(Batch("events", tuple(many)), "p")


@pytest.mark.parametrize("arrow, spark, ok", [
    ("int32", "bigint", True), ("int64", "int", False), ("float", "double", True), ("string", "bigint", False),
    ("timestamp_tz", "timestamp", True), ("timestamp_tz", "timestamp_ntz", False), ("decimal", "decimal(10,2)", True),
    ("list", "array<int>", True), ("struct", "struct<a:int>", True), ("list", "map<string,int>", False),
])
def test_a_landed_column_is_checked_against_the_table_type(arrow, spark, ok):
    import pyarrow as pa

    from icemaint.engine.landing import _arrow_compatible

    types = {"int32": pa.int32(), "int64": pa.int64(), "float": pa.float32(), "string": pa.string(),
             "timestamp_tz": pa.timestamp("us", tz="UTC"), "decimal": pa.decimal128(10, 2),
             "list": pa.list_(pa.int32()), "struct": pa.struct([("a", pa.int32())])}
    assert _arrow_compatible(types[arrow], spark) is ok


def test_a_name_that_lands_out_of_order_is_counted_by_the_next_whole_listing():
    """The listing position skips names sorting before it; a whole listing every `relist_seconds` (the source's
    max_age, 1 min .. 1 h) recounts from scratch, so a late name before the position waits a bounded time."""
    import datetime as dt

    from icemaint.domain.landing import ListingCursor, advance, listing_after, relist_seconds

    source = LandingSource("events", "/land", "parquet", "t.events", min_files=3, max_age_seconds=600)
    assert relist_seconds(source) == 600
    assert relist_seconds(LandingSource("e", "/l", "parquet", "t.e", max_age_seconds=5)) == 60
    assert relist_seconds(LandingSource("e", "/l", "parquet", "t.e", max_age_seconds=86_400)) == 3600

    def present(names, age=1.0):  # the landing area at a time: name -> file
        return [landed(n, age=age) for n in names]

    def tick(cursor, files, now):  # what the sensor does: list from `listing_after`, then advance
        after = listing_after(cursor, source, now)
        return advance(cursor, [f for f in files if after is None or f.name > after], source, now,
                       whole=after is None)

    cursor, verdict, request = tick(ListingCursor(), present(["b", "c"]), NOW)  # never listed: a whole listing
    assert (cursor.after, cursor.files, cursor.listed_all_at, request) == ("c", 2, NOW.timestamp(), False)
    later = NOW + dt.timedelta(seconds=30)
    cursor, verdict, request = tick(cursor, present(["a", "b", "c"]), later)  # "a" sorts before "c": not seen yet
    assert (cursor.files, request) == (2, False) and listing_after(cursor, source, later) == "c"
    relist = NOW + dt.timedelta(seconds=600)
    assert listing_after(cursor, source, relist) is None
    cursor, verdict, request = tick(cursor, present(["a", "b", "c"]), relist)  # the whole listing counts it
    assert request and "3 files >= min_files 3" in verdict.reason and cursor == ListingCursor()
    # a whole listing replaces the counts: files moved away meanwhile are not counted twice
    counted, _, _ = advance(ListingCursor("z", files=9, bytes=90, oldest_mtime=1.0, listed_all_at=0.0),
                            present(["a"]), source, NOW, whole=True)
    assert (counted.after, counted.files, counted.bytes) == ("a", 1, 10) and counted.oldest_mtime > 1.0
    assert ListingCursor.from_dict(counted.to_dict()) == counted
    assert ListingCursor.from_dict({"after": "x", "files": 1}) == ListingCursor("x", 1)  # a cursor from before
