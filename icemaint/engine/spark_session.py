"""Builds the one SparkSession a process uses, with the Iceberg runtime the deployment brings.

The runtime is the user's when `spark.jars.packages` or `spark.jars` name one, or when
`spark.iceberg_runtime: provided` says the cluster's classpath has it; otherwise the jar bundled in
the `snowpark-connect-deps-iceberg==1.0.2` wheel (1.0.3's jar is broken, see STACK.md). Two runtimes
on one classpath break in odd ways, so the bundled jar is never added beside another.

Secrets (catalog tokens, keys, passwords from `ICEMAINT_CATALOG_*`) never go through the session
builder: every builder setting becomes a `--conf` on the JVM's command line, which any local user
reads with `ps`. They are set on the running session before the catalog is first used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import threading
from pathlib import Path

from icemaint.config import MaintenanceConfig
from icemaint.config.catalog import catalog_secret_properties
from icemaint.domain.masking import mask_credentials
from icemaint.engine.java import answer_without_delay, import_hot_classes, java_class
from icemaint.engine.local_fs import CLASSPATH_KEY, local_fs_conf
from icemaint.engine.class_archive import DEFAULT_OPTIONS_KEY, JAVA_OPTIONS_KEY, archive_conf, java_agent
from icemaint.engine.driver_output import DriverOutput, last_words, unresolved_packages
from icemaint.engine.spark_defaults import deployment_defaults
from icemaint.errors import OperationalError, one_line

ICEBERG_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
POSTGRES_JDBC_JAR = "/usr/share/java/postgresql.jar"
_lock = threading.Lock()


# The Iceberg versions the engine's Java calls work with: `ContentFile.location()` and
# `ContentFileUtil.referencedDataFileLocation` arrived in 1.7; tested with 1.10.2.
SUPPORTED_ICEBERG = ((1, 7), (2, 0))
TESTED_ICEBERG = "1.10.2"


# Iceberg plans a scan of many manifests on its worker pool through `ParallelIterable`, which keeps 2 x the
# pool's size manifests in flight and, whenever none of them has handed over an entry yet, sleeps 10 ms
# before it looks again. The pool's size defaults to the driver's cores, so on a small driver a table of many
# small manifests (a streaming writer's, one per commit) plans a few manifests per 10 ms and mostly sleeps:
# 1,000 single-file manifests planned in 2.5 s on 2 cores, warm, and in 0.5-0.7 s with a pool of 16 (or
# planned serially; serial planning would be slow where each manifest is a remote read, so the pool grows).
WORKER_THREADS_PROPERTY = "iceberg.worker.num-threads"
WORKER_THREADS_ENV = "ICEBERG_WORKER_NUM_THREADS"
WORKER_THREADS_FLOOR = 16


class JavaMissing(OperationalError, RuntimeError):
    """No Java on this machine: Spark cannot start."""


class UnsupportedIceberg(OperationalError, RuntimeError):
    """The Iceberg runtime on Spark's classpath is missing or of a version the engine cannot drive."""


class SparkDidNotStart(OperationalError, RuntimeError):
    """The driver JVM exited before it started; its output is in <state_dir>/logs/jvm.log."""


class PackagesUnresolved(SparkDidNotStart):
    """spark-submit could not resolve a `spark.jars.packages` coordinate (a typo, no mirror, no network)."""


def iceberg_jar_path() -> str:
    import snowpark_connect_deps_iceberg

    return str(snowpark_connect_deps_iceberg.get_jar_path(ICEBERG_JAR))


def require_java() -> None:
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        raise JavaMissing("Java 17 is required for Spark and was not found: install it "
                          "(Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME")


def catalog_spark_conf(config: MaintenanceConfig, *, secrets: bool = True) -> dict[str, str]:
    """The `spark.sql.catalog.<name>.*` settings for the configured catalog (without the secrets
    from the environment when `secrets` is false)."""
    cat = config.catalog
    prefix = f"spark.sql.catalog.{cat.name}"
    # Maintenance decides on, validates against and rolls back to snapshots that other processes
    # may have just committed: a cached table would plan and time-travel on stale metadata.
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.cache-enabled": "false"}
    if cat.type == "glue":
        conf[f"{prefix}.catalog-impl"] = "org.apache.iceberg.aws.glue.GlueCatalog"
    else:
        conf[f"{prefix}.type"] = cat.type
    if cat.warehouse:
        conf[f"{prefix}.warehouse"] = cat.warehouse
    if cat.uri and (secrets or not carries_credentials(cat.uri)):  # else set on the running session only
        conf[f"{prefix}.uri"] = cat.uri
    for key, value in {**cat.properties, **(catalog_secret_properties(cat) if secrets else {})}.items():
        conf[f"{prefix}.{key}"] = value
    return conf


