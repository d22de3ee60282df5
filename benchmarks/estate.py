"""A many-table estate for the sensor benchmark, made by copying small template tables' metadata.

Two template tables are written with Spark into the Hadoop warehouse: `healthy` (7 days, 3 small
files a day: nothing to do) and `needs_work` (the same plus 3 more small files on its first day:
one compaction to request). An estate table is a copy of a template's metadata directory with
every path inside its metadata JSON moved to the copy, so the Hadoop layout (`version-hint.text`
-> `v<N>.metadata.json` -> its own manifest lists) is complete and `CatalogReader` reads it like
any table. The manifests and data files stay the template's: pyiceberg re-reads a manifest's
entries on every `inspect.files()`, so each table's health still costs its own reads.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

from icemaint.domain.names import TableName

from benchmarks.lake import create_table, day_rows

TEMPLATE_START = dt.date(2024, 2, 1)
TEMPLATE_DAYS = 7
ROWS_PER_DAY = 20
HEALTHY_COMMITS = 3
EXTRA_COMMITS = 3  # on the first day of `needs_work`: 6 small files >= min_input_files 5
NEEDS_WORK_EVERY = 50  # one table in 50 has a date to compact: 20 runs at 1,000 tables (the tick's budget)
ESTATE_NAMESPACE = "estate"


def _append_days(spark, table_sql: str, days: list[dt.date], start_id: int, seed: int = 7) -> int:
    frames = [day_rows(spark, start_id + i * ROWS_PER_DAY, start_id + (i + 1) * ROWS_PER_DAY, 1, day, seed)
              for i, day in enumerate(days)]
    df = frames[0]
    for more in frames[1:]:
        df = df.union(more)
    df.writeTo(table_sql).append()
    return start_id + len(days) * ROWS_PER_DAY


def build_templates(spark, catalog: str, warehouse: str | Path) -> dict[str, Path]:
    """Writes the `tmpl.healthy` and `tmpl.needs_work` tables; returns their directories."""
    days = [TEMPLATE_START + dt.timedelta(days=i) for i in range(TEMPLATE_DAYS)]
    out = {}
    for kind in ("healthy", "needs_work"):
        table = TableName.parse(f"tmpl.{kind}")
        create_table(spark, catalog, table)  # the simulator's hash distribution: one file per day per commit
        next_id = 0
        for _ in range(HEALTHY_COMMITS):
            next_id = _append_days(spark, table.sql(catalog), days, next_id)
        if kind == "needs_work":
            for _ in range(EXTRA_COMMITS):
                next_id = _append_days(spark, table.sql(catalog), days[:1], next_id)
        out[kind] = Path(warehouse, *table.namespace, table.name)
    return out


def _rebase(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {k: _rebase(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebase(v, old, new) for v in value]
    if isinstance(value, str) and (value == old or value.startswith(old + "/")):
        return new + value[len(old):]
    return value


def copy_table(template_dir: Path, target_dir: Path) -> None:
    """A new Hadoop-layout table at `target_dir` with the template's metadata (see module docstring)."""
    source, target = template_dir / "metadata", target_dir / "metadata"
    target.mkdir(parents=True, exist_ok=False)
    old, new = str(template_dir), str(target_dir)
    for f in source.iterdir():
        if f.name.endswith(".metadata.json"):
            doc = _rebase(json.loads(f.read_text()), old, new)
            (target / f.name).write_text(json.dumps(doc))
        elif f.name.startswith("snap-") or f.name == "version-hint.text":
            shutil.copyfile(f, target / f.name)  # manifest lists: they name the template's manifests


def build_estate(templates: dict[str, Path], warehouse: Path, tables: int) -> list[str]:
    """`tables` copies in `<warehouse>/estate/`, one in NEEDS_WORK_EVERY from `needs_work`; returns their names."""
    if warehouse.exists():
        shutil.rmtree(warehouse)
    names = []
    for i in range(tables):
        kind = "needs_work" if i % NEEDS_WORK_EVERY == 0 else "healthy"
        name = f"{ESTATE_NAMESPACE}.t{i:05d}"
        copy_table(templates[kind], warehouse / ESTATE_NAMESPACE / f"t{i:05d}")
        names.append(name)
    return names
