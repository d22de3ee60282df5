"""Planning a staged rewrite (pure): which files are rewritten, in which groups, in what order."""

import random

import pytest

from icemaint.domain.rewrite_plan import CandidateFile, SortKey, SortOrderError, next_fit_splits, order_by_sql, \
    parse_sort_order, plan_groups, read_splits, zorder_sql

MiB = 2**20


def f(path, size_mib, part="d=1", deletes=0, spec=0):
    return CandidateFile(path=path, size_bytes=int(size_mib * MiB), record_count=10, spec_id=spec, partition=part,
                         delete_files=deletes)


def plan(files, partial=False, max_group=100 * MiB):
    return plan_groups(files, small_file_size_bytes=4 * MiB, delete_file_threshold=1, partial_progress=partial,
                       max_group_bytes=max_group)


def paths(groups):
    return [[x.path for x in g.files] for g in groups]


def test_small_files_of_a_partition_are_rewritten_together_and_large_ones_stay():
    assert paths(plan([f("a", 1), f("b", 2), f("big", 64)])) == [["a", "b"]]


def test_a_lone_small_file_is_left_unless_it_carries_deletes():
    assert plan([f("a", 1), f("big", 64)]) == []
    assert paths(plan([f("a", 1, deletes=2), f("big", 64, deletes=0)])) == [["a"]]
    assert paths(plan([f("big", 64, deletes=1)])) == [["big"]]  # deletes are applied even on a large file


def test_each_spec_and_partition_is_its_own_bin_but_one_publish_without_partial_progress():
    files = [f("a", 1, "h=1"), f("b", 1, "h=1"), f("c", 1, "h=2"), f("old", 1, "d=1", spec=0),
             f("new", 1, "d=1", spec=1)]
    # h=2, and d=1 under each spec, hold one small file each: not worth a rewrite
    assert paths(plan(files)) == [["a", "b"]]


def test_partial_progress_splits_a_date_into_groups_each_published_alone():
    files = [f(str(i), 3) for i in range(6)]
    groups = plan(files, partial=True, max_group=7 * MiB)
    assert paths(groups) == [["0", "1"], ["2", "3"], ["4", "5"]]
    assert all(g.total_bytes <= 7 * MiB for g in groups)


@pytest.mark.parametrize("text, strategy, keys", [
    ("id", "sort", (SortKey("id"),)),
    ("id DESC NULLS LAST, ts", "sort", (SortKey("id", True, False), SortKey("ts"))),
    ("a asc nulls first", "sort", (SortKey("a", False, True),)),
    ("zorder(a, b)", "zorder", (SortKey("a"), SortKey("b"))),
    ("a, b", "zorder", (SortKey("a"), SortKey("b"))),
])
def test_sort_orders_parse(text, strategy, keys):
    assert parse_sort_order(text, strategy) == keys


@pytest.mark.parametrize("text, strategy", [
    ("id; DROP TABLE x", "sort"), ("id DESC DESC", "sort"), ("(SELECT 1)", "sort"), ("a DESC", "zorder"),
    ("", "sort"),
])
def test_bad_sort_orders_are_refused(text, strategy):
    with pytest.raises(SortOrderError):
        parse_sort_order(text, strategy)


def test_order_by_quotes_columns():
    assert order_by_sql((SortKey("id", True, False), SortKey("ts"))) == "`id` DESC NULLS LAST, `ts` ASC"


def test_zorder_interleaves_bits_of_every_column():
    expr = zorder_sql((SortKey("a"), SortKey("b")), {"a": "number", "b": "time"}, {"a": (0, 10), "b": (5, 5)})
    assert "shiftleft(shiftright(" in expr and ", 0)" in expr and ", 1)" in expr
    assert "CAST(0 AS BIGINT)" in expr  # a column without a range contributes no bits


def test_each_spec_is_written_as_its_own_group():
    files = [f("o1", 1, "d=1", spec=0), f("o2", 1, "d=1", spec=0), f("n1", 1, "h=1", spec=1), f("n2", 1, "h=1", spec=1)]
    groups = plan(files)
    assert paths(groups) == [["o1", "o2"], ["n1", "n2"]] and [g.spec_id for g in groups] == [0, 1]


# -- read splits --------------------------------------------------------------------------------------