def secret_spark_conf(config: MaintenanceConfig) -> dict[str, str]:
    """The catalog's secret settings, for the running session only (never the command line): the
    `ICEMAINT_CATALOG_*` properties, and the URI when it carries a password."""
    cat = config.catalog
    prefix = f"spark.sql.catalog.{cat.name}"
    uri = {f"{prefix}.uri": cat.uri} if cat.uri and carries_credentials(cat.uri) else {}
    return {**uri, **{f"{prefix}.{k}": v for k, v in catalog_secret_properties(cat).items()}}


def carries_credentials(uri: str) -> bool:
    return mask_credentials(uri) != uri


ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
# Settings icemaint adds to rather than sets: they start from the deployment's own value.
ADDED_TO = (JAVA_OPTIONS_KEY, CLASSPATH_KEY)


def deployment_conf(config: MaintenanceConfig) -> dict[str, str]:
    """The deployment's own Spark settings: its spark-defaults.conf (`spark_defaults`) with the config's
    `spark.conf` over it, which is what spark-submit applies where icemaint names nothing."""
    return {**deployment_defaults(), **config.spark.conf}


def with_iceberg_extensions(extensions: str | None) -> str:
    """The SQL extensions with Iceberg's first (its CALL procedures and branch DDL are what the engine runs);
    the deployment's own are kept after it."""
    named = [e.strip() for e in (extensions or "").split(",") if e.strip() and e.strip() != ICEBERG_EXTENSIONS]
    return ",".join([ICEBERG_EXTENSIONS, *named])


def brings_own_iceberg(config: MaintenanceConfig, conf: dict[str, str] | None = None) -> bool:
    """Whether the deployment supplies the Iceberg runtime (so the bundled jar must not be added); `conf` is
    `deployment_conf(config)` when the caller has it."""
    if config.spark.iceberg_runtime != "auto":
        return config.spark.iceberg_runtime == "provided"
    conf = deployment_conf(config) if conf is None else conf
    named = ",".join((conf.get("spark.jars.packages", ""), conf.get("spark.jars", ""), conf.get(CLASSPATH_KEY, "")))
    return "iceberg-spark-runtime" in named


def credentials_in_jars(conf: dict[str, str]) -> None:
    """Refuses a `spark.jars` entry whose URL carries credentials (`https://user:token@host/...`): icemaint adds
    its jars to that setting on spark-submit's command line, which any local user reads with `ps`.

    Raises:
        ValueError: naming the entry's host, never the credentials.
    """
    from urllib.parse import urlsplit

    for entry in filter(None, (e.strip() for e in conf.get("spark.jars", "").split(","))):
        parts = urlsplit(entry)
        if "://" in entry and (parts.username or parts.password):
            raise ValueError(f"spark.jars names a jar on {parts.hostname} with credentials in its URL: icemaint adds "
                             "to spark.jars on spark-submit's command line, where other users can read them; name "
                             "the jar by a local path or a URL without credentials")


