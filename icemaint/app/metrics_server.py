"""`icemaint metrics`: a Prometheus endpoint over what the tick last read and the audit trail.

A scrape reads no table metadata: per-table figures come from the summaries the compaction tick persisted
(`icemaint.safety.health_store`), counters and histograms from the audit log read incrementally
(`icemaint.safety.audit_tail`, tallied by `icemaint.domain.audit_tally`). `build_registry` and `wsgi_app` let a
deployment mount the same figures in its own process (beside the Dagster daemon, say); docs/metrics.md says how
to wire it into an existing Prometheus.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

from icemaint.domain.audit_tally import AuditTally
from icemaint.domain.health_summary import HealthSummary, due_age_seconds
from icemaint.safety.audit_tail import open_audit_tail
from icemaint.safety.health_store import HealthStore

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from icemaint.config import MaintenanceConfig

DEFAULT_PORT = 9464
PREFIX = "icemaint"
# per-table gauges: (name, help, the summary's field)
TABLE_GAUGES = (
    ("table_data_files", "Live data files of the table's current snapshot", "data_files"),
    ("table_small_files", "Live data files under the table's small-file size", "small_files"),
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
)


class EstateCollector:
    """A prometheus_client collector: the estate's figures at scrape time (see the module docstring)."""

    def __init__(self, config: "MaintenanceConfig", clock: Callable[[], dt.datetime] | None = None):
        self.store = HealthStore(config.state_dir)
        self.tail = open_audit_tail(config)
        self.tally = AuditTally()
        self.clock = clock or (lambda: dt.datetime.now(dt.timezone.utc))
        self._lock = threading.Lock()  # scrapes may arrive at once; the tail's offset is read by one at a time
        self.audit_errors = 0

    def describe(self) -> list:
        return []  # registering must not scrape (nor touch the audit log)

    def collect(self) -> Iterator[Any]:
        started = time.perf_counter()
        with self._lock:
            audit_up = self._read_audit()
            yield from self._audit_families(audit_up)
        now = self.clock()
        yield from self._table_families(self.store.tables(), now)
        yield from self._tick_families(self.store.last_tick())
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(f"{PREFIX}_scrape_duration_seconds", "Seconds this scrape took to collect",
                                value=time.perf_counter() - started)

    def _read_audit(self) -> bool:
        try:
            for record in self.tail.read_new():
                self.tally.add(record)
        except Exception:  # the database down: the counters keep their values, the scrape says the read failed
            self.audit_errors += 1
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

    def _table_families(self, tables: dict[str, dict[str, Any]], now: dt.datetime) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        families = {f: GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["table"]) for name, doc, f in TABLE_GAUGES}
        due = GaugeMetricFamily(f"{PREFIX}_table_oldest_due_date_age_seconds",
                                "Seconds since the start of the table's oldest date decided due", labels=["table"])
        held = GaugeMetricFamily(f"{PREFIX}_table_held", "1 while a scope of the table is held (awaiting approval, "
                                 "after a failed proof, failed runs or a revert)", labels=["table"])
        observed = GaugeMetricFamily(f"{PREFIX}_table_observed_timestamp_seconds",
                                     "When the tick last read the table's metadata", labels=["table"])
        published = GaugeMetricFamily(f"{PREFIX}_table_last_publish_age_seconds",
                                      "Seconds since the table's last published compaction", labels=["table"])
        now_s = now.timestamp()
        for table, stored in tables.items():
            s = HealthSummary.from_dict(stored)
            labels = [table]
            for field_name, family in families.items():
                value = getattr(s, field_name)
                if value is not None:
                    family.add_metric(labels, value)
            age = due_age_seconds(s, now)
            if age is not None:
                due.add_metric(labels, age)
            held.add_metric(labels, 1 if s.held else 0)
            observed.add_metric(labels, dt.datetime.fromisoformat(s.observed_at).timestamp())
        for table, when in self.tally.last_published.items():
            if table in tables:
                published.add_metric([table], max(now_s - when, 0.0))
        yield from families.values()
        yield from (due, held, observed, published)
        yield GaugeMetricFamily(f"{PREFIX}_tables", "Tables with a health summary", value=len(tables))

    def _tick_families(self, tick: dict[str, Any]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        if not tick.get("at"):
            return
        yield GaugeMetricFamily(f"{PREFIX}_last_tick_timestamp_seconds", "When the last compaction tick finished",
                                value=dt.datetime.fromisoformat(tick["at"]).timestamp())
        for key, doc in (("evaluated", "Tables the last tick read"), ("unchanged", "Tables the last tick skipped "
                         "as unchanged"), ("errors", "Tables the last tick could not read")):
            yield GaugeMetricFamily(f"{PREFIX}_last_tick_{key}", doc, value=float(tick.get(key) or 0))


def build_registry(config: "MaintenanceConfig") -> "CollectorRegistry":
    """A registry holding the estate's collector, for a deployment to expose (e.g. `prometheus_client.make_wsgi_app`
    or `generate_latest`) in its own process."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(EstateCollector(config))
    return registry


def wsgi_app(config: "MaintenanceConfig"):
    """A WSGI app serving the estate's figures on any path (`/metrics` by convention)."""
    from prometheus_client import make_wsgi_app

    return make_wsgi_app(build_registry(config))


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # a scrape every few seconds is not worth a line each
        pass


def make_metrics_server(config: "MaintenanceConfig", host: str, port: int) -> WSGIServer:
    """The HTTP server (`serve_forever`, `shutdown`); port 0 takes a free one (`server_port` says which)."""
    return make_server(host, port, wsgi_app(config), server_class=_Server, handler_class=_QuietHandler)


def cmd_metrics(config: "MaintenanceConfig", args) -> int:
    from icemaint.config import ConfigError

    try:
        server = make_metrics_server(config, args.host, args.port)
    except OSError as exc:
        raise ConfigError(f"port {args.port} on {args.host} cannot be used ({exc.strerror}): give another with "
                          "--port") from None
    print(f"icemaint metrics on http://{args.host}:{server.server_port}/metrics (state dir {config.state_dir}); "
          "Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def register(sub, port_type: Callable[[str], int]) -> None:
    """Adds `icemaint metrics` to the CLI's subcommands."""
    s = sub.add_parser("metrics", help="serve Prometheus metrics over the tick's last health read and the audit "
                                       "trail (/metrics)")
    s.add_argument("--port", type=port_type, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; 0.0.0.0 for a Prometheus on another host)")
    s.set_defaults(func=cmd_metrics)
