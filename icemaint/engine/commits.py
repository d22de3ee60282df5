"""A table commit made again until it lands: which failure only lost a race, how long to wait, and the loops.

The staged commit (`icemaint.engine.staging`: a branch and its append) and the publish (`icemaint.engine.publish`: the
pending `replace`) each build one attempt on the fresh table; `commit_racing` repeats it while it only loses races.
A change of the refs alone (a staging branch removed) is made again by `commit_ref_change`.
"""

from __future__ import annotations

import logging
import time

from icemaint.engine.java import COMMIT_FAILED, CONFLICT_CLASSES, java_exception_class, one_java_line, sequence_number_race

log = logging.getLogger(__name__)

# A publish that loses races waits this long before its next attempt, at most (jittered, doubling from 50 ms):
# short beside a streaming writer's interval, so an attempt is made in the writer's next gap.
MAX_RACE_BACKOFF_SECONDS = 2.0


def publish_race(exc: BaseException) -> bool:
    """A commit lost only a race: another commit landed first and nothing conflicts (the catalog refused the swap, or
    Iceberg's own retries of it are spent), or a REST catalog refused it for the sequence-number race. Made again on
    the fresh table, it lands; a `ValidationException` (a real conflict) is not one."""
    return java_exception_class(exc) == COMMIT_FAILED or sequence_number_race(exc)


def race_backoff(attempt: int) -> float:
    """Seconds to wait after the `attempt`-th lost race: doubling from 50 ms up to MAX_RACE_BACKOFF_SECONDS,
    jittered by +-50% so two maintainers (or a writer's own retry) do not meet again in step."""
    import random

    return min(0.05 * 2 ** (attempt - 1), MAX_RACE_BACKOFF_SECONDS) * random.uniform(0.5, 1.5)


def publish_backoff(attempt: int) -> float:
    """Seconds to wait after the publish's `attempt`-th lost race: next to none (0-50 ms, jittered). A lost race means
    a commit landed during the attempt, so the next writer's commit is most of its interval away: the best moment
    to try again, and an attempt reuses its pending rewrite (`icemaint.engine.publish`), so it costs a refresh and a
    metadata write. A doubling backoff would start attempts at random points of the writer's cycle instead."""
    import random

    return random.uniform(0.0, 0.05)


def commit_racing(attempt, what: str, table: str, timeout_seconds: float, sleep=time.sleep,
                  backoff=race_backoff) -> list[float]:
    """Runs `attempt()` (one commit of `table`, built on the fresh table) until it lands; the seconds of each try.

    A try that lost only a race (`publish_race`: another commit landed first, nothing conflicts) is made again
    with jittered backoff until `timeout_seconds` have passed; then, or on any other error, the error goes up
    with `.attempts` set. Iceberg's own retry of a transaction cannot re-apply a ref change (it fails with
    "Table metadata refresh is required" at the first race): for the staged commit (a branch and its append,
    cheap to build again) this loop is the retry; for the publish it is the only one (each attempt one `apply()` and
    swap of the pending rewrite, `icemaint.engine.publish`), with `publish_backoff`."""
    started, attempts = time.monotonic(), []
    while True:
        t0 = time.monotonic()
        try:
            attempt()
        except Exception as exc:
            attempts.append(round(time.monotonic() - t0, 4))
            if publish_race(exc) and time.monotonic() - started < timeout_seconds:
                log.info("%s of %s lost a race (attempt %d, %.2fs), committing again: %s", what, table,
                         len(attempts), attempts[-1], one_java_line(exc))
                sleep(backoff(len(attempts)))
                continue
            setattr(exc, "attempts", tuple(attempts))  # noqa: B010 (an attribute Exception does not declare)
            raise
        attempts.append(round(time.monotonic() - t0, 4))
        return attempts


def commit_ref_change(fresh_table, change, attempts: int = 6) -> None:
    """Commits a change of a table's refs, built by `change(table)` (None: nothing to change) on `fresh_table()`, the
    table read again, which it is each time a writer's commit got in first.

    A branch change touches no data, so it is simply retried on the fresh table (Hadoop tables raise
    `CommitFailedException: Table metadata refresh is required` when another commit landed meanwhile).
    """
    from py4j.protocol import Py4JJavaError

    for attempt in range(1, attempts + 1):
        update = change(fresh_table())
        if update is None:
            return
        try:
            update.commit()
            return
        except Py4JJavaError as exc:
            if java_exception_class(exc) not in CONFLICT_CLASSES or attempt == attempts:
                raise
            time.sleep(0.05 * attempt)
