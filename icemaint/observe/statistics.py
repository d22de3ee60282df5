"""A table's statistics state from its metadata (pyiceberg, no Spark): main's lineage and its statistics files."""

from __future__ import annotations

from icemaint.domain.statistics import SnapshotRows, StatisticsState, statistics_state, summary_rows
from icemaint.observe.manifests import main_lineage


def read_statistics_state(tbl) -> StatisticsState:
    """Where the table's statistics files stand against `main`."""
    lineage = [SnapshotRows(snapshot_id, operation, *summary_rows(summary))
               for snapshot_id, _, operation, summary in main_lineage(tbl)]
    return statistics_state(lineage, (f.snapshot_id for f in tbl.metadata.statistics))
