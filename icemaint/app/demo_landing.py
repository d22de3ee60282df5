"""The demo's landing step: a device fleet drops small parquet files into the demo config's `readings` landing
source, and one `icemaint ingest` appends them to `demo.readings` as a few large files, exactly once."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from icemaint.config import MaintenanceConfig
from icemaint.domain.names import TableName

SOURCE = "readings"
FILES, ROWS_PER_FILE = 60, 50


def drop_readings(folder: Path, files: int = FILES, rows: int = ROWS_PER_FILE) -> int:
    """Small parquet files as devices drop them (written under a temporary name, then renamed); the rows dropped."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for n in range(files):
        ids = list(range(n * rows, (n + 1) * rows))
        table = pa.table({"reading_id": pa.array(ids, pa.int64()),
                          "device": [f"sensor-{i % 7}" for i in ids],
                          "ts": [start + dt.timedelta(seconds=i) for i in ids],
                          "value": [round(i * 0.37 % 40, 2) for i in ids]})
        tmp = folder / f".f{n:06d}.parquet.tmp"
        pq.write_table(table, tmp)
        tmp.rename(folder / f"{start:%Y%m%dT%H%M%S}-{n:06d}.parquet")
    return files * rows


def run_landing_step(config: MaintenanceConfig, spark, tick: Callable[[], dict], say: Callable[[str], None]) -> None:
    """Drops the files, then one tick: the landing sensor's decision finds the source due and runs the ingest."""
    source = config.landing.get(SOURCE)
    if source is None or "://" in source.location:
        return
    name = TableName.parse(source.table)
    spark.sql(f"DROP TABLE IF EXISTS {name.sql(config.catalog.name)} PURGE")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS `{config.catalog.name}`.`{name.namespace[0]}`")
    spark.sql(f"CREATE TABLE {name.sql(config.catalog.name)} (reading_id bigint, device string, ts timestamp, "
              "value double) USING iceberg")
    shutil.rmtree(source.location, ignore_errors=True)
    rows = drop_readings(Path(source.location))
    say(f"== landing: devices dropped {FILES} small parquet files ({rows} rows) into {source.location}; the next "
        f"tick's landing sensor finds {SOURCE} due and appends them to {source.table} (icemaint ingest {SOURCE})")
    for line in tick()["lines"]:
        if line.startswith("landing "):
            say("   " + line)
