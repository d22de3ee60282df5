"""The driver JVM's class-data archive (icemaint/engine/class_archive.py): when it is recorded, promoted, used,
pruned and left alone; and, with real JVMs, that a later session maps what an earlier one recorded, silently."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import TEST_JAVA_OPTIONS, write_config
from icemaint.engine import class_archive as ca

REPO = Path(__file__).resolve().parent.parent
NOW = 1_800_000_000.0


@pytest.fixture
def jdk(tmp_path, monkeypatch):
    """A JAVA_HOME whose `release` file names the version the test writes (only the file is read)."""
    home = tmp_path / "jdk"
    home.mkdir()

    def version(text: str) -> None:
        (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{text}"\n')

    version("17.0.15")
    monkeypatch.setenv("JAVA_HOME", str(home))
    return version


def options(folder: Path, now: float, **conf) -> str:
    return ca.archive_options({k.replace("_", "."): v for k, v in conf.items()}, folder=folder, now=now)


def written(option: str) -> Path:
    """The JVM writing the recording named by -XX:ArchiveClassesAtExit (here: a file of a few bytes)."""
    path = Path(option.split("-XX:ArchiveClassesAtExit=", 1)[1].split()[0])
    path.write_bytes(b"archive")
    return path


@pytest.mark.parametrize("text, major", [("17.0.15", 17), ("21", 21), ("1.8.0_392", 8), ("11.0.2", 11)])
def test_the_java_version_comes_from_the_release_file(text, major):
    assert ca.java_major(f'JAVA_VERSION="{text}"\n') == major
    assert ca.java_major("") is None


def test_a_class_path_is_recorded_the_second_time_and_mapped_once_the_recording_settled(tmp_path, jdk):
    folder = tmp_path / "cache"
    assert options(folder, NOW) == "", "met once: nothing recorded"
    first = options(folder, NOW + 1)
    assert first.startswith("-XX:ArchiveClassesAtExit=") and ca.QUIET in first
    assert options(folder, NOW + 2) == "", "one process records at a time"
    recording = written(first)
    os.utime(recording, (NOW + 3, NOW + 3))
    assert options(folder, NOW + 3 + ca.SETTLE_S / 2) == "", "a recording still being written is not used"

    mapped = options(folder, NOW + 3 + ca.SETTLE_S)
    archives = list(folder.glob("classes-*.jsa"))
    assert mapped == f"-XX:SharedArchiveFile={archives[0]} {ca.QUIET}" and len(archives) == 1
    assert not recording.exists() and archives[0].read_bytes() == b"archive"
    assert options(folder, NOW + 100) == mapped


def test_another_jar_is_another_class_path(tmp_path, jdk):
    folder, jar = tmp_path / "cache", tmp_path / "extra.jar"
    jar.write_bytes(b"one")
    options(folder, NOW, spark_jars=str(jar))
    assert options(folder, NOW, spark_jars=str(jar)).startswith("-XX:ArchiveClassesAtExit=")
    jar.write_bytes(b"changed")  # another size: the JVM would refuse the archive, so it is another key
    assert options(folder, NOW + 1, spark_jars=str(jar)) == "", "a changed jar is met for the first time"
    assert len(list(folder.glob("classes-*.seen"))) == 2


@pytest.mark.parametrize("case", ["jdk 11", "jdk 8", "disabled", "own sharing", "no release file", "quoted path"])
def test_no_archive_where_none_can_be_recorded_or_the_deployment_shares_its_own(tmp_path, jdk, case):
    folder = tmp_path / ("cache dir" if case == "quoted path" else "cache")
    conf = {"spark.driver.extraJavaOptions": "-Xss4m -Xshare:off"} if case == "own sharing" else {}
    if case == "jdk 11":
        jdk("11.0.2")
    elif case == "jdk 8":
        jdk("1.8.0_392")
    elif case == "no release file":
        (Path(os.environ["JAVA_HOME"]) / "release").unlink()
    for now in (NOW, NOW + 1, NOW + 2):
        assert ca.archive_options(conf, case != "disabled", folder=folder, now=now) == ""


def test_only_the_most_recently_used_archives_are_kept_and_forgotten_recordings_go(tmp_path, jdk):
    folder = tmp_path / "cache"
    folder.mkdir()
    olds = []
    for i in range(ca.KEEP_ARCHIVES):
        old = folder / f"classes-{i:016x}.jsa"
        old.write_bytes(b"old")
        os.utime(old, (NOW + i, NOW + i))
        olds.append(old)
    forgotten = folder / "classes-00000000000000ff.4-1.recording"
    forgotten.write_bytes(b"never promoted")
    os.utime(forgotten, (NOW, NOW))

    options(folder, NOW + ca.STALE_RECORDING_S + 1)
    assert not forgotten.exists()
    recording = written(options(folder, NOW + ca.STALE_RECORDING_S + 2))
    os.utime(recording, (NOW, NOW + ca.STALE_RECORDING_S + 2))
    options(folder, NOW + ca.STALE_RECORDING_S + 2 + ca.SETTLE_S)
    kept = sorted(p.name for p in folder.glob("classes-*.jsa"))
    assert len(kept) == ca.KEEP_ARCHIVES and olds[0].name not in kept, kept


def test_the_deployments_own_java_options_stay_first(tmp_path, jdk):
    conf, folder = {"spark.driver.extraJavaOptions": "-Dsome.flag=1"}, tmp_path / "cache"
    assert ca.archive_conf(conf, folder=folder, now=NOW) == {}, "met once: nothing to add"
    added = ca.archive_conf(conf, folder=folder, now=NOW + 1)["spark.driver.extraJavaOptions"]
    assert added.startswith("-Dsome.flag=1 -XX:ArchiveClassesAtExit=") and added.endswith(ca.QUIET)
    assert ca.archive_conf(conf, False, folder=folder, now=NOW + 2) == {}


SESSION = textwrap.dedent("""
    import sys
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark
    spark = get_spark(load_config(sys.argv[1]))
    print("rows", spark.sql("SELECT count(*) FROM range(10)").first()[0])
