"""An operator's Ctrl-C (or a termination signal) is honoured even where Python swallowed its exception.

Python raises the KeyboardInterrupt (Dagster's handler: its own interrupt error) wherever the main thread is when
the signal arrives. Inside a finalizer or a weakref callback (Py4J's, SQLAlchemy's) that exception is printed as
"Exception ignored in ..." and dropped, so a run went on to publish and exit 0 after the operator pressed Ctrl-C
(3 of 8 early presses in the crash review). The CLI installs a wakeup pipe: the interpreter writes each signal's
number to it whatever handler is installed, and the operating contract checks it at its step boundaries (before
the act, before staging, before each publish), raising the interrupt there if it was lost on the way.

An interrupt stops the whole command, not only the run it lands in: once one is seen (on the pipe, or answered by a
run that recorded itself as interrupted) the process is *stopping*. A run in flight on another thread (a tick's
lanes) stops at its next step boundary, and no further run starts (`before_run`): a Ctrl-C in `icemaint tick`
used to interrupt one run while the tick's other lanes, its next batches and its next ticks went on.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

_INTERRUPTS = {int(signal.SIGINT), int(signal.SIGTERM)}
_read_fd: int | None = None
_stopping = threading.Event()
_last_signal: int | None = None  # the latest interrupt seen on the pipe, for the message


class InterruptLost(KeyboardInterrupt):
    """A Ctrl-C or termination signal whose exception was swallowed on its way, raised again at a step boundary."""


class Stopped(KeyboardInterrupt):
    """The command is stopping after an interrupt: a run that had not started is not started."""


def install() -> bool:
    """Opens the wakeup pipe (main thread only, once per process); whether it is in place."""
    global _read_fd
    if _read_fd is not None:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    _read_fd = read
    # SQLAlchemy (Dagster's storage) logs an interrupt that lands while it closes a pooled connection as an error
    # with its traceback, and carries on: on a terminal that is a stack trace under the CLI's one line, for an
    # interrupt this module then honours. Its pool's own errors below CRITICAL stay out of a CLI process's output.
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    return True


def requested() -> bool:
    """Whether a Ctrl-C or termination signal arrived since the last look (each is reported once)."""
    global _last_signal
    if _read_fd is None:
        return False
    seen = False
    while True:
        try:
            data = os.read(_read_fd, 4096)
        except BlockingIOError:
            break
        if not data:
            break
        for b in data:
            if b in _INTERRUPTS:
                seen, _last_signal = True, b
    if seen:
        _stopping.set()
    return seen


def signal_number() -> int:
    """The signal that stopped the command (SIGINT unless a SIGTERM was seen): its exit status is 128 + it."""
    requested()
    return int(signal.SIGTERM) if _last_signal == int(signal.SIGTERM) else int(signal.SIGINT)


def described() -> str:
    """What stopped the command, as its last line says it: a Ctrl-C, or a termination signal (`kill`, `timeout`)."""
    return "terminated (SIGTERM)" if signal_number() == int(signal.SIGTERM) else "interrupted (Ctrl-C)"


def acknowledge() -> None:
    """A run answered an interrupt (it recorded itself as interrupted): the signal behind it is consumed, and the
    rest of the command stops (in a process with `install` only: a run worker or a test process goes on)."""
    requested()
    if _read_fd is not None:
        _stopping.set()


def stopping() -> bool:
    """Whether this process is stopping after an interrupt."""
    return requested() or _stopping.is_set()


def check() -> None:
    """Raises `InterruptLost` when the process is stopping after an interrupt (a no-op without `install`): at a step
    boundary of a run on any thread."""
    if stopping():
        raise InterruptLost("interrupted (Ctrl-C or a termination signal)")


def before_run() -> None:
    """Raises `Stopped` instead of starting a run once the process is stopping after an interrupt."""
    if stopping():
        raise Stopped(f"{described()}: no further run was started")


def reset() -> None:
    """Forgets any interrupt seen (a process that goes on after one: the test suite)."""
    global _last_signal
    requested()
    _stopping.clear()
    _last_signal = None
