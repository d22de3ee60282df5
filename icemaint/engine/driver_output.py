"""What the driver JVM prints (spark-submit's Ivy resolution, a GC log, a crash report), kept readable.

The JVM writes into a pipe that a thread reads: every line goes to <state_dir>/logs/jvm.log; while the JVM
starts, lines are held back, and shown on the command's standard error once it has started (what the
terminal always showed). When it exits before it started, the held lines say why (an unresolved
`spark.jars.packages` coordinate took ~115 lines of Ivy output ending in JAVA_GATEWAY_EXITED): the caller
reads them (`DriverOutput.lines`) and says it in one line, the rest stays in the log.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

# spark-submit's last word on a failed resolution: "[unresolved dependency: org.x#y;1: not found, ...]".
_UNRESOLVED = re.compile(r"unresolved dependency: ([^#\s\[\],]+)#([^;\s\],]+);([^:\s\],]+)")
DRAIN_TIMEOUT_S = 5.0


def unresolved_packages(lines: list[str]) -> list[str]:
    """The Maven coordinates (`group:artifact:version`) Ivy could not resolve, in order, once each."""
    found = [":".join(m.groups()) for line in lines for m in _UNRESOLVED.finditer(line)]
    return list(dict.fromkeys(found))


class DriverOutput:
    """A pipe for the driver JVM's standard output and error, read by a daemon thread for the JVM's life."""

    def __init__(self, logs: Path):
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / "jvm.log"
        self.lines: list[str] = []  # held while the JVM starts
        self._started = False
        self._lock = threading.Lock()
        self._stderr = os.dup(2)  # the terminal as it is now: a Dagster run later points descriptor 2 at its logs
        read, self.write_fd = os.pipe()
        self._reader = threading.Thread(target=self._pump, args=(read,), name="icemaint-jvm-output", daemon=True)
        self._reader.start()

    def _pump(self, read: int) -> None:
        with os.fdopen(read, "rb") as pipe, self.log_path.open("ab") as log:
            for raw in pipe:
                log.write(raw)
                log.flush()
                with self._lock:
                    if not self._started:
                        self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                        continue
                _write(self._stderr, raw)

    def started(self) -> None:
        """The JVM answered: show what it printed while starting, and from now on each line as it comes."""
        os.close(self.write_fd)  # the JVM holds its own copy
        with self._lock:
            self._started = True
            held, self.lines = self.lines, []
        if held:
            _write(self._stderr, ("\n".join(held) + "\n").encode())

    def exited(self) -> list[str]:
        """The JVM exited before it started: every line it printed (also in the log)."""
        os.close(self.write_fd)
        self._reader.join(DRAIN_TIMEOUT_S)
        with self._lock:
            return list(self.lines)


def _write(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)
    except OSError:  # the terminal is gone: the log has it
        pass


def last_words(lines: list[str]) -> str:
    """The line of a failed start that says most: the last exception or error line, else the last line."""
    said = [line.strip() for line in lines if line.strip() and not line.startswith(("\tat ", "  at "))]
    errors = [line for line in said if "Exception" in line or line.lower().startswith("error")]
    return (errors or said or [""])[-1]
