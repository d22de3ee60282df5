"""An AI agent's arguments to `icemaint mcp`, checked before anything is decided: a table in scope that exists, dates
within the maintained range, a stated reason, a run id, an audit limit, a retention operation. What cannot be used
raises `AgentInputError`, one line naming the problem; nothing was done.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Callable

from icemaint.config import MaintenanceConfig
from icemaint.domain.names import TableName
from icemaint.domain.scope import parse_date
from icemaint.errors import UsageError

MAX_REASON_CHARS = 1000      # an agent's stated reason is stored in the audit log: bounded, as an approval's note
MAX_DATES = 31               # dates in one request (a batched backfill run's bound)
MAX_AUDIT = 100              # audit records in one answer
RETENTION_REQUESTS = ("expire", "manifests", "statistics")


class AgentInputError(UsageError):
    """An agent's argument that cannot be used (a table name, a date, a reason); nothing was done."""


def table_key(config: MaintenanceConfig, text: Any) -> str:
    """The validated key of a table in scope that exists (the CLI's checks).

    Raises:
        AgentInputError, InvalidTableName, TableNotFound: not a string, not a table name, out of scope, missing.
    """
    from icemaint.observe.catalog import CatalogReader

    if not isinstance(text, str):
        raise AgentInputError(f"table {text!r} is not a string")
    key = TableName.parse(text).key
    if not config.scope.admits(key):
        raise AgentInputError(f"table {key} is not in this server's scope (scope.include/exclude)")
    CatalogReader(config).metadata_location(key)  # TableNotFound
    return key


def request_date(config: MaintenanceConfig, today: dt.date, text: Any) -> str:
    """A date (YYYY-MM-DD) from the maintained range's start to tomorrow, the last date a run can target."""
    return parse_date(text, config.dates_start, today + dt.timedelta(days=1)).isoformat()


def request_dates(dates: Any, date: Callable[[Any], str]) -> list[str] | None:
    """The distinct dates `date` validates, in the order given; None (every due date) when left out."""
    if dates is None:
        return None
    if not isinstance(dates, list) or not dates or len(dates) > MAX_DATES:
        raise AgentInputError(f"dates must be a list of 1 to {MAX_DATES} dates (YYYY-MM-DD), or left out for every "
                              "due date")
    return list(dict.fromkeys(date(d) for d in dates))


def reason(text: Any) -> str:
    """The agent's stated reason, stripped: required, at most MAX_REASON_CHARS."""
    if not isinstance(text, str) or not text.strip():
        raise AgentInputError("give a reason: one or two sentences on why this maintenance is wanted (it is kept in "
                              "the audit trail)")
    if len(text) > MAX_REASON_CHARS:
        raise AgentInputError(f"a reason is at most {MAX_REASON_CHARS} characters (this one has {len(text)})")
    return text.strip()


def run_id(text: Any) -> str:
    """A run id in its canonical UUID form."""
    try:
        return str(uuid.UUID(str(text)))
    except ValueError:
        raise AgentInputError(f"run id {str(text)[:80]!r} is not a run id (a UUID)") from None


def audit_limit(limit: Any) -> int:
    """How many audit records to answer: a whole number from 1 to MAX_AUDIT."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_AUDIT:
        raise AgentInputError(f"limit {limit!r} must be a whole number from 1 to {MAX_AUDIT}")
    return limit


def retention_operation(operation: Any) -> str:
    """One of RETENTION_REQUESTS."""
    if operation not in RETENTION_REQUESTS:
        raise AgentInputError(f"{operation!r} is not a retention request: one of {', '.join(RETENTION_REQUESTS)}")
    return str(operation)
