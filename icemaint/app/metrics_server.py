"""`icemaint metrics`: a Prometheus endpoint over what the tick last read and the audit trail.

A scrape reads no table metadata: per-table figures come from the summaries the compaction tick persisted
(`icemaint.safety.health_store`), counters and histograms from the audit log read incrementally
(`icemaint.safety.audit_tail`, tallied by `icemaint.domain.audit_tally`). `build_registry` and `wsgi_app` let a
deployment mount the same figures in its own process (beside the Dagster daemon, say); docs/operations/metrics.md says how
to wire it into an existing Prometheus.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

from icemaint.app.cli_types import port
from icemaint.domain.audit_tally import AuditTally
from icemaint.safety.audit_tail import open_audit_tail
from icemaint.safety.health_store import HealthStore

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from icemaint.config import MaintenanceConfig

DEFAULT_PORT = 9464
PREFIX = "icemaint"
# The text format's content type (prometheus_client's own default moved to 1.0.0; every Prometheus reads 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# per-table gauges: (name, help, the summary's field)
TABLE_GAUGES = (
    ("table_data_files", "Live data files of the table's current snapshot", "data_files"),
    ("table_small_files", "Live data files under the table's small-file size (absent when the tick screened the "
     "table from its manifest list: nothing can be due there)", "small_files"),
    ("table_small_files_max_partition", "Small files in the table's partition (date) that holds most",
     "small_files_max_partition"),
    ("table_small_files_threshold", "Small files that make a partition due (the policy's min_input_files)",
     "small_files_threshold"),
    ("table_delete_files", "Live delete files (position, equality, deletion vectors)", "delete_files"),
    ("table_deleted_row_ratio", "Deleted rows per row of the live data files", "deleted_row_ratio"),
    ("table_snapshots", "Snapshots in the table's metadata", "snapshots"),
    ("table_manifests", "Manifests of the current snapshot", "manifests"),
    ("table_metadata_json_bytes", "Bytes of the table's metadata.json files (when measured)", "metadata_bytes"),
    ("table_lagging_partitions", "Partitions at or above their small-file threshold that wait on no writer",
     "lagging_partitions"),
    ("table_held", "1 while a scope of the table is held (awaiting approval, after a failed proof, failed runs or "
     "a revert)", "held"),
    ("table_observed_timestamp_seconds", "When the tick last read the table's metadata", "observed"),
    ("table_oldest_due_date_timestamp_seconds", "Start (UTC) of the table's oldest date decided due; its age is "
     "time() minus this", "oldest_due"),
)
LAST_PUBLISH = ("table_last_publish_timestamp_seconds", "When the table's last compaction was published (from the "
                "audit trail); seconds since: time() minus this")

Rows = dict[str, list[tuple[str, float]]]


def table_rows(tables: dict[str, dict[str, Any]]) -> Rows:
    """Each per-table gauge's (table, value) pairs from the stored summaries (`HealthSummary.to_dict`); ages are
    left to PromQL (`time() -`), so the rows change only when the tick stores new summaries. Read from the stored
    dicts directly: building 10,000 dataclasses was half of a rebuild."""
    rows: Rows = {name: [] for name, _, _ in TABLE_GAUGES}
    plain = [(rows[name], f) for name, _, f in TABLE_GAUGES if f not in ("held", "observed", "oldest_due")]
    held, observed, due = rows["table_held"], rows["table_observed_timestamp_seconds"], \
        rows["table_oldest_due_date_timestamp_seconds"]
    starts: dict[str, float] = {}
    for table, stored in tables.items():
        for out, f in plain:
            value = stored.get(f)
            if value is not None:
                out.append((table, float(value)))
        held.append((table, 1.0 if stored.get("held") else 0.0))
        observed.append((table, dt.datetime.fromisoformat(stored["observed_at"]).timestamp()))
        date = stored.get("oldest_due_date")
        if date is not None:
            if date not in starts:
                starts[date] = dt.datetime.combine(dt.date.fromisoformat(date), dt.time(), dt.timezone.utc).timestamp()
            due.append((table, starts[date]))
    return rows


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def gauge_text(name: str, doc: str, rows: list[tuple[str, float]]) -> str:
    """One per-table gauge in the text format, written directly: at 10,000 tables prometheus_client's generic
    formatting of ~130,000 samples took most of a scrape (benchmarks/metrics_scrape.py)."""
    head = f"# HELP {PREFIX}_{name} {doc}\n# TYPE {PREFIX}_{name} gauge\n"
    return head + "".join(f'{PREFIX}_{name}{{table="{_label(t)}"}} {v!r}\n' for t, v in rows)


class EstateCollector:
    """A prometheus_client collector: the estate's figures at scrape time (see the module docstring). With
    `tables` false it leaves the per-table gauges to `EstateExposition`'s cached text."""

    def __init__(self, config: "MaintenanceConfig", tables: bool = True):
        self.store = HealthStore(config.state_dir)
        self.tail = open_audit_tail(config)
        self.tally = AuditTally()
        self.tables = tables
        self._lock = threading.Lock()  # scrapes may arrive at once; the tail's offset is read by one at a time
        self._rows: tuple[object, Rows] | None = None

    def describe(self) -> list:
        return []  # registering must not scrape (nor touch the audit log)

    def rows(self) -> Rows:
        """The per-table rows, rebuilt only when the stored summaries changed."""
        tables = self.store.tables()
        if self._rows is None or self._rows[0] is not tables:
            self._rows = (tables, table_rows(tables))
        return self._rows[1]

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        started = time.perf_counter()
        with self._lock:
            audit_up = self._read_audit()
            yield from self._audit_families(audit_up)
        yield from self._tick_families(self.store.last_tick())
        if self.tables:
            docs = {name: doc for name, doc, _ in TABLE_GAUGES}
            for name, rows in self.rows().items():
                family = GaugeMetricFamily(f"{PREFIX}_{name}", docs[name], labels=["table"])
                for table, value in rows:
                    family.add_metric([table], value)
                yield family
            family = GaugeMetricFamily(f"{PREFIX}_{LAST_PUBLISH[0]}", LAST_PUBLISH[1], labels=["table"])
            for table, value in self.published_rows():
                family.add_metric([table], value)
            yield family
            yield GaugeMetricFamily(f"{PREFIX}_scrape_duration_seconds", "Seconds the last scrape took to collect",
                                    value=time.perf_counter() - started)

    def published_rows(self) -> list[tuple[str, float]]:
        tables = self.store.tables()
        return [(t, when) for t, when in sorted(self.tally.last_published.items()) if t in tables]

    def _read_audit(self) -> bool:
        try:
            for record in self.tail.read_new():
                self.tally.add(record)
        except Exception:  # the database down: the counters keep their values, icemaint_audit_up says so
            return False
        return True

    def _audit_families(self, audit_up: bool) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        t = self.tally
        yield GaugeMetricFamily(f"{PREFIX}_audit_up", "1 when the last read of the audit log succeeded",
                                value=1 if audit_up else 0)
        yield CounterMetricFamily(f"{PREFIX}_audit_records", "Audit records tallied (dry runs and started markers "
                                  "left out)", value=t.records)
        ops = CounterMetricFamily(f"{PREFIX}_operations", "Maintenance decisions recorded in the audit trail",
                                  labels=["operation", "decision", "reason_kind"])
        for (operation, decision, kind), n in sorted(t.operations.items()):
            ops.add_metric([operation, decision, kind], n)
        yield ops
        proofs = CounterMetricFamily(f"{PREFIX}_proof_failures", "Proofs that failed (nothing was published)",
                                     labels=["operation"])
        for operation in sorted({"compact", *t.proof_failures}):
            proofs.add_metric([operation], t.proof_failures.get(operation, 0))
        yield proofs
        for name, doc, value in (
                ("rewritten_bytes", "Bytes of data files replaced by published compactions", t.rewritten_bytes),
                ("rewritten_files", "Data and delete files replaced by published compactions", t.rewritten_files),
                ("written_files", "Files written by published compactions", t.written_files),
                ("publish_attempts", "Commit attempts of staged rewrites", t.publish_attempts),
                ("snapshots_expired", "Snapshots removed by snapshot expiry", t.snapshots_expired),
                ("orphans_removed", "Orphan files removed (deleted or quarantined)", t.orphans_removed),
                ("manifests_rewritten", "Manifests replaced by manifest rewrites", t.manifests_rewritten)):
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        runs = HistogramMetricFamily(f"{PREFIX}_run_duration_seconds", "Seconds of one operation's call",
                                     labels=["operation"])
        for operation, h in sorted(t.run_seconds.items()):
            runs.add_metric([operation], h.buckets(), h.total)
        yield runs
        steps = HistogramMetricFamily(f"{PREFIX}_step_duration_seconds", "Seconds of one step of an operation "
                                      "(plan, stage, proof, publish, act)", labels=["operation", "step"])
        for (operation, step), h in sorted(t.step_seconds.items()):
            steps.add_metric([operation, step], h.buckets(), h.total)
        yield steps
        ratio = HistogramMetricFamily(f"{PREFIX}_proof_rewrite_ratio", "A compaction's proof seconds per rewrite "
                                      "second")
        ratio.add_metric([], t.proof_to_rewrite.buckets(), t.proof_to_rewrite.total)
        yield ratio

    def _tick_families(self, tick: dict[str, Any]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(f"{PREFIX}_tables", "Tables with a health summary", value=len(self.store.tables()))
        if not tick.get("at"):
            return
        yield GaugeMetricFamily(f"{PREFIX}_last_tick_timestamp_seconds", "When the last compaction tick finished",
                                value=dt.datetime.fromisoformat(tick["at"]).timestamp())
        for key, doc in (("evaluated", "Tables the last tick read"), ("unchanged", "Tables the last tick skipped "
                         "as unchanged"), ("errors", "Tables the last tick could not read")):
            yield GaugeMetricFamily(f"{PREFIX}_last_tick_{key}", doc, value=float(tick.get(key) or 0))


class EstateExposition:
    """The whole `/metrics` text: the audit's and tick's families through prometheus_client, the per-table gauges
    as text cached until the tick stores new summaries."""

    def __init__(self, config: "MaintenanceConfig"):
        from prometheus_client import CollectorRegistry

        self.collector = EstateCollector(config, tables=False)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._text: tuple[object, bytes] | None = None

    def _tables_text(self) -> bytes:
        rows = self.collector.rows()
        if self._text is None or self._text[0] is not rows:
            docs = {name: doc for name, doc, _ in TABLE_GAUGES}
            self._text = (rows, "".join(gauge_text(name, docs[name], r) for name, r in rows.items()).encode())
        return self._text[1]

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        started = time.perf_counter()
        body = generate_latest(self.registry) + self._tables_text() + gauge_text(
            LAST_PUBLISH[0], LAST_PUBLISH[1], self.collector.published_rows()).encode()
        took = time.perf_counter() - started
        return body + (f"# HELP {PREFIX}_scrape_duration_seconds Seconds this scrape took to render\n"
                       f"# TYPE {PREFIX}_scrape_duration_seconds gauge\n"
                       f"{PREFIX}_scrape_duration_seconds {took!r}\n").encode()


def build_registry(config: "MaintenanceConfig") -> "CollectorRegistry":
    """A registry holding the estate's collector, for a deployment to merge with its own (`generate_latest`).
    `wsgi_app` serves the same figures faster (its per-table text is cached): prefer it where it can be mounted."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(EstateCollector(config))
    return registry


class MetricsApp:
    """The WSGI app: the exposition's text on any path (`/metrics` by convention)."""

    def __init__(self, exposition: EstateExposition):
        self.exposition = exposition

    def __call__(self, environ, start_response):
        body = self.exposition.render()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [body]


def wsgi_app(config: "MaintenanceConfig") -> MetricsApp:
    """A WSGI app serving the estate's figures, for a deployment to mount."""
    return MetricsApp(EstateExposition(config))


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # a scrape every few seconds is not worth a line each
        pass


def make_metrics_server(config: "MaintenanceConfig", host: str, port: int, app: MetricsApp | None = None) -> WSGIServer:
    """The HTTP server (`serve_forever`, `shutdown`); port 0 takes a free one (`server_port` says which)."""
    return make_server(host, port, app or wsgi_app(config), server_class=_Server, handler_class=_QuietHandler)


def cmd_metrics(config: "MaintenanceConfig", args) -> int:
    from icemaint.config.parse import ConfigError

    app = wsgi_app(config)
    try:
        server = make_metrics_server(config, args.host, args.port, app)
    except OSError as exc:
        raise ConfigError(f"port {args.port} on {args.host} cannot be used ({exc.strerror}): give another with "
                          "--port") from None
    # The first scrape tallies the whole audit trail: done before serving, so it cannot outlast a scrape timeout.
    started = time.perf_counter()
    exposition = app.exposition
    exposition.render()
    print(f"icemaint metrics on http://{args.host}:{server.server_port}/metrics (state dir {config.state_dir}; "
          f"{exposition.collector.tally.records} audit records read in {time.perf_counter() - started:.1f} s); "
          "Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def register(sub) -> None:
    """Adds `icemaint metrics` to the CLI's subcommands."""
    from icemaint.app.cli_help import add_command

    s = add_command(sub, "metrics", cmd_metrics)
    s.add_argument("--port", type=port, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; 0.0.0.0 for a Prometheus on another host)")
