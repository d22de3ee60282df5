"""A throwaway PostgreSQL server for the production-profile tests (session fixtures `postgres_dsn`,
`postgres_server`). Needs the Debian packages that scripts/ensure_postgres.sh installs.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

DATABASE = "icemaint"
USER = "icemaint"
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class PostgresServer:
    """A running test server; `dsn` for psycopg2/libpq, `jdbc_url` + user/password for a JdbcCatalog."""

    host: str
    port: int
    user: str
    password: str
    database: str
    socket_dir: str
    pid: int

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"


def find_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin that has initdb and postgres, else None."""
    candidates = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        bindir = Path(initdb).parent
        version = bindir.parent.name
        if (bindir / "postgres").exists() and version.isdigit():
            candidates.append((int(version), bindir))
    return max(candidates)[1] if candidates else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user() -> dict:
    """Popen arguments that run a command as the `postgres` OS user when we are root.

    The server refuses to run as root. Popen's user/group switch execs postgres directly (unlike
    runuser, which forks), so Popen.pid is the postmaster's own PID and we can stop it by PID.
    """
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root but there is no 'postgres' OS user: run scripts/ensure_postgres.sh")
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _server_env(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(HOME=str(root), LC_ALL="C", LANG="C")
    return env


def _wait_ready(server: PostgresServer, proc: subprocess.Popen, log: Path) -> None:
    import psycopg2

    deadline = time.monotonic() + _START_TIMEOUT_S
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {proc.returncode}; log:\n{log.read_text()[-3000:]}")
        try:
            psycopg2.connect(host=server.host, port=server.port, user=server.user,
                             password=server.password, dbname="postgres", connect_timeout=2).close()
            return
        except psycopg2.OperationalError as exc:
            last = exc
            time.sleep(0.1)
    raise RuntimeError(f"postgres did not accept connections within {_START_TIMEOUT_S}s ({last}); "
                       f"log:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    # SIGINT is the server's "fast" shutdown: it ends sessions and stops without waiting for clients.
    os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=_STOP_TIMEOUT_S)


def start_server(root: Path) -> tuple[PostgresServer, subprocess.Popen]:
    """initdb into `root` and start a server on 127.0.0.1:<free port>; the caller stops it."""
    import psycopg2

    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: "
                    "run scripts/ensure_postgres.sh")
    as_user = _as_server_user()
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    password = secrets.token_hex(12)
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")
    if as_user:
        for p in (root, sock, pwfile):
            os.chown(p, as_user["user"], as_user["group"])
    env = _server_env(root)

    init = subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={pwfile}", "-E", "UTF8",
         "--no-locale", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"],
        cwd=root, env=env, capture_output=True, text=True, **as_user,
    )
    pwfile.unlink()
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed ({init.returncode}):\n{init.stdout}\n{init.stderr}")

    log = root / "postgres.log"
    for _attempt in range(3):
        port = _free_port()
        with open(log, "ab") as log_fh:
            proc = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(data), "-p", str(port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={sock}",
                 # A throwaway server: durability buys nothing and costs the shared 2 cores.
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=100", "-c", "shared_buffers=32MB"],
                cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                start_new_session=True, **as_user,
            )
        server = PostgresServer("127.0.0.1", port, USER, password, DATABASE, str(sock), proc.pid)
        try:
            _wait_ready(server, proc, log)
            break
        except RuntimeError:
            _stop(proc)
            # Another process may have taken the free port between our probe and the bind: retry.
            if "could not bind" not in log.read_text():
                raise
    else:
        raise RuntimeError(f"postgres could not bind a free port; log:\n{log.read_text()[-3000:]}")

    conn = psycopg2.connect(host=server.host, port=server.port, user=USER, password=password,
                            dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DATABASE}")  # a constant of this module, not input
    conn.close()
    return server, proc


@contextlib.contextmanager
def running_server(prefix: str = "icemaint-pg-") -> Iterator[PostgresServer]:
    """A server in a new temporary directory, stopped by PID and deleted at the end (also used by the
    benchmark's shared catalog, benchmarks/shared_catalog.py)."""
    # Not under pytest's tmp dir: that is 0700 root-owned, and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix=prefix))
    proc = None
    try:
        server, proc = start_server(root)
        yield server
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server for this test session."""
    with running_server() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_dsn(postgres_server) -> str:
    """`postgresql://icemaint:<password>@127.0.0.1:<port>/icemaint` of the session's test server."""
    return postgres_server.dsn


@contextlib.contextmanager
def fresh_database(dsn: str, name: str) -> Iterator[str]:
    """A new, empty database on the server of `dsn` for one test; yields its DSN, then drops it."""
    import psycopg2
    from psycopg2 import sql

    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        yield dsn.rsplit("/", 1)[0] + "/" + name
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
    finally:
        admin.close()
