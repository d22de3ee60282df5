"""Long-lived objects moved out of the cyclic garbage collector's way (`gc.freeze`).

A maintenance process loads Dagster, Great Expectations, pandas, PySpark and pyiceberg: ~450,000 objects the
collector tracks (~240,000 once the runner has started, measured), living as long as the process. CPython's
full (generation 2) collection walks every one of them, and a tick over many tables triggers one every two
seconds or so: 14 full collections took 2.5 s of a 30-table tick (one lane, 2 cores), holding the GIL that
the run's threads and Py4J need. Frozen once those modules are
loaded (`MaintenanceRunner`'s start; the proof's Great Expectations context), a full collection walks only
what was made since: the same tick took 28.1 s against 30.1 s (means of 3 runs each, interleaved).

Frozen objects are still freed by reference counting; only garbage cycles that exist at the moment of the
freeze stay until the process exits. Nothing is collected here: a collection would finalize other threads'
objects in this one (see `CatalogReader.read_many`).
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_done: set[str] = set()


def freeze_loaded(moment: str) -> bool:
    """Freezes the objects alive now, once per `moment` a process reaches (e.g. "runner", "gx");
    True when this call froze them."""
    with _lock:
        if moment in _done:
            return False
        _done.add(moment)
        gc.freeze()
        return True
