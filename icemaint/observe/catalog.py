"""Catalog access with pyiceberg (no Spark): opening the catalog, table listing, current metadata, loading.

This is what sensors use: cheap, Spark-free observation (see STACK.md for the measured costs). A loaded
table's metadata becomes health inputs in `icemaint.observe.manifests`; `CatalogReader.health` joins the two.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import os
from pathlib import Path
from urllib.parse import quote

from icemaint.config import MaintenanceConfig
from icemaint.config.catalog import catalog_secret_properties
from icemaint.config.parse import ConfigError
from icemaint.domain.masking import mask_credentials
from icemaint.domain.health import TableHealth, compute_health, writer_commit_times
from icemaint.domain.rewrite_plan import sort_order_problem
from icemaint.domain.names import InvalidTableName, TableName
from icemaint.domain.units import printable
from icemaint.domain.drift import LayoutTarget
from icemaint.domain.screen import Screened, screen_compaction
from icemaint.observe.manifests import (
    current_manifests, manifest_summaries, metadata_below_log, metadata_log_bytes, read_file_entries, read_snapshots,
    read_writer_touches, schema_columns, spec_descriptions, time_partitioning,
)
from icemaint.errors import OperationalError, UserError, one_line

log = logging.getLogger(__name__)


class TableNotFound(UserError, LookupError):
    """The catalog has no table of that name."""


class CatalogUnavailable(OperationalError, RuntimeError):
    """The catalog could not be reached or did not answer in time (named with its URI, never a secret)."""


class WarehouseMissing(CatalogUnavailable):
    """A hadoop catalog's warehouse directory does not exist: none created yet, a mistyped path or a volume not
    mounted (only the tables known before tell them apart)."""


class CatalogDenied(CatalogUnavailable):
    """The catalog answered but refused our credentials (named with its URI and the variables, never a secret)."""


# pyiceberg's answers to a request the catalog would not authorize (wrong keys, a bad signature, no grant).
_DENIED = ("ForbiddenError", "UnauthorizedError", "OAuthError")



def bounded_rest_catalog(name: str, timeout: float, **properties):
    """pyiceberg's REST catalog with a timeout on every HTTP request, its first config call included.

    pyiceberg 0.12 sets none, so a catalog that accepts the connection and never answers would hang the
    caller (a sensor tick, the CLI) for good.
    """
    from pyiceberg.catalog.rest import RestCatalog

    class BoundedRestCatalog(RestCatalog):
        def _create_session(self):
            session = super()._create_session()
            unbounded = session.request

            def request(method, url, **kwargs):
                if kwargs.get("timeout") is None:
                    kwargs["timeout"] = timeout
                return unbounded(method, url, **kwargs)

            session.request = request
            return session

    return BoundedRestCatalog(name, **properties)


def shown_location(cat) -> str:
    """Where the catalog is, as messages name it: its URI (else its warehouse), credentials masked."""
    return mask_credentials(cat.uri or cat.warehouse or "")


class CatalogReader:
    """Spark-free access to the configured catalog's tables and their metadata."""

    def __init__(self, config: MaintenanceConfig):
        self.config = config
        self._catalog = None

    # -- catalog ---------------------------------------------------------------------------
    def _unavailable(self, exc: BaseException) -> CatalogUnavailable:
        cat = self.config.catalog
        text = one_line(exc)
        return CatalogUnavailable(f"catalog {cat.name!r} ({cat.type} at {shown_location(cat)}) did not answer: "
                                  f"{type(exc).__name__}: {text}")

    def _denied(self, exc: BaseException) -> CatalogDenied:
        from icemaint.config.catalog import SECRET_ENV_PREFIX

        cat = self.config.catalog
        text = one_line(exc)
        names = sorted(n for n in os.environ if n.startswith(SECRET_ENV_PREFIX) and os.environ[n])
        return CatalogDenied(f"catalog {cat.name!r} ({cat.type} at {shown_location(cat)}) refused the credentials: "
                             f"{text} (credentials from {', '.join(names) or f'no {SECRET_ENV_PREFIX}* variable'})")

    def _answer_or_raise(self, call):
        """Runs one catalog call; a refusal or an unreachable catalog becomes one named error."""
        try:
            return call()
        except (OSError, ConnectionError) as exc:
            raise self._unavailable(exc) from exc
        except Exception as exc:
            if type(exc).__name__ in _DENIED:
                raise self._denied(exc) from None
            if type(exc).__module__.startswith(("requests", "urllib3", "sqlalchemy")):
                raise self._unavailable(exc) from exc
            raise

    def _pyiceberg_catalog(self):
        try:
            return self._open_catalog()
        except ConfigError:
            raise
        except ValueError as exc:  # a configuration mistake, named by pyiceberg
            raise ConfigError(f"catalog {self.config.catalog.name!r}: {one_line(exc)}") from None
        except TypeError:
            raise
        except Exception as exc:  # network, timeout, refused connection, authentication
            raise self._unavailable(exc) from exc

    def _open_catalog(self):
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            cat = self.config.catalog
            props = {**cat.properties, **catalog_secret_properties(cat)}
            if cat.type == "jdbc":
                self._catalog = load_catalog(cat.name, type="sql", uri=jdbc_to_sqlalchemy(cat.uri, props),
                                             warehouse=cat.warehouse or "")
            elif cat.type == "rest":
                self._catalog = bounded_rest_catalog(cat.name, cat.timeout_seconds, uri=cat.uri,
                                                     warehouse=cat.warehouse or "", **props)
            elif cat.type == "glue":
                self._catalog = load_catalog(cat.name, type="glue", **props)
            else:
                raise AssertionError("the hadoop catalog is read from the warehouse directory")
        return self._catalog

    def read_many(self, fn, tables):
        """`fn` over `tables` with at most `catalog.read_workers` at once, results in order (the
        tick's metadata reads: `icemaint.domain.tick.plan_compaction_tick`'s `read`)."""
        workers = min(self.config.catalog.read_workers, len(tables))
        if workers <= 1:
            return [fn(t) for t in tables]
        from concurrent.futures import ThreadPoolExecutor

        if self.config.catalog.type != "hadoop":
            try:
                self._pyiceberg_catalog()  # opened once, before the threads share it
            except CatalogUnavailable:
                pass  # each table's read reports it, as with one reader
        # The caller's garbage is collected here, in its own thread: a SQLite connection it dropped (Dagster's
        # instance storage) finalized by a collection in a reader thread makes SQLAlchemy log an error.
        gc.collect()
        # A few chunks per worker, not a future per table: at 10,000 tables the futures alone cost
        # more than reading the version hints they wrapped.
        size = -(-len(tables) // (workers * 4))
        chunks = [tables[i:i + size] for i in range(0, len(tables), size)]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="icemaint-metadata") as pool:
            return [r for chunk in pool.map(lambda c: [fn(t) for t in c], chunks) for r in chunk]

    def _table_dir(self, name: TableName) -> Path:
        return Path(self.config.catalog.warehouse, *name.namespace, name.name)

    def list_tables(self) -> list[str]:
        """Every table in the catalog, as `namespace.table` keys (names we cannot handle are skipped)."""
        if self.config.catalog.type == "hadoop":
            root = Path(self.config.catalog.warehouse)
            if not root.is_dir():
                # A mistyped or unmounted warehouse is not an empty estate: discovery would drop every known table.
                raise WarehouseMissing(f"catalog {self.config.catalog.name!r}: its warehouse {root} does not exist "
                                       "(a mistyped path, or a volume not mounted); no table was listed")
            found = []
            # A commit replaces the version hint (delete, then rename): a table is also known by its
            # metadata files, so discovery never drops a live table for the instant of a commit.
            for marker in (*root.glob("**/metadata/version-hint.text"), *root.glob("**/metadata/v*.metadata.json")):
                parts = marker.parent.parent.relative_to(root).parts
                found.append(".".join(parts))
        else:
            catalog = self._pyiceberg_catalog()
            found = []
            stack = self._answer_or_raise(lambda: list(catalog.list_namespaces()))
            while stack:
                ns = stack.pop()
                found.extend(".".join(ident) for ident in self._answer_or_raise(lambda: catalog.list_tables(ns)))
                stack.extend(self._answer_or_raise(lambda: catalog.list_namespaces(ns)))
        tables = []
        for key in sorted(set(found)):
            try:
                tables.append(TableName.parse(key).key)
            except InvalidTableName as exc:
                log.warning("skipping table %s: %s", printable(key), printable(str(exc)))
        return tables

    def metadata_location(self, table: str) -> str:
        """The table's current metadata file; cheap (one small read for the hadoop catalog)."""
        name = TableName.parse(table)
        if self.config.catalog.type == "hadoop":
            hint = self._table_dir(name) / "metadata" / "version-hint.text"
            try:
                version = hint.read_text().strip()
            except FileNotFoundError:
                version = ""
            if not version.isdigit():
                # A commit replaces the hint (delete, then rename): for that instant it is missing or
                # empty. Iceberg's own HadoopTableOperations then takes the highest vN.metadata.json.
                versions = [int(p.name[1:-len(".metadata.json")]) for p in hint.parent.glob("v*.metadata.json")
                            if p.name[1:-len(".metadata.json")].isdigit()]
                if not versions:
                    raise TableNotFound(f"table {table} not found in catalog {self.config.catalog.name!r} "
                                        f"(no {hint})") from None
                version = str(max(versions))
            return str(hint.parent / f"v{version}.metadata.json")
        return self.load(table).metadata_location

    def load(self, table: str):
        """The pyiceberg table at its current metadata."""
        name = TableName.parse(table)
        if self.config.catalog.type == "hadoop":
            from pyiceberg.table import StaticTable

            return StaticTable.from_metadata(self.metadata_location(table))
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self._pyiceberg_catalog()
        try:
            return self._answer_or_raise(lambda: catalog.load_table((*name.namespace, name.name)))
        except NoSuchTableError:
            raise TableNotFound(f"table {table} not found in catalog {self.config.catalog.name!r}") from None

    # -- health ----------------------------------------------------------------------------
    def health(self, table: str, now: dt.datetime | None = None, loaded=None,
               measure_metadata: bool = False) -> TableHealth:
        """Health numbers of the table's current snapshot (see `icemaint.domain.health`); with
        `measure_metadata`, also the bytes of its metadata.json files (a stat per file in the log)."""
        tbl = loaded if loaded is not None else self.load(table)
        return self._health(table, tbl, current_manifests(tbl), now, measure_metadata)

    def tick_health(self, table: str, now: dt.datetime | None = None) -> TableHealth | Screened:
        """Health as a sensor tick needs it: a table whose manifest list shows that no partition can be
        due (`icemaint.domain.screen`) is `Screened` without reading its manifests."""
        policy = self.config.policy(table)
        tbl = self.load(table)
        manifests = current_manifests(tbl)
        timing = time_partitioning(tbl, policy.time_column)
        if timing.found or not policy.time_column:  # a policy time_column that is wrong is refused in full
            summaries = manifest_summaries(tbl, timing, manifests)
            layout = LayoutTarget(tbl.metadata.default_spec_id, tbl.metadata.default_sort_order_id,
                                  policy.max_file_size_bytes, policy.drift_min_bytes) if policy.layout_drift else None
            reason = screen_compaction(summaries, policy.min_input_files, dated=timing.found, layout=layout,
                                       data_bytes=_total_data_bytes(tbl))
            if reason:
                return Screened(TableName.parse(table).key, tbl.metadata_location, reason,
                                data_files=sum(m.live_files or 0 for m in summaries if not m.deletes),
                                snapshots=len(tbl.metadata.snapshots), manifests=len(manifests))
        return self._health(table, tbl, manifests, now)

    def _health(self, table: str, tbl, manifests: list, now: dt.datetime | None,
                measure_metadata: bool = False) -> TableHealth:
        policy = self.config.policy(table)
        # After the load: a commit that landed while the table was read is not in the future.
        now = now or dt.datetime.now(dt.timezone.utc)
        timing = time_partitioning(tbl, policy.time_column)
        snapshot = tbl.current_snapshot()
        files = list(read_file_entries(tbl, timing, manifests))
        snapshots = read_snapshots(tbl)
        touched, known = [], True
        if policy.writer_scope == "partition" and snapshot is not None and policy.writer_idle_seconds > 0:
            writer_times = writer_commit_times(snapshots, snapshot.snapshot_id)
            since = now - dt.timedelta(seconds=policy.writer_idle_seconds)
            touched, known = read_writer_touches(tbl, timing, files, writer_times, since)
        return compute_health(
            table=TableName.parse(table).key,
            metadata_location=tbl.metadata_location,
            snapshot_id=snapshot.snapshot_id if snapshot else None,
            schema_id=tbl.metadata.current_schema_id,
            spec_id=tbl.metadata.default_spec_id,
            time_column=timing.column,
            time_transform=timing.transform,
            time_column_type=timing.column_type,
            format_version=int(tbl.metadata.format_version),
            time_column_problem=timing.source if policy.time_column and not timing.found else None,
            sort_order_problem=sort_order_problem(schema_columns(tbl.schema()), policy.strategy, policy.sort_order),
            files=files,
            manifest_lengths=[m.manifest_length for m in manifests],
            snapshots=snapshots,
            touched=touched,
            writer_partitions_known=known,
            metadata_files=len(tbl.metadata.metadata_log) + 1,
            metadata_bytes=metadata_log_bytes(tbl) if measure_metadata else None,
            metadata_below_log=metadata_below_log(tbl, now) if measure_metadata else None,
            small_file_size_bytes=policy.small_file_size_bytes,
            small_manifest_bytes=policy.manifest_small_bytes,
            now=now,
            sort_order_id=tbl.metadata.default_sort_order_id,
            max_file_size_bytes=policy.max_file_size_bytes,
            specs=spec_descriptions(tbl),
        )


