"""Compaction at the entrance, the file-system and Spark part: list a landing location, check each landed file
against the table, read a batch with Spark, stage it on a branch, read it back for the proof, append the proven
files to `main` with the batch id in the snapshot summary, and move landed files to the processed or rejected area.

Files are listed, checked and moved through pyarrow's file systems (a local directory or s3://), the rows are read
and written by Spark; the staging branch and its removal reuse `icemaint.engine.staging.StagingArea`.
"""

from __future__ import annotations

import logging
import math
import posixpath
import re
from dataclasses import dataclass

from icemaint.domain.health import MAINTENANCE_TAG
from icemaint.domain.landing import BATCH_ID_KEY, SOURCE_KEY, Batch, LandedFile, LandingSource, ignored, \
    last_batch_property
from icemaint.engine.java import COMMIT_STATE_UNKNOWN, find_on_main, java_exception_class, listed_java
from icemaint.engine.staging import STAGE_KEY, StagingArea, StagingError

log = logging.getLogger(__name__)

# Spark SQL type of a table column -> the pyarrow type ids a landed file's column may carry for it.
_COMPATIBLE = {
    "bigint": ("int64", "int32", "int16", "int8"), "int": ("int32", "int16", "int8"),
    "smallint": ("int16", "int8"), "tinyint": ("int8",),
    "double": ("double", "float", "halffloat"), "float": ("float", "halffloat"),
    "string": ("string", "large_string"), "boolean": ("bool",), "date": ("date32", "date64"),
    "timestamp": ("timestamp",), "timestamp_ntz": ("timestamp",), "binary": ("binary", "large_binary"),
}
# The config's column types (jsonl, csv) as Spark SQL types.
SPARK_TYPES = {"string": "string", "int": "int", "long": "bigint", "float": "float", "double": "double",
               "boolean": "boolean", "date": "date", "timestamp": "timestamp"}


class LandingError(StagingError):
    """Landed files could not be listed, read, staged or moved; what was committed is said in the message."""


def filesystem(location: str):
    """(pyarrow FileSystem, root path) of a local directory or an s3:// prefix."""
    from pyarrow import fs

    if "://" in location:
        return fs.FileSystem.from_uri(location)
    return fs.LocalFileSystem(), location.rstrip("/") or "/"


def list_landed(location: str, after: str | None = None) -> list[LandedFile]:
    """The landed files under `location` (recursively; hidden, in-progress, processed and rejected ones skipped),
    by name; with `after`, only names after it (the sensor's listing position)."""
    from pyarrow import fs as pafs

    filesys, root = filesystem(location)
    try:
        infos = filesys.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError as exc:
        raise LandingError(f"cannot list {location}: {exc}") from exc
    out = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        name = posixpath.relpath(info.path, root)
        if ignored(name) or (after is not None and name <= after):
            continue
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        out.append(LandedFile(mtime, name, int(info.size or 0)))
    return sorted(out, key=lambda f: f.name)


def spark_path(location: str, name: str) -> str:
    path = f"{location.rstrip('/')}/{name}"
    if path.startswith("s3://"):
        return "s3a://" + path[len("s3://"):]
    return path if "://" in path else f"file://{path}"


def move(source_location: str, name: str, target_location: str, reason: str | None = None) -> str:
    """Moves landed file `name` to `target_location` (keeping its relative name; a name taken there gets a suffix),
    with a `<name>.reason.txt` beside it when `reason` is given; returns where it went."""
    from pyarrow import fs as pafs

    src_fs, src_root = filesystem(source_location)
    dst_fs, dst_root = filesystem(target_location)
    target = f"{dst_root}/{name}"
    dst_fs.create_dir(posixpath.dirname(target), recursive=True)
    n = 0
    while dst_fs.get_file_info(target).type != pafs.FileType.NotFound:
        n += 1
        target = f"{dst_root}/{name}.{n}"
    if reason is not None:
        with dst_fs.open_output_stream(f"{target}.reason.txt") as out:
            out.write(reason.encode() + b"\n")
    if src_fs.type_name == dst_fs.type_name:
        src_fs.move(f"{src_root}/{name}", target)
    else:
        pafs.copy_files(f"{src_root}/{name}", target, source_filesystem=src_fs, destination_filesystem=dst_fs)
        src_fs.delete_file(f"{src_root}/{name}")
    return target


def delete(location: str, name: str) -> None:
    filesys, root = filesystem(location)
    filesys.delete_file(f"{root}/{name}")


