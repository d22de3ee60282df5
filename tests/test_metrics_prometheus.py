"""`icemaint metrics` scraped by a real Prometheus (Debian's, `scripts/ensure_prometheus.sh`) while the tick defers
a table whose claim a writer holds, refuses a read-only one and compacts: PromQL through its HTTP API, the alert rules loaded and
unit-tested with promtool, and every dashboard panel's query answered.

One module estate: two tables, three ticks, ONE compaction; Prometheus on a free port scraping every second.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from conftest import write_config
from icemaint.app.metrics_server import make_metrics_server
from icemaint.app.simulator import StreamingWriter, WorkloadSpec
from icemaint.config import load_config
from icemaint.safety.claims import open_claims

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "icemaint-rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "icemaint-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "icemaint.json"


def _tool(name: str) -> str:
    """Debian installs prometheus and promtool in /usr/bin (`make test-fast` leaves it off PATH)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/local/bin")
    if found is None:
        pytest.fail(f"{name} not found: install it with `bash scripts/ensure_prometheus.sh` (make test does)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server of the test's own: its config and data dir under `root`, stopped by `stop`."""

    def __init__(self, root: Path, target: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "prometheus.yml").write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "icemaint", "static_configs": [{"targets": [target]}]}]}))
        self.log = root / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [_tool("prometheus"), f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"prometheus exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        pytest.fail(f"prometheus not ready after {timeout}s: {self.log.read_text()[-2000:]}")

    def query(self, expr: str) -> list[dict]:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def query_range(self, expr: str, start: float) -> list[dict]:
        window = {"query": expr, "start": str(start), "end": str(time.time()), "step": "1s"}
        answer = requests.get(f"{self.url}/api/v1/query_range", params=window, timeout=10).json()
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, expected: float, timeout: float = 30) -> None:
        deadline, seen = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            seen = self.value(expr)
            if seen == expected:
                return
            time.sleep(0.5)
        pytest.fail(f"{expr}: {seen}, not {expected}, after {timeout}s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _ticker(path: Path):
    """One `icemaint tick` process's ticker for the module's three ticks (Dagster's definitions load once)."""
    from icemaint.app.ticker import Ticker

    return Ticker(load_config(path), str(path))


@pytest.fixture(scope="module")
def watched(spark, lake_root, tmp_path_factory):
    """The estate, its metrics endpoint and a Prometheus scraping it, after: a tick that defers the table whose
    claim a writer holds and refuses the read-only one; the claim released and one more commit, a tick that
    compacts; a tick that reads the result."""
    root = tmp_path_factory.mktemp("metrics")
    namespace = f"metrics_{root.name.replace('-', '_')[-6:]}_{int(time.time()) % 100000}"
    writer = StreamingWriter(spark, "lake", WorkloadSpec(table=f"{namespace}.stream", days=1, rows_per_day=6,
                                                          delete_every=0, seed=11))
    writer.create_table()
    writer.run(3)
    frozen = StreamingWriter(spark, "lake", WorkloadSpec(table=f"{namespace}.frozen", days=1, rows_per_day=4,
                                                          delete_every=0, seed=12))
    frozen.create_table()
    frozen.run(1)
    stream, ro = writer.name.key, frozen.name.key
    path = write_config(root / "maintenance.yaml", lake_root, state_dir=str(root / "state"),
                        scope={"include": [stream, ro]},
                        tables={ro: {"read_only": True}})
    config = load_config(path)

    server = make_metrics_server(config, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    prometheus = Prometheus(root, f"127.0.0.1:{server.server_port}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(root / "unused-dagster-home"))
        try:
            prometheus.wait_ready()
            started = time.time()
            ticker = _ticker(path)
            claim = open_claims(config).acquire(stream, holder="ingest-job")  # a cooperating writer's
            try:
                first = ticker.tick()
            finally:
                claim.release()
            writer.run(1)  # the writer's next commit: the table moved, so the next tick decides it again
            verdicts = {(d["table"], d["decision"]) for d in first["decisions"] if d["operation"] == "compact"}
            assert verdicts == {(stream, "defer"), (ro, "refuse")}, first["decisions"]
            prometheus.wait_for(f'icemaint_table_data_files{{table="{stream}"}}', 3)  # scraped before compaction
            second = ticker.tick()
            [ran] = [d for d in second["decisions"] if d["table"] == stream and d["operation"] == "compact"]
            assert ran["published"] is True and (ran["files_before"], ran["files_after"]) == (4, 1), ran
            assert not ticker.tick()["errors"]  # reads the compacted table
            prometheus.wait_for(f'icemaint_table_data_files{{table="{stream}"}}', 1)
            yield SimpleNamespace(prometheus=prometheus, stream=stream, read_only=ro, config=config, started=started)
        finally:
            prometheus.stop()
            server.shutdown()
            server.server_close()


def test_prometheus_sees_files_before_and_after_and_each_decision_with_its_reason(watched):
    p, table = watched.prometheus, watched.stream
    assert p.value(f'max_over_time(icemaint_table_data_files{{table="{table}"}}[10m])') == 4
    assert p.value(f'icemaint_table_data_files{{table="{table}"}}') == 1
    assert p.value(f'icemaint_table_small_files_threshold{{table="{table}"}}') == 3
    assert p.value(f'icemaint_table_held{{table="{table}"}}') == 0
    assert p.value(f'time() - icemaint_table_last_publish_timestamp_seconds{{table="{table}"}} < 120') is not None
    by_kind = {(r["metric"]["operation"], r["metric"]["decision"], r["metric"]["reason_kind"]): float(r["value"][1])
               for r in p.query('icemaint_operations_total{operation="compact"}')}
    assert by_kind == {("compact", "defer", "claim_busy"): 1, ("compact", "refuse", "policy"): 1,
                       ("compact", "run", "due"): 1}, by_kind
    assert p.value("icemaint_rewritten_files_total") == 4 and p.value("icemaint_written_files_total") == 1
    assert p.value('icemaint_proof_failures_total{operation="compact"}') == 0
    assert p.value('icemaint_step_duration_seconds_count{operation="compact",step="proof"}') == 1
    assert p.value("icemaint_last_tick_errors") == 0


def test_the_alert_rules_load_and_pass_their_unit_tests(watched):
    groups = requests.get(f"{watched.prometheus.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == {"IcemaintProofFailed", "IcemaintTableHeld", "IcemaintSmallFilesNotKeptUp", "IcemaintNoTick",
                          "IcemaintRefusalsJumped"}
    assert {r["health"] for r in rules.values()} == {"ok"}, rules  # each evaluated against the live series
    assert rules["IcemaintNoTick"]["state"] == "inactive"  # the ticks are recent
    check = subprocess.run([_tool("promtool"), "test", "rules", str(RULES_TEST)], capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_dashboard_query_returns_series(watched):
    """Over the estate's few minutes, as the dashboard plots them (a range query): a table's small files, for one,
    are known before its compaction and not after (a table screened from its manifest list has no count)."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = [(panel["title"], t["expr"]) for panel in panels for t in panel.get("targets", [])]
    assert len(queries) >= 20
    # `increase(...)` needs two samples of a series in its window: a counter the last tick created has them one
    # scrape (1 s) later, which a quiet machine may not have waited for yet
    deadline, empty = time.monotonic() + 30, queries
    while empty and time.monotonic() < deadline:
        empty = [(title, expr) for title, expr in empty if not watched.prometheus.query_range(expr, watched.started)]
        if empty:
            time.sleep(1.0)
    assert empty == [], empty


def test_a_proof_failure_the_endpoint_counts_fires_its_rule(watched, tmp_path):
    """A compaction record whose proof failed, as the run writes it, scraped before and after: the two values,
    as promtool's input series, fire IcemaintProofFailed (the live estate's one compaction passed its proof)."""
    from prometheus_client.parser import text_string_to_metric_families

    from icemaint.app.metrics_server import EstateExposition
    from icemaint.config import parse_config
    from icemaint.safety.audit import FileAuditLog
    from test_metrics import _compaction

    config = parse_config({"state_dir": str(tmp_path / "state")}, tmp_path)
    exposition = EstateExposition(config)

    def failures() -> float:
        [family] = [f for f in text_string_to_metric_families(exposition.render().decode())
                    if f.name == "icemaint_proof_failures"]
        return {s.labels["operation"]: s.value for s in family.samples if s.name.endswith("_total")}["compact"]

    before = failures()
    FileAuditLog(config.state_dir).append(_compaction(decision="not_published", published=False, passed=False))
    after = failures()
    assert (before, after) == (0, 1)
    case = tmp_path / "proof-failure.test.yml"
    case.write_text(json.dumps({
        "rule_files": [str(RULES)], "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": 'icemaint_proof_failures_total{operation="compact"}',
                                     "values": f"{before:g}x10 {after:g}x30"}],
                   "alert_rule_test": [
                       {"eval_time": "5m", "alertname": "IcemaintProofFailed", "exp_alerts": []},
                       {"eval_time": "15m", "alertname": "IcemaintProofFailed", "exp_alerts": [{
                           "exp_labels": {"severity": "critical", "operation": "compact"},
                           "exp_annotations": {
                               "summary": "icemaint: a proof of a compact failed; nothing was published"}}]}]}]}))
    check = subprocess.run([_tool("promtool"), "test", "rules", str(case)], capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
