"""What a CLI command gives back: its exit status, its JSON, and, on a bug, the trace it saved.

One place for every command module (`cli_tables`, `cli_estate`, `cli_retention`, `serve`) and for `cli`'s main.
"""

from __future__ import annotations

import json
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from icemaint.config import MaintenanceConfig

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def save_trace(config: MaintenanceConfig | None) -> str:
    """Appends the current exception's stack trace to <state_dir>/logs/cli.log (without a config: the temporary
    directory's icemaint-cli.log); returns the path."""
    path = Path(config.state_dir, "logs", "cli.log") if config else Path(tempfile.gettempdir(), "icemaint-cli.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(traceback.format_exc() + "\n")
    return str(path)
