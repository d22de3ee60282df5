"""Compaction at the entrance, the file-system and Spark part: list a landing location, check each landed file
against the table, read a batch with Spark, stage it on a branch, read it back for the proof, append the proven
files to `main` with the batch id in the snapshot summary, and move landed files to the processed or rejected area.

Files are listed, checked and moved through pyarrow's file systems: a local directory, or an s3:// prefix reached
with the catalog's own endpoint and credentials (`storage_properties`: its `s3.*` properties and the
`ICEMAINT_CATALOG_*` secrets, never a command line). Spark reads a batch itself where Hadoop has a file system for
the location (a local directory; s3a:// with hadoop-aws on the classpath). Where it has none (the production shape:
tables through Iceberg's S3FileIO, no hadoop-aws), the driver reads the landed objects with pyarrow and hands them
to Spark as Arrow record batches (`arrow_frame`): the executors need neither Python nor S3 jars for it, and the
driver holds one batch's rows at a time. The staging branch and its removal reuse
`icemaint.engine.staging.StagingArea`.
"""

from __future__ import annotations

import logging
import math
import posixpath
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping
from urllib.parse import urlsplit

from icemaint.domain.health import MAINTENANCE_TAG
from icemaint.domain.landing import BATCH_ID_KEY, SOURCE_KEY, Batch, LandedFile, LandingSource, ignored, \
    last_batch_property
from icemaint.engine.java import COMMIT_STATE_UNKNOWN, find_on_main, java_exception_class, listed_java
from icemaint.engine.staging import STAGE_KEY, StagingArea
from icemaint.engine.staging_errors import StagingError

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


# Landed files read at once on the driver (checks, and the driver's reads of an object-store batch).
READ_WORKERS = 8
# Schemes pyiceberg's PyArrowFileIO serves with pyarrow's S3FileSystem.
S3_SCHEMES = ("s3", "s3a", "s3n")
Properties = Mapping[str, str]


def storage_properties(config) -> dict[str, str]:
    """The catalog's properties with its secrets (`ICEMAINT_CATALOG_*`): a landing prefix on the catalog's object
    store is reached with the catalog's endpoint, region and keys (`s3.endpoint`, `client.region`,
    `s3.access-key-id`, ...; pyiceberg's names)."""
    from icemaint.config.catalog import catalog_secret_properties

    return {**config.catalog.properties, **catalog_secret_properties(config.catalog)}


@lru_cache(maxsize=8)
def _s3(items: tuple[tuple[str, str], ...], scheme: str, bucket: str):
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO(dict(items)).fs_by_scheme(scheme, bucket)


def filesystem(location: str, properties: Properties | None = None):
    """(pyarrow FileSystem, root path) of a local directory or a URI; an s3:// one with `properties` (see
    `storage_properties`) gets pyiceberg's S3 file system for them, without them pyarrow's defaults (AWS's)."""
    from pyarrow import fs

    if "://" not in location:
        return fs.LocalFileSystem(), location.rstrip("/") or "/"
    parts = urlsplit(location)
    if properties is not None and parts.scheme.lower() in S3_SCHEMES:
        root = f"{parts.netloc}{parts.path}".rstrip("/")
        return _s3(tuple(sorted(properties.items())), parts.scheme.lower(), parts.netloc), root
    return fs.FileSystem.from_uri(location)


def list_landed(location: str, after: str | None = None, properties: Properties | None = None) -> list[LandedFile]:
    """The landed files under `location` (recursively; hidden, in-progress, processed and rejected ones skipped),
    by name; with `after`, only names after it (the sensor's listing position)."""
    from pyarrow import fs as pafs

    filesys, root = filesystem(location, properties)
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


def move(source_location: str, name: str, target_location: str, reason: str | None = None,
         properties: Properties | None = None) -> str:
    """Moves landed file `name` to `target_location` (keeping its relative name; a name taken there gets a suffix),
    with a `<name>.reason.txt` beside it when `reason` is given; returns where it went."""
    from pyarrow import fs as pafs

    src_fs, src_root = filesystem(source_location, properties)
    dst_fs, dst_root = filesystem(target_location, properties)
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


def delete(location: str, name: str, properties: Properties | None = None) -> None:
    filesys, root = filesystem(location, properties)
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


class UnreadableFile(Exception):
    """A landed file cannot be read as its source's format; the message is the reason (one line)."""