def session_conf(config: MaintenanceConfig) -> dict[str, str]:
    """The builder's settings: everything but the secrets.

    Where icemaint adds to a setting the deployment already has (the driver's Java options and class path, the
    jars, the SQL extensions), it adds to the deployment's value, from the config or its spark-defaults.conf:
    spark-submit applies the file only to settings the command line does not name."""
    own = deployment_conf(config)
    credentials_in_jars(own)
    jars = [] if brings_own_iceberg(config, own) else [iceberg_jar_path()]
    # Debian's JDBC driver (libpostgresql-jdbc-java), whenever installed: a JdbcCatalog on PostgreSQL
    # can then be used, also as a second catalog added to a running session.
    if os.path.exists(POSTGRES_JDBC_JAR):
        jars.append(POSTGRES_JDBC_JAR)
    conf = {
        **({"spark.jars": ",".join(jars)} if jars else {}),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.showConsoleProgress": "false",
        # Rewrite proofs bring each snapshot's sampled row fingerprints to the driver (toPandas).
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **catalog_spark_conf(config, secrets=False),
    }
    conf.update(config.spark.conf)
    conf.update({key: own[key] for key in ADDED_TO if own.get(key)})
    conf["spark.sql.extensions"] = with_iceberg_extensions(own.get("spark.sql.extensions"))
    if own.get("spark.jars"):
        conf["spark.jars"] = ",".join(jars + [own["spark.jars"]])
    conf.update(local_fs_conf(config.spark.master, {**own, **conf}))
    conf.update(worker_threads_conf(conf))
    # Last: it is keyed by the jars above. Never with an agent (`class_archive.java_agent`).
    with_agent = java_agent({**conf, DEFAULT_OPTIONS_KEY: own.get(DEFAULT_OPTIONS_KEY, "")})
    conf.update(archive_conf(conf, config.spark.class_archive and not with_agent))
    return conf


def worker_threads_conf(conf: dict[str, str], cores: int | None = None) -> dict[str, str]:
    """The driver's Java options with Iceberg's worker pool at the machine's cores, and at least
    WORKER_THREADS_FLOOR threads; nothing when the deployment sizes the pool itself, through the driver's Java
    options or the environment. (The JVM would count the cores a container may use; `os.cpu_count()` counts
    the host's, so a container of few cores on a big host gets the host's count, never fewer than the floor.)"""
    options = conf.get(JAVA_OPTIONS_KEY, "")
    if WORKER_THREADS_PROPERTY in options or os.environ.get(WORKER_THREADS_ENV):
        return {}
    threads = max(WORKER_THREADS_FLOOR, cores or os.cpu_count() or 1)
    return {JAVA_OPTIONS_KEY: f"{options} -D{WORKER_THREADS_PROPERTY}={threads}".strip()}


def archive_settings(config: MaintenanceConfig) -> dict[str, str]:
    """The session's settings without the class archive's own options: what its archive is keyed by
    (`class_archive.archive_file`). Touches none of the archive's markers, unlike `session_conf`."""
    return session_conf(dataclasses.replace(config, spark=dataclasses.replace(config.spark, class_archive=False)))


def check_iceberg(spark) -> str:
    """The Iceberg version the session loaded; one line naming it when the engine cannot drive it.

    Raises:
        UnsupportedIceberg: no Iceberg runtime on the classpath, or a version outside SUPPORTED_ICEBERG.
    """
    from py4j.protocol import Py4JError

    try:
        version = str(spark._jvm.org.apache.iceberg.IcebergBuild.version())
    except (Py4JError, TypeError):  # a class Py4J cannot find comes back as an uncallable JavaPackage
        raise UnsupportedIceberg(
            "no Iceberg runtime on Spark's classpath: set spark.jars.packages (e.g. org.apache.iceberg:"
            f"iceberg-spark-runtime-3.5_2.12:{TESTED_ICEBERG}) or spark.jars, or spark.iceberg_runtime: "
            "bundled") from None
    parts = tuple(int(p) for p in version.split("-")[0].split(".")[:2] if p.isdigit())
    low, high = SUPPORTED_ICEBERG
    if len(parts) < 2 or not low <= parts < high:
        raise UnsupportedIceberg(
            f"Iceberg {version} on Spark's classpath is not supported: icemaint needs "
            f"{low[0]}.{low[1]} <= version < {high[0]}.{high[1]} (tested with {TESTED_ICEBERG})")
    return version


def iceberg_table(spark, catalog: str, name):
    """The Iceberg Java `Table` behind the Spark catalog (the same cache Spark SQL uses)."""
    spark3_util = java_class(spark._jvm, "org.apache.iceberg.spark.Spark3Util")
    return spark3_util.loadIcebergTable(spark._jsparkSession, name.sql(catalog))


