"""`icemaint serve`: one long-lived process that ticks on an interval over one warm Spark session.

Each tick is `icemaint tick`'s (`Ticker.tick`, one `Ticker` and so one Dagster instance for the process); the JVM
starts once, before the first tick, and every run of every tick uses it. A supervisor probes `/healthz` (the loop
beats) and `/readyz` (Spark started, the last tick did not raise) on a small HTTP server in a thread; the verdicts
are `icemaint.domain.serve_health`'s. SIGTERM or Ctrl-C stops it gracefully: the run in flight stops at its next step
boundary (`icemaint.safety.interrupts`: before the act, before staging, before each publish) or finishes, no tick
starts after it, and it exits 0 with one line; a second signal interrupts at once, as Ctrl-C does in `tick`.

Every tick's line carries the resident memory of this process and of its JVM (docs/operations/serve.md;
`make bench-serve` measures it over many ticks). When the Python process's resident set is over `--recycle-above`
after a tick, it starts afresh: the JVM stopped and waited for, the same command executed again in the same process
(the same pid, so a supervisor sees no exit), its tick count carried on (`CARRIED_TICKS`).
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable

from icemaint.app.cli_output import save_trace
from icemaint.app.cli_types import port, positive_int
from icemaint.app.process_memory import jvm_heap, jvm_pid, rss_bytes, trim_heap
from icemaint.domain.serve_health import (BUG, OPERATIONAL, Recycle, ServeState, TickRecord, alive, ready,
                                          recycle_after, stale_after)
from icemaint.domain.units import counted, human_duration, human_size, parse_duration, parse_size, printable
from icemaint.errors import UserError, is_operational, one_line
from icemaint.safety import interrupts

if TYPE_CHECKING:
    from icemaint.app.ticker import Ticker

DEFAULT_INTERVAL = "60s"
DEFAULT_RECYCLE_ABOVE = "1GiB"
WAIT_SLICE = 0.5  # seconds: how soon a signal between ticks is seen
# What a process image that started afresh carries on from the one before it (set by `start_afresh`, read once).
CARRIED_TICKS, CARRIED_RESTARTS = "ICEMAINT_SERVE_TICKS", "ICEMAINT_SERVE_RESTARTS"


def interval_arg(text: str) -> float:
    """`--interval` / `--stale-after`: a readable duration of at least one second."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is under a second: give at least 1s")
    return seconds


def recycle_arg(text: str) -> int | None:
    """`--recycle-above`: a readable size of at least 1 MiB, or `off`."""
    if text.strip().lower() == "off":
        return None
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size < 2**20:
        raise argparse.ArgumentTypeError(f"{text!r} is under 1 MiB: give a size such as 2GiB, or off")
    return size


def carried() -> tuple[int, int]:
    """The ticks and restarts of the process images before this one (0, 0 for a process a person started)."""
    try:
        return int(os.environ.pop(CARRIED_TICKS, 0)), int(os.environ.pop(CARRIED_RESTARTS, 0))
    except ValueError:
        return 0, 0


