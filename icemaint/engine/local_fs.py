"""Local files without a `chmod` process per file: the Hadoop file system a local Spark session uses.

Spark's pip distribution ships no Hadoop native library, so its `file:` file system (Hive's
ProxyLocalFileSystem, a Hadoop LocalFileSystem) sets the permissions of every file it creates by running
`chmod` in a child process, twice a file (the file and its `.crc`): about 9 ms per file created against 2 ms
without (measured here), which made a publish of 600 single-file commits' manifests 4.5 s instead of 1.4 s.
`jvm/NioLocalFileSystem.java` is Hadoop's LocalFileSystem with the permissions set through java.nio and the
rename contract of the class it replaces (never onto an existing file: the Hadoop catalog's commit and the
quarantine rely on it); it is compiled once per machine (javac, a second or less) into a jar
kept in the user's cache, and a local session (`spark.master` local[...]) puts it on the driver's classpath
as the `file:` scheme's file system. Without a JDK's javac, or where the deployment names its own
`spark.hadoop.fs.file.impl`, nothing changes. Object stores and clusters are not concerned: their file
systems do not fork, and a cluster's executors would need the jar shipped (so it is never added there).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from icemaint.errors import one_line

log = logging.getLogger(__name__)

FS_IMPL_KEY = "spark.hadoop.fs.file.impl"
CLASSPATH_KEY = "spark.driver.extraClassPath"
FS_CLASS = "icemaint.hadoop.NioLocalFileSystem"
SOURCE = Path(__file__).with_name("jvm") / "NioLocalFileSystem.java"
CACHE_ENV = "ICEMAINT_CACHE_DIR"
JAVAC_TIMEOUT_S = 120


def cache_dir() -> Path:
    """Where the compiled jar is kept: $ICEMAINT_CACHE_DIR, else $XDG_CACHE_HOME/icemaint, else ~/.cache/icemaint."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "icemaint"


def javac() -> str | None:
    """The JDK's compiler: $JAVA_HOME/bin/javac, else the one on PATH; None with a JRE only."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home, "bin", "javac"), os.X_OK):
        return str(Path(home, "bin", "javac"))
    return shutil.which("javac")


def hadoop_api_jar() -> Path | None:
    """A jar holding Hadoop's `org.apache.hadoop.fs` classes in the Spark this process launches."""
    homes = [Path(os.environ["SPARK_HOME"])] if os.environ.get("SPARK_HOME") else []
    try:
        import pyspark

        homes.append(Path(pyspark.__file__).parent)
    except ImportError:
        pass
    for home in homes:
        for pattern in ("hadoop-client-api-*.jar", "hadoop-common-*.jar"):
            found = sorted((home / "jars").glob(pattern))
            if found:
                return found[0]
    return None


def jar_name() -> str:
    return f"icemaint-localfs-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]}.jar"


@dataclass(frozen=True)
class LocalFs:
    """The compiled file system for this machine: its jar, or why there is none."""

    jar: Path | None
    reason: str = ""


@functools.cache
def local_fs() -> LocalFs:
    """The compiled file system (built on first use, then read from the cache); when it cannot be built here,
    why (said once in the log)."""
    target = cache_dir() / jar_name()
    if target.exists():
        return LocalFs(target)
    compiler, api = javac(), hadoop_api_jar()
    if compiler is None or api is None:
        reason = "no javac (a JDK) found" if compiler is None else "no Hadoop jar in Spark's jars"
        log.info("local files keep Hadoop's chmod per file: %s", reason)
        return LocalFs(None, reason)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as build:
            classes = Path(build, "classes")
            # Java 8 class files: any JVM Spark runs on loads them.
            subprocess.run([compiler, "-nowarn", "--release", "8", "-cp", str(api), "-d", str(classes), str(SOURCE)],
                           check=True, capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S)
            built = Path(build, target.name)
            with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as jar:
                for path in sorted(classes.rglob("*.class")):
                    jar.write(path, path.relative_to(classes).as_posix())
            os.replace(built, target)  # atomic: a concurrent process finds the whole jar or none
    except (OSError, subprocess.SubprocessError) as exc:
        detail = (getattr(exc, "stderr", None) or str(exc)).strip()
        reason = f"compiling {SOURCE.name} failed: {one_line(detail) or type(exc).__name__}"
        log.warning("local files keep Hadoop's chmod per file: %s", reason)
        return LocalFs(None, reason)
    return LocalFs(target)


def concerns(master: str, conf) -> bool:
    """Whether a session of `master` with settings `conf` gets the file system: local, naming none of its own."""
    return master.startswith("local") and FS_IMPL_KEY not in conf


def local_fs_conf(master: str, conf: dict[str, str]) -> dict[str, str]:
    """The settings that make a local session's `file:` file system `NioLocalFileSystem`, given the session's
    other settings `conf` (the driver's class path is extended, not replaced); empty for a non-local master,
    a deployment naming its own file system, or where the jar cannot be built."""
    if not concerns(master, conf):
        return {}
    jar = local_fs().jar
    if jar is None:
        return {}
    classpath = os.pathsep.join(p for p in (conf.get(CLASSPATH_KEY, ""), str(jar)) if p)
    return {CLASSPATH_KEY: classpath, FS_IMPL_KEY: FS_CLASS}
