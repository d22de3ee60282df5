"""The machine and software a benchmark ran on: cores, memory, CPU model, load, versions."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib import metadata


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in open("/proc/meminfo", encoding="utf-8"):
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _package(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _java_version(spark) -> str:
    if spark is not None:
        system = spark.sparkContext._jvm.java.lang.System
        return f"{system.getProperty('java.version')} ({system.getProperty('java.vm.name')})"
    out = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "([^"]+)"', out)
    return match.group(1) if match else "unknown"


def _iceberg_version(spark) -> str:
    if spark is None:
        return "unknown"
    try:
        return str(spark.sparkContext._jvm.org.apache.iceberg.IcebergBuild.version())
    except Exception:  # an older runtime without IcebergBuild: fall back to the jar's name
        return os.path.basename(spark.conf.get("spark.jars", "")).split(",")[0]


def load_average() -> tuple[float, float, float] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


def describe_machine(spark=None) -> dict:
    """Cores, memory, CPU model, OS and the versions that matter for the figures."""
    return {
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "cpu_model": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "java": _java_version(spark),
        "spark": spark.version if spark is not None else _package("pyspark"),
        "spark_master": spark.sparkContext.master if spark is not None else None,
        "iceberg": _iceberg_version(spark),
        "pyiceberg": _package("pyiceberg"),
        "pyarrow": _package("pyarrow"),
        "great_expectations": _package("great-expectations"),
        "dagster": _package("dagster"),
    }


# ---------------------------------------------------------------------------------------------
# Concurrent load: CPU used by processes outside this benchmark while it measures.


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def _busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine spent busy since boot (all cores; /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...
    busy = sum(fields[:3]) + sum(fields[5:8])
    return busy / _clock_ticks()


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds used by `root` and its live descendants (and the children they have reaped)."""
    stats: dict[int, tuple[int, float]] = {}
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            rest = text[text.rindex(")") + 2:].split()
            ppid = int(rest[1])
            utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
            stats[int(entry)] = (ppid, (utime + stime + cutime + cstime) / _clock_ticks())
    except OSError:
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


class CpuShare:
    """`with CpuShare() as cpu: ...` then `cpu.result`: busy CPU of the machine, ours, and others'.

    Others' = machine busy - this process tree's; a measure of concurrent load during a section
    (test runs or other jobs sharing the cores), in CPU seconds and average cores.
    """

    def __enter__(self) -> "CpuShare":
        import time

        self._t = time.perf_counter()
        self._busy = _busy_cpu_seconds()
        self._ours = tree_cpu_seconds(os.getpid())
        self.result: dict = {}
        return self

    def __exit__(self, *exc) -> None:
        import time

        wall = time.perf_counter() - self._t
        busy, ours = _busy_cpu_seconds(), tree_cpu_seconds(os.getpid())
        if None in (busy, ours, self._busy, self._ours) or wall <= 0:
            self.result = {"wall_seconds": wall}
            return
        others = max(0.0, (busy - self._busy) - (ours - self._ours))
        self.result = {"wall_seconds": round(wall, 1), "machine_busy_cpu_seconds": round(busy - self._busy, 1),
                       "ours_cpu_seconds": round(ours - self._ours, 1), "others_cpu_seconds": round(others, 1),
                       "others_average_cores": round(others / wall, 2)}