""")
# The settings `get_spark` would start its JVM with, and no JVM.
SETTINGS = textwrap.dedent("""
    import sys
    from icemaint.config import load_config
    from icemaint.engine.spark_session import session_conf
    print("options", session_conf(load_config(sys.argv[1])).get("spark.driver.extraJavaOptions", ""))
""")


@pytest.mark.slow
@pytest.mark.java
def test_a_later_session_maps_the_classes_an_earlier_one_recorded_and_nobody_sees_it(tmp_path, lake_root):
    """On one cache: a first process's session settings note the class path (`session_conf`, what `get_spark`
    starts its JVM with: no JVM needed to note it); a real JVM then records its classes as it exits, a third maps
    them (the JVM's own log says so: its dynamic archive mapped, no class path mismatch), and a fourth, started
    with a flight recording and a Java agent, leaves them unmapped and answers."""
    import shutil

    from icemaint.engine.local_fs import local_fs

    release = ca.java_release(ca.java_home())
    if (ca.java_major(release) or 0) < ca.MIN_JAVA:
        pytest.skip("this JDK cannot record a class archive")
    cache, log = tmp_path / "cache", tmp_path / "cds.log"

    def session(java_options: str = "", env: dict | None = None, script: str = SESSION) -> str:
        spark = {"master": "local[1]", "conf": {"spark.ui.enabled": "false"}}
        if java_options:  # with the test JVMs' own (C1 only): replaced, the session's JVM took twice the CPU
            spark["conf"]["spark.driver.extraJavaOptions"] = f"{TEST_JAVA_OPTIONS} {java_options}"
        path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"), spark=spark)
        proc = subprocess.run([sys.executable, "-c", script, str(path)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300,  # a crashed JVM leaves its hs_err files in the cwd
                              env={**os.environ, "ICEMAINT_CACHE_DIR": str(cache), **(env or {})})
        assert proc.returncode == 0 and ("rows 10" in proc.stdout or script != SESSION), proc.stderr[-3000:]
        assert "[cds]" not in proc.stdout + proc.stderr and "[class,path]" not in proc.stdout + proc.stderr
        return proc.stdout

    built = local_fs().jar  # the compiled local file system, on the class path: copied, not compiled again
    if built is not None:
        cache.mkdir()
        shutil.copy2(built, cache / built.name)
    first = session(script=SETTINGS)
    assert "options " in first and "Archive" not in first, first  # met once: nothing recorded, nothing mapped
    assert not list(cache.glob(f"{ca.ARCHIVE_DIR}/*.recording")) and list(cache.glob(f"{ca.ARCHIVE_DIR}/*.seen"))
    session()
    agent = java_agent_jar(tmp_path / "agent")  # compiled while the JVM above writes its recording
    deadline, sizes = time.monotonic() + 120, []
    while time.monotonic() < deadline:  # the JVM writes its recording as it exits, after the Python process
        found = list(cache.glob(f"{ca.ARCHIVE_DIR}/*.recording"))
        sizes.append(found[0].stat().st_size if found else -1)
        if len(sizes) >= 3 and sizes[-1] > 0 and sizes[-1] == sizes[-2] == sizes[-3]:
            break
        time.sleep(1)
    (recording,) = cache.glob(f"{ca.ARCHIVE_DIR}/*.recording")
    settled = time.time() - ca.SETTLE_S - 1
    os.utime(recording, (settled, settled))

    session(f"-Xlog:cds=info:file={log}")
    text = log.read_text()
    assert "Mapped dynamic region" in text and "mismatch" not in text, text[-3000:]
    assert list(cache.glob(f"{ca.ARCHIVE_DIR}/*.jsa")) and not list(cache.glob(f"{ca.ARCHIVE_DIR}/*.recording"))

    # With the archive in place, a JVM that starts a flight recording or a Java agent leaves it unmapped: mapping
    # it crashed JDK 17 (SIGSEGV in KlassFactory::check_shared_class_file_load_hook) in every such session. One
    # JVM with both (a recording from JAVA_TOOL_OPTIONS, an agent in the Java options): each alone keeps the
    # archive off (`java_agent`, tests/test_deployment_spark.py), and a crashed JVM never answers.
    session(f"-javaagent:{agent}" if agent is not None else "",
            env={"JAVA_TOOL_OPTIONS": f"-XX:StartFlightRecording=filename={tmp_path / 'r.jfr'}"})


AGENT = """package probe;
public class Agent {
  public static void premain(String args, java.lang.instrument.Instrumentation inst) {
    inst.addTransformer(new java.lang.instrument.ClassFileTransformer() {  // sees every class, changes none
      public byte[] transform(ClassLoader loader, String name, Class<?> cls, java.security.ProtectionDomain domain,
                              byte[] bytes) { return null; }
    }, true);
  }
}
"""


def java_agent_jar(folder: Path) -> Path | None:
    """A Java agent that hooks every class load and changes none (what an APM agent does first); None without
    a JDK's compiler."""
    import shutil
    import zipfile

    javac = shutil.which("javac")
    if javac is None:
        return None
    (folder / "probe").mkdir(parents=True)
    (folder / "probe" / "Agent.java").write_text(AGENT)
    subprocess.run([javac, "-d", str(folder / "classes"), str(folder / "probe" / "Agent.java")], check=True,
                   capture_output=True, timeout=120)
    jar = folder / "agent.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nPremain-Class: probe.Agent\n"
                                           "Can-Retransform-Classes: true\n")
        for cls in (folder / "classes").rglob("*.class"):
            z.write(cls, str(cls.relative_to(folder / "classes")))
    return jar
