"""The doctor's report lines (`Check`, `Status`) and what every probe shares: the first line of an error that says
most, a time limit for a probe that may hang, and a URI shown without its password."""

from __future__ import annotations

import enum
import re
import threading
from dataclasses import dataclass
from typing import Callable

from icemaint.domain.masking import mask_credentials
from icemaint.errors import one_line

NETWORK_TIMEOUT_S = 10.0


class Status(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: Status
    detail: str

    def line(self) -> str:
        return f"{self.status.value:<6}{self.name}: {self.detail}"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail}


def ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


def warn(name: str, detail: str) -> Check:
    return Check(name, Status.WARN, detail)


def fail(name: str, detail: str) -> Check:
    return Check(name, Status.FAIL, detail)


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message` of the error that says most.

    A network error is reported by its deepest OS-level cause (`ConnectionRefusedError: [Errno 111]
    Connection refused`, not the HTTP pool's paragraph around it); a Py4J error by its Java exception;
    a SQLAlchemy error by the driver's error it wraps.
    """
    from icemaint.observe.catalog import CatalogUnavailable

    if isinstance(exc, CatalogUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__  # the catalog's own error says most; the check line names the catalog already
    if isinstance(exc, OSError):
        seen: set[int] = {id(exc)}
        cause: BaseException = exc
        while True:
            nxt = cause.__cause__ or cause.__context__
            if nxt is None or id(nxt) in seen:
                break
            seen.add(id(nxt))
            cause = nxt
        exc = cause if isinstance(cause, OSError) else exc
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    line = one_line(text, 100_000)
    wrapped = re.match(r"\(([\w.]+)\) (.*)", line)  # SQLAlchemy: "(psycopg2.OperationalError) message"
    if wrapped:
        line = f"{wrapped.group(1)}: {wrapped.group(2)}"
    else:
        line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return one_line(line, 300)


def within(seconds: float, fn: Callable[[], object]):
    """fn's result, or TimeoutError after `seconds` (a hung connect is left to die with the process)."""
    box: dict[str, object] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    worker = threading.Thread(target=target, name="icemaint-doctor", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g}s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def shown_uri(uri: str) -> str:
    """The URI with a password in its user info or query replaced by `***`."""
    return mask_credentials(uri)