class HealthServer:
    """`GET /healthz` and `GET /readyz` as JSON, 200 or 503, from the loop's state (a thread, `http.server`)."""

    def __init__(self, host: str, port: int, answer: Callable[[str], tuple[int, dict] | None]):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                found = answer(self.path.split("?", 1)[0])
                status, body = found if found else (404, {"error": f"no such path {self.path!r}: /healthz, /readyz"})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format, *args) -> None:  # noqa: A002 - a probe every few seconds is no log line
                pass

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise UserError(f"--health-host {host} --health-port {port} cannot be used ({exc.strerror or exc}): "
                            "give another port or address") from None
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="icemaint-serve-health", daemon=True)
        self.thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Serve:
    """The loop: one `Ticker`, one Spark session, a tick every `interval` seconds (between a tick's end and the next's
    start, so ticks never overlap), until `max_ticks` (counted from `ticks_before`, the ticks of the process images
    before this one), an interrupt, or a tick after which the resident set is over `recycle_above` (`recycling`
    says so; `cmd_serve` then starts afresh)."""

    def __init__(self, config, config_path: str | None, interval: float, stale: float | None = None,
                 health: tuple[str, int] | None = None, json_lines: bool = False, emit: Callable[[str], None] = print,
                 recycle_above: int | None = None, ticks_before: int = 0):
        self.config, self.config_path, self.json_lines, self.emit = config, config_path, json_lines, emit
        self.recycle_above, self.ticks_before = recycle_above, ticks_before
        self.recycling: Recycle | None = None
        now = time.time()
        self.state = ServeState(started_at=now, interval=interval, stale_after=stale_after(interval, stale),
                                heartbeat=now, ticks=ticks_before)
        self.lock = threading.Lock()
        self.health = HealthServer(health[0], health[1], self.probe) if health else None  # before Spark: a bad port
        self.spark: Any = None
        self.ticker: Ticker | None = None

    def probe(self, path: str) -> tuple[int, dict] | None:
        verdict = {"/healthz": alive, "/readyz": ready}.get(path)
        if verdict is None:
            return None
        with self.lock:
            ok, body = verdict(self.state, time.time())
        return (200 if ok else 503), body

    def beat(self, **changes) -> None:
        with self.lock:
            self.state.heartbeat = time.time()
            for key, value in changes.items():
                setattr(self.state, key, value)

    def start(self) -> None:
        """The Dagster instance and the warm Spark session every tick's runs use."""
        from icemaint.app.ticker import Ticker
        from icemaint.engine.spark_session import get_spark

        self.ticker = Ticker(self.config, self.config_path)
        self.spark = get_spark(self.config)
        self.beat(spark_started=True, spark_app_id=self.spark.sparkContext.applicationId)

    def run(self, max_ticks: int | None = None) -> int:
        """Ticks until `max_ticks`, an interrupt or a recycle; the number of ticks that started, with those of the
        process images before this one."""
        if self.ticker is None and not interrupts.stopping():  # a stop held over a fresh start: no JVM for it
            self.start()
        n = self.ticks_before
        try:
            while not interrupts.stopping() and (max_ticks is None or n < max_ticks):
                n += 1
                self.tick(n)
                if interrupts.stopping() or (max_ticks is not None and n >= max_ticks):
                    self.recycling = None  # the process ends here: no fresh start
                    break
                if self.recycling is not None:
                    break
                self.wait()
        except KeyboardInterrupt:  # a run answered the interrupt, no further run started, or a second signal
            self.recycling = None
        self.beat(stopping=True, ticking=None)
        return n

    def wait(self) -> None:
        deadline = time.monotonic() + self.state.interval
        while not interrupts.stopping():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(WAIT_SLICE, left))
            self.beat()

    def tick(self, n: int) -> TickRecord:
        """One `Ticker.tick`, its line emitted; an interrupt is emitted as the tick's end, then goes on up."""
        assert self.ticker is not None
        self.beat(ticking=n)
        started, report, raised, error = time.monotonic(), None, None, None
        try:
            report = self.ticker.tick()
        except KeyboardInterrupt as exc:  # the run in flight answered it (main as it was), or none started
            self.finish(TickRecord(n, time.time(), time.monotonic() - started, failed=True,
                                   error=f"{one_line(str(exc)) or interrupts.described()}"), None)
            raise
        except Exception as exc:  # the loop goes on; /readyz says why it is not ready until a tick succeeds
            raised = OPERATIONAL if is_operational(exc) or isinstance(exc, OSError) else BUG
            error = f"{type(exc).__name__}: {one_line(exc)}"
            if raised == BUG:
                error += f" (trace in {save_trace(self.config)})"
        record = TickRecord(n, time.time(), time.monotonic() - started, failed=bool(report and report["failed"]),
                            raised=raised, error=error)
        self.finish(record, report)
        return record

    def finish(self, record: TickRecord, report: dict | None) -> None:
        with self.lock:
            self.state.last, self.state.ticks = record, record.number
        self.beat(ticking=None)
        trimmed = trim_heap()  # the pages the tick freed go back before its memory is read
        measured = self.measured()
        self.emit_tick(record, report, trimmed, measured)
        self.recycling = recycle_after(record.number, measured["rss_python_bytes"], self.recycle_above,
                                       record.number - self.ticks_before, interrupts.stopping())

    def measured(self) -> dict:
        """This tick's memory: this process's and its JVM's resident set, and which JVM it is."""
        import os

        pid = jvm_pid(self.spark) if self.spark is not None else None
        return {"rss_python_bytes": rss_bytes(os.getpid()), "jvm_pid": pid,
                "rss_jvm_bytes": rss_bytes(pid) if pid else None, **jvm_heap(self.spark),
                "spark_app_id": self.state.spark_app_id}

    def emit_tick(self, record: TickRecord, report: dict | None, trimmed: int | None, measured: dict) -> None:
        decisions = (report or {}).get("decisions", [])
        runs = len({d["run_id"] for d in decisions if d.get("run_id")})
        published = sum(1 for d in decisions if d.get("published"))
        line = {"event": "tick", "tick": record.number, "finished_at": record.finished_at,
                "seconds": round(record.seconds, 3), "failed": record.failed or bool(record.raised),
                "raised": record.raised, "error": record.error, "runs": runs, "published": published,
                "stopping": interrupts.stopping(), "rss_trimmed_bytes": trimmed, **measured}
        if self.json_lines:
            self.emit(json.dumps(line))
            return
        for text in (report or {}).get("lines", []):
            self.emit(printable(text))
        memory = " + ".join(f"{name} {human_size(line[key])}" for name, key in
                            (("python", "rss_python_bytes"), ("jvm", "rss_jvm_bytes")) if line[key] is not None)
        self.emit(f"serve: tick {record.number} {'FAILED' if line['failed'] else 'done'} in "
                  f"{human_duration(record.seconds) if record.seconds >= 1 else f'{record.seconds:.1f}s'}: "
                  f"{counted(runs, 'run')}, {published} published"
                  + (f"; {printable(record.error)}" if record.error else "")
                  + (f"; memory {memory}" if memory else ""))

    def close(self) -> None:
        if self.health is not None:
            self.health.close()


