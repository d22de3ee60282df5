"""scripts/cpu_by_process.py: the kernel's accounting records (acct v3, as Linux writes them) charged to tests.

The records are packed here in the kernel's layout rather than written by `accton`, which needs root and a
package CI does not install; the parsing, the ancestry through reused pids and the charging are what is tested.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def script():
    spec = importlib.util.spec_from_file_location("cpu_by_process", ROOT / "scripts" / "cpu_by_process.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def comp_t(ticks: int) -> int:
    """The kernel's `comp_t` for a tick count: 13 bits of mantissa, 3 of base-8 exponent."""
    exponent = 0
    while ticks > 0x1FFF:
        ticks >>= 3
        exponent += 1
    return (exponent << 13) | ticks


def record(command: str, pid: int, ppid: int, start: int, elapsed_s: float, cpu_s: float) -> bytes:
    ticks = int(cpu_s * 100)
    return struct.pack("<BBHIIIIIIf8H16s", 0, 3, 0, 0, 0, 0, pid, ppid, start, elapsed_s * 100,
                       comp_t(ticks), 0, 0, 0, 0, 0, 0, 0, command.encode())


def test_processes_are_charged_to_the_test_that_started_them_through_reused_pids(tmp_path):
    worker, other = 500, 501  # two pytest workers
    pacct = tmp_path / "suite.pacct"
    pacct.write_bytes(b"".join([
        # test A (t 1000-1010): a CLI subprocess (pid 600) that starts a JVM (pid 601)
        record("python", 600, worker, 1001, 8.0, 2.5),
        record("java", 601, 600, 1002, 6.0, 12.0),
        # test B on the other worker (t 1010-1030): pid 600 reused, its JVM; and a session JVM that outlives it
        record("python", 600, other, 1012, 5.0, 1.0),
        record("java", 602, 600, 1013, 3.0, 8192.0),  # large enough for comp_t's exponent
        record("java", 700, worker, 1015, 500.0, 300.0),
        # a daemon reparented to init long after its parent: no worker in its ancestry
        record("java", 800, 1, 1005, 20.0, 7.0),
        # an orphan: a CLI (pid 900) under test A starts a JVM (pid 901) that outlives it by a moment and ends as
        # init's child; an unrelated process (pid 950, not the suite's) alive then ends between the two
        record("python", 900, worker, 1002, 6.0, 3.0),
        record("java", 901, 1, 1003, 5.5, 4.0),
        record("python", 950, 77, 1001, 8.3, 0.5),
        record("pytest", worker, 1, 990, 600.0, 40.0),
    ]))
    timeline = tmp_path / "suite.timeline"
    timeline.write_text("\n".join(json.dumps(t) for t in [
        {"test": "tests/test_a.py::test_a", "worker": worker, "start": 1000.0, "end": 1010.0},
        {"test": "tests/test_b.py::test_b", "worker": other, "start": 1010.5, "end": 1030.0},
        {"test": "tests/test_c.py::test_c", "worker": worker, "start": 1010.5, "end": 1030.0},
    ]) + "\n")
    module = script()
    procs = module.read_pacct(str(pacct))
    assert [p.command for p in procs][:2] == ["python", "java"]
    assert procs[3].cpu == 8192.0 and procs[1].elapsed == 6.0

    charged = module.charge(procs, module.read_timeline(str(timeline)))
    per_test = charged.per_test
    # the orphan JVM is matched to the CLI that started last among those alive at its start, not to pid 950
    assert sorted((p.pid, p.cpu) for p in per_test["tests/test_a.py::test_a"]) == [
        (600, 2.5), (601, 12.0), (900, 3.0), (901, 4.0)]
    assert [p.pid for p in charged.adopted] == [901]
    # the second pid 600 is the other worker's: its JVM is charged to test B, not to test C on the first worker
    assert sorted((p.pid, p.cpu) for p in per_test["tests/test_b.py::test_b"]) == [(600, 1.0), (602, 8192.0)]
    assert "tests/test_c.py::test_c" not in per_test
    assert [p.pid for p in charged.shared] == [700]
    assert sorted(p.pid for p in charged.untraced) == [800, 950]
    assert [p.pid for p in charged.workers] == [worker]

    text = module.report(procs, module.read_timeline(str(timeline)), top=10)
    assert "charged to the test that started them  (java 8208.0, python 6.5; 3 JVMs, 8208 CPU-s)" in text, text
    assert text.index("tests/test_b.py::test_b") < text.index("tests/test_a.py::test_a")


def test_a_file_that_is_not_process_accounting_is_refused_in_one_line(tmp_path, capsys):
    bad = tmp_path / "not.pacct"
    bad.write_bytes(b"x" * 64)
    assert script().main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "is not an acct v3 record" in err and err.count("\n") == 1, err
