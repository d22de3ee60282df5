"""The old side of a rewrite's proof, digested by the same read that feeds the writer.

A staged rewrite reads the replaced files' rows once to write the new files. `FeedDigest.wrap` hangs an
Observation (Spark's CollectMetrics) on that read: the same row count, whole-row hash sum, per-column
aggregates and sample fingerprints as `icemaint.engine.digest.rows_digest`, plus a per-file checksum of
which file each row came from. The proof then reads only the new files.

Because the old side is no longer read by a query of its own, the feeding read itself is checked against
the table's metadata (`FeedCheck`): every replaced file's live rows (its record count less its deletes,
from the manifests) must have been fed, file by file: `sum(crc32(file))` over the fed rows equals
`sum(crc32(file) * live rows)` over the files (CRC-32 of the path's UTF-8 bytes: the same in Spark and
in Python's zlib, so the expected side needs no Spark job). Where the live rows cannot be known from metadata
(equality deletes, position deletes that name more than one file), or the counts differ (a file missing
from the read, a filter that picked other rows, a task run twice), the proof reads the old side again
with its own query, as before: never a weaker proof, only sometimes not a cheaper one.
"""

from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from icemaint.engine.digest import SnapshotDigest, _free_name, aggregate_values, aggregates_for, fingerprint_exprs, \
    ident, sample_predicate

PUFFIN = "PUFFIN"


@dataclass(frozen=True)
class FeedCheck:
    """The fed rows against the replaced files' live rows from metadata.

    `expected_*` are None when metadata cannot tell a file's live rows (see `live_rows`).
    """

    fed_rows: int
    fed_file_checksum: str
    expected_rows: int | None
    expected_file_checksum: str | None

    @property
    def complete(self) -> bool:
        return (self.expected_rows is not None and self.fed_rows == self.expected_rows
                and self.fed_file_checksum == self.expected_file_checksum)

    def to_dict(self) -> dict:
        return {"fed_rows": self.fed_rows, "expected_rows": self.expected_rows,
                "fed_file_checksum": self.fed_file_checksum, "expected_file_checksum": self.expected_file_checksum,
                "complete": self.complete}


def live_rows(task, content_util) -> int | None:
    """A data file's rows as of the scan task's snapshot, from metadata alone: its record count less its
    deletion vector's cardinality or its file-scoped position deletes' rows; None when other deletes
    apply (equality deletes, or position deletes written for several files). `content_util` is Iceberg's
    ContentFileUtil (a file-scoped v2 delete file names its data file by equal file_path bounds)."""
    data = task.file()
    count = int(data.recordCount())
    deletes = task.deletes()
    if not deletes.size():
        return count
    path = str(data.location())
    for i in range(deletes.size()):
        delete = deletes.get(i)
        if delete.content().toString() != "POSITION_DELETES":
            return None
        referenced = content_util.referencedDataFileLocation(delete)
        if referenced is None or str(referenced) != path:
            return None
        count -= int(delete.recordCount())
    return count


class FeedDigest:
    """Digests the rows that feed a write, in that write's own pass. One instance per write."""

    def __init__(self, *, snapshot_id: int, sample_fraction: float, seed: int = 0):
        self.snapshot_id = int(snapshot_id)
        self.sample_fraction = sample_fraction
        self.seed = seed
        self._observation = None
        self._aggregates = None

    def wrap(self, rows):
        """`rows` (an Iceberg read) with the observation attached; the
        same columns as `rows`. The digest is ready after the action that consumes them has run."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        schema = rows.schema
        fp1, fp2, source = (_free_name(schema, f"__icemaint_{n}") for n in ("fp1", "fp2", "file"))
        first, second = fingerprint_exprs(schema, self.seed)
        self._aggregates = aggregates_for(schema, ident(fp1))
        exprs = ["count(1)", f"sum(CAST(crc32(CAST({ident(source)} AS BINARY)) AS DECIMAL(38,0)))"]
        exprs += [e for a in self._aggregates for e in a.exprs]
        # Sampled fingerprints as one text ("fp1 fp2 fp1 fp2 ..."): observed metrics return arrays of rows as
        # Java objects, text comes back as it is (about 40 bytes a sampled row).
        exprs.append(f"concat_ws(' ', collect_list(CASE WHEN {sample_predicate(ident(fp1), self.sample_fraction)} "
                     f"THEN concat({ident(fp1)}, ' ', {ident(fp2)}) END))")
        self._observation = Observation(f"icemaint_feed_{self.snapshot_id}_{uuid.uuid4().hex[:8]}")
        columns = [ident(f.name) for f in schema.fields]
        # The file each row came from, as Iceberg's reader announces it to Spark (its `_file` metadata
        # column does not resolve on this read once a v3 table's lineage columns are in its output).
        return (rows.select("*", F.input_file_name().alias(source))
                .selectExpr(*columns, ident(source), f"{first} AS {ident(fp1)}", f"{second} AS {ident(fp2)}")
                .observe(self._observation, *[F.expr(e).alias(f"m{i}") for i, e in enumerate(exprs)])
                .selectExpr(*columns))

    def result(self, spark, tasks: list) -> tuple[SnapshotDigest, FeedCheck]:
        """The old side's digest and the check of the feeding read against `tasks`' metadata."""
        metrics = self._observation.get
        values = [metrics[f"m{i}"] for i in range(len(metrics))]
        rows, checksum, sample_text = int(values[0]), str(int(values[1] or 0)), values[-1] or ""
        pairs = np.array(sample_text.split(), dtype=np.int64).reshape(-1, 2) if sample_text else \
            np.empty((0, 2), dtype=np.int64)
        digest = SnapshotDigest(snapshot_id=self.snapshot_id, row_count=rows,
                                aggregates=aggregate_values(self._aggregates, values[2:-1]),
                                sample=pd.DataFrame(pairs, columns=["fp1", "fp2"]),
                                read={"rows": rows})
        expected_rows, expected_checksum = expected_feed(spark._jvm.org.apache.iceberg.util.ContentFileUtil, tasks)
        return digest, FeedCheck(rows, checksum, expected_rows, expected_checksum)


def expected_feed(content_util, tasks: list) -> tuple[int | None, str | None]:
    """(live rows, sum of crc32(path) * live rows) over the tasks' files; (None, None) when a file's live
    rows are not known from metadata."""
    rows = checksum = 0
    for task in tasks:
        live = live_rows(task, content_util)
        if live is None:
            return None, None
        rows += live
        checksum += zlib.crc32(str(task.file().location()).encode("utf-8")) * live
    return rows, str(checksum)
