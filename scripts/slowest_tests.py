"""The suite's time, kept visible: reads pytest's JUnit XML report and prints the slowest tests, the time per
file, and the run's wall time against CI's budget.

    python scripts/slowest_tests.py REPORT.xml [--top 25] [--budget-s 900] [--wall-s SECONDS]
                                    [--write-durations tests/durations.json]

`--write-durations` records each file's time, which `tests/conftest.py` uses to hand the longest files to the
workers first (whole files are the workers' units of work).

A test's time is its setup, call and teardown together (pytest's `junit_duration_report = total`); under
pytest-xdist the tests of two workers overlap, so their times add up to more than the wall time. Over the
budget it says so on its last line and exits 0: on shared 2-core machines a slow run is more often the
machine's load than the suite's, and the figures above the line say which.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def case_times(report: str) -> list[tuple[float, str, float | None]]:
    """(seconds, node id, CPU seconds or None) of every test case in the report, slowest first. CPU seconds are
    the `cpu_s` property tests/cpu_time.py records: the worker's process tree, subprocesses included."""
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is `tests.test_x` or `tests.test_x.TestClass`: the file is the part up to `test_*`
        path = "/".join(module[:next((i + 1 for i, p in enumerate(module) if p.startswith("test_")), len(module))])
        cpu = next((float(p.get("value") or 0.0) for p in case.iter("property") if p.get("name") == "cpu_s"), None)
        cases.append((float(case.get("time") or 0.0), f"{path}.py::{case.get('name')}", cpu))
    return sorted(cases, key=lambda c: (c[0], c[1]), reverse=True)


def test_times(report: str) -> list[tuple[float, str]]:
    """(seconds, node id) of every test case in the report, slowest first."""
    return [(seconds, node) for seconds, node, _ in case_times(report)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--budget-s", type=float, default=900.0, help="CI's target for the whole run")
    parser.add_argument("--wall-s", type=float, help="the run's wall time, when the caller measured it")
    parser.add_argument("--write-durations", metavar="PATH", help="write each file's seconds as JSON")
    args = parser.parse_args(argv)

    cases = case_times(args.report)
    total = sum(t for t, _, _ in cases)
    print(f"slowest {min(args.top, len(cases))} of {len(cases)} tests (setup + call + teardown; CPU of the "
          f"worker's processes):")
    for seconds, node, cpu in cases[:args.top]:
        print(f"  {seconds:8.1f} s  {_cpu(cpu)}  {node}")
    by_file: dict[str, float] = defaultdict(float)
    cpu_by_file: dict[str, float] = defaultdict(float)
    for seconds, node, cpu in cases:
        by_file[node.split("::", 1)[0]] += seconds
        cpu_by_file[node.split("::", 1)[0]] += cpu or 0.0
    measured = any(cpu is not None for _, _, cpu in cases)
    print("slowest files:")
    for path, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {seconds:8.1f} s  {_cpu(cpu_by_file[path] if measured else None)}  {path}")
    print(f"test time summed over workers: {total:.0f} s")
    if measured:
        # CPU well below the wall time summed: the tests waited (on the machine's other load, or on themselves)
        cpu_total = sum(cpu_by_file.values())
        print(f"CPU time summed over workers: {cpu_total:.0f} s ({cpu_total / total:.2f} of the test time)"
              if total else f"CPU time summed over workers: {cpu_total:.0f} s")
    if args.write_durations:
        ordered = dict(sorted(((path, round(seconds, 1)) for path, seconds in by_file.items()), key=lambda kv: -kv[1]))
        with open(args.write_durations, "w") as out:
            json.dump(ordered, out, indent=0)
            out.write("\n")
    if args.wall_s is not None:
        verdict = "within" if args.wall_s <= args.budget_s else "OVER"
        print(f"wall time {args.wall_s:.0f} s: {verdict} the {args.budget_s:.0f} s budget")
    return 0


def _cpu(seconds: float | None) -> str:
    return f"{seconds:8.1f} CPU-s" if seconds is not None else " " * 14


if __name__ == "__main__":
    sys.exit(main())
