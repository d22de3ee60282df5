"""The driver JVM's class-data archive: Spark's, Iceberg's and our classes mapped from one file at start-up.

Every icemaint process that starts Spark starts a JVM that loads, verifies and links thousands of classes from
Spark's and Iceberg's jars before its first query. The JDK can record the classes a run loaded into an archive
(dynamic class-data sharing, JDK 13 and later) and map them from it in later runs. Measured here (2 cores,
JDK 17): a local session and its first query took 4.1-4.2 s, and 2.6-2.7 s with the archive; the one run that
records the archive took 7.7 s; `icemaint compact` of 100 small files, a fresh process each, 11.08 s -> 9.67 s
(`make bench-jvm`). A CLI command, each Dagster run worker and each test process starts a JVM.

One archive per machine and class path (the JDK, Spark's jars and the session's own jars and their sizes and
times: `archive_key`), under the user's cache like the compiled file system (`local_fs.cache_dir`):

- A class path met for the first time: nothing (a marker notes it), so a one-off class path (a test's own
  jar) never pays for a recording. Met again without an archive: the session records one
  (`-XX:ArchiveClassesAtExit`, to a file name of its own), which its JVM writes as it exits. One process
  records at a time: a marker younger than RECORDING_WINDOW_S says one is under way.
- A recording that has not changed for SETTLE_S (its JVM is gone) becomes the archive (`os.replace`: a
  concurrent process finds the whole file or none); later sessions map it (`-XX:SharedArchiveFile`).
- The JVM checks the archive against its class path and JDK and ignores one that does not match; a damaged or
  foreign archive costs the speed-up, never the run. Its messages about the archive are turned off, so nothing
  reaches the user's terminal.

Off with `spark.class_archive: false`, on a JDK before 13 (none can record), where the deployment's own
`spark.driver.extraJavaOptions` already configures class-data sharing, and where the driver JVM starts with a
Java agent or a flight recording (`java_agent`): JDK 17 crashed (SIGSEGV in
`KlassFactory::check_shared_class_file_load_hook`) in every session that mapped the archive with a no-op
`-javaagent` or `-XX:StartFlightRecording`, from the Java options or from `JAVA_TOOL_OPTIONS`, the way APM
agents are commonly injected. A recording started later (`jcmd JFR.start`) did not crash.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
from pathlib import Path

from icemaint.engine.local_fs import cache_dir

log = logging.getLogger(__name__)

JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"
DEFAULT_OPTIONS_KEY = "spark.driver.defaultJavaOptions"  # an administrator's, put before the Java options
# Options the driver JVM reads from the environment: every JVM's, spark-submit's own (client mode) and pyspark's
# arguments to spark-submit (`--driver-java-options`).
ENV_OPTIONS = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS", "SPARK_SUBMIT_OPTS", "PYSPARK_SUBMIT_ARGS")
ARCHIVE_DIR = "jvm-classes"
SETTLE_S = 30.0  # a recording unchanged this long is finished (the JVM writes it in a second or two at exit)
RECORDING_WINDOW_S = 600.0  # another process records only when no recording started within this window
KEEP_ARCHIVES = 3  # archives kept, the most recently used (each 100-200 MiB)
STALE_RECORDING_S = 3600.0  # a recording nobody promoted within this is removed
MARKER_DAYS = 30
MIN_JAVA = 13  # dynamic class-data sharing (ArchiveClassesAtExit)
# The JVM reports an archive it cannot use (another class path, a damaged file) as warnings on stdout.
QUIET = "-Xlog:cds*=off -Xlog:class+path=off"
_OWN_SHARING = re.compile(r"-Xshare|SharedArchiveFile|ArchiveClassesAtExit|SharedClassListFile")
# A JVMTI or Java agent (its class-file load hook is what the crash is in), a recording started with the JVM, or
# options read from a file (`@argfile`, `-XX:VMOptionsFile`) that could hold either; quoted options too.
_AGENT = re.compile(r"""(?:^|[\s'"])(?:-javaagent:|-agentlib:|-agentpath:|-Xrun|-XX:StartFlightRecording|"""
                    r"""-XX:VMOptionsFile=|@\S)""")


def java_home() -> Path | None:
    """The JDK spark-submit runs: $JAVA_HOME, else the `java` on PATH (both as spark-class picks it)."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return Path(os.path.realpath(java)).parent.parent if java else None


def java_release(home: Path | None) -> str:
    """The JDK's `release` file (JAVA_VERSION and its build), or '' when there is none."""
    try:
        return (home / "release").read_text() if home is not None else ""
    except OSError:
        return ""


def java_major(release: str) -> int | None:
    """The major version named by a `release` file: 17 for "17.0.15", 8 for "1.8.0_392"; None when unknown."""
    found = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release, flags=re.M)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def spark_jars_dir() -> Path | None:
    """Spark's own jars: $SPARK_HOME/jars, else the pip distribution's."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"], "jars")
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).parent / "jars"


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def archive_key(conf: dict[str, str], release: str, jars_dir: Path | None) -> str:
    """What the archive must match: the JDK, Spark's jars and the session's own jars (each path with its size
    and time), and the packages it resolves; 16 hex digits."""
    parts = [release]
    if jars_dir is not None and jars_dir.is_dir():
        parts += sorted(_stamp(p) for p in jars_dir.glob("*.jar"))
    parts += [_stamp(Path(p.strip())) for p in conf.get("spark.jars", "").split(",") if p.strip()]
    parts += [_stamp(Path(p)) for p in conf.get("spark.driver.extraClassPath", "").split(os.pathsep) if p]
    parts.append(conf.get("spark.jars.packages", ""))
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _touch(path: Path, now: float) -> None:
    path.touch()
    os.utime(path, (now, now))


def _promote(folder: Path, key: str, archive: Path, now: float) -> None:
    """The newest settled recording of `key` becomes its archive (unsettled ones are left to their JVMs); then
    only the KEEP_ARCHIVES most recently used archives are kept."""
    settled = sorted((p for p in folder.glob(f"classes-{key}.*.recording")
                      if now - (_mtime(p) or now) >= SETTLE_S), key=lambda p: _mtime(p) or 0.0)
    for recording in settled:
        os.replace(recording, archive)  # atomic; the newest one stays
    if settled:
        _touch(archive, now)
        others = sorted((p for p in folder.glob("classes-*.jsa") if p != archive),
                        key=lambda p: _mtime(p) or 0.0, reverse=True)
        for old in others[KEEP_ARCHIVES - 1:]:
            old.unlink(missing_ok=True)


def _tidy(folder: Path, now: float) -> None:
    """Removes recordings no process came back to promote (a class path met twice, then never again) and
    markers of class paths not seen for MARKER_DAYS."""
    for path in folder.glob("classes-*.recording"):
        if now - (_mtime(path) or now) > STALE_RECORDING_S:
            path.unlink(missing_ok=True)
    for path in (*folder.glob("classes-*.seen"), *folder.glob("classes-*.recording-started")):
        if now - (_mtime(path) or now) > MARKER_DAYS * 86400:
            path.unlink(missing_ok=True)


def own_sharing(conf: dict[str, str]) -> bool:
    """Whether the deployment's own Java options already configure class-data sharing (then ours stay off)."""
    return bool(_OWN_SHARING.search(conf.get(JAVA_OPTIONS_KEY, "")))


