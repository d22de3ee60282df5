"""The catalog through the sensors' own pyiceberg reader, and the `tables:` entries of the config against it."""

from __future__ import annotations

from pathlib import Path

from icemaint.app.doctor.files import writable_directory
from icemaint.app.doctor.report import (NETWORK_TIMEOUT_S, Check, Status, fail, first_line, ok, shown_uri, warn,
                                        within)
from icemaint.config import MaintenanceConfig


def check_catalog(config: MaintenanceConfig, timeout_s: float = NETWORK_TIMEOUT_S,
                  listed: list[list[str]] | None = None) -> Check:
    """The catalog answers: the hadoop warehouse is a writable directory; any other catalog lists its
    tables through the sensors' pyiceberg reader within `timeout_s` (appended to `listed` when given)."""
    from icemaint.observe.catalog import CatalogReader

    cat = config.catalog
    if cat.type == "hadoop":
        where = cat.warehouse or ""
        local = where[len("file://"):] if where.startswith("file://") else where
        if "://" in local:
            return warn("catalog", f"hadoop warehouse {shown_uri(where)} is not a local path: not checked")
        # a warehouse path relative to the wrong directory is a new user's classic: say it is empty
        found = writable_directory(Path(local), "catalog", Status.WARN,
                                   "does not exist: no tables yet (created with the first table)")
        if found.status is not Status.OK:
            return Check("catalog", found.status, f"hadoop warehouse {found.detail}")
        where, writable = f"hadoop warehouse {local}", " (writable)"
    else:
        where, writable = (f"{cat.type} {shown_uri(cat.uri)}" if cat.uri else cat.type), ""
    try:
        tables = within(timeout_s, CatalogReader(config).list_tables)
    except Exception as exc:
        return fail("catalog", f"{where}: {first_line(exc)}")
    if listed is not None:
        listed.append(tables)
    return ok("catalog", f"{where}: {_tables(tables)}{writable}")


def check_configured_tables(config: MaintenanceConfig, listed: list[list[str]]) -> Check:
    """Every `tables:` entry names a table the catalog has: a misspelt name's policy would never apply (its
    table would run on the defaults), so it fails, naming the entry and the nearest table the catalog has."""
    import difflib

    name, configured = "configured tables", sorted(config.policies.tables)
    if not listed:
        return warn(name, f"{len(configured)} in tables: not checked (the catalog did not list its tables)")
    known = set(listed[0])
    missing = [t for t in configured if t not in known]
    if missing:
        def near(table: str) -> str:
            close = difflib.get_close_matches(table, sorted(known), n=1)
            return f" (did you mean {close[0]}?)" if close else ""
        return fail(name, "; ".join(f"tables.{t} names a table the catalog does not have{near(t)}" for t in missing)
                    + f": its policy never applies; fix or remove the entr{'y' if len(missing) == 1 else 'ies'} in "
                      f"{config.source or 'the config'}")
    outside = [t for t in configured if not config.scope.admits(t)]
    if outside:
        return warn(name, f"{', '.join(outside)} in tables: but outside scope (include/exclude): never maintained")
    return ok(name, f"all {len(configured)} in tables: are in the catalog")


def _tables(tables: list[str]) -> str:
    return f"{len(tables)} table{'' if len(tables) == 1 else 's'}"
