"""Timing primitives shared by the benchmark sections: medians, ratios and timed call wrappers."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any, Callable, Iterable


def median(values: Iterable[float]) -> float:
    """The median of the repetitions (raises ValueError on none: a figure needs a measurement)."""
    values = list(values)
    if not values:
        raise ValueError("median of no repetitions: the section measured nothing")
    return float(statistics.median(values))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is zero."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


class Stopwatch:
    """`with Stopwatch() as sw: ...` then `sw.seconds` (wall clock, perf_counter)."""

    def __enter__(self) -> "Stopwatch":
        self.started = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.started


class CallTimes:
    """Seconds and call counts accumulated per name; `wrap` times any callable under a name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
                self.calls[name] += 1
        return timed

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {k: {"seconds": round(v, 4), "calls": self.calls[k]} for k, v in sorted(self.seconds.items())}


class TimedProxy:
    """Delegates every attribute to `target`, timing the named methods into `times`.

    Used to see where the Compactor and the sensor tick spend time in the real claims, audit and
    catalog objects without changing them.
    """

    def __init__(self, target: Any, times: CallTimes, prefix: str, methods: Iterable[str]):
        self._target = target
        self._timed = {m: times.wrap(f"{prefix}.{m}", getattr(target, m)) for m in methods}

    def __getattr__(self, name: str) -> Any:
        timed = self.__dict__.get("_timed", {})
        if name in timed:
            return timed[name]
        return getattr(self._target, name)
