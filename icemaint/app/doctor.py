"""`icemaint doctor`: what a new deployment gets wrong, found before the first run, one line per check.

Each check looks at one thing the way the product later uses it: Java as Spark's launcher finds it,
the jars the session would load, the catalog through the sensors' own pyiceberg reader, PostgreSQL
through the connector claims and the audit log use, the Dagster instance the CLI opens. A check
turns its own exceptions into a FAIL line with their first line (never a stack trace), and every
line is scrubbed of the secrets in the environment: credentials are named, never shown.
"""

from __future__ import annotations

import enum
import glob
import os
import re
import shutil
import subprocess
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from icemaint.config import SECRET_ENV_PREFIX, MaintenanceConfig, catalog_secret_properties, secret_env_name
from icemaint.engine.spark_session import (ICEBERG_JAR, POSTGRES_JDBC_JAR, SUPPORTED_ICEBERG, TESTED_ICEBERG,
                                           brings_own_iceberg, deployment_conf)
from icemaint.domain.masking import mask_credentials
from icemaint.errors import one_line

MIN_JAVA = 17
NETWORK_TIMEOUT_S = 10.0
_RUNTIME_ARTIFACT = re.compile(r"iceberg-spark-runtime-(\d+\.\d+)_(\d+\.\d+)")


class Status(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: Status
    detail: str

    def line(self) -> str:
        return f"{self.status.value:<6}{self.name}: {self.detail}"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail}


def _ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


def _warn(name: str, detail: str) -> Check:
    return Check(name, Status.WARN, detail)


