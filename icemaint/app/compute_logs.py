"""Dagster's local compute-log manager, with its mirror processes deaf to a terminal's Ctrl-C.

To show a step's output on the terminal while it is captured, Dagster starts two children per stream: `tail -F`
and a Python watcher (`watch_orphans.py`). A terminal's Ctrl-C goes to the whole foreground process group, so
the watchers died with a KeyboardInterrupt traceback each, printed under the CLI's own one-line answer
("interrupted ... main is unchanged"). Here they start with SIGINT blocked (a child keeps its parent's signal
mask across exec): the run alone answers Ctrl-C, and Dagster's own clean-up still ends the children (SIGTERM)
as the step ends. SIGINT is blocked in the starting thread only while the children start; one that arrives
meanwhile waits and is delivered as soon as they have started, so no Ctrl-C is lost.
"""

from __future__ import annotations

import signal
from contextlib import ExitStack, contextmanager

from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager


@contextmanager
def sigint_blocked():
    """SIGINT held back from this thread (and from children it starts) inside the block; delivered after it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class TerminalQuietComputeLogManager(LocalComputeLogManager):
    """`LocalComputeLogManager` (the same files, the same UI), whose mirror children ignore a terminal's Ctrl-C."""

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> "TerminalQuietComputeLogManager":
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key):
        with ExitStack() as stack:
            with sigint_blocked():
                captured = stack.enter_context(super().capture_logs(log_key))
            yield captured