def read_file(source: LandingSource, name: str, properties: Properties | None = None):
    """Landed file `name`, read whole as a pyarrow Table: a parquet file with its own schema, a jsonl or csv file with
    the source's (a value that does not parse, a column the schema does not name, or a missing column raises).

    Raises:
        UnreadableFile: the reason, in one line.
    """
    import pyarrow as pa

    filesys, root = filesystem(source.location, properties)
    path = f"{root}/{name}"
    try:
        if source.format == "parquet":
            import pyarrow.parquet as pq

            with filesys.open_input_file(path) as handle:  # read whole: a bad page is found here, not in Spark
                return pq.ParquetFile(handle).read()
        schema = pa.schema([(c, _arrow_type(t)) for c, t in source.schema])
        with filesys.open_input_stream(path) as handle:
            data = handle.read()
        if source.format == "jsonl":
            import pyarrow.json as pj

            return pj.read_json(pa.BufferReader(data), parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="error"))
        import pyarrow.csv as pc

        header = data.split(b"\n", 1)[0].decode(errors="replace").strip().split(",")
        if header != [c for c, _ in source.schema]:
            raise UnreadableFile(f"csv header {header} is not the schema's columns {[c for c, _ in source.schema]}")
        return pc.read_csv(pa.BufferReader(data), convert_options=pc.ConvertOptions(column_types=schema))
    except (OSError, pa.ArrowException, ValueError, UnicodeDecodeError) as exc:
        raise UnreadableFile(f"cannot be read as {source.format}: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc


def check_files(source: LandingSource, names: list[str], table_columns: list[tuple[str, str]],
                properties: Properties | None = None) -> list[tuple[int, str | None]]:
    """`check_file` of each of `names`, in their order, `READ_WORKERS` at a time."""
    return list(_each(lambda name: check_file(source, name, table_columns, properties), names))


def _each(read, names: list[str]):
    """`read` of each name in order, up to READ_WORKERS at once (an object store's latency, not the CPU, is what a
    small file's read waits on)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(READ_WORKERS, len(names))),
                            thread_name_prefix="icemaint-landed-read") as pool:
        yield from pool.map(read, names)


def check_file(source: LandingSource, name: str, table_columns: list[tuple[str, str]],
               properties: Properties | None = None) -> tuple[int, str | None]:
    """(rows, None) when landed file `name` can be read (`read_file`) and matches the table's columns, else (0, the
    reason). A file Spark then could not read would fail every batch it is in; read here, it is set aside alone."""
    try:
        table = read_file(source, name, properties)
    except UnreadableFile as exc:
        return 0, str(exc)
    columns = {f.name: f.type for f in table.schema}
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
    return int(table.num_rows), None


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

    def __init__(self, spark, area: StagingArea, source: LandingSource, properties: Properties | None = None):
        self.spark = spark
        self.area = area
        self.source = source
        self.properties = properties  # the object store's (`storage_properties`), for the driver's reads
        self._spark_reads: bool | None = None

    @property
    def read_by(self) -> str:
        """Who reads the landed rows: "spark" where Hadoop has a file system for the location (a local directory;
        s3a:// with hadoop-aws on the classpath), else "driver" (pyarrow on the driver, `arrow_frame`)."""
        if self._spark_reads is None:
            from icemaint.engine.files import Files

            self._spark_reads = "://" not in self.source.location or \
                Files(self.spark).on_hadoop(spark_path(self.source.location, "x"))
        return "spark" if self._spark_reads else "driver"

    def table_schema(self):
        """The table's Spark schema (a StructType)."""
        return self.spark.table(self.area.name.sql(self.area.catalog)).schema

    def table_columns(self) -> list[tuple[str, str]]:
        """(column, Spark SQL type) of the table, in order."""
        return [(f.name, f.dataType.simpleString()) for f in self.table_schema().fields]

    def read(self, names: list[str], columns: list[tuple[str, str]]):
        """The landed rows of `names`, as the table's columns (by name, cast to the table's types)."""
        if self.read_by == "driver":
            return self.arrow_frame(names)
        paths = [spark_path(self.source.location, n) for n in names]
        reader = self.spark.read
        if self.source.format == "parquet":
            df = reader.parquet(*paths)
        else:
            ddl = ", ".join(f"`{c}` {SPARK_TYPES[t]}" for c, t in self.source.schema)
            reader = reader.schema(ddl).option("mode", "FAILFAST")
            df = reader.json(paths) if self.source.format == "jsonl" else reader.option("header", "true").csv(paths)
        return df.selectExpr(*(f"CAST(`{c}` AS {t}) AS `{c}`" for c, t in columns))

    def arrow_frame(self, names: list[str]):
        """The landed rows of `names` read on the driver with pyarrow (`read_file`), each file's columns taken by
        name and cast to the table's types (a value that does not fit fails, nothing is truncated), handed to Spark
        as Arrow record batches (`READ_WORKERS` files read at once).

        PySpark 3.5 has no public Arrow-table entry (`createDataFrame(pyarrow.Table)` is Spark 4's); this is the
        path its `createDataFrame(pandas)` takes after converting to Arrow, without pandas, which would turn a
        nullable bigint into a double (2**60 + 1 read back as 2**60) and cannot carry arrays or structs. The files
        stream one at a time into the JVM's copy (the driver's heap holds the batch, as a local relation)."""
        from pyspark.sql import DataFrame
        from pyspark.sql.pandas.serializers import ArrowStreamSerializer
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructField, StructType

        schema = StructType([StructField(f.name, f.dataType, True) for f in self.table_schema().fields])
        target = to_arrow_schema(schema)

        def table(name: str):
            try:
                return read_file(self.source, name, self.properties).select(target.names).cast(target, safe=True)
            except (UnreadableFile, KeyError, ValueError, TypeError, NotImplementedError) as exc:
                raise LandingError(f"landed file {name} of {self.source.name} no longer reads as the table's "
                                   f"columns (changed during the run?): {str(exc).splitlines()[0]}") from exc

        def batches():
            import pyarrow as pa

            sent = False
            for landed in _each(table, names):
                for batch in landed.to_batches():
                    sent = True
                    yield batch
            if not sent:  # a stream needs one batch to carry its schema
                yield pa.RecordBatch.from_pylist([], schema=target)

        jvm, session = self.spark._jvm, self.spark
        rows = session._sc._serialize_to_jvm(batches(), ArrowStreamSerializer(),
                                             lambda path: jvm.PythonSQLUtils.readArrowStreamFromFile(path),
                                             lambda: jvm.ArrowIteratorServer())
        frame = DataFrame(jvm.PythonSQLUtils.toDataFrame(rows, schema.json(), session._jsparkSession), session)
        return frame

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

