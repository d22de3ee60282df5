"""The config file the doctor was given and the state directory icemaint writes into."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from icemaint.app.doctor.report import Check, Status, fail, ok
from icemaint.config import MaintenanceConfig


def check_config(config: MaintenanceConfig, config_path: str | os.PathLike | None) -> Check:
    path = Path(config_path or config.source or "maintenance.yaml").resolve()
    cat = config.catalog
    return ok("config", f"{path} (catalog {cat.name}: {cat.type}, state dir {config.state_dir})")


def _writable(directory: Path) -> bool:
    """Whether a file can really be created in `directory` (os.access is wrong under ACLs and read-only mounts)."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".icemaint-doctor-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def writable_directory(path: Path, what: str, when_missing: Status, missing: str) -> Check:
    """A directory icemaint writes into: there and writable, or creatable (then `when_missing`, `missing`)."""
    if path.exists():
        if not path.is_dir():
            return fail(what, f"{path} is not a directory")
        if not _writable(path):
            return fail(what, f"{path} is not writable by this user")
        return ok(what, f"{path} (writable)")
    ancestor = next((p for p in path.parents if p.exists()), None)
    if ancestor is None or not ancestor.is_dir():
        return fail(what, f"{path} cannot be created: {ancestor} is not a directory")
    if not _writable(ancestor):
        return fail(what, f"{path} does not exist and cannot be created: {ancestor} is not writable")
    return Check(what, when_missing, f"{path} {missing}")


def check_state_dir(config: MaintenanceConfig) -> Check:
    return writable_directory(config.state_path, "state dir", Status.OK, "(created on first use)")
