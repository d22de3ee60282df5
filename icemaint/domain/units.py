"""Parsing of the human units the config file and the CLI accept: durations and byte sizes."""

from __future__ import annotations

import math
import re
import reprlib

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$")
_SIZE_BYTES = {
    None: 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}


# A bad value is named in its error, bounded: a YAML alias bomb must not become a megabyte-long line.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlevel = 120, 120, 5, 5, 2
# Sizes reach Iceberg as Java longs; ages beyond a century overflow date arithmetic.
MAX_SIZE_BYTES = 2**63 - 1
MAX_DURATION_SECONDS = 100 * 366 * 86400


def shown(value: object) -> str:
    """A value as an error message names it: its repr, cut short."""
    return _SHOWN.repr(value)


def printable(text: str) -> str:
    """`text` on one line for a terminal: line breaks and other control characters (escape sequences) shown
    escaped, as Python writes them, so stored text cannot start a line of its own or drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def parse_duration(value: object) -> float:
    """Seconds in a duration such as ``72h``, ``7d``, ``30m``, ``45s`` or a bare number of seconds.

    Raises:
        ValueError: naming the value and the units allowed; negative durations are refused.
    """
    if isinstance(value, bool):
        raise ValueError(f"{shown(value)} is not a duration; use a number with a unit s, m, h, d or w (e.g. 72h, 7d)")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{shown(value)} is not a duration; use a finite number with a unit s, m, h, d or w")
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(
                f"{shown(value)} is not a duration; use a number with a unit s, m, h, d or w (e.g. 72h, 7d, 30m)"
            )
        seconds = float(match.group(1)) * _DURATION_SECONDS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"{shown(value)} is negative; a duration must be zero or more")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{shown(value)} is longer than a century; use a duration up to 36600d")
    return seconds


def parse_size(value: object) -> int:
    """Bytes in a size such as ``128MiB``, ``512MB`` or a bare number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{shown(value)} is not a size; use bytes or a unit B, KB, MB, GB, KiB, MiB, GiB")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{shown(value)} is not a size; use a finite number of bytes or a unit (e.g. 128MiB)")
        size = int(value)
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"{shown(value)} is not a size; use bytes or a unit B, KB, MB, GB, KiB, MiB, GiB (e.g. 128MiB)")
        size = int(float(match.group(1)) * _SIZE_BYTES[match.group(2)])
    if size < 0:
        raise ValueError(f"{shown(value)} is negative; a size must be zero or more")
    if size > MAX_SIZE_BYTES:
        raise ValueError(f"{shown(value)} is larger than a Java long can hold (8 EiB)")
    return size


def format_duration(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{int(seconds // length)}{unit}"
    return f"{seconds:g}s"


def human_duration(seconds: float) -> str:
    """A measured duration as people read it: `36s`, `20m`, `1.5h`, `7d` (raw seconds go in JSON)."""
    size = abs(seconds)
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if size >= length:
            value = seconds / length
            return f"{value:.0f}{unit}" if abs(value - round(value)) < 0.05 else f"{value:.1f}{unit}"
    return f"{seconds:.0f}s"


def human_size(size: float) -> str:
    """A byte count as people read it: `512 B`, `8 MiB`, `1.5 GiB` (raw bytes go in JSON)."""
    for unit, length in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= length:
            value = size / length
            return f"{value:.0f} {unit}" if abs(value - round(value)) < 0.05 else f"{value:.1f} {unit}"
    return f"{size:.0f} B"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 table`, `3 tables`, `0 tables` (`plural` where adding an s is wrong: `1 table-date`... `2 table-dates`)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
