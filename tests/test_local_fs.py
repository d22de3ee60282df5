"""The local file system a local Spark session uses: permissions set in the JVM, no `chmod` per file
(icemaint/engine/local_fs.py, icemaint/engine/jvm/NioLocalFileSystem.java)."""

from __future__ import annotations

import os
import stat

import pytest

from icemaint.engine import local_fs
from icemaint.engine.local_fs import CLASSPATH_KEY, FS_CLASS, FS_IMPL_KEY, local_fs_conf

pytestmark = pytest.mark.java  # compiles with the JDK's javac


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(local_fs.CACHE_ENV, str(tmp_path / "cache"))
    local_fs.local_fs.cache_clear()
    yield tmp_path / "cache"
    local_fs.local_fs.cache_clear()


def test_a_local_session_creates_files_through_the_nio_file_system_with_hadoops_modes(spark, tmp_path):
    jvm = spark._jvm
    fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == FS_CLASS
    assert fs.getRawFileSystem().getClass().getName() == FS_CLASS + "$Raw"

    def path(name):
        return jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path / name}")

    def mode(name):
        return stat.S_IMODE(os.stat(tmp_path / name).st_mode)

    out = fs.create(path("data.parquet"), jvm.org.apache.hadoop.fs.permission.FsPermission(0o640),
                    False, 4096, 1, 1 << 20, None)
    out.write(b"rows")
    out.close()
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "data.parquet").read_bytes() == b"rows"
    assert (tmp_path / ".data.parquet.crc").exists()  # still Hadoop's checksummed LocalFileSystem
    assert mode("data.parquet") == 0o640 & ~umask
    for bits in (0o644, 0o600, 0o751, 0o421, 0o124, 0o000, 0o777):
        fs.setPermission(path("data.parquet"), jvm.org.apache.hadoop.fs.permission.FsPermission(bits))
        assert mode("data.parquet") == bits
    # A mode java.nio cannot express (the sticky bit) is Hadoop's own chmod, as before.
    (tmp_path / "shared").mkdir()
    fs.setPermission(path("shared"), jvm.org.apache.hadoop.fs.permission.FsPermission(0o1777))
    assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o1777


def test_a_rename_never_replaces_a_file(spark, tmp_path):
    """As FileSystem's contract and the `file:` class of Spark's distribution (Hive's ProxyLocalFileSystem) say:
    the quarantine and the Hadoop catalog's commit rely on it."""
    fs = spark._jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration())

    def path(name):
        return spark._jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path / name}")

    for name, text in (("a", "source"), ("taken", "already here")):
        out = fs.create(path(name), False)
        out.write(text.encode())
        out.close()
    assert fs.rename(path("a"), path("taken")) is False
    assert (tmp_path / "a").read_text() == "source" and (tmp_path / "taken").read_text() == "already here"
    assert fs.rename(path("a"), path("free")) is True
    assert (tmp_path / "free").read_text() == "source" and not (tmp_path / "a").exists()
    assert (tmp_path / ".free.crc").exists() and not (tmp_path / ".a.crc").exists()


def test_the_jar_is_built_once_and_then_read_from_the_cache(fresh_cache, monkeypatch):
    jar = local_fs.local_fs().jar
    assert jar is not None and jar.parent == fresh_cache and jar.name == local_fs.jar_name()
    import zipfile

    assert "icemaint/hadoop/NioLocalFileSystem.class" in zipfile.ZipFile(jar).namelist()
    assert [p.name for p in fresh_cache.iterdir()] == [jar.name]  # no build directory left behind
    local_fs.local_fs.cache_clear()
    monkeypatch.setattr(local_fs, "javac", lambda: None)  # a second process finds it without compiling
    assert local_fs.local_fs().jar == jar


def test_local_masters_get_the_file_system_and_keep_the_users_class_path(fresh_cache):
    conf = local_fs_conf("local[2]", {CLASSPATH_KEY: "/opt/extra.jar"})
    jar = str(local_fs.local_fs().jar)
    assert conf == {CLASSPATH_KEY: f"/opt/extra.jar{os.pathsep}{jar}", FS_IMPL_KEY: FS_CLASS}
    assert local_fs_conf("local", {}) == {CLASSPATH_KEY: jar, FS_IMPL_KEY: FS_CLASS}


def test_clusters_and_deployments_naming_their_own_file_system_are_left_alone(fresh_cache):
    assert local_fs_conf("spark://spark-master:7077", {}) == {}
    assert local_fs_conf("local[2]", {FS_IMPL_KEY: "org.apache.hadoop.fs.LocalFileSystem"}) == {}
    assert not fresh_cache.exists()  # nothing was compiled for them


def test_without_a_jdk_nothing_changes(fresh_cache, monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with caplog.at_level("INFO", logger="icemaint.engine.local_fs"):
        assert local_fs_conf("local[2]", {}) == {}
    assert "no javac" in caplog.text
    assert not fresh_cache.exists()


def test_a_failed_compile_leaves_nothing_and_changes_nothing(fresh_cache, monkeypatch, tmp_path, caplog):
    broken = tmp_path / "Broken.java"
    broken.write_text("class Broken {")
    monkeypatch.setattr(local_fs, "SOURCE", broken)
    with caplog.at_level("WARNING", logger="icemaint.engine.local_fs"):
        assert local_fs_conf("local[2]", {}) == {}
    assert "compiling Broken.java failed" in caplog.text
    assert list(fresh_cache.iterdir()) == []


def test_doctor_says_which_file_system_local_files_get(fresh_cache, monkeypatch, config):
    from dataclasses import replace

    from icemaint.app.doctor.report import Status
    from icemaint.app.doctor.spark import check_local_files

    built = check_local_files(config)
    assert built.status is Status.OK and str(local_fs.local_fs().jar) in built.detail
    own = replace(config, spark=replace(config.spark, conf={FS_IMPL_KEY: "org.apache.hadoop.fs.LocalFileSystem"}))
    assert check_local_files(own).line().endswith(f"{FS_IMPL_KEY} is the deployment's: org.apache.hadoop.fs.LocalFileSystem")
    local_fs.local_fs.cache_clear()
    monkeypatch.setattr(local_fs, "cache_dir", lambda: fresh_cache / "elsewhere")
    monkeypatch.setattr(local_fs, "javac", lambda: None)
    missing = check_local_files(config)
    assert missing.status is Status.WARN and missing.detail.startswith("no javac (a JDK) found: Hadoop runs chmod")