class _Signals:
    """SIGTERM and SIGINT during `serve`: the first only lands on the interrupts' wakeup pipe (a Python handler must
    exist for it to be written), so the run in flight stops at its next step boundary; a second interrupts at once."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, signum, frame) -> None:
        self.seen += 1
        if self.seen > 1:
            raise KeyboardInterrupt(f"{interrupts.described()} again: stopping now")

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self)


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def cmd_serve(config, args) -> int:
    interrupts.install()  # main() did already; a no-op then
    _Signals().install()
    # A stop that arrived while an earlier image started this one afresh was held (`start_afresh` blocks the
    # signals, exec keeps the mask): it is delivered now, to the handlers above, and the loop stops gracefully.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    ticks_before, restarts = carried()
    serve = Serve(config, args.config, args.interval, args.stale_after,
                  (args.health_host, args.health_port) if args.health_port is not None else None,
                  json_lines=args.json, emit=lambda text: print(text, flush=True),
                  recycle_above=args.recycle_above, ticks_before=ticks_before)
    address = serve.health.address if serve.health is not None else None
    limit = "off" if args.recycle_above is None else human_size(args.recycle_above)
    if args.json:
        serve.emit(json.dumps({"event": "start", "interval_seconds": args.interval,
                               "health": None if address is None else f"http://{address[0]}:{address[1]}",
                               "recycle_above_bytes": args.recycle_above, "ticks_before": ticks_before,
                               "restarts": restarts, "pid": os.getpid()}))
    elif restarts:
        serve.emit(f"serve: started afresh (restart {restarts}, after tick {ticks_before})")
    else:
        where = "" if address is None else f" health on http://{address[0]}:{address[1]} (/healthz, /readyz);"
        serve.emit(f"serve: ticking every {human_duration(args.interval)};{where} starts afresh above "
                   f"{limit} (--recycle-above); SIGTERM or Ctrl-C stops it after the current step")
    try:
        ticks = serve.run(args.max_ticks)
    finally:
        serve.close()
    if serve.recycling is not None and not interrupts.stopping():
        start_afresh(serve, serve.recycling, restarts)
    why = interrupts.described() if interrupts.stopping() else f"--max-ticks {args.max_ticks}"
    print(f"serve: stopped ({why}) after {counted(ticks, 'tick')}", file=sys.stderr, flush=True)
    return 0


def start_afresh(serve: Serve, recycle: Recycle, restarts: int) -> None:
    """Replaces this process image with the same command (`os.execv`, the same pid): the JVM stopped and waited
    for first, exit handlers run, output flushed, the tick count carried on in the environment. A stop signal
    from here on is held until the new image's handlers are in place. Returns only when a stop arrived before
    the signals were held: the caller then stops as it would have."""
    from icemaint.engine.spark_session import stop_jvm

    if serve.json_lines:
        serve.emit(json.dumps({"event": "recycle", "tick": recycle.tick, "rss_python_bytes": recycle.rss,
                               "recycle_above_bytes": recycle.limit, "first_in_process": recycle.first_in_process,
                               "restarts": restarts + 1}))
    else:
        serve.emit(f"serve: python {human_size(recycle.rss)} after tick {recycle.tick} is over --recycle-above "
                   f"{human_size(recycle.limit)}: starting afresh (the same process, a new JVM)"
                   + ("; it was over on this process's first tick, so a fresh start is no smaller: raise "
                      "--recycle-above" if recycle.first_in_process else ""))
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    if interrupts.stopping():  # a stop that landed before the mask: honour it here, not in the next image
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return
    if not stop_jvm():
        print("serve: the driver JVM did not exit within a minute of its session's stop: killed",
              file=sys.stderr, flush=True)
    atexit._run_exitfuncs()  # what a normal exit runs (exec does not): Dagster's and logging's handlers
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[CARRIED_TICKS], os.environ[CARRIED_RESTARTS] = str(recycle.tick), str(restarts + 1)
    os.execv(sys.executable, sys.orig_argv)


def register(sub) -> None:
    """Adds `icemaint serve` to the CLI's subcommands."""
    from icemaint.app.cli_help import add_command

    s = add_command(sub, "serve", cmd_serve)
    s.add_argument("--interval", type=interval_arg, default=parse_duration(DEFAULT_INTERVAL), metavar="DURATION",
                   help=f"wait between the end of a tick and the start of the next (default {DEFAULT_INTERVAL})")
    s.add_argument("--health-port", type=port, default=None, metavar="PORT",
                   help="serve GET /healthz and /readyz (JSON) on this port (default: no probe server)")
    s.add_argument("--health-host", default="127.0.0.1", metavar="HOST",
                   help="address the probe server binds (default 127.0.0.1; 0.0.0.0 for a kubelet's probes)")
    s.add_argument("--stale-after", type=interval_arg, default=None, metavar="DURATION",
                   help="/healthz fails when the loop has not beaten for this long (default: 3 intervals, at "
                        "least 15m; the loop does not beat inside a tick, so it must exceed the longest tick)")
    s.add_argument("--recycle-above", type=recycle_arg, default=DEFAULT_RECYCLE_ABOVE, metavar="SIZE",
                   help="after a tick that leaves this process's Python resident set over SIZE, start afresh: the "
                        "same process (pid) runs the same command again with a new JVM (default "
                        f"{DEFAULT_RECYCLE_ABOVE}; off to never)")
    s.add_argument("--max-ticks", type=positive_int, default=None, metavar="N",
                   help="stop after N ticks, counted across fresh starts (a benchmark, a smoke test); default: "
                        "until SIGTERM or Ctrl-C")
    s.add_argument("--json", action="store_true",
                   help="one JSON object per tick on standard output (raw numbers: seconds, bytes of memory)")