# -- checking one file against the table -------------------------------------------------------------------------
_KINDS = {"array": "list", "struct": "struct", "map": "map", "decimal": "decimal"}


def _arrow_compatible(arrow_type, spark_type: str) -> bool:
    allowed = _COMPATIBLE.get(spark_type)
    if allowed is None:  # decimals, nested types: the same kind, Spark's cast decides the rest
        kind = re.split(r"[<(]", spark_type, maxsplit=1)[0]
        return str(arrow_type).startswith(_KINDS.get(kind, kind))
    name = str(arrow_type).split("[")[0]
    if spark_type == "timestamp_ntz" and getattr(arrow_type, "tz", None):
        return False
    return name in allowed


def check_file(source: LandingSource, name: str, table_columns: list[tuple[str, str]]) -> tuple[int, str | None]:
    """(rows, None) when landed file `name` can be read and matches the table's columns, else (0, the reason).

    Each file is read whole (landed files are small): a parquet file with its own schema, a jsonl or csv file with the
    source's (a value that does not parse, a column the schema does not name, or a missing column is a reason). A
    file Spark then could not read would fail every batch it is in; read here, it is set aside alone."""
    import pyarrow as pa

    filesys, root = filesystem(source.location)
    path = f"{root}/{name}"
    try:
        if source.format == "parquet":
            import pyarrow.parquet as pq

            with filesys.open_input_file(path) as handle:  # read whole: a bad page is found here, not in Spark
                table = pq.ParquetFile(handle).read()
                schema, rows = table.schema, table.num_rows
        else:
            schema = pa.schema([(c, _arrow_type(t)) for c, t in source.schema])
            with filesys.open_input_stream(path) as handle:
                data = handle.read()
            if source.format == "jsonl":
                import pyarrow.json as pj

                table = pj.read_json(pa.BufferReader(data), parse_options=pj.ParseOptions(
                    explicit_schema=schema, unexpected_field_behavior="error"))
            else:
                import pyarrow.csv as pc

                header = data.split(b"\n", 1)[0].decode(errors="replace").strip().split(",")
                if header != [c for c, _ in source.schema]:
                    return 0, f"csv header {header} is not the schema's columns {[c for c, _ in source.schema]}"
                table = pc.read_csv(pa.BufferReader(data), convert_options=pc.ConvertOptions(column_types=schema))
            rows = table.num_rows
    except (OSError, pa.ArrowException, ValueError, UnicodeDecodeError) as exc:
        return 0, f"cannot be read as {source.format}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    columns = {f.name: f.type for f in schema}
    wanted = dict(table_columns)
    extra = [c for c in columns if c not in wanted]
    if extra:
        return 0, f"column(s) {', '.join(extra)} not in table {source.table}"
    missing = [c for c in wanted if c not in columns]
    if missing:
        return 0, f"lacks column(s) {', '.join(missing)} of table {source.table}"
    for column, spark_type in table_columns:
        if not _arrow_compatible(columns[column], spark_type):
            return 0, f"column {column} is {columns[column]}, the table's is {spark_type}"
    return int(rows), None


def _arrow_type(kind: str):
    import pyarrow as pa

    return {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
            "double": pa.float64(), "boolean": pa.bool_(), "date": pa.date32(),
            "timestamp": pa.timestamp("us", tz="UTC")}[kind]


# -- Spark: read, stage, prove's sides, publish -------------------------------------------------------------------
@dataclass
class StagedBatch:
    branch: str
    base_snapshot_id: int
    staged_snapshot_id: int
    new_files: list  # Java DataFiles
    new_paths: tuple[str, ...]
    new_bytes: tuple[int, ...]


