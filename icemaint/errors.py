"""The project's errors, as one tree, and an exception as one line.

`UserError`: the input was wrong (a config key, a table name, a date, an option); the CLI exits 2.
`OperationalError`: the input was fine but the world was not (the catalog, a claim, Java, a commit);
the CLI exits 1. Anything else is a bug: the CLI logs its trace and exits 1. Callers decide by
class, never by message. An error that is both (a retention failure its callers still catch as a
`RetentionError`) is operational: `is_operational` is asked first.

Pure, so that every layer, the domain included, may import it.
"""

from __future__ import annotations

from icemaint.domain.masking import mask_credentials


class IcemaintError(Exception):
    """An error of ours: its message is one line meant for the operator."""


class UserError(IcemaintError):
    """The operator's input cannot be used; nothing was done."""


class OperationalError(IcemaintError):
    """A service, a resource or a concurrent writer failed the operation; the input was fine."""


class UsageError(UserError, ValueError):
    """A command's arguments do not fit together (`--from` without `--to`, an unknown operation)."""


def is_operational(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError)


def is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, UserError) and not is_operational(exc)


def one_line(exc: BaseException | str | None, limit: int = 300) -> str:
    """The first non-blank line of an exception's message (or of a text), at most `limit` characters (a cut
    one ends in "..."), with credentials in any URI masked: the line is for terminals, logs and audit records."""
    text = "" if exc is None else str(exc)
    line = next((part.strip() for part in text.strip().splitlines() if part.strip()), "")
    line = mask_credentials(line)
    return line if len(line) <= limit else line[:max(limit - 3, 0)] + "..."
