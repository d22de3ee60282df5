"""Where the suite's CPU goes, process by process: the kernel's process accounting laid over the tests' timeline.

    accton /tmp/suite.pacct                                    # as root; `apt-get install acct` provides it
    ICEMAINT_TEST_TIMELINE=/tmp/suite.timeline make test
    accton off
    python scripts/cpu_by_process.py /tmp/suite.pacct --timeline /tmp/suite.timeline [--top 25]

`tests/cpu_time.py` reads a test's CPU from the worker's process tree, which misses what leaves the tree (a daemon
reparented to init) and cannot say what kind of process spent it. The kernel writes one record per process as it
ends (its command, pid, parent, start, CPU), the reparented ones included. This script prints the CPU by command,
the JVMs the suite started and who started them, and per test the processes it started: a test is charged for a
process when the process's ancestry reaches that test's worker and the process started during the test. A process
that outlived the test that started it (a session's Spark JVM, a shared stack) is listed as shared.
"""

from __future__ import annotations

import argparse
import bisect
import json
import struct
import sys
from collections import defaultdict
from dataclasses import dataclass

_V3 = struct.Struct("<BBHIIIIIIf8H16s")  # linux/acct.h's struct acct_v3: 64 bytes
_AHZ = 100.0  # the accounting clock's ticks per second


@dataclass(frozen=True)
class Proc:
    command: str
    pid: int
    ppid: int
    start: float  # epoch seconds (whole seconds: the record's resolution)
    elapsed: float
    cpu: float  # user + system seconds, the process's threads summed

    @property
    def end(self) -> float:
        return self.start + self.elapsed


def _comp(value: int) -> float:
    """A `comp_t`: 13 bits of mantissa, 3 of base-8 exponent."""
    return float((value & 0x1FFF) << (3 * ((value >> 13) & 0x7)))


def read_pacct(path: str) -> list[Proc]:
    data = open(path, "rb").read()
    procs = []
    for offset in range(0, len(data) - _V3.size + 1, _V3.size):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, etime, utime, stime,
         *_rest, comm) = _V3.unpack_from(data, offset)
        if version & 0x0F != 3:
            raise SystemExit(f"{path}: record {offset // _V3.size} is not an acct v3 record (version {version})")
        procs.append(Proc(comm.split(b"\0", 1)[0].decode(errors="replace"), pid, ppid, float(btime),
                          etime / _AHZ, (_comp(utime) + _comp(stime)) / _AHZ))
    return procs


