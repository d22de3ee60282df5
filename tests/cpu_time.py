"""Each test's CPU time in the JUnit report (a `cpu_s` property), beside pytest's wall time.

CI's machines differ: the same suite took 951 s on one CI run and 3,685 s on another. Wall time alone cannot say
whether a slow run used more CPU (a slower processor, or a test doing more work) or waited longer (a machine
shared with others, a test waiting on a bound). CPU time is read from /proc for the worker's process and
everything under it (Spark's JVM, subprocesses a test starts, the processes they reaped), so
`scripts/slowest_tests.py` can print both and their ratio.

With `ICEMAINT_TEST_TIMELINE=FILE`, each test also appends a JSON line (its node id, the worker's pid, its start
and end in epoch seconds) to FILE: `scripts/cpu_by_process.py` lays the kernel's process accounting over it to
say which test started which process and what each cost, the ones that left the tree included.

A lower bound: a process that leaves the tree before it ends (reparented to init when its parent is killed, as
`dagster dev`'s daemon and run workers can be) takes its CPU with it, and one that was in the tree when the test
began and left it during the test would make the difference negative (counted as 0).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from benchmarks.machine import tree_cpu_seconds

_STARTED = pytest.StashKey[float]()
_BEGAN = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = tree_cpu_seconds(os.getpid()) or 0.0
    item.stash[_BEGAN] = time.time()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    # Before the teardown's report is made: JUnit XML takes a test's properties from that report.
    if call.when == "teardown" and _STARTED in item.stash:
        used = (tree_cpu_seconds(os.getpid()) or 0.0) - item.stash[_STARTED]
        item.user_properties.append(("cpu_s", round(max(0.0, used), 2)))
        timeline = os.environ.get("ICEMAINT_TEST_TIMELINE")
        if timeline:
            line = {"test": item.nodeid, "worker": os.getpid(), "start": item.stash[_BEGAN], "end": time.time()}
            with open(timeline, "a", encoding="utf-8") as out:  # one short write per line: workers do not interleave
                out.write(json.dumps(line) + "\n")
