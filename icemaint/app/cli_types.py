"""The CLI's argument types: argparse `type=` functions whose error is one line naming the value.

One place for every subcommand's module (`cli`, `cli_retention`, `serve`, `metrics_server`).
"""

from __future__ import annotations

import argparse


def port(text: str) -> int:
    """A TCP port (Dagster's own failure on a bad one left its daemon running without a UI)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return value


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def whole_number(text: str) -> int:
    """A whole number of 0 or more (a limit on records)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: the limit is a number of records, 0 or more")
    return value


MAX_NOTE_CHARS = 1000


def note(text: str) -> str:
    """An approval's note: stored in the audit log, so bounded."""
    if len(text) > MAX_NOTE_CHARS:
        raise argparse.ArgumentTypeError(f"a note is at most {MAX_NOTE_CHARS} characters (this one has {len(text)})")
    return text
