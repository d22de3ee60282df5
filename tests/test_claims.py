"""Table claims on both backends: flock files and PostgreSQL advisory locks (real server)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg2
import pytest

from conftest import make_config
from icemaint.safety.claims import (
    ClaimBusy,
    FileClaims,
    PostgresClaims,
    advisory_key,
    open_claims,
    table_claim,
)
from icemaint.config.parse import ConfigError
from icemaint.domain.names import InvalidTableName

REPO = Path(__file__).resolve().parents[1]
DSN_ENV = "ICEMAINT_TEST_CLAIMS_DSN"


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def cfg(request, tmp_path, monkeypatch):
    """A config whose claims backend is the parameter (the postgres one on the test server)."""
    if request.param == "postgres":
        monkeypatch.setenv(DSN_ENV, request.getfixturevalue("postgres_dsn"))
        return make_config(tmp_path, claims={"backend": "postgres", "dsn_env": DSN_ENV})
    return make_config(tmp_path)


@pytest.fixture
def claims(cfg):
    return open_claims(cfg)


def _recent(ts: dt.datetime | None) -> bool:
    return ts is not None and abs(dt.datetime.now(dt.timezone.utc) - ts) < dt.timedelta(seconds=30)


def test_open_claims_picks_the_configured_backend(cfg, claims):
    expected = PostgresClaims if cfg.claims.backend == "postgres" else FileClaims
    assert isinstance(claims, expected)


def test_acquire_release_and_holder_of(claims, table_name):
    assert claims.holder_of(table_name) is None

    claim = claims.acquire(table_name, "maintenance")
    info = claims.holder_of(table_name)
    assert (info.table, info.holder, info.pid, info.host) == (table_name, "maintenance", os.getpid(),
                                                              socket.gethostname())
    assert _recent(info.since)
    assert claim.is_held()

    claim.release()
    assert claim.released and not claim.is_held()
    assert claims.holder_of(table_name) is None
    claims.acquire(table_name, "maintenance").release()  # free again


def test_busy_claim_names_its_holder(claims, table_name):
    with claims.acquire(table_name, "ingest"):
        with pytest.raises(ClaimBusy) as caught:
            claims.acquire(table_name, "maintenance")
    busy = caught.value
    assert busy.table == table_name and busy.holder == "ingest" and _recent(busy.since)
    message = str(busy)
    assert message.startswith(f"claim on {table_name} is held by 'ingest' (pid {os.getpid()} on host ")
    assert " since 20" in message
    assert claims.holder_of(table_name) is None  # the `with` released it


def test_claims_are_per_table(claims, table_name):
    with claims.acquire(table_name, "ingest"), claims.acquire(table_name + "_other", "maintenance"):
        assert claims.holder_of(table_name).holder == "ingest"
        assert claims.holder_of(table_name + "_other").holder == "maintenance"


def test_two_backend_objects_in_one_process_conflict(cfg, table_name):
    # flock conflicts between two open() calls of one process, and advisory locks between two
    # sessions: a claim is not re-entrant, not even for its own process.
    first, second = open_claims(cfg), open_claims(cfg)
    with first.acquire(table_name, "a"):
        with pytest.raises(ClaimBusy):
            second.acquire(table_name, "b")
    second.acquire(table_name, "b").release()


def test_release_is_idempotent_and_never_frees_a_later_holder(claims, table_name):
    first = claims.acquire(table_name, "first")
    first.release()
    first.release()
    with claims.acquire(table_name, "second"):
        first.release()  # a stale handle must not touch the new holder's claim
        with first:
            pass
        assert claims.holder_of(table_name).holder == "second"
        with pytest.raises(ClaimBusy):
            claims.acquire(table_name, "third")


_HOLD_AND_WAIT = """
import sys, time
from icemaint.safety.claims import FileClaims, PostgresClaims
backend, where, table = sys.argv[1:4]
claims = FileClaims(where) if backend == "file" else PostgresClaims(where)
claim = claims.acquire(table, "doomed")
print("held", flush=True)
time.sleep(120)
"""


def test_a_dead_holder_frees_the_claim(cfg, claims, table_name):
    where = cfg.state_dir if cfg.claims.backend == "file" else os.environ[DSN_ENV]
    child = subprocess.Popen([sys.executable, "-c", _HOLD_AND_WAIT, cfg.claims.backend, where, table_name],
                             stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout.readline().strip() == "held"
        info = claims.holder_of(table_name)
        assert (info.holder, info.pid) == ("doomed", child.pid)
        with pytest.raises(ClaimBusy, match=f"'doomed' \\(pid {child.pid} "):
            claims.acquire(table_name, "maintenance")
    finally:
        child.send_signal(signal.SIGKILL)  # no cleanup runs: the OS / server must free the lock
        child.wait(timeout=10)
        child.stdout.close()

    # The server notices the dropped connection asynchronously; the OS frees a flock at once.
    deadline = time.monotonic() + 10
    while claims.holder_of(table_name) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert claims.holder_of(table_name) is None
    with claims.acquire(table_name, "maintenance"):
        assert claims.holder_of(table_name).holder == "maintenance"


def test_file_claim_stale_note_is_only_informational(tmp_path, table_name):
    claims = FileClaims(tmp_path)
    claims.directory.mkdir(parents=True)
    note = claims.directory / f"{table_name}.holder.json"
    note.write_text(json.dumps({"holder": "ghost", "pid": 999999, "host": "gone", "since": "2020-01-01T00:00:00+00:00"}))
    assert claims.holder_of(table_name) is None
    with claims.acquire(table_name, "maintenance"):
        assert claims.holder_of(table_name).holder == "maintenance"
    assert not note.exists()  # the holder removes its own note on release
    assert (claims.directory / f"{table_name}.lock").exists()  # lock files are never deleted


@pytest.mark.postgres
def test_postgres_stale_row_does_not_block_and_lost_session_is_detected(postgres_dsn, table_name):
    claims = PostgresClaims(postgres_dsn)
    claim = claims.acquire(table_name, "maintenance")
    admin = psycopg2.connect(postgres_dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT backend_pid FROM icemaint_claims WHERE table_name = %s", (table_name,))
            (backend_pid,) = cur.fetchone()
            cur.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))
        deadline = time.monotonic() + 10
        while claims.holder_of(table_name) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not claim.is_held()  # a commit guarded by this claim must not go ahead
        assert claims.holder_of(table_name) is None  # the row left behind is not a holder
        with admin.cursor() as cur:
            cur.execute("SELECT holder FROM icemaint_claims WHERE table_name = %s", (table_name,))
            assert cur.fetchone() == ("maintenance",)
        claim.release()  # the session is gone: release must still not raise
        with claims.acquire(table_name, "ingest"):
            assert claims.holder_of(table_name).holder == "ingest"
    finally:
        admin.close()


def test_advisory_key_is_stable_signed_64_bit():
    assert advisory_key("db.events") == advisory_key("db.events")
    assert advisory_key("db.events") != advisory_key("db.events2")
    keys = [advisory_key(f"ns.t{i}") for i in range(200)]
    assert all(-(2**63) <= k < 2**63 for k in keys) and any(k < 0 for k in keys)


def test_table_claim_waits_for_the_holder(cfg, claims, table_name):
    held = claims.acquire(table_name, "ingest")
    threading.Timer(0.5, held.release).start()
    started = time.monotonic()
    with table_claim(cfg, table_name, holder="maintenance", wait_seconds=10, poll_seconds=0.05) as claim:
        waited = time.monotonic() - started
        assert claim.holder == "maintenance"
        assert claims.holder_of(table_name).holder == "maintenance"
    assert 0.4 <= waited < 5
    assert claims.holder_of(table_name) is None


def test_table_claim_times_out_naming_the_holder(cfg, claims, table_name):
    with claims.acquire(table_name, "ingest"):
        started = time.monotonic()
        with pytest.raises(ClaimBusy, match="held by 'ingest'"):
            with table_claim(cfg, table_name, holder="maintenance", wait_seconds=0.3, poll_seconds=0.05):
                pytest.fail("the body must not run while the claim is busy")
        assert 0.3 <= time.monotonic() - started < 3
        assert claims.holder_of(table_name).holder == "ingest"


def test_table_claim_without_wait_fails_at_once(cfg, claims, table_name):
    with claims.acquire(table_name, "ingest"):
        started = time.monotonic()
        with pytest.raises(ClaimBusy):
            with table_claim(cfg, table_name, holder="maintenance"):
                pass
        assert time.monotonic() - started < 1


def test_table_claim_releases_when_the_body_raises(cfg, claims, table_name):
    with pytest.raises(RuntimeError, match="writer failed"):
        with table_claim(cfg, table_name, holder="ingest"):
            raise RuntimeError("writer failed")
    assert claims.holder_of(table_name) is None


@pytest.mark.parametrize("bad", ["events", "db.events; DROP TABLE x", "../etc.passwd", "db/x.y", "", "db..x"])
def test_bad_table_names_are_refused_and_mutate_nothing(cfg, claims, bad):
    with pytest.raises(InvalidTableName):
        claims.acquire(bad, "maintenance")
    with pytest.raises(InvalidTableName):
        claims.holder_of(bad)
    with pytest.raises(InvalidTableName):
        with table_claim(cfg, bad, holder="ingest"):
            pass
    assert not (Path(cfg.state_dir) / "claims").exists()


def test_bad_holder_and_wait_arguments_are_refused(cfg, claims, table_name):
    with pytest.raises(ValueError, match="holder"):
        claims.acquire(table_name, " ")
    with pytest.raises(ValueError, match="wait_seconds"):
        with table_claim(cfg, table_name, holder="ingest", wait_seconds=-1):
            pass
    assert claims.holder_of(table_name) is None


def test_postgres_backend_without_dsn_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("ICEMAINT_TEST_NO_SUCH_DSN", raising=False)
    config = make_config(tmp_path, claims={"backend": "postgres", "dsn_env": "ICEMAINT_TEST_NO_SUCH_DSN"})
    with pytest.raises(ConfigError, match="ICEMAINT_TEST_NO_SUCH_DSN is not set"):
        open_claims(config)
