"""Java as Spark's launcher finds it: there, and new enough."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from icemaint.app.doctor.report import Check, fail, ok

MIN_JAVA = 17


def java_executable() -> tuple[str | None, str]:
    """The java Spark's launcher runs: `$JAVA_HOME/bin/java` when JAVA_HOME is set, else `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return str(Path(home, "bin", "java")), "JAVA_HOME"
    return shutil.which("java"), "PATH"


def check_java() -> Check:
    from icemaint.engine.spark_session import JavaMissing, require_java

    try:
        require_java()
    except JavaMissing as exc:
        return fail("java", str(exc))
    java, source = java_executable()
    if not java or not os.access(java, os.X_OK):
        return fail("java", f"JAVA_HOME={os.environ.get('JAVA_HOME')} has no executable bin/java")
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    banner = (proc.stderr or proc.stdout).strip().splitlines()
    # the banner may follow other lines (`Picked up JAVA_TOOL_OPTIONS: ...`)
    match = next(filter(None, (re.match(r'(\S+) version "([^"]+)"', line) for line in banner)), None)
    if proc.returncode != 0 or not match:
        return fail("java", f"{java} -version failed: {banner[0] if banner else f'exit {proc.returncode}'}")
    vendor, version = match.groups()
    parts = re.findall(r"\d+", version)
    major = int(parts[1] if parts[0] == "1" and len(parts) > 1 else parts[0])
    if major < MIN_JAVA:
        return fail("java", f"{vendor} {version} ({java}, from {source}): Spark here needs Java {MIN_JAVA} or later")
    return ok("java", f"{vendor} {version} ({java})")
