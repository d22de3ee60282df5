"""The proof's guard against unstable reads: a pass never comes from the second read.

`prove_rows` reads each side once; only when the two disagree are both read again (with a hash sum per
column, to name what differs). Sides that disagreed on the first read and agree on the second are not
stable, so nothing is proven: the proof fails on `column_aggregates`, whatever the second read says.
"""

from __future__ import annotations

from icemaint.engine.validation import COLUMN_AGGREGATES, RowSet, prove_rows

SCHEMA = "id BIGINT, v STRING, amount DOUBLE"
ROWS = [(i, f"v{i}", i * 1.5) for i in range(200)]
CHANGED = [(i, "changed" if i == 7 else v, a) for i, v, a in ROWS]  # the same rows, one value changed
UNSTABLE = "not stable"


class CountingRows:
    """A row set's `load`: `first` on the first call, `later` on every call after it; counts the calls."""

    def __init__(self, spark, first: list[tuple], later: list[tuple]):
        self.spark, self.first, self.later, self.calls = spark, first, later, 0

    def __call__(self):
        self.calls += 1
        return self.spark.createDataFrame(self.first if self.calls == 1 else self.later, SCHEMA)


def prove(before_load, after_load):
    return prove_rows(RowSet(1, before_load, "before"), RowSet(2, after_load, "after"), sample_fraction=1.0,
                      what="rows")


def test_sides_that_agree_only_when_read_again_fail_the_proof(spark):
    before = CountingRows(spark, ROWS, ROWS)
    after = CountingRows(spark, CHANGED, ROWS)  # one value differs on the first read only

    result = prove(before, after)

    assert after.calls >= 2 and before.calls >= 2, (before.calls, after.calls)  # both sides were read again
    assert result.passed is False
    failed = [c for c in result.checks if not c.passed]
    assert [c.name for c in failed] == [COLUMN_AGGREGATES], [(c.name, c.observed) for c in result.checks]
    assert UNSTABLE in failed[0].observed["error"], failed[0].observed
    assert "disagreed when first read and agreed when read again" in failed[0].observed["error"]
    # the second read agreed: no aggregate differs, the failure is the guard's alone
    assert failed[0].observed["differing_aggregates"] == []


def test_stable_equal_sides_pass(spark):
    before = CountingRows(spark, ROWS, ROWS)
    after = CountingRows(spark, ROWS, ROWS)

    result = prove(before, after)

    assert result.passed is True, [(c.name, c.observed) for c in result.checks]
    assert (before.calls, after.calls) == (1, 1)  # a passing proof reads each side once
    assert all("error" not in c.observed for c in result.checks)


def test_sides_that_differ_on_every_read_fail_without_the_unstable_error(spark):
    before = CountingRows(spark, ROWS, ROWS)
    after = CountingRows(spark, CHANGED, CHANGED)

    result = prove(before, after)

    assert result.passed is False
    aggregates = result.check(COLUMN_AGGREGATES)
    assert not aggregates.passed and aggregates.observed["differing_aggregates"], aggregates.observed
    assert UNSTABLE not in aggregates.observed.get("error", ""), aggregates.observed