def java_agent(conf: dict[str, str], environ: dict[str, str] | None = None) -> str | None:
    """The setting or environment variable that starts the driver JVM with an agent or a flight recording, or with
    options from a file that may hold one (then no archive is mapped or recorded: the JDK crashes mapping one with
    an agent), else None. Variables that spark-env.sh exports are not seen here: set spark.class_archive: false
    when it starts an agent."""
    env = os.environ if environ is None else environ
    places = [(key, conf.get(key, "")) for key in (JAVA_OPTIONS_KEY, DEFAULT_OPTIONS_KEY)]
    places += [(name, env.get(name, "")) for name in ENV_OPTIONS]
    for where, options in places:
        if _AGENT.search(options):
            return where
    return None


def archive_file(conf: dict[str, str], folder: Path | None = None) -> Path | None:
    """Where the archive for sessions with settings `conf` is (or would be) kept; None on a JDK that cannot
    record one. Touches nothing."""
    release = java_release(java_home())
    major = java_major(release)
    if major is None or major < MIN_JAVA:
        return None
    return (folder or cache_dir() / ARCHIVE_DIR) / f"classes-{archive_key(conf, release, spark_jars_dir())}.jsa"


def _key_of(archive: Path) -> str:
    """The class path key an archive's file is named by (`classes-<key>.jsa`)."""
    return archive.name[len("classes-"):-len(".jsa")]


def archive_options(conf: dict[str, str], enabled: bool = True, *, folder: Path | None = None,
                    now: float | None = None) -> str:
    """The Java options that map this machine's archive, or record one; '' when there is none to use or record.

    `conf` is the session's other settings (its jars and the deployment's own Java options)."""
    if not enabled or own_sharing(conf) or java_agent(conf):
        return ""
    archive = archive_file(conf, folder)
    if archive is None or re.search(r"""[\s'"]""", str(archive)):
        return ""  # no JDK that records; a path Spark would split into two options
    folder, key = archive.parent, _key_of(archive)
    now = time.time() if now is None else now
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not archive.exists():
            _promote(folder, key, archive, now)
        if archive.exists():
            if now - (_mtime(archive) or now) > 3600:
                _touch(archive, now)  # recently used: kept when other class paths' archives are pruned
            return f"-XX:SharedArchiveFile={archive} {QUIET}"
        _tidy(folder, now)
        seen = folder / f"classes-{key}.seen"
        if not seen.exists():
            _touch(seen, now)
            return ""  # a class path met once (a test's own jar) is not worth 100-200 MiB and a slower run
        started = folder / f"classes-{key}.recording-started"
        if now - (_mtime(started) or 0.0) < RECORDING_WINDOW_S:
            return ""  # another process is recording; this one starts as it always did
        _touch(started, now)
        recording = folder / f"classes-{key}.{os.getpid()}-{int(now)}.recording"
        return f"-XX:ArchiveClassesAtExit={recording} {QUIET}"
    except OSError as exc:  # a read-only or full cache: start as before
        log.info("no JVM class archive: %s", exc)
        return ""


def archive_conf(conf: dict[str, str], enabled: bool = True, **where) -> dict[str, str]:
    """The session setting that adds `archive_options` to the driver's Java options (the deployment's own are
    kept, ours after them); empty when there is nothing to add. `where`: `archive_options`' folder and now."""
    options = archive_options(conf, enabled, **where)
    if not options:
        return {}
    own = conf.get(JAVA_OPTIONS_KEY, "").strip()
    return {JAVA_OPTIONS_KEY: f"{own} {options}".strip()}
