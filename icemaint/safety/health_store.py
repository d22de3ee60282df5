"""The tick's last health read, persisted for `icemaint metrics`: one JSON file of per-table summaries and a
heartbeat of the last finished tick, under `<state_dir>/metrics/`.

Written by the compaction tick (the sensor's and `icemaint tick`'s), read by the metrics endpoint on each scrape
(parsed again only when the file changed). A writer takes an exclusive lock and replaces the file atomically, so a
reader never needs a lock and never sees half a file. Summaries of tables no longer in the estate are dropped.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from icemaint.domain.health_summary import HealthSummary

FORMAT = 1


class HealthStore:
    def __init__(self, state_dir: str | os.PathLike):
        self.root = Path(state_dir) / "metrics"
        self.path = self.root / "health.json"
        self.tick_path = self.root / "tick.json"
        self._cache: tuple[tuple[int, int], dict[str, dict[str, Any]]] | None = None

    def _replace(self, path: Path, data: Any) -> None:
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(data, separators=(",", ":")))
        os.replace(partial, path)

    def record(self, summaries: Iterable[HealthSummary], tick: Mapping[str, Any],
               estate: Iterable[str] | None = None) -> None:
        """Stores the tick's summaries (replacing each table's previous one) and its heartbeat; with `estate`,
        drops the summaries of tables not in it. The summaries file is read and rewritten only when a summary is
        new or the estate changed (an unchanged tick of 10,000 tables writes the heartbeat alone)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fresh = {s.table: s.to_dict() for s in summaries}
        keep = set(estate) if estate is not None else None
        digest = hashlib.sha1("\n".join(sorted(keep)).encode()).hexdigest() if keep is not None else None
        with open(self.root / "health.lock", "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            if fresh or digest is None or digest != self.last_tick().get("estate"):
                tables = dict(self._read_file())
                tables.update(fresh)
                if keep is not None:
                    tables = {t: s for t, s in tables.items() if t in keep}
                self._replace(self.path, {"format": FORMAT, "tables": tables})
            self._replace(self.tick_path, {**tick, "estate": digest})

    def _read_file(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        tables = data.get("tables") if isinstance(data, dict) else None
        return tables if isinstance(tables, dict) else {}

    def tables(self) -> dict[str, dict[str, Any]]:
        """table -> its summary as stored (`HealthSummary.to_dict`); re-read only when the file changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {}
        key = (st.st_mtime_ns, st.st_ino)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._read_file())
        return self._cache[1]

    def last_tick(self) -> dict[str, Any]:
        """The last finished tick's heartbeat ({} before the first)."""
        try:
            data = json.loads(self.tick_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
