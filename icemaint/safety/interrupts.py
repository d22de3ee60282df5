"""An operator's Ctrl-C (or a termination signal) is honoured even where Python swallowed its exception.

Python raises the KeyboardInterrupt (Dagster's handler: its own interrupt error) wherever the main thread is when
the signal arrives. Inside a finalizer or a weakref callback (Py4J's, SQLAlchemy's) that exception is printed as
"Exception ignored in ..." and dropped, so a run went on to publish and exit 0 after the operator pressed Ctrl-C
(3 of 8 early presses in the crash review). The CLI installs a wakeup pipe: the interpreter writes each signal's
number to it whatever handler is installed, and the operating contract checks it at its step boundaries (before
the act, before staging, before each publish), raising the interrupt there if it was lost on the way.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

_INTERRUPTS = {int(signal.SIGINT), int(signal.SIGTERM)}
_read_fd: int | None = None


class InterruptLost(KeyboardInterrupt):
    """A Ctrl-C or termination signal whose exception was swallowed on its way, raised again at a step boundary."""


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
    if _read_fd is None:
        return False
    seen = False
    while True:
        try:
            data = os.read(_read_fd, 4096)
        except BlockingIOError:
            return seen
        if not data:
            return seen
        seen = seen or any(b in _INTERRUPTS for b in data)


def check() -> None:
    """Raises `InterruptLost` when an interrupt arrived that nothing has acted on yet (a no-op without `install`)."""
    if requested():
        raise InterruptLost("interrupted (Ctrl-C or a termination signal)")