def test_read_splits_make_no_more_tasks_than_output_files_where_a_plain_share_made_one_more():
    sizes = [20_971] * 54  # the nightly estate's date: 54 files, 5 outputs of a 256 KiB target
    old_share = sum(sizes) // 5 + 1
    assert next_fit_splits(sizes, old_share) == 6  # the sixth split wrote a 61 KB file
    splits = read_splits(sizes, sum(sizes), 256 * 1024)
    assert (splits.files, splits.lookback) == (5, 1)
    assert next_fit_splits(sizes, splits.split_bytes) == 5
    assert next_fit_splits(sizes, splits.split_bytes - 1) > 5  # the smallest split that does it
    assert splits.split_bytes == 11 * 20_971 and splits.writer_target == 256 * 1024 * 7 // 5


def test_read_splits_hold_their_bound_on_uneven_sizes_and_give_the_writer_room_past_the_split():
    rng = random.Random(7)
    for _ in range(300):
        target = rng.choice([100, 1_000, 128 * 2**20])
        sizes = [rng.randint(1, max(1, target // rng.choice([2, 3, 10, 50]))) for _ in range(rng.randint(1, 400))]
        splits = read_splits(sizes, sum(sizes), target)
        if splits.lookback is None:  # one output, or a file above a share: the plain share, as before
            assert splits.files == 1 or max(sizes) > sum(sizes) // splits.files + 1
            continue
        assert next_fit_splits(sizes, splits.split_bytes) <= splits.files, (sizes, target)
        assert splits.writer_target == max(target + 2 * target // 5, splits.split_bytes) >= max(sizes)


def test_a_file_above_a_share_keeps_the_plain_share_for_iceberg_to_cut_at_row_groups():
    splits = read_splits([1_000, 10, 10], 1_020, 400)
    assert (splits.files, splits.split_bytes, splits.writer_target, splits.lookback) == (3, 341, 560, None)


def test_zorder_scales_a_range_as_wide_as_the_doubles_without_overflow_and_ignores_non_finite_bounds():
    import math
    import re

    widest = zorder_sql((SortKey("d"),), {"d": "number"}, {"d": (-1.7976931348623157e308, 1.7976931348623157e308)})
    literals = [float(x) for x in re.findall(r"\((-?[0-9.]+e[+-]?[0-9]+|-?[0-9.]+)\)", widest)]
    assert literals and all(math.isfinite(x) for x in literals) and "inf" not in widest and "nan" not in widest
    for bounds in [(float("-inf"), 1.0), (0.0, float("nan")), (None, 2.0)]:
        assert zorder_sql((SortKey("d"),), {"d": "number"}, {"d": bounds}).count("CAST(0 AS BIGINT)") > 0


COLUMNS = {"event_id": "long", "ts": "timestamptz", "payload": "string", "price": "decimal(10, 2)",
           "flag": "boolean", "st": "struct<1: x: optional int>", "st.x": "int", "tags": "list<string>",
           "attrs": "map<string, string>"}


@pytest.mark.parametrize("strategy, sort_order, problem", [
    ("binpack", None, None),
    ("sort", "event_id DESC NULLS LAST, ts", None),
    ("sort", "EVENT_ID, Ts", None),  # Spark resolves a sort key in any case
    ("zorder", "zorder(event_id, ts, payload, price)", None),
    ("sort", "event_id, no_such", "'no_such' is not a column of the table (attrs, event_id, flag, payload, price, st, tags, ts)"),
    ("zorder", "event_id, nope", "'nope' is not a column"),
    ("zorder", "EVENT_ID, ts", "must name a top-level column exactly as the table does ('event_id')"),
    ("zorder", "ts, st", "'st' has type struct"),
    ("zorder", "ts, flag", "'flag' has type boolean; z-order takes numbers"),
    ("zorder", "ts, tags", "'tags' has type list<string>"),
    ("sort", "attrs", "'attrs' has type map<string, string>, which Spark cannot order by"),
])
def test_a_sort_order_is_checked_against_the_tables_columns(strategy, sort_order, problem):
    from icemaint.domain.rewrite_plan import sort_order_problem

    found = sort_order_problem(COLUMNS, strategy, sort_order)
    assert (found is None) if problem is None else (problem in (found or "")), found
