"""CI's report of the suite's time (scripts/slowest_tests.py) reads pytest's JUnit XML as pytest writes it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def report_module():
    spec = importlib.util.spec_from_file_location("slowest_tests", ROOT / "scripts" / "slowest_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_report_ranks_pytests_own_junit_xml_and_says_when_over_budget(tmp_path):
    (tmp_path / "test_pace.py").write_text(textwrap.dedent("""
        import time
        import pytest

        def test_slow():
            time.sleep(0.3)

        def test_quick():
            pass

        class TestGroup:
            @pytest.mark.parametrize("n", [1])
            def test_in_a_class(self, n):
                time.sleep(0.1)
    """))
    xml = tmp_path / "junit.xml"
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                          "--rootdir", str(tmp_path), str(tmp_path / "test_pace.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # no Dagster plugin: seconds
    assert ran.returncode == 0, ran.stdout + ran.stderr

    times = report_module().test_times(str(xml))
    assert [node for _, node in times] == ["test_pace.py::test_slow", "test_pace.py::test_in_a_class[1]",
                                           "test_pace.py::test_quick"]
    assert times[0][0] >= 0.3

    printed = subprocess.run([sys.executable, str(ROOT / "scripts" / "slowest_tests.py"), str(xml), "--top", "2",
                              "--wall-s", "1000", "--budget-s", "900"], capture_output=True, text=True, timeout=60)
    lines = printed.stdout.splitlines()
    assert printed.returncode == 0 and lines[0].startswith("slowest 2 of 3 tests (setup + call + teardown"), \
        printed.stdout
    assert not any(line.startswith("CPU time") for line in lines), "no CPU figures where none were recorded"
    assert lines[1].endswith("test_pace.py::test_slow") and lines[-1] == "wall time 1000 s: OVER the 900 s budget"

    durations = tmp_path / "durations.json"
    written = subprocess.run([sys.executable, str(ROOT / "scripts" / "slowest_tests.py"), str(xml), "--top", "0",
                              "--write-durations", str(durations)], capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    import json

    recorded = json.loads(durations.read_text())
    assert list(recorded) == ["test_pace.py"] and recorded["test_pace.py"] >= 0.4, recorded


def test_each_tests_cpu_time_counts_its_subprocesses_and_not_its_waiting(tmp_path):
    """tests/cpu_time.py's `cpu_s`: a test busy in a subprocess is charged for it, a sleeping test is not."""
    (tmp_path / "test_burn.py").write_text(textwrap.dedent("""
        import subprocess, sys, time

        def test_busy_in_a_child():
            subprocess.run([sys.executable, "-c",
                            "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"],
                           check=True)

        def test_asleep():
            time.sleep(0.6)
    """))
    xml = tmp_path / "junit.xml"
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "cpu_time",
                          f"--junitxml={xml}", "--rootdir", str(tmp_path), str(tmp_path / "test_burn.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                              "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])})
    assert ran.returncode == 0, ran.stdout + ran.stderr

    cases = {node.split("::")[1]: (seconds, cpu) for seconds, node, cpu in report_module().case_times(str(xml))}
    assert cases["test_busy_in_a_child"][1] >= 0.5, cases
    assert cases["test_asleep"][0] >= 0.6 and cases["test_asleep"][1] < 0.3, cases
    printed = subprocess.run([sys.executable, str(ROOT / "scripts" / "slowest_tests.py"), str(xml)],
                             capture_output=True, text=True, timeout=60)
    assert "CPU-s  test_burn.py::test_busy_in_a_child" in printed.stdout, printed.stdout
    assert any(line.startswith("CPU time summed over workers: ") for line in printed.stdout.splitlines()), \
        printed.stdout


def test_the_suite_hands_out_the_longest_recorded_files_first():
    """conftest orders the collection by each file's recorded time (the workers' units are whole files)."""
    import json

    import conftest

    recorded = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert recorded and all(path.startswith("tests/test_") for path in recorded), "durations.json names test files"

    class Item:
        def __init__(self, nodeid, cluster=False):
            self.nodeid, self.fixturenames, self._cluster = nodeid, (), cluster

        def get_closest_marker(self, name):
            return object() if name == "cluster" and self._cluster else None

        def add_marker(self, marker):
            pass

    slowest, quickest = max(recorded, key=recorded.get), min(recorded, key=recorded.get)
    items = [Item(f"{quickest}::a"), Item("tests/test_not_recorded.py::b"), Item(f"{slowest}::c"),
             Item("tests/test_cluster.py::d", cluster=True)]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid.split("::")[1] for i in items] == ["d", "c", "b", "a"]
