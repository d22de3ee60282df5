"""A date scope: the Spark SQL predicate that selects one day of a table's time column.

Built only from a validated column name, its Iceberg type and a `datetime.date`, never from user text.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from icemaint.domain.names import quote_column
from icemaint.errors import UserError

_TIMESTAMP_TYPES = ("timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns")
# Python 3.11+ fromisoformat also accepts week dates (2024-W01-1) and compact forms: check the shape first.
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class InvalidDate(UserError, ValueError):
    """A date that is malformed or outside the maintained range."""


def parse_date(text: str, start: dt.date | None = None, end: dt.date | None = None) -> dt.date:
    """A `YYYY-MM-DD` string as a date, checked against the maintained range [start, end]."""
    try:
        date = dt.date.fromisoformat(text) if isinstance(text, str) and _ISO_DATE.fullmatch(text) else None
    except ValueError:
        date = None
    if date is None:
        raise InvalidDate(f"date {text!r} is not a calendar date in the form YYYY-MM-DD")
    if start and date < start:
        raise InvalidDate(f"date {text} is before the maintained range, which starts at {start} (dates_start)")
    if end and date > end:
        raise InvalidDate(f"date {text} is after the maintained range, which ends at {end}")
    return date


SPANS = ("day", "month", "year")


def span_of(transform: str | None) -> str:
    """The period one date key covers: a month (year) partition is maintained as a whole, keyed by its
    first day; every other time transform (and a policy time column) works day by day."""
    return transform if transform in ("month", "year") else "day"


def period_start(date: dt.date, span: str) -> dt.date:
    """The key of the period holding `date`: the date itself, or its month's or year's first day."""
    if span == "month":
        return date.replace(day=1)
    if span == "year":
        return date.replace(month=1, day=1)
    return date


@dataclass(frozen=True)
class DateScope:
    column: str
    column_type: str  # the Iceberg type name: date, timestamp, timestamptz, ...
    date: dt.date     # the period's first day (see `period_start`)
    span: str = "day"

    @property
    def start(self) -> dt.date:
        return period_start(self.date, self.span)

    @property
    def end(self) -> dt.date:
        """The first day after the period."""
        start = self.start
        if self.span == "month":
            return (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        if self.span == "year":
            return start.replace(year=start.year + 1)
        return start + dt.timedelta(days=1)

    def predicate(self) -> str:
        col = quote_column(self.column)
        if self.column_type == "date":
            if self.span == "day":
                return f"{col} = DATE '{self.start.isoformat()}'"
            return f"{col} >= DATE '{self.start.isoformat()}' AND {col} < DATE '{self.end.isoformat()}'"
        if self.column_type in _TIMESTAMP_TYPES:
            start = f"{self.start.isoformat()} 00:00:00"
            end = f"{self.end.isoformat()} 00:00:00"
            # The literal's type must be the column's: Spark casts a zone-less column to TIMESTAMP
            # against a TIMESTAMP literal, and Iceberg cannot push that cast down.
            kind = "TIMESTAMP" if self.column_type.startswith("timestamptz") else "TIMESTAMP_NTZ"
            return f"{col} >= {kind} '{start}' AND {col} < {kind} '{end}'"
        raise ValueError(f"column {self.column!r} has type {self.column_type}; a date scope needs a date or timestamp")

    @property
    def ends_at(self) -> dt.datetime:
        return dt.datetime.combine(self.end, dt.time(), dt.timezone.utc)
