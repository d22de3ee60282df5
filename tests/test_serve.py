"""`icemaint serve`: ticks on an interval in one process on one JVM, probes for a supervisor, a graceful SIGTERM."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import run_cli, streaming_table, write_config
from icemaint.config import load_config
from icemaint.domain.serve_health import (BUG, OPERATIONAL, Recycle, ServeState, TickRecord, alive, ready,
                                          recycle_after, stale_after)
from icemaint.observe.catalog import CatalogReader
from icemaint.safety.claims import open_claims
from waiting import Patience, cpu_steps

REPO = Path(__file__).resolve().parent.parent


def state(**changes) -> ServeState:
    s = ServeState(started_at=1000.0, interval=60.0, stale_after=900.0, heartbeat=1000.0, spark_started=True)
    for key, value in changes.items():
        setattr(s, key, value)
    return s


@pytest.mark.parametrize("heartbeat, now, expected", [(1000.0, 1000.0, True), (1000.0, 1900.0, True),
                                                      (1000.0, 1900.5, False)])
def test_alive_while_the_last_beat_is_within_stale_after(heartbeat, now, expected):
    ok, body = alive(state(heartbeat=heartbeat), now)
    assert ok is expected and body["alive"] is expected


@pytest.mark.parametrize("changes, expected, reason", [
    ({}, True, None),
    ({"spark_started": False}, False, "Spark session has not started"),
    ({"last": TickRecord(3, 1000.0, 1.0, failed=True)}, True, None),  # a failed run of one table: still ready
    ({"last": TickRecord(3, 1000.0, 1.0, failed=True, raised=OPERATIONAL, error="CatalogUnavailable: down")},
     False, "tick 3 failed (operational): CatalogUnavailable: down"),
    ({"last": TickRecord(3, 1000.0, 1.0, failed=True, raised=BUG, error="KeyError: 'x'")}, False, "(bug)"),
    ({"stopping": True}, False, "stopping"),
])
def test_ready_unless_spark_is_down_the_last_tick_raised_or_it_is_stopping(changes, expected, reason):
    ok, body = ready(state(**changes), 1010.0)
    assert ok is expected and body["ready"] is expected
    assert (reason is None and body["reasons"] == []) or any(reason in r for r in body["reasons"])


def test_stale_after_covers_three_intervals_and_a_long_tick():
    assert stale_after(60, None) == 900 and stale_after(600, None) == 1800 and stale_after(60, 120) == 120


MiB = 2**20


@pytest.mark.parametrize("rss, limit, ticks_in_process, stopping, expected", [
    (300 * MiB, 200 * MiB, 5, False, Recycle(tick=9, rss=300 * MiB, limit=200 * MiB, first_in_process=False)),
    (300 * MiB, 200 * MiB, 1, False, Recycle(tick=9, rss=300 * MiB, limit=200 * MiB, first_in_process=True)),
    (200 * MiB, 200 * MiB, 5, False, None),   # at the limit is not over it
    (300 * MiB, None, 5, False, None),        # --recycle-above off
    (None, 200 * MiB, 5, False, None),        # nothing measured (no /proc): never on a guess
    (300 * MiB, 200 * MiB, 5, True, None),    # stopping: the process exits instead
])
def test_recycles_only_when_measured_over_the_limit_and_not_stopping(rss, limit, ticks_in_process, stopping,
                                                                     expected):
    assert recycle_after(9, rss, limit, ticks_in_process, stopping) == expected


@pytest.mark.parametrize("argv, words", [(["--interval", "0s"], "under a second"),
                                         (["--interval", "soon"], "is not a duration"),
                                         (["--health-port", "70000"], "not a TCP port"),
                                         (["--recycle-above", "512KiB"], "under 1 MiB"),
                                         (["--recycle-above", "lots"], "is not a size")])
def test_bad_flags_are_one_line_and_start_nothing(capsys, argv, words):
    code, out, err = run_cli(capsys, "serve", *argv)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and out == ""


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def due_table(spark, lake_root, tmp_path):
    """A simulated streaming table with three due dates, and a config that maintains it alone."""
    writer = streaming_table(spark, "lake", f"serve_{uuid.uuid4().hex[:8]}.events", batches=4, rows_per_day=8,
                             delete_every=0)
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        scope={"include": [writer.name.key]})
    return writer, path


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_dagster_home")
def test_two_ticks_on_one_jvm_compact_and_answer_the_probes(spark, lake_root, tmp_path):
    from icemaint.app.serve import Serve

    writer, path = due_table(spark, lake_root, tmp_path)
    lines: list[str] = []
    serve = Serve(load_config(path), str(path), interval=1.0, health=("127.0.0.1", 0), json_lines=True,
                  emit=lines.append)
    base = "http://{}:{}".format(*serve.health.address)
    try:
        code, body = get(base + "/readyz")
        assert code == 503 and "Spark session has not started" in body["reasons"][0]
        assert serve.run(max_ticks=2) == 2
        ticks = [json.loads(line) for line in lines]
        assert [t["tick"] for t in ticks] == [1, 2]
        # one JVM for both: the session of this process, the same application and pid
        own_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        assert {t["spark_app_id"] for t in ticks} == {spark.sparkContext.applicationId}
        assert {t["jvm_pid"] for t in ticks} == {own_pid}
        assert all(t["rss_python_bytes"] > 0 and t["rss_jvm_bytes"] > 0 for t in ticks)
        assert all(isinstance(t["rss_trimmed_bytes"], int) and t["rss_trimmed_bytes"] >= 0 for t in ticks)  # glibc
        assert all(0 < t["jvm_heap_committed_bytes"] <= t["jvm_heap_max_bytes"] for t in ticks)
        assert ticks[0]["published"] == 3 and ticks[1]["published"] == 0 and not any(t["failed"] for t in ticks)
        code, body = get(base + "/healthz")
        assert code == 200 and body["alive"] and body["ticks"] == 2
        code, body = get(base + "/readyz")  # stopping after --max-ticks: out of service
        assert code == 503 and body["reasons"] == ["stopping"] and body["last_tick"]["number"] == 2
        assert get(base + "/nope")[0] == 404
    finally:
        serve.close()
    reader = CatalogReader(load_config(path))  # pyiceberg: an independent reader
    assert [p.data_files for p in reader.health(writer.name.key).partitions] == [1, 1, 1]
    ids = reader.load(writer.name.key).scan().to_arrow().column("event_id").to_pylist()
    assert sorted(ids) == sorted(writer.ledger.expected_ids())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sigterm_mid_tick_exits_0_with_one_line_and_leaves_main_whole(spark, lake_root, tmp_path):
    writer, path = due_table(spark, lake_root, tmp_path)
    reader = CatalogReader(load_config(path))
    head_before = reader.load(writer.name.key).metadata.current_snapshot_id
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "unused-dagster-home"), "ICEMAINT_IDENTITY": "maint-test"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "icemaint"), "--config", str(path), "serve",
                             "--interval", "1s", "--health-port", str(port), "--json"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        claims, patience = open_claims(load_config(path)), Patience("serve's first run", cap_s=1800)
        while claims.holder_of(writer.name.key) is None:  # the first tick's run holds the claim: SIGTERM lands in it
            assert proc.poll() is None, f"serve exited before its first run: {proc.stderr.read()[-3000:]}"
            patience.check(cpu_steps(proc.pid))
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out
    ticks = [json.loads(line) for line in out.splitlines()[1:]]
    # the run in flight answered it at a step boundary (or had just published), and no further tick started
    assert len(ticks) == 1 and ticks[0]["stopping"] and ticks[0]["runs"] == 1, out
    stopped = [line for line in err.splitlines() if line.startswith("serve: ")]
    assert stopped == [stopped[-1]] and stopped[-1].startswith("serve: stopped (terminated (SIGTERM)) after 1 tick")
    table = reader.load(writer.name.key)
    assert set(table.metadata.refs) == {"main"}  # no staging branch left behind
    ancestry = set()
    snapshot = table.current_snapshot()
    while snapshot is not None:  # main is where it was or forward of it, never rewound
        ancestry.add(snapshot.snapshot_id)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    assert head_before in ancestry
    if ticks[0]["published"] == 0:
        assert table.current_snapshot().snapshot_id == head_before
    ids = table.scan().to_arrow().column("event_id").to_pylist()
    assert sorted(ids) == sorted(writer.ledger.expected_ids())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_over_recycle_above_it_starts_afresh_in_the_same_process_with_a_new_jvm(spark, lake_root, tmp_path):
    """Over the limit after each tick (1 MiB), serve executes itself again: the same pid, the tick count carried on, a
    new JVM while the old one has exited. A SIGTERM sent once the old JVM is gone lands in the start afresh (held
    over the exec or delivered to the new image): it still stops gracefully, exit 0, without a new JVM."""
    writer, path = due_table(spark, lake_root, tmp_path)
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "unused-dagster-home"), "ICEMAINT_IDENTITY": "maint-test"}
    err_file = (tmp_path / "serve.err").open("w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "icemaint"), "--config", str(path), "serve",
                             "--interval", "1s", "--recycle-above", "1MiB", "--json"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=err_file, text=True)
    lines: queue.Queue = queue.Queue()
    seen: list[dict] = []
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()

    def next_event(kind: str) -> dict:
        patience = Patience(f"serve's {kind} line", cap_s=1800)
        while True:
            try:
                event = json.loads(lines.get(timeout=0.5))
            except queue.Empty:
                assert proc.poll() is None, f"serve exited: {(tmp_path / 'serve.err').read_text()[-3000:]}"
                patience.check(cpu_steps(proc.pid), seen)
                continue
            seen.append(event)
            if event["event"] == kind:
                return event

    try:
        first = next_event("start")
        tick1 = next_event("tick")
        assert next_event("recycle")["tick"] == 1
        second = next_event("start")
        tick2 = next_event("tick")
        assert next_event("recycle")["tick"] == 2
        patience = Patience("the second JVM's exit", cap_s=600)
        while not gone(tick2["jvm_pid"]):  # past stop_jvm: the stop signals are held from here on
            patience.check(cpu_steps(proc.pid))
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        err_file.close()
    reader.join(timeout=60)
    err = (tmp_path / "serve.err").read_text()
    third = [json.loads(lines.get_nowait()) for _ in range(lines.qsize())]
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    assert [e["event"] for e in third] == ["start"], third  # the third image saw the stop: no tick, no JVM
    assert [(e["restarts"], e["ticks_before"]) for e in (first, second, third[0])] == [(0, 0), (1, 1), (2, 2)]
    assert {e["pid"] for e in (first, second, third[0])} == {proc.pid}  # the same process all along
    assert [t["tick"] for t in (tick1, tick2)] == [1, 2]
    assert tick1["jvm_pid"] != tick2["jvm_pid"] and tick1["spark_app_id"] != tick2["spark_app_id"]
    assert gone(tick1["jvm_pid"]) and gone(tick2["jvm_pid"])
    stopped = [line for line in err.splitlines() if line.startswith("serve: ")]
    assert stopped == ["serve: stopped (terminated (SIGTERM)) after 2 ticks"], err[-3000:]
    assert tick1["published"] == 3 and tick2["published"] == 0 and not tick1["failed"] and not tick2["failed"]
    table = CatalogReader(load_config(path)).load(writer.name.key)
    assert set(table.metadata.refs) == {"main"}
    ids = table.scan().to_arrow().column("event_id").to_pylist()
    assert sorted(ids) == sorted(writer.ledger.expected_ids())