_LOG4J = """status = error
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def log_to_file(config: MaintenanceConfig, conf: dict[str, str]) -> dict[str, str]:
    """Spark's own log goes to <state_dir>/logs/spark.log, not to the operator's terminal (a failed task's
    Java stack trace is evidence for the log, not output); a log4j2 configuration of the user's wins."""
    options = conf.get(JAVA_OPTIONS_KEY, "")
    if "log4j" in options:
        return conf
    logs = Path(config.state_dir, "logs").resolve()
    logs.mkdir(parents=True, exist_ok=True)
    properties = logs / "log4j2.properties"
    properties.write_text(_LOG4J.format(path=logs / "spark.log"))
    return {**conf, JAVA_OPTIONS_KEY: f"{options} -Dlog4j2.configurationFile=file:{properties}".strip()}


def start_jvm(config: MaintenanceConfig, settings: dict[str, str]) -> None:
    """Starts the driver JVM as pyspark would, but with its output read by `DriverOutput`.

    What the JVM prints to standard output (a flight recording's start, `-verbose:gc` or `-Xlog` from the
    deployment's Java options, an agent's banner) went into `--json` output and broke it for whoever parses it:
    it goes to the command's standard error, once the JVM has started, and to <state_dir>/logs/jvm.log. A JVM
    that exits before it starts is one line (`SparkDidNotStart`, `PackagesUnresolved`). pyspark then uses this
    JVM (`SparkContext._ensure_initialized` takes a gateway already set); one already running is left alone."""
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if getattr(SparkContext, "_gateway", None) is not None:
            return
        conf = SparkConf(loadDefaults=False).setMaster(config.spark.master).setAppName("icemaint")
        for key, value in settings.items():
            conf.set(key, value)
        output = DriverOutput(Path(config.state_dir, "logs").resolve())
        try:
            with _forks_under_the_import_lock():
                gateway = launch_gateway(conf, popen_kwargs={"stdout": output.write_fd, "stderr": output.write_fd})
        except PySparkRuntimeError as exc:
            if exc.getErrorClass() != "JAVA_GATEWAY_EXITED":
                output.started()
                raise
            raise did_not_start(output.exited(), output.log_path, settings) from None
        output.started()
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm


def stop_jvm(timeout: float = 60.0) -> bool:
    """Stops this process's Spark session and its driver JVM, and waits for the JVM to exit (`icemaint serve`
    before it starts afresh, so two JVMs never hold memory at once). The JVM exits when its standard input closes
    (pyspark's gateway watches it); one that does not within `timeout` seconds is killed. True when it exited on
    its own, or there was none."""
    import subprocess

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    with _lock:
        session = SparkSession.getActiveSession() or _running_session(SparkSession)
        if session is not None:
            try:
                session.stop()
            except Exception:  # noqa: BLE001 - a JVM already dying: it is waited for or killed below all the same
                pass
        gateway = getattr(SparkContext, "_gateway", None)
        if gateway is None:
            return True
        proc = getattr(gateway, "proc", None)  # set by pyspark's launch_gateway
        try:
            gateway.shutdown()
        except Exception:  # noqa: BLE001 - a gateway already gone: the JVM's exit below is what matters
            pass
        SparkContext._gateway, SparkContext._jvm = None, None
        if proc is None:
            return True
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return False


@contextlib.contextmanager
def _forks_under_the_import_lock():
    """pyspark starts the JVM with a `preexec_fn`, so the fork runs Python's at-fork hooks: `logging` takes its
    module lock, then the interpreter takes the global import lock. A thread importing a module meanwhile holds
    the import lock (a meta-path finder such as setuptools' distutils hack imports inside it) and, when that
    module asks `logging.getLogger`, waits for the logging lock: each waits for the other, forever (seen: an MCP
    server whose run started the JVM while Great Expectations loaded in the background). pyspark's `Popen` is
    called here with the import lock taken first, the order the importing thread takes them in; the lock is held
    only while the child is forked and exec'd, not while the JVM starts."""
    import _imp
    import subprocess

    import pyspark.java_gateway as java_gateway

    def popen(*args, **kwargs):
        _imp.acquire_lock()
        try:
            return subprocess.Popen(*args, **kwargs)
        finally:
            _imp.release_lock()

    saved = java_gateway.Popen
    java_gateway.Popen = popen
    try:
        yield
    finally:
        java_gateway.Popen = saved


