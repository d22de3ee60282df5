"""Where the suite's CPU goes, process by process: the kernel's process accounting laid over the tests' timeline.

    rm -f /tmp/suite.timeline; touch /tmp/suite.pacct
    accton /tmp/suite.pacct                                    # as root; `apt-get install acct` provides it
    ICEMAINT_TEST_TIMELINE=/tmp/suite.timeline make test       # appends: start from no file
    accton off
    python scripts/cpu_by_process.py /tmp/suite.pacct --timeline /tmp/suite.timeline [--top 25]

`tests/cpu_time.py` reads a test's CPU from the worker's process tree, which misses what leaves the tree (a daemon
reparented to init) and cannot say what kind of process spent it. The kernel writes one record per process as it
ends (its command, pid, parent, start, CPU), the reparented ones included. This script prints the CPU by command,
the JVMs the suite started and who started them, and per test the processes it started: a test is charged for a
process when the process's ancestry reaches that test's worker and the process started during the test. A process
that outlived the test that started it (a session's Spark JVM, a shared stack) is listed as shared; one whose
ancestry reaches no worker (a parent killed before it, or a process that is not the suite's) as untraced.
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
    """Every record of an accounting file (ValueError: a file of another format; a record cut short at the end,
    as by a copy taken while the kernel writes, is left out)."""
    with open(path, "rb") as f:
        data = f.read()
    procs = []
    for offset in range(0, len(data) - _V3.size + 1, _V3.size):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, etime, utime, stime,
         *_rest, comm) = _V3.unpack_from(data, offset)
        if version & 0x0F != 3:
            raise ValueError(f"{path}: record {offset // _V3.size} is not an acct v3 record (version {version})")
        procs.append(Proc(comm.split(b"\0", 1)[0].decode(errors="replace"), pid, ppid, float(btime),
                          etime / _AHZ, (_comp(utime) + _comp(stime)) / _AHZ))
    return procs


def read_timeline(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


class Ancestry:
    """A process's parent at its start: pids are reused, so the parent is the record with that pid that was alive
    then and started last.

    The kernel records the parent a process has when it ends. A process whose parent ended first was adopted
    by init (ppid 1): a Spark JVM outlives the Python process that started it by a moment, as it notices its
    parent gone. For those the parent is matched by time: of the suite's processes (their recorded parents reach
    a worker) alive when it started and ended at most `ORPHAN_GAP_S` before it, the one that ended last (a guess:
    `adopted` lists them, and the report counts them apart)."""

    ORPHAN_GAP_S = 10.0

    def __init__(self, procs: list[Proc], workers: dict[int, tuple[float, float]]):
        """`workers`: each pytest worker's pid and the span of its tests."""
        self._by_pid: dict[int, list[Proc]] = defaultdict(list)
        for p in procs:
            self._by_pid[p.pid].append(p)
        self._by_end = sorted(procs, key=lambda p: p.end)
        self._ends = [p.end for p in self._by_end]
        self._workers = workers
        self.adopted: set[int] = set()  # id() of the processes whose parent was matched by time

    def is_worker(self, pid: int, at: float) -> bool:
        span = self._workers.get(pid)
        return span is not None and span[0] - 1 <= at <= span[1] + 1

    def parent(self, proc: Proc) -> Proc | None:
        parent = self._by_pid_at(proc)
        if parent is None and proc.ppid == 1:
            return self._adopter(proc)
        return parent

    def _by_pid_at(self, proc: Proc) -> Proc | None:
        alive = [p for p in self._by_pid.get(proc.ppid, ()) if p.start <= proc.start + 1 and p.end >= proc.start - 1]
        return max(alive, key=lambda p: p.start) if alive else None

    def _direct_worker(self, proc: Proc) -> int | None:
        """The worker reached through recorded parents alone (no matching by time)."""
        for _ in range(64):
            if self.is_worker(proc.pid, proc.start):
                return proc.pid
            if self.is_worker(proc.ppid, proc.start):
                return proc.ppid
            parent = self._by_pid_at(proc)
            if parent is None:
                return None
            proc = parent
        return None

    def _adopter(self, proc: Proc) -> Proc | None:
        lo = bisect.bisect_left(self._ends, proc.end - self.ORPHAN_GAP_S)
        hi = bisect.bisect_right(self._ends, proc.end + 1)
        candidates = [p for p in self._by_end[lo:hi]
                      if p is not proc and p.ppid != proc.pid and p.start <= proc.start + 1 and p.end >= proc.start
                      and p.command not in ("sh", "bash") and self._direct_worker(p) is not None]
        if not candidates:
            return None
        self.adopted.add(id(proc))
        return max(candidates, key=lambda p: (p.end, p.start))

    def worker_of(self, proc: Proc) -> int | None:
        """The pytest worker this process descends from (its pid), when the chain can be followed."""
        for _ in range(64):
            if self.is_worker(proc.ppid, proc.start):
                return proc.ppid
            parent = self.parent(proc)
            if parent is None:
                return None
            if self.is_worker(parent.pid, proc.start):  # adopted: matched to the worker itself
                return parent.pid
            proc = parent
        return None