def read_timeline(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


class Ancestry:
    """A process's parent at its start: pids are reused, so the parent is the record with that pid alive then.

    The kernel records the parent a process has when it ends. A process whose parent ended first was adopted
    by init (ppid 1): a Spark JVM outlives the Python process that started it by a moment, as it notices its
    parent gone. For those the parent is matched by time: the process alive when it started that ended last
    before it, within `ORPHAN_GAP_S` (a guess, counted apart in the report)."""

    ORPHAN_GAP_S = 10.0

    def __init__(self, procs: list[Proc]):
        self._by_pid: dict[int, list[Proc]] = defaultdict(list)
        for p in procs:
            self._by_pid[p.pid].append(p)
        self._by_end = sorted(procs, key=lambda p: p.end)
        self._ends = [p.end for p in self._by_end]

    def parent(self, proc: Proc) -> Proc | None:
        alive = [p for p in self._by_pid.get(proc.ppid, ()) if p.start <= proc.start + 1 and p.end >= proc.start - 1]
        if alive:
            return min(alive, key=lambda p: p.elapsed)
        return self._adopter(proc) if proc.ppid == 1 else None

    def _adopter(self, proc: Proc) -> Proc | None:
        """The process that ended last before `proc`, within the gap, and was alive when `proc` started."""
        lo = bisect.bisect_left(self._ends, proc.end - self.ORPHAN_GAP_S)
        hi = bisect.bisect_right(self._ends, proc.end + 1)
        candidates = [p for p in self._by_end[lo:hi]
                      if p is not proc and p.start <= proc.start + 1 and p.end >= proc.start - 1
                      and p.command not in ("sh", "bash")]
        return max(candidates, key=lambda p: (p.end, -p.elapsed)) if candidates else None

    def worker_of(self, proc: Proc, workers: set[int]) -> int | None:
        """The pytest worker this process descends from (its pid), when the chain can be followed."""
        for _ in range(64):
            if proc.ppid in workers:
                return proc.ppid
            parent = self.parent(proc)
            if parent is None:
                return None
            if parent.pid in workers:  # adopted: matched to the worker itself
                return parent.pid
            proc = parent
        return None


def charge(procs: list[Proc], timeline: list[dict]) -> tuple[dict[str, list[Proc]], list[Proc], list[Proc]]:
    """(test -> the processes it started and that ended within it, shared processes, unattributed ones)."""
    workers = {t["worker"] for t in timeline}
    by_worker: dict[int, list[dict]] = defaultdict(list)
    for t in timeline:
        by_worker[t["worker"]].append(t)
    ancestry = Ancestry(procs)
    per_test: dict[str, list[Proc]] = defaultdict(list)
    shared, unattributed = [], []
    for p in procs:
        if p.pid in workers:
            continue  # the workers themselves: their own CPU is the Python of every test
        worker = ancestry.worker_of(p, workers)
        test = None if worker is None else next(
            (t for t in by_worker.get(worker, ()) if t["start"] - 1 <= p.start <= t["end"]), None)
        if test is None:
            unattributed.append(p)
        elif p.end > test["end"] + 2:
            shared.append(p)
        else:
            per_test[test["test"]].append(p)
    return per_test, shared, unattributed


def _by_command(group: list[Proc], most: int = 3) -> str:
    """The commands that spent most of a group's CPU: `java 12.0, python3 3.1`."""
    spent: dict[str, float] = defaultdict(float)
    for p in group:
        spent[p.command] += p.cpu
    return ", ".join(f"{c} {v:.1f}" for c, v in sorted(spent.items(), key=lambda kv: -kv[1])[:most])


def _row(cpu: float, n: int, label: str) -> str:
    return f"  {cpu:9.1f} CPU-s  {n:5d}  {label}"


def report(procs: list[Proc], timeline: list[dict] | None, top: int) -> str:
    lines = [f"{len(procs)} processes ended, {sum(p.cpu for p in procs):.0f} CPU-s in all", "by command:"]
    by_command: dict[str, list[Proc]] = defaultdict(list)
    for p in procs:
        by_command[p.command].append(p)
    for command, group in sorted(by_command.items(), key=lambda kv: -sum(p.cpu for p in kv[1]))[:top]:
        lines.append(_row(sum(p.cpu for p in group), len(group), command))
    if timeline:
        per_test, shared, unattributed = charge(procs, timeline)
        workers = {t["worker"] for t in timeline}
        own = [p for p in procs if p.pid in workers and p.elapsed > 60]
        lines.append(_row(sum(p.cpu for p in own), len(own), "the pytest workers' own Python (every test's in-process work)"))
        java = [p for p in procs if p.command == "java"]
        lines.append(f"JVMs: {len(java)}, {sum(p.cpu for p in java):.0f} CPU-s; started inside a test and ended with it: "
                     f"{sum(1 for g in per_test.values() for p in g if p.command == 'java')}")
        lines.append(_row(sum(p.cpu for p in shared), len(shared), "shared: outlived the test that started them")
                     + f"  ({_by_command(shared)})")
        lines.append(_row(sum(p.cpu for p in unattributed), len(unattributed),
                          "unattributed: no worker in their ancestry (reparented, or started outside a test)")
                     + f"  ({_by_command(unattributed)})")
        lines.append("tests by the CPU of the processes they started (processes, JVMs among them):")
        ranked = sorted(per_test.items(), key=lambda kv: -sum(p.cpu for p in kv[1]))
        for test, group in ranked[:top]:
            jvms = sum(1 for p in group if p.command == "java")
            lines.append(f"  {sum(p.cpu for p in group):9.1f} CPU-s  {len(group):5d}  {jvms:3d} JVM  {test}  "
                         f"({_by_command(group)})")
        by_file: dict[str, list[Proc]] = defaultdict(list)
        for test, group in per_test.items():
            by_file[test.split("::", 1)[0]].extend(group)
        lines.append("files by the CPU of the processes their tests started:")
        for path, group in sorted(by_file.items(), key=lambda kv: -sum(p.cpu for p in kv[1]))[:top]:
            jvms = sum(1 for p in group if p.command == "java")
            lines.append(f"  {sum(p.cpu for p in group):9.1f} CPU-s  {len(group):5d}  {jvms:3d} JVM  {path}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pacct", help="the file `accton` wrote")
    parser.add_argument("--timeline", help="the file ICEMAINT_TEST_TIMELINE named during the run")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        procs = read_pacct(args.pacct)
        timeline = read_timeline(args.timeline) if args.timeline else None
    except OSError as exc:
        print(f"cpu_by_process: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    print(report(procs, timeline, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
