"""File operations wherever a table's files live, for orphan removal, quarantine and expiry's accounting.

A location is handled by Hadoop's FileSystem when Hadoop has one for its scheme (the local disk, HDFS),
else by Iceberg's FileIO: the table's own (`table_io`, e.g. S3FileIO with credentials the catalog vended)
or one resolved from the Spark catalog's properties (`ResolvingFileIO`, for the quarantine outside any
table). Object stores have no rename: a move there is copy, check the copy's length, then delete. An
object appears only once its upload completes, so an interruption at any point leaves a file still in
place, or whole in its new place (possibly in both, until the move is run again).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import urlsplit

from icemaint.domain.retention import QuarantineMoveFailed
from icemaint.engine.java import java_class
from icemaint.errors import one_line

_COPY_BUFFER = 1 << 20
# File lookups (`Files.sizes`) in flight at once: each waits on the store, not on the CPU.
LOOKUP_WORKERS = 16
_RESOLVING_IO = "org.apache.iceberg.io.ResolvingFileIO"


@dataclass(frozen=True)
class FileEntry:
    location: str
    size: int
    modified_ms: int


def _scheme(location: str) -> str:
    return urlsplit(location).scheme.lower() or "file"


def normalized(uri: str) -> tuple[str, str, str]:
    parts = urlsplit(uri)
    return parts.scheme.lower(), parts.netloc, posixpath.normpath(parts.path or "/")  # s3://bucket is its root


def relative_under(root: str, candidate: str) -> str | None:
    """`candidate`'s path relative to `root`, or None unless it lies strictly inside `root`."""
    r_scheme, r_net, r_path = normalized(root)
    c_scheme, c_net, c_path = normalized(candidate)
    if (r_scheme, r_net) != (c_scheme, c_net) or ".." in candidate.split("/"):
        return None
    prefix = r_path.rstrip("/") + "/"
    return c_path[len(prefix):] if c_path.startswith(prefix) and len(c_path) > len(prefix) else None


def catalog_properties(spark, catalog: str) -> dict[str, str]:
    """The Spark catalog's settings (`spark.sql.catalog.<catalog>.*`, the secrets set on the session
    included) without the prefix: what Iceberg's catalog itself is initialised with."""
    prefix = f"spark.sql.catalog.{catalog}."
    jconf = spark._jsparkSession.conf().getAll()
    entries = java_class(spark._jvm, "scala.collection.JavaConverters").mapAsJavaMapConverter(jconf).asJava()
    return {str(k)[len(prefix):]: str(v) for k, v in entries.items() if str(k).startswith(prefix)}