class LandingStage:
    """Reads a batch's landed files with Spark and stages, proves and appends them to one table."""

    def __init__(self, spark, area: StagingArea, source: LandingSource):
        self.spark = spark
        self.area = area
        self.source = source

    def check_readable(self) -> None:
        """Spark reads an object-store source through Hadoop's S3A file system: without it (hadoop-aws on the
        classpath, `spark.jars`), say so before anything is moved or staged."""
        if "://" not in self.source.location:
            return
        from icemaint.engine.files import Files

        if not Files(self.spark).on_hadoop(spark_path(self.source.location, "x")):
            raise LandingError(f"landing.{self.source.name}: Spark has no file system for "
                               f"{spark_path(self.source.location, '')}: put hadoop-aws (and its AWS SDK) on the "
                               "Spark classpath (spark.jars) to ingest from an object store; nothing was moved")

    def table_columns(self) -> list[tuple[str, str]]:
        """(column, Spark SQL type) of the table, in order."""
        schema = self.spark.table(self.area.name.sql(self.area.catalog)).schema
        return [(f.name, f.dataType.simpleString()) for f in schema.fields]

    def read(self, names: list[str], columns: list[tuple[str, str]]):
        """The landed rows of `names`, as the table's columns (by name, cast to the table's types)."""
        paths = [spark_path(self.source.location, n) for n in names]
        reader = self.spark.read
        if self.source.format == "parquet":
            df = reader.parquet(*paths)
        else:
            ddl = ", ".join(f"`{c}` {SPARK_TYPES[t]}" for c, t in self.source.schema)
            reader = reader.schema(ddl).option("mode", "FAILFAST")
            df = reader.json(paths) if self.source.format == "jsonl" else reader.option("header", "true").csv(paths)
        return df.selectExpr(*(f"CAST(`{c}` AS {t}) AS `{c}`" for c, t in columns))

    def stage(self, batch: Batch, names: list[str], columns: list[tuple[str, str]], branch: str) -> StagedBatch:
        """Writes the batch's rows as few large files to a new staging branch (at `main`, or at an empty snapshot of
        an empty table); `main` does not move."""
        tbl = self.area.table()
        if tbl.refs().containsKey(branch):
            self.area.discard(branch)
        tbl = self.area.table()
        tbl.manageSnapshots().createBranch(branch).commit()
        base = int(self.area.table().refs().get(branch).snapshotId())
        with self.area.branch_removed_on_failure(branch, f"batch {batch.batch_id}"):
            size = max(1, self.source.target_file_size)
            parts = max(1, math.ceil(batch.bytes / size))
            rows = self.read(names, columns).coalesce(parts)
            rows.writeTo(f"{self.area.name.sql(self.area.catalog)}.`branch_{branch}`") \
                .option("target-file-size-bytes", str(size)) \
                .option(f"snapshot-property.{STAGE_KEY}", branch) \
                .option(f"snapshot-property.{MAINTENANCE_TAG}", "true") \
                .option(f"snapshot-property.{BATCH_ID_KEY}", batch.batch_id).append()
            tbl = self.area.table()
            staged = int(tbl.refs().get(branch).snapshotId())
            new_files = listed_java(self.area.jvm, tbl.snapshot(staged).addedDataFiles(tbl.io()))
            return StagedBatch(branch, base, staged, new_files, tuple(str(f.location()) for f in new_files),
                               tuple(int(f.fileSizeInBytes()) for f in new_files))

    def staged_rows(self, staged: StagedBatch):
        """The rows of the staged files alone (what the branch's append added to its base)."""
        tbl = self.area.table(refresh=False)
        scan = tbl.newIncrementalAppendScan().fromSnapshotExclusive(staged.base_snapshot_id) \
            .toSnapshot(staged.staged_snapshot_id)
        iterable = scan.planFiles()
        try:
            tasks = listed_java(self.area.jvm, iterable)
        finally:
            iterable.close()
        return self.area.read_tasks(tasks)

    def append(self, staged: StagedBatch, summary: dict[str, str]) -> tuple[int, bool]:
        """Appends the proven files to `main` in one commit carrying `summary` (Iceberg retries a lost race: an
        append conflicts with nothing); (the snapshot id, whether the catalog first answered an unknown state)."""
        from py4j.protocol import Py4JJavaError

        batch = summary[BATCH_ID_KEY]
        txn = self.area.table().newTransaction()
        append = txn.newFastAppend()
        for data_file in staged.new_files:
            append = append.appendFile(data_file)
        for key, value in summary.items():
            append = append.set(key, str(value))
        append.commit()
        txn.updateProperties().set(last_batch_property(summary[SOURCE_KEY]), batch).commit()
        try:
            txn.commitTransaction()
        except Py4JJavaError as exc:
            if java_exception_class(exc) != COMMIT_STATE_UNKNOWN:
                raise
            found = self.find(batch)
            if found is None:
                raise LandingError(f"the catalog could not confirm the append of batch {batch} to "
                                   f"{self.area.name.key} and it is not on main after a re-read; the next run "
                                   "looks for it again before appending") from exc
            return found, True
        found = self.find(batch)
        if found is None:
            raise LandingError(f"the append of batch {batch} returned but is not on main of {self.area.name.key}")
        return found, False

    def find(self, batch: str) -> int | None:
        """The snapshot on `main` that appended batch `batch`, or None."""
        snap = find_on_main(self.area.table(), BATCH_ID_KEY, batch)
        return None if snap is None else int(snap.snapshotId())