def jdbc_to_sqlalchemy(uri: str, props: dict[str, str]) -> str:
    """`jdbc:postgresql://host:port/db` + jdbc.user/jdbc.password -> a SQLAlchemy URI for pyiceberg."""
    if uri.startswith("jdbc:postgresql://"):
        rest = uri[len("jdbc:postgresql://"):]
        user = props.get("jdbc.user") or os.environ.get("PGUSER", "")
        password = props.get("jdbc.password") or os.environ.get("PGPASSWORD", "")
        auth = ""
        if user:
            auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "") + "@"
        return f"postgresql+psycopg2://{auth}{rest}"
    if uri.startswith("jdbc:sqlite:"):
        # jdbc:sqlite:/abs/cat.db -> sqlite:////abs/cat.db (absolute); jdbc:sqlite:cat.db -> sqlite:///cat.db
        return "sqlite:///" + uri[len("jdbc:sqlite:"):]
    raise ConfigError(f"catalog.uri {mask_credentials(uri)!r}: only jdbc:postgresql:// and jdbc:sqlite: JDBC catalogs "
                      "are supported")


def _total_data_bytes(tbl) -> int | None:
    """The current snapshot's data bytes from its summary (`total-files-size`), None when it does not say."""
    snapshot = tbl.current_snapshot()
    summary = snapshot.summary if snapshot is not None else None
    value = summary.additional_properties.get("total-files-size") if summary is not None else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
