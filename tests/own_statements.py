"""The tests' own Spark statements (building tables, reading them back to judge) without adaptive query execution.

AQE re-plans every stage of every query: on the tiny tables of the tests that costs more than it can win. Measured
warm on 2 cores: a whole-table digest 0.17 -> 0.10 CPU-s, a CREATE with three INSERTs 0.37 -> 0.24. The product's
own runs (compaction, expiry, manifest rewrite) keep the session's settings: they are what is under test.
"""

from __future__ import annotations

from contextlib import contextmanager

ADAPTIVE = "spark.sql.adaptive.enabled"


@contextmanager
def own_statements(spark):
    """Within: the session runs without AQE; after, as it was (call it from the thread that runs the test)."""
    previous = spark.conf.get(ADAPTIVE)
    spark.conf.set(ADAPTIVE, "false")
    try:
        yield
    finally:
        spark.conf.set(ADAPTIVE, previous)
