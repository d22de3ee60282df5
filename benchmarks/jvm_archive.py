"""Benchmarks time icemaint's processes as a deployment runs them after its first few: with the JVM class
archive (icemaint/engine/class_archive.py) this machine records for their sessions already in place, so that
no timed run is the one that records it (~3.6 s slower) or one of the two before it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SESSION = ("import sys; from icemaint.config import load_config; from icemaint.engine.spark_session import get_spark; "
           "get_spark(load_config(sys.argv[1])).sql('SELECT 1').collect()")


def ready(config_path: Path, env: dict | None = None, timeout: float = 300.0) -> str:
    """Starts sessions of `config_path`'s settings (each a process of its own) until its class archive exists;
    returns what was done, for the report."""
    from icemaint.config import load_config
    from icemaint.engine.class_archive import SETTLE_S, archive_file
    from icemaint.engine.spark_session import archive_settings

    config = load_config(config_path)
    if not config.spark.class_archive:
        return "class archive off (spark.class_archive: false)"
    archive = archive_file(archive_settings(config))
    if archive is None:
        return "no class archive: this JDK cannot record one"
    if archive.exists():
        return "class archive already in place"
    started = time.monotonic()
    for _ in range(3):  # met once, recorded, then promoted and mapped
        subprocess.run([sys.executable, "-c", SESSION, str(config_path)], env=env or dict(os.environ), check=True,
                       capture_output=True, timeout=timeout)
        if archive.exists():
            break
        _wait_settled(archive, SETTLE_S, timeout)
    seconds = time.monotonic() - started
    if not archive.exists():
        return f"no class archive after {seconds:.0f} s of sessions (timed runs start without one)"
    return f"class archive recorded first ({seconds:.0f} s, untimed)"


def _wait_settled(archive: Path, settle: float, timeout: float) -> None:
    """Waits until a recording of `archive`'s class path is complete and older than `settle` seconds."""
    pattern = archive.name.replace(".jsa", ".*.recording")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(archive.parent.glob(pattern))
        if not found:
            if not list(archive.parent.glob(archive.name.replace(".jsa", ".recording-started"))):
                return  # nothing is recording (the class path was only met)
            time.sleep(1)  # its JVM writes the recording as it exits, after the Python process
            continue
        if time.time() - max(p.stat().st_mtime for p in found) >= settle:
            return
        time.sleep(1)