@dataclass
class Charged:
    """Each process of the run, by where it is charged."""

    per_test: dict[str, list[Proc]]
    shared: list[Proc]  # started in a test, outlived it
    untraced: list[Proc]  # no worker found in its ancestry
    workers: list[Proc]  # the pytest workers themselves
    adopted: list[Proc]  # charged through a parent matched by time


def worker_spans(timeline: list[dict]) -> dict[int, tuple[float, float]]:
    spans: dict[int, tuple[float, float]] = {}
    for t in timeline:
        lo, hi = spans.get(t["worker"], (t["start"], t["end"]))
        spans[t["worker"]] = (min(lo, t["start"]), max(hi, t["end"]))
    return spans


def charge(procs: list[Proc], timeline: list[dict]) -> Charged:
    """Each process charged to the test that started it (its ancestry reaches that test's worker, and it started
    during the test: the latest test begun on that worker by then), or as shared, untraced or a worker."""
    spans = worker_spans(timeline)
    by_worker: dict[int, list[dict]] = defaultdict(list)
    for t in sorted(timeline, key=lambda t: t["start"]):
        by_worker[t["worker"]].append(t)
    ancestry = Ancestry(procs, spans)
    out = Charged(defaultdict(list), [], [], [], [])
    for p in procs:
        span = spans.get(p.pid)
        if span is not None and p.start <= span[0] + 1 and p.end >= span[1] - 1:
            out.workers.append(p)  # their own CPU is the Python of every in-process test
            continue
        worker = ancestry.worker_of(p)
        started = [t for t in by_worker.get(worker, ()) if t["start"] - 1 <= p.start] if worker is not None else []
        test = started[-1] if started and p.start <= started[-1]["end"] else None
        if test is None:
            out.untraced.append(p)
        elif p.end > test["end"] + 2:
            out.shared.append(p)
        else:
            out.per_test[test["test"]].append(p)
    untraced = {id(p) for p in out.untraced}
    out.adopted = [p for p in procs if id(p) in ancestry.adopted and id(p) not in untraced]
    return out


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
        charged = charge(procs, timeline)
        per_test, shared, untraced = charged.per_test, charged.shared, charged.untraced
        lines.append(_row(sum(p.cpu for p in charged.workers), len(charged.workers),
                          "the pytest workers' own Python (every test's in-process work)"))
        in_tests = [p for g in per_test.values() for p in g]
        for label, group in (("charged to the test that started them", in_tests),
                             ("shared: outlived the test that started them", shared),
                             ("untraced: no worker in their ancestry (a parent killed first, or not the suite's)",
                              untraced)):
            group_jvms = [p for p in group if p.command == "java"]
            lines.append(_row(sum(p.cpu for p in group), len(group), label) + f"  ({_by_command(group)}; "
                         f"{len(group_jvms)} JVMs, {sum(p.cpu for p in group_jvms):.0f} CPU-s)")
        lines.append(_row(sum(p.cpu for p in charged.adopted), len(charged.adopted),
                          "of those charged or shared, traced through a parent matched by time (orphans)"))
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
    except ValueError as exc:  # not accounting records, or a timeline line that is not JSON
        print(f"cpu_by_process: {exc}", file=sys.stderr)
        return 2
    print(report(procs, timeline, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
