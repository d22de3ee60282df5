"""A long-lived process's memory: what it reads of itself and its JVM, and the C heap's free pages handed back.

`icemaint serve` reads these after every tick (its tick line and /metrics-style JSON carry them) and trims the heap
then. Measured (docs/operations/serve.md): over serve's ticks the Python objects in use stay flat, while glibc's
malloc keeps the pages that the tick's threads freed (fragmented arenas: free chunks it does not return on its
own), so the resident set grew ~1.3 MiB a tick; `malloc_trim` after each tick gives most of them back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from pathlib import Path
from typing import Any


def rss_bytes(pid: int) -> int | None:
    """A process's resident set size (Linux /proc), or None where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def jvm_pid(spark) -> int | None:
    """The driver JVM's process id, as the JVM itself says it."""
    try:
        return int(spark._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # noqa: BLE001 - a session without a local JVM (Spark Connect): no pid to measure
        return None


def jvm_heap(spark) -> dict[str, int]:
    """The JVM heap's committed and maximum bytes: its RSS grows as the collector commits heap up to the maximum
    (`spark.driver.memory`), which is growth toward a bound, not a leak."""
    try:
        runtime = spark._jvm.java.lang.Runtime.getRuntime()
        return {"jvm_heap_committed_bytes": int(runtime.totalMemory()), "jvm_heap_max_bytes": int(runtime.maxMemory())}
    except Exception:  # noqa: BLE001 - no session or no local JVM: nothing to report
        return {}


@functools.cache
def _malloc_trim() -> Any:
    """glibc's `malloc_trim`, or None where the C library is not glibc (musl, macOS): nothing to trim there."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_heap() -> int | None:
    """Hands this process's free C heap pages back to the system; the resident bytes that released (None: no glibc,
    or the resident set could not be read). Costs a walk of malloc's free lists: milliseconds, once a tick."""
    trim = _malloc_trim()
    if trim is None:
        return None
    before = rss_bytes(os.getpid())
    trim(0)
    after = rss_bytes(os.getpid())
    return None if before is None or after is None else max(before - after, 0)
