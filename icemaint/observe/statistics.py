"""A table's statistics state from its metadata (pyiceberg, no Spark): main's lineage and its statistics files."""

from __future__ import annotations

from icemaint.domain.statistics import THETA_BLOB, SnapshotRows, StatisticsState, statistics_state, summary_rows
from icemaint.observe.manifests import main_lineage


def read_statistics_state(tbl) -> StatisticsState:
    """Where the table's statistics files stand against `main`, and which columns each covers (by the current
    schema's names; a column dropped since is not counted)."""
    lineage = [SnapshotRows(snapshot_id, operation, *summary_rows(summary))
               for snapshot_id, _, operation, summary in main_lineage(tbl)]
    schema = tbl.schema()

    def covered(statistics_file) -> frozenset[str]:
        ids = {field_id for blob in statistics_file.blob_metadata if blob.type == THETA_BLOB for field_id in blob.fields}
        return frozenset(name for name in (schema.find_column_name(i) for i in ids) if name is not None)

    files = list(tbl.metadata.statistics)
    return statistics_state(lineage, (f.snapshot_id for f in files), {f.snapshot_id: covered(f) for f in files},
                            [f.name for f in schema.fields if f.field_type.is_primitive])