class Files:
    def __init__(self, spark, catalog: str | None = None, table_io=None):
        self._jvm = spark._jvm
        self._spark = spark
        self._conf = spark._jsc.hadoopConfiguration()
        self._catalog = catalog
        self._table_io = table_io
        self._catalog_io = None
        self._hadoop_schemes: dict[str, bool] = {}

    # -- which API serves a location -------------------------------------------------------------
    def on_hadoop(self, location: str) -> bool:
        """Whether Hadoop has a FileSystem for `location`'s scheme (else Iceberg's FileIO serves it)."""
        from py4j.protocol import Py4JJavaError

        scheme = _scheme(location)
        if scheme not in self._hadoop_schemes:
            try:
                java_class(self._jvm, "org.apache.hadoop.fs.FileSystem").getFileSystemClass(scheme, self._conf)
                self._hadoop_schemes[scheme] = True
            except Py4JJavaError:  # UnsupportedFileSystemException: no FileSystem for this scheme
                self._hadoop_schemes[scheme] = False
        return self._hadoop_schemes[scheme]

    def _io(self):
        if self._table_io is not None:
            return self._table_io
        if self._catalog_io is None:
            if self._catalog is None:
                raise QuarantineMoveFailed("no FileIO for an object-store location outside a table: name the catalog")
            self._catalog_io = java_class(self._jvm, "org.apache.iceberg.CatalogUtil").loadFileIO(
                _RESOLVING_IO, catalog_properties(self._spark, self._catalog), self._conf)
        return self._catalog_io

    def _path(self, location: str):
        return java_class(self._jvm, "org.apache.hadoop.fs.Path")(location)

    def _fs(self, path):
        return path.getFileSystem(self._conf)

    # -- operations ------------------------------------------------------------------------------
    def qualify(self, location: str) -> str:
        if not self.on_hadoop(location):
            return location
        path = self._path(location)
        return str(self._fs(path).makeQualified(path).toString())

    def size(self, location: str) -> int | None:
        """The file's length in bytes, None when there is no file."""
        if self.on_hadoop(location):
            path = self._path(location)
            fs = self._fs(path)
            return int(fs.getFileStatus(path).getLen()) if fs.exists(path) else None
        stream = self._io().newInputFile(location)
        return int(stream.getLength()) if stream.exists() else None

    def exists(self, location: str) -> bool:
        return self.size(location) is not None

    def sizes(self, locations, workers: int = LOOKUP_WORKERS) -> dict[str, int | None]:
        """`size` of each location (None where there is no file), up to `workers` lookups at once.

        One lookup is a round trip to the store (a HEAD on an object store): the thousands of manifest lists
        an expiry releases on a streaming table would be as many round trips one after the other."""
        unique = list(dict.fromkeys(locations))
        if len(unique) < 2 or workers <= 1:
            return {location: self.size(location) for location in unique}
        from concurrent.futures import ThreadPoolExecutor

        first = {unique[0]: self.size(unique[0])}  # settles the scheme's API (and FileIO) before the threads
        with ThreadPoolExecutor(max_workers=min(workers, len(unique) - 1), thread_name_prefix="icemaint-files") as pool:
            return {**first, **dict(zip(unique[1:], pool.map(self.size, unique[1:])))}

    def delete(self, location: str) -> bool:
        """Deletes one file; False when it was not there."""
        if self.on_hadoop(location):
            path = self._path(location)
            return bool(self._fs(path).delete(path, False))
        if self.size(location) is None:
            return False
        self._io().deleteFile(location)
        return True

    def list(self, prefix: str) -> list[FileEntry]:
        """Every file under `prefix` (a directory), recursively, with its length and modification time."""
        root = prefix.rstrip("/")
        if self.on_hadoop(root):
            path = self._path(root)
            fs = self._fs(path)
            if not fs.exists(path):
                return []
            found, walk = [], fs.listFiles(path, True)
            while walk.hasNext():
                status = walk.next()
                found.append(FileEntry(str(status.getPath().toString()), int(status.getLen()),
                                       int(status.getModificationTime())))
            return found
        found, walk = [], self._io().listPrefix(root + "/").iterator()
        while walk.hasNext():
            info = walk.next()
            found.append(FileEntry(str(info.location()), int(info.size()), int(info.createdAtMillis())))
        return found

    def children(self, location: str) -> list[str]:
        """The entries directly under `location` (a directory; on an object store, the key prefixes)."""
        root = location.rstrip("/")
        if self.on_hadoop(root):
            path = self._path(root)
            fs = self._fs(path)
            if not fs.exists(path):
                return []
            return [str(status.getPath().toString()) for status in fs.listStatus(path)]
        names = {entry.location[len(root) + 1:].split("/", 1)[0] for entry in self.list(root)
                 if entry.location.startswith(root + "/")}
        return sorted(f"{root}/{name}" for name in names if name)

    def delete_tree(self, location: str) -> bool:
        """Deletes a directory and everything under it; False when there was nothing."""
        if self.on_hadoop(location):
            path = self._path(location)
            return bool(self._fs(path).delete(path, True))
        if not self.list(location):
            return False
        self._io().deletePrefix(location.rstrip("/") + "/")
        return True

    def move(self, source: str, target: str) -> None:
        """Moves one file: a rename within one Hadoop FileSystem, else copy, compare lengths, delete.

        Raises:
            QuarantineMoveFailed: the file could not be moved; it is still in place (a partial copy, if
                any, is overwritten by the next attempt).
        """
        from py4j.protocol import Py4JJavaError

        try:
            if self.on_hadoop(source) and self.on_hadoop(target) and self._same_hadoop_fs(source, target):
                src, dst = self._path(source), self._path(target)
                fs = self._fs(dst)
                fs.mkdirs(dst.getParent())
                if not fs.rename(src, dst):
                    raise QuarantineMoveFailed(f"could not move {source} to {target}")
                return
            length = self.size(source)
            if length is None:
                raise QuarantineMoveFailed(f"could not move {source}: it is not there")
            java_class(self._jvm, "org.apache.hadoop.io.IOUtils").copyBytes(
                self._open(source), self._create(target), _COPY_BUFFER, True)
            copied = self.size(target)
            if copied != length:
                raise QuarantineMoveFailed(f"could not move {source} to {target}: the copy holds {copied} of "
                                           f"{length} bytes; the file is still in place")
            self.delete(source)
            if self.size(source) is not None:  # a move that leaves the source is a copy: say so
                raise QuarantineMoveFailed(f"copied {source} to {target} but could not delete it; it is in both "
                                           "places (the copy is whole)")
        except Py4JJavaError as exc:
            cause = one_line(exc.java_exception.toString())
            raise QuarantineMoveFailed(f"could not move {source} to {target}: {cause}") from None

    def _same_hadoop_fs(self, source: str, target: str) -> bool:
        return normalized(self.qualify(source))[:2] == normalized(self.qualify(target))[:2]

    def _open(self, location: str):
        if self.on_hadoop(location):
            path = self._path(location)
            return self._fs(path).open(path)
        return self._io().newInputFile(location).newStream()

    def _create(self, location: str):
        if self.on_hadoop(location):
            path = self._path(location)
            fs = self._fs(path)
            fs.mkdirs(path.getParent())
            return fs.create(path, True)
        return self._io().newOutputFile(location).createOrOverwrite()