def _fail(name: str, detail: str) -> Check:
    return Check(name, Status.FAIL, detail)


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message` of the error that says most.

    A network error is reported by its deepest OS-level cause (`ConnectionRefusedError: [Errno 111]
    Connection refused`, not the HTTP pool's paragraph around it); a Py4J error by its Java exception;
    a SQLAlchemy error by the driver's error it wraps.
    """
    from icemaint.observe.catalog import CatalogUnavailable

    if isinstance(exc, CatalogUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__  # the catalog's own error says most; the check line names the catalog already
    if isinstance(exc, OSError):
        seen, cause = {id(exc)}, exc
        while True:
            nxt = cause.__cause__ or cause.__context__
            if nxt is None or id(nxt) in seen:
                break
            seen.add(id(nxt))
            cause = nxt
        exc = cause if isinstance(cause, OSError) else exc
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    line = one_line(text, 100_000)
    wrapped = re.match(r"\(([\w.]+)\) (.*)", line)  # SQLAlchemy: "(psycopg2.OperationalError) message"
    if wrapped:
        line = f"{wrapped.group(1)}: {wrapped.group(2)}"
    else:
        line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return one_line(line, 300)


def _within(seconds: float, fn: Callable[[], object]):
    """fn's result, or TimeoutError after `seconds` (a hung connect is left to die with the process)."""
    box: dict[str, object] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    worker = threading.Thread(target=target, name="icemaint-doctor", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g}s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def shown_uri(uri: str) -> str:
    """The URI with a password in its user info or query replaced by `***`."""
    return mask_credentials(uri)


def _writable(directory: Path) -> bool:
    """Whether a file can really be created in `directory` (os.access is wrong under ACLs and read-only mounts)."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".icemaint-doctor-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _directory(path: Path, what: str, when_missing: Status, missing: str) -> Check:
    """A directory icemaint writes into: there and writable, or creatable (then `when_missing`, `missing`)."""
    if path.exists():
        if not path.is_dir():
            return _fail(what, f"{path} is not a directory")
        if not _writable(path):
            return _fail(what, f"{path} is not writable by this user")
        return _ok(what, f"{path} (writable)")
    ancestor = next((p for p in path.parents if p.exists()), None)
    if ancestor is None or not ancestor.is_dir():
        return _fail(what, f"{path} cannot be created: {ancestor} is not a directory")
    if not _writable(ancestor):
        return _fail(what, f"{path} does not exist and cannot be created: {ancestor} is not writable")
    return Check(what, when_missing, f"{path} {missing}")


# -- the checks ------------------------------------------------------------------------------------------
def check_config(config: MaintenanceConfig, config_path: str | os.PathLike | None) -> Check:
    path = Path(config_path or config.source or "maintenance.yaml").resolve()
    cat = config.catalog
    return _ok("config", f"{path} (catalog {cat.name}: {cat.type}, state dir {config.state_dir})")


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
        return _fail("java", str(exc))
    java, source = java_executable()
    if not java or not os.access(java, os.X_OK):
        return _fail("java", f"JAVA_HOME={os.environ.get('JAVA_HOME')} has no executable bin/java")
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    banner = (proc.stderr or proc.stdout).strip().splitlines()
    # the banner may follow other lines (`Picked up JAVA_TOOL_OPTIONS: ...`)
    match = next(filter(None, (re.match(r'(\S+) version "([^"]+)"', line) for line in banner)), None)
    if proc.returncode != 0 or not match:
        return _fail("java", f"{java} -version failed: {banner[0] if banner else f'exit {proc.returncode}'}")
    vendor, version = match.groups()
    parts = re.findall(r"\d+", version)
    major = int(parts[1] if parts[0] == "1" and len(parts) > 1 else parts[0])
    if major < MIN_JAVA:
        return _fail("java", f"{vendor} {version} ({java}, from {source}): Spark here needs Java {MIN_JAVA} or later")
    return _ok("java", f"{vendor} {version} ({java})")


def check_local_files(config: MaintenanceConfig) -> Check:
    """A local session's file system (icemaint/engine/local_fs.py): permissions set in the JVM, or a chmod
    process for every file created."""
    from icemaint.engine.local_fs import FS_IMPL_KEY, concerns, local_fs

    own = deployment_conf(config)
    if not concerns(config.spark.master, own):
        return _ok("local files", f"{FS_IMPL_KEY} is the deployment's: {own[FS_IMPL_KEY]}")
    built = local_fs()
    if built.jar is None:
        return _warn("local files", f"{built.reason}: Hadoop runs chmod in a child process for every file a local "
                     "session creates (about 9 ms a file against 2; a JDK, e.g. openjdk-17-jdk-headless, avoids it)")
    return _ok("local files", f"permissions set in the JVM, no chmod process per file ({built.jar})")


def check_class_archive(config: MaintenanceConfig) -> Check:
    """The driver JVM's class archive (icemaint/engine/class_archive.py): mapped at start-up, still to be
    recorded, or off and why. Reads files only."""
    from icemaint.domain.units import human_size
    from icemaint.engine.class_archive import DEFAULT_OPTIONS_KEY, JAVA_OPTIONS_KEY, archive_file, java_agent, own_sharing
    from icemaint.engine.spark_session import archive_settings

    if not config.spark.class_archive:
        return _ok("class archive", "off (spark.class_archive: false): each session loads Spark's classes from its jars")
    conf = archive_settings(config)
    if own_sharing(conf):
        return _ok("class archive", f"the deployment's own class-data sharing ({JAVA_OPTIONS_KEY})")
    agent = java_agent({**conf, DEFAULT_OPTIONS_KEY: deployment_conf(config).get(DEFAULT_OPTIONS_KEY, "")})
    if agent:
        return _ok("class archive", f"off: the driver JVM starts with a Java agent or a flight recording ({agent}), "
                   "and Java crashes mapping an archive with one")
    archive = archive_file(conf)
    if archive is None:
        return _ok("class archive", "none: recording one needs Java 13 or later")
    if archive.exists():
        return _ok("class archive", f"{archive} ({human_size(archive.stat().st_size)}): sessions map Spark's "
                   "classes from it")
    return _ok("class archive", f"not recorded yet: the second session with these jars records it ({archive})")


def iceberg_supported(version: str) -> bool:
    parts = tuple(int(p) for p in version.split("-")[0].split(".")[:2] if p.isdigit())
    low, high = SUPPORTED_ICEBERG
    return len(parts) == 2 and low <= parts < high


def _supported_range() -> str:
    (lo1, lo2), (hi1, hi2) = SUPPORTED_ICEBERG
    return f"{lo1}.{lo2} <= version < {hi1}.{hi2} (tested with {TESTED_ICEBERG})"


def jar_iceberg_version(jar: str) -> str | None:
    """The Iceberg version a runtime jar was built as (its `iceberg-build.properties`), else None."""
    try:
        with zipfile.ZipFile(jar) as z:
            props = z.read("iceberg-build.properties").decode("utf-8", "replace")
    except KeyError:
        return None
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{jar} is not a jar: {exc}") from None
    found = re.search(r"^git\.build\.version=(\S+)", props, re.M)
    return found.group(1) if found else None


def installed_spark() -> tuple[str, str] | None:
    """(Spark version, Scala version) of the Spark the driver runs ($SPARK_HOME, else pyspark's own jars)."""
    jars = Path(os.environ["SPARK_HOME"], "jars") if os.environ.get("SPARK_HOME") else None
    if jars is None:
        import importlib.util

        spec = importlib.util.find_spec("pyspark")
        if spec is None or not spec.origin:
            return None
        jars = Path(spec.origin).parent / "jars"
    for core in sorted(jars.glob("spark-core_*.jar")):
        found = re.match(r"spark-core_(\d+\.\d+)-(\d+\.\d+\.\d+)", core.name)
        if found:
            return found.group(2), found.group(1)
    return None


def _runtime_problems(artifact_name: str, version: str | None) -> list[str]:
    """What is wrong with an Iceberg runtime of this artifact and version for the engine and this Spark."""
    problems = []
    if version and not iceberg_supported(version):
        problems.append(f"Iceberg {version} is not supported: icemaint needs {_supported_range()}")
    built = _RUNTIME_ARTIFACT.search(artifact_name)
    spark = installed_spark()
    if built and spark:
        (spark_version, scala), (for_spark, for_scala) = spark, built.groups()
        if not spark_version.startswith(for_spark + ".") or scala != for_scala:
            problems.append(f"built for Spark {for_spark} / Scala {for_scala}, but this Spark is "
                            f"{spark_version} / Scala {scala}")
    return problems


def _named_runtimes(config: MaintenanceConfig) -> list[tuple[str, str, str | None]]:
    """The Iceberg runtimes the deployment names: (setting, artifact or path, version or None)."""
    conf = deployment_conf(config)
    named = []
    for coord in filter(None, (c.strip() for c in conf.get("spark.jars.packages", "").split(","))):
        parts = coord.split(":")
        if len(parts) >= 3 and parts[1].startswith("iceberg-spark-runtime"):
            named.append(("spark.jars.packages", coord, parts[2]))
    for path in filter(None, deployment_conf(config).get("spark.driver.extraClassPath", "").split(os.pathsep)):
        if "iceberg-spark-runtime" in Path(path).name:
            version = jar_iceberg_version(path) if os.path.isfile(path) else None
            named.append(("spark.driver.extraClassPath", path, version))
    for jar in _jar_entries(config):
        if "iceberg-spark-runtime" in Path(jar).name:
            local = _local_path(jar)
            version = jar_iceberg_version(local) if local and os.path.isfile(local) else None
            named.append(("spark.jars", jar, version))
    return named


def check_iceberg_runtime(config: MaintenanceConfig) -> Check:
    """Which Iceberg runtime the session will load, and whether the engine can drive it (without Spark)."""
    name, mode = "iceberg runtime", config.spark.iceberg_runtime
    named = _named_runtimes(config)
    if mode == "bundled" and named:
        return _fail(name, f"spark.iceberg_runtime: bundled adds the bundled runtime beside {named[0][1]} "
                           f"({named[0][0]}): two Iceberg runtimes on one classpath")
    if brings_own_iceberg(config) and not named:
        if mode == "provided":
            return _ok(name, "provided by the cluster's classpath (spark.iceberg_runtime: provided); "
                             "only --spark checks its version")
        return _ok(name, "named in spark.jars / spark.jars.packages; only --spark checks its version")
    if len(named) > 1:
        return _fail(name, "two Iceberg runtimes on one classpath: "
                           + ", ".join(f"{what} ({setting})" for setting, what, _ in named) + "; name one")
    if named:
        lines, failed = [], False
        for setting, what, version in named:
            a_file = setting != "spark.jars.packages"
            local = _local_path(what) if a_file else None
            if a_file and local and not os.path.isfile(local):
                lines.append(f"{what} ({setting}) does not exist")
                failed = True
                continue
            problems = _runtime_problems(what, version)
            failed = failed or bool(problems)
            shown = f"{what} ({setting}{f', Iceberg {version}' if version and a_file else ''})"
            lines.append(shown + (": " + "; ".join(problems) if problems else ""))
        return (_fail if failed else _ok)(name, "; ".join(lines))
    from icemaint.engine.spark_session import iceberg_jar_path

    jar = iceberg_jar_path()
    if not os.path.isfile(jar):
        return _fail(name, f"the bundled runtime {jar} does not exist: reinstall snowpark-connect-deps-iceberg")
    version = jar_iceberg_version(jar)
    problems = _runtime_problems(ICEBERG_JAR, version)
    detail = f"bundled Iceberg {version or 'of unknown version'} ({jar})"
    return _fail(name, detail + ": " + "; ".join(problems)) if problems else _ok(name, detail)


def _jar_entries(config: MaintenanceConfig) -> list[str]:
    return [j.strip() for j in deployment_conf(config).get("spark.jars", "").split(",") if j.strip()]


def _local_path(jar: str) -> str | None:
    """The local file a spark.jars entry names, or None for a remote one (hdfs://, s3a://, https://)."""
    if "://" not in jar and not jar.startswith(("file:", "local:")):
        return jar
    scheme, _, rest = jar.partition(":")
    if scheme not in ("file", "local"):
        return None
    return urlsplit(jar).path if rest.startswith("//") else rest


def check_spark_jars(config: MaintenanceConfig) -> Check:
    """Every local path in `spark.jars` exists (remote ones are left to Spark)."""
    present, missing, remote = [], [], []
    for jar in _jar_entries(config):
        local = _local_path(jar)
        if local is None:
            remote.append(jar)
        elif glob.has_magic(local):
            (present if glob.glob(local) else missing).append(jar)
        else:
            (present if os.path.isfile(local) else missing).append(jar)
    if missing:
        return _fail("spark.jars", "; ".join(f"{jar} does not exist" for jar in missing))
    # A deployment's jars can be dozens (the AWS SDK alone is 30): name a few, count them all.
    shown = ", ".join(present[:3]) + (f" and {len(present) - 3} more" if len(present) > 3 else "")
    detail = f"{shown} exist" if present else ""
    if remote:
        detail += ("; " if present else "") + ", ".join(remote) + " (remote, not checked)"
    return _ok("spark.jars", detail)


def check_jdbc_driver(config: MaintenanceConfig) -> Check:
    """A JDBC catalog on PostgreSQL needs the driver on Spark's classpath."""
    conf = deployment_conf(config)
    named = ",".join((conf.get("spark.jars", ""), conf.get("spark.jars.packages", ""))).lower()
    if "postgresql" in named:
        return _ok("jdbc driver", "PostgreSQL driver named in spark.jars / spark.jars.packages")
    if os.path.isfile(POSTGRES_JDBC_JAR):
        return _ok("jdbc driver", f"{POSTGRES_JDBC_JAR} (added to Spark's jars)")
    return _fail("jdbc driver", f"Spark needs the PostgreSQL JDBC driver for {shown_uri(config.catalog.uri or '')}: "
                                f"install libpostgresql-jdbc-java ({POSTGRES_JDBC_JAR}) or name it in spark.jars")


def check_catalog_credentials(config: MaintenanceConfig) -> Check:
    """Which `ICEMAINT_CATALOG_*` variables are set, by name; what the catalog type expects and lacks."""
    name, cat = "catalog credentials", config.catalog
    present = sorted(secret_env_name(key) for key in catalog_secret_properties(cat))
    empty = sorted(v for v, value in os.environ.items() if v.startswith(SECRET_ENV_PREFIX) and not value)
    shown = f"set: {', '.join(present)}" if present else "none set"
    if empty:
        return _warn(name, f"{shown}; set but empty: {', '.join(empty)}")
    keys = {**cat.properties, **catalog_secret_properties(cat)}
    if cat.type == "jdbc" and (cat.uri or "").startswith("jdbc:postgresql:"):
        lacking = [secret_env_name(k) for k in ("jdbc.password",) if k not in keys]
        if "jdbc.user" not in keys:
            lacking.insert(0, f"catalog.properties.jdbc.user or {secret_env_name('jdbc.user')}")
        if lacking:
            return _warn(name, f"{shown}; missing: {', '.join(lacking)}")
    if cat.type == "rest" and not {"token", "credential"} & set(keys):
        return _ok(name, f"{shown} (a REST catalog that needs auth takes {secret_env_name('token')} "
                         f"or {secret_env_name('credential')})")
    return _ok(name, shown)


def check_catalog(config: MaintenanceConfig, timeout_s: float = NETWORK_TIMEOUT_S,
                  listed: list[list[str]] | None = None) -> Check:
    """The catalog answers: the hadoop warehouse is a writable directory; any other catalog lists its
    tables through the sensors' pyiceberg reader within `timeout_s` (appended to `listed` when given)."""
    from icemaint.observe.catalog import CatalogReader

    cat = config.catalog
    if cat.type == "hadoop":
        where = cat.warehouse or ""
        local = where[len("file://"):] if where.startswith("file://") else where
        if "://" in local:
            return _warn("catalog", f"hadoop warehouse {shown_uri(where)} is not a local path: not checked")
        # a warehouse path relative to the wrong directory is a new user's classic: say it is empty
        found = _directory(Path(local), "catalog", Status.WARN,
                           "does not exist: no tables yet (created with the first table)")
        if found.status is not Status.OK:
            return Check("catalog", found.status, f"hadoop warehouse {found.detail}")
        where, writable = f"hadoop warehouse {local}", " (writable)"
    else:
        where, writable = (f"{cat.type} {shown_uri(cat.uri)}" if cat.uri else cat.type), ""
    try:
        tables = _within(timeout_s, CatalogReader(config).list_tables)
    except Exception as exc:
        return _fail("catalog", f"{where}: {first_line(exc)}")
    if listed is not None:
        listed.append(tables)
    return _ok("catalog", f"{where}: {_tables(tables)}{writable}")


def check_configured_tables(config: MaintenanceConfig, listed: list[list[str]]) -> Check:
    """Every `tables:` entry names a table the catalog has: a misspelt name's policy would never apply (its
    table would run on the defaults), so it fails, naming the entry and the nearest table the catalog has."""
    import difflib

    name, configured = "configured tables", sorted(config.policies.tables)
    if not listed:
        return _warn(name, f"{len(configured)} in tables: not checked (the catalog did not list its tables)")
    known = set(listed[0])
    missing = [t for t in configured if t not in known]
    if missing:
        def near(table: str) -> str:
            close = difflib.get_close_matches(table, sorted(known), n=1)
            return f" (did you mean {close[0]}?)" if close else ""
        return _fail(name, "; ".join(f"tables.{t} names a table the catalog does not have{near(t)}" for t in missing)
                     + f": its policy never applies; fix or remove the entr{'y' if len(missing) == 1 else 'ies'} in "
                       f"{config.source or 'the config'}")
    outside = [t for t in configured if not config.scope.admits(t)]
    if outside:
        return _warn(name, f"{', '.join(outside)} in tables: but outside scope (include/exclude): never maintained")
    return _ok(name, f"all {len(configured)} in tables: are in the catalog")


def _tables(tables: list[str]) -> str:
    return f"{len(tables)} table{'' if len(tables) == 1 else 's'}"


def check_state_dir(config: MaintenanceConfig) -> Check:
    return _directory(config.state_path, "state dir", Status.OK, "(created on first use)")


def _postgres_users(config: MaintenanceConfig) -> dict[str, list[str]]:
    """The DSN variables the config uses, each with the sections (claims, audit) that chose PostgreSQL."""
    users: dict[str, list[str]] = {}
    if config.claims.backend == "postgres":
        users.setdefault(config.claims.dsn_env, []).append("claims")
    if config.audit.sink == "postgres":
        users.setdefault(config.audit.dsn_env, []).append("audit")
    return users


def check_postgres(var: str, sections: list[str], timeout_s: float = NETWORK_TIMEOUT_S) -> Check:
    """The DSN in `$var` connects (what claims and the audit log will do)."""
    import psycopg2
    from psycopg2.extensions import parse_dsn

    from icemaint.safety.postgres import PostgresConnector, dsn_from_env

    name, used = "postgres", f"{' and '.join(sections)} via ${var}"
    dsn = dsn_from_env(var, f"{sections[0]}.dsn_env")
    try:
        parts = parse_dsn(dsn)
    except psycopg2.Error:  # its message may quote the value
        return _fail(name, f"${var} is not a PostgreSQL DSN (its value is not shown)")
    where = f"{parts.get('host', 'local socket')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"

    def connect():
        conn = PostgresConnector(dsn, connect_timeout_s=max(1, int(timeout_s / 2))).connect("icemaint doctor")
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW server_version")
                return cur.fetchone()[0]
        finally:
            conn.close()

    try:
        version = _within(timeout_s, connect)
    except Exception as exc:
        return _fail(name, f"{where} ({used}): {first_line(exc)}")
    return _ok(name, f"{where}: PostgreSQL {version} ({used})")


def check_dagster_instance(config: MaintenanceConfig) -> Check:
    from icemaint.app.instance import get_instance

    instance = get_instance(config, reap=False)  # doctor looks, it changes nothing
    try:
        runs = instance.get_runs_count()
        storage = type(instance.run_storage).__name__
    finally:
        instance.dispose()
    return _ok("dagster instance", f"{config.dagster_home.resolve()} ({storage}, {runs} runs)")


def check_spark(config: MaintenanceConfig) -> Check:
    """Start Spark as maintenance does and report the Iceberg version it loaded and the catalog's answer."""
    from pyspark.sql import SparkSession

    from icemaint.engine.spark_session import _running_session, check_iceberg, get_spark

    # A session another thread started is active in that thread only: it is not ours to stop either.
    ours = SparkSession.getActiveSession() is None and _running_session(SparkSession) is None
    spark = get_spark(config)
    try:
        version = check_iceberg(spark)
        started = f"Spark {spark.version} ({config.spark.master}) with Iceberg {version}"
        cat = config.catalog
        if cat.type == "hadoop" and not os.path.isdir((cat.warehouse or "").removeprefix("file://")):
            # Iceberg's HadoopCatalog cannot list a warehouse that does not exist yet
            return _ok("spark", f"{started}; catalog {cat.name}: empty warehouse")
        try:
            namespaces = spark.sql(f"SHOW NAMESPACES IN `{cat.name}`").count()
        except Exception as exc:
            return _fail("spark", f"{started}, but catalog {cat.name} failed: {first_line(exc)}")
        return _ok("spark", f"{started}; catalog {cat.name}: {namespaces} namespace{'' if namespaces == 1 else 's'}")
    finally:
        if ours:  # leave a session someone else started (a test run's) running
            spark.stop()


# -- the report ------------------------------------------------------------------------------------------
def secret_values(config: MaintenanceConfig) -> list[str]:
    """Values no line may show: the catalog's secrets and the PostgreSQL DSNs in the environment, and
    the passwords inside those DSNs (a driver's message may quote one alone)."""
    dsn_vars = {config.claims.dsn_env, config.audit.dsn_env, "PGPASSWORD"}
    values = [v for k, v in os.environ.items() if v and (k.startswith(SECRET_ENV_PREFIX) or k in dsn_vars)]
    for value in list(values):
        values += re.findall(r"//[^/@:]*:([^/@]+)@", value)
        values += re.findall(r"password\s*=\s*'?([^\s&;']+)", value, flags=re.I)
    # longest first, so a DSN goes whole before its password; very short values would garble every line
    return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)


def _scrubbed(check: Check, secrets: list[str]) -> Check:
    detail = check.detail
    for value in secrets:
        detail = detail.replace(value, "***")
    return check if detail == check.detail else Check(check.name, check.status, detail)


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    try:
        return check()
    except Exception as exc:
        return _fail(name, first_line(exc))


def check_automation(config: MaintenanceConfig) -> Check:
    """What starts on its own when the UI or the daemon loads the definitions (read from them, as the UI shows)."""
    from maint_assets.definitions import build_definitions
    from sensors.startup import startup_summary

    return _ok("automation", startup_summary(config, build_definitions(config.source)))


def run_doctor(config: MaintenanceConfig, config_path: str | os.PathLike | None = None, *, spark: bool = False,
               timeout_s: float = NETWORK_TIMEOUT_S) -> list[Check]:
    """Every check for this config, in the order a new user fixes them.

    Args:
        config: the loaded configuration (loading it was the first check).
        config_path: the file it came from, for the report.
        spark: also start Spark and report the Iceberg version it loaded (slow: a JVM).
        timeout_s: how long the catalog and PostgreSQL get to answer.
    """
    checks = [_guarded("config", lambda: check_config(config, config_path)),
              _guarded("java", check_java)]
    if config.spark.master.startswith("local"):  # a cluster's file systems are its own
        checks.append(_guarded("local files", lambda: check_local_files(config)))
    checks.append(_guarded("iceberg runtime", lambda: check_iceberg_runtime(config)))
    checks.append(_guarded("class archive", lambda: check_class_archive(config)))
    if _jar_entries(config):
        checks.append(_guarded("spark.jars", lambda: check_spark_jars(config)))
    if config.catalog.type == "jdbc" and (config.catalog.uri or "").startswith("jdbc:postgresql:"):
        checks.append(_guarded("jdbc driver", lambda: check_jdbc_driver(config)))
    checks.append(_guarded("catalog credentials", lambda: check_catalog_credentials(config)))
    listed: list[list[str]] = []
    checks.append(_guarded("catalog", lambda: check_catalog(config, timeout_s, listed)))
    if config.policies.tables:
        checks.append(_guarded("configured tables", lambda: check_configured_tables(config, listed)))
    checks.append(_guarded("state dir", lambda: check_state_dir(config)))
    for var, sections in _postgres_users(config).items():
        checks.append(_guarded("postgres", lambda var=var, sections=sections: check_postgres(var, sections, timeout_s)))
    checks.append(_guarded("dagster instance", lambda: check_dagster_instance(config)))
    checks.append(_guarded("automation", lambda: check_automation(config)))
    if spark:
        blocking = [c.name for c in checks
                    if c.status is Status.FAIL and c.name in ("java", "iceberg runtime", "spark.jars")]
        checks.append(_warn("spark", f"not started: fix {', '.join(blocking)} first") if blocking
                      else _guarded("spark", lambda: check_spark(config)))
    secrets = secret_values(config)
    return [_scrubbed(c, secrets) for c in checks]
