"""The errors of a staged rewrite: it could not be written or read, a writer's commit conflicts with its publish,
or the publish's outcome is unknown. In each case but the last `main` was not changed.
"""

from __future__ import annotations

from icemaint.errors import OperationalError


class StagingError(OperationalError, RuntimeError):
    """A staged rewrite could not be written or read; `main` was not changed."""


class PublishConflict(StagingError):
    """A writer committed something the rewrite conflicts with (e.g. a delete on a replaced file), or the publish
    lost races for longer than its time budget.

    Decided by the Java exception's class, never by its message; `main` is unchanged. `attempts`: the seconds
    of each commit attempt made.
    """

    def __init__(self, message: str, attempts: tuple[float, ...] = ()):
        super().__init__(message)
        self.attempts = attempts


class PublishStateUnknown(StagingError):
    """The publish commit's outcome is unknown and re-reading the table did not find it.

    The commit may still land later; the caller must not retry blindly.
    """
