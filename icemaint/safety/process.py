"""A process as another process can check it later (pid, host and start), and the probe that says
whether it still runs: how an interrupted call or run is told from one still under way.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping


class ProcessState(str, Enum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"  # on another host, or no way to tell here


_PROC = Path("/proc")


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a Linux process; None when there is none."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields_ = text.rsplit(")", 1)[1].split()  # the command name (in parentheses) may hold spaces
    return fields_[0], int(fields_[19])


def _boot_id() -> str | None:
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None


def _boot_time() -> float | None:
    try:
        for line in (_PROC / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return None


_CURRENT: dict[int, "ProcessRef"] = {}


@dataclass(frozen=True)
class ProcessRef:
    """A process as another process can check it later: pid and host, plus how to tell a reused pid.

    `start` ("<boot id>:<start ticks>", Linux) identifies the process exactly; without it, `existed_at`
    (epoch seconds at which the process is known to have run, e.g. an event it wrote) rules out a
    process that started later under the same pid.
    """

    pid: int
    host: str | None = None
    start: str | None = None
    existed_at: float | None = None

    @classmethod
    def current(cls) -> "ProcessRef":
        """This process (read from /proc once per process: every run under the contract names it)."""
        pid = os.getpid()  # a forked child is another process: keyed by pid
        found = _CURRENT.get(pid)
        if found is None:
            stat, boot = _proc_stat(pid), _boot_id()
            found = _CURRENT[pid] = cls(pid, socket.gethostname(), f"{boot}:{stat[1]}" if stat and boot else None)
        return found

    def to_dict(self) -> dict:
        return {"pid": self.pid, "host": self.host, "start": self.start}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "ProcessRef | None":
        if not isinstance(data, Mapping) or isinstance(data.get("pid"), bool) or not isinstance(data.get("pid"), int):
            return None
        return cls(data["pid"], data.get("host"), data.get("start"))

    def describe(self) -> str:
        return f"pid {self.pid}" + (f" on {self.host}" if self.host else "")

    def probe(self) -> tuple[ProcessState, str]:
        """Whether the process still runs, and why we say so.

        DEAD only on proof: no process has the pid, it is a zombie, the host rebooted since, or the pid
        belongs to a process that started later. A process on another host is UNKNOWN, never DEAD.
        """
        here = socket.gethostname()
        if self.host and self.host != here:
            return ProcessState.UNKNOWN, f"{self.describe()} runs on another host than this one ({here})"
        if not _PROC.joinpath("self").exists():  # no procfs: existence only, a reused pid looks alive
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return ProcessState.DEAD, f"no process has pid {self.pid}"
            except PermissionError:
                pass
            return ProcessState.ALIVE, f"a process with pid {self.pid} exists"
        stat = _proc_stat(self.pid)
        if stat is None:
            return ProcessState.DEAD, f"no process has pid {self.pid}"
        state, ticks = stat
        if state in ("Z", "X"):
            return ProcessState.DEAD, f"pid {self.pid} has exited (a zombie)"
        if self.start:
            boot, _, started = self.start.partition(":")
            if boot != _boot_id():
                return ProcessState.DEAD, f"the host has rebooted since {self.describe()} ran"
            if started != str(ticks):
                return ProcessState.DEAD, f"pid {self.pid} now belongs to another process (started later)"
        elif self.existed_at is not None:
            booted = _boot_time()
            # btime is whole seconds: allow 2 s before calling a process younger than the evidence
            if booted is not None and booted + ticks / os.sysconf("SC_CLK_TCK") > self.existed_at + 2:
                return ProcessState.DEAD, f"pid {self.pid} now belongs to another process (started later)"
        return ProcessState.ALIVE, f"{self.describe()} is running"


Probe = Callable[[ProcessRef], tuple[ProcessState, str]]


def probe_process(ref: ProcessRef) -> tuple[ProcessState, str]:
    return ref.probe()