def did_not_start(lines: list[str], log: Path, settings: dict[str, str]) -> SparkDidNotStart:
    """One line for a driver JVM that exited before it started, from what it printed."""
    unresolved = unresolved_packages(lines)
    if unresolved:
        mirror = settings.get("spark.jars.repositories") or "not set"
        return PackagesUnresolved(
            f"spark.jars.packages: {', '.join(unresolved)} could not be resolved: check the coordinate, the Maven "
            f"mirror (spark.jars.repositories: {mask_credentials(mirror)}) and this machine's network or proxy; "
            f"spark-submit's output is in {log}")
    return SparkDidNotStart(f"the Spark driver exited before it started: {one_line(last_words(lines))} "
                            f"(its output is in {log})")


def get_spark(config: MaintenanceConfig):
    """The process's SparkSession, created on first use with the config's catalog and settings.

    Spark allows one active session per process; a second config naming a different catalog is
    added to the running session (catalog settings are read when the catalog is first used).
    """
    require_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    with _lock:
        # The session another thread made is not active in a new thread's JVM thread (the tick runs tables'
        # runs in threads): the process's one instantiated session is.
        active = SparkSession.getActiveSession() or _running_session(SparkSession)
        if active is not None:
            for key, value in catalog_spark_conf(config).items():
                if active.conf.get(key, None) != value:
                    active.conf.set(key, value)
            # Spark resolves catalogs through the calling JVM thread's active session: a thread that did not
            # make the session has none, and `Spark3Util.loadIcebergTable` would not know the catalog.
            active._jvm.SparkSession.setActiveSession(active._jsparkSession)
            answer_without_delay(active._jvm, active.sparkContext._gateway)  # this thread's connection too
            return active
        settings = log_to_file(config, session_conf(config))
        builder = SparkSession.builder.master(config.spark.master).appName("icemaint")
        for key, value in settings.items():
            builder = builder.config(key, value)
        start_jvm(config, settings)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        import_hot_classes(spark._jvm)
        answer_without_delay(spark._jvm, spark.sparkContext._gateway)
        # Before the catalog is first used: it reads its settings then.
        for key, value in secret_spark_conf(config).items():
            spark.conf.set(key, value)
        try:
            check_iceberg(spark)
        except UnsupportedIceberg:
            spark.stop()
            raise
        return spark


def _running_session(session_class):
    """The session this process instantiated, while its SparkContext is alive; else None."""
    session = getattr(session_class, "_instantiatedSession", None)
    if session is None or session._sc._jsc is None:
        return None
    return session


_STARTING: threading.Thread | None = None
_STARTING_LOCK = threading.Lock()


def start_in_background(config: MaintenanceConfig) -> None:
    """Starts the process's session in a daemon thread, once per process, and returns at once.

    For a command that is about to do Spark work (a compaction that is not a dry run): its JVM starts while
    Python is still loading Dagster and deciding, on the core Python leaves idle, instead of after the
    decision. The first use of the session waits for the start to finish (`get_spark` holds its lock while
    it builds) and then shares the session. A start that fails is not reported here: the first use starts
    the session again, in the caller's thread, and says what fails. A run that turns out to need no Spark
    (a date that is not due) leaves the JVM unused; it ends with the process.
    """
    global _STARTING
    from pyspark.sql import SparkSession

    with _STARTING_LOCK:
        if _STARTING is not None or _running_session(SparkSession) is not None:
            return
        _STARTING = threading.Thread(target=_start_quietly, args=(config,), name="icemaint-start-spark",
                                     daemon=True)
        _STARTING.start()


def _start_quietly(config: MaintenanceConfig) -> None:
    try:
        get_spark(config)
    except Exception:  # noqa: BLE001 - the first use starts it again and reports the failure in its own thread
        pass


class LazySession:
    """A SparkSession started on first use: a run that decides from metadata alone (a dry run, a date
    that is not due) never starts a JVM through it (a command about to do Spark work may have started the
    session already, `start_in_background`). Every attribute is the session's."""

    def __init__(self, config: MaintenanceConfig):
        self._config = config
        self._session = None

    @property
    def started(self) -> bool:
        return self._session is not None

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._session is None:
            self._session = get_spark(self._config)
        return getattr(self._session, name)
