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
