"""The Dagster UI itself, rendered: `dagster dev` on a free loopback port serves an instance that holds two
compacted dates of a small table, and headless Chromium (Debian `chromium`, over its DevTools pipe) renders the
`maintenance` group's lineage, one `compaction` partition and the asset's checks. The assertions are on
the DOM the browser built (graph nodes and edges, the partition's materialization and metadata, the
checks' names and results), not on GraphQL answers.

Routes (Dagster 1.13.27): the group's lineage is `/locations/<repo>@<location>/asset-groups/<group>`
(`/asset-groups/<group>` alone shows the global lineage); a partition of an asset is
`/assets/<key>?view=partitions&partition=<key>`; the checks tab is `/assets/<key>?view=checks&checkDetail=<name>`.
The partition view shows no check results in 1.13, hence the checks tab.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import streaming_table, write_config
from icemaint.app.instance import ensure_dagster_home
from icemaint.config import load_config
from test_daemon_e2e import dagster_dev
from test_dagster_dev import REPO, graphql, group_alive
from waiting import Patience, Stalled, cpu_steps

pytestmark = pytest.mark.slow

REPOSITORY, LOCATION, GROUP = "__repository__", "maint_assets.definitions", "maintenance"
CHECKS = ("column_aggregates", "row_count_parity", "sample_comparison")
DATES = ("2026-01-01", "2026-01-02")  # the writer's days compacted, in one run (a batch, as the tick runs them)
DEFERRED = "2026-01-03"  # the writer's third day: its writer is not idle under the served config, so it is deferred
# The flags of ../shared/STACK.md, and a window wide enough that the graph draws full asset nodes
# (at the default 800x600 it zooms out to bare names, truncated in the middle).
WINDOW = (1920, 1080)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  f"--window-size={WINDOW[0]},{WINDOW[1]}"]
# The documentation's screenshots (docs/images/ui-*.png) are the pages this test renders, shot in the same
# Chromium run as the DOM it asserts on (so a shot is of a page known to be ready, and costs no extra run).
# They are written into the tmp dir and checked; ICEMAINT_UPDATE_SCREENSHOTS=1 also copies them into the docs.
SCREENSHOTS = REPO / "docs" / "images"
UPDATE_SCREENSHOTS = os.environ.get("ICEMAINT_UPDATE_SCREENSHOTS") == "1"
# An answer of the browser that does not come: fails after 300 s without progress (its output, its CPU), or after 3x
# RENDER_TIMEOUT_S in all (tests/waiting.py: a slow machine is not a broken one). A page not ready: read until
# RENDER_CAP_S while it, the browser or the server progress (at 0.3 of a core the lineage page's asset data was still
# loading after 6 minutes), then asserted on as it is.
RENDER_TIMEOUT_S = 120
RENDER_CAP_S = 900
POLL_S = 0.5
GROUP_QUERY = """{ assetNodes(group: {groupName: "%s", repositoryName: "%s", repositoryLocationName: "%s"})
  { assetKey { path } dependencyKeys { path } } }""" % (GROUP, REPOSITORY, LOCATION)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium, installed by scripts/ensure_chromium.sh when missing; skips only if that fails."""
    found = shutil.which("chromium")
    if found:
        return found
    result = subprocess.run(["bash", str(REPO / "scripts" / "ensure_chromium.sh")], capture_output=True, text=True,
                            timeout=900)
    found = shutil.which("chromium")
    if result.returncode != 0 or not found:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"chromium is not installed and scripts/ensure_chromium.sh could not install it: {reason}")
    return found


# -- the rendered DOM ---------------------------------------------------------------------------

VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict
    children: list = field(default_factory=list)  # Element | str

    def iter(self, tag: str):
        for child in self.children:
            if isinstance(child, Element):
                if child.tag == tag:
                    yield child
                yield from child.iter(tag)

    def texts(self) -> list[str]:
        """The element's visible text, one entry per text node, in document order."""
        out = []
        for child in self.children:
            if isinstance(child, str):
                if child.strip():
                    out.append(child.strip())
            elif child.tag not in ("script", "style"):
                out.extend(child.texts())
        return out


class DomTree(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        element = Element(tag, dict(attrs))
        self.stack[-1].children.append(element)
        if tag not in VOID_TAGS:
            self.stack.append(element)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Element(tag, dict(attrs)))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(html: str) -> Element:
    tree = DomTree()
    tree.feed(html)
    tree.close()
    return tree.root


def after(texts: list[str], label: str, start: int = 0) -> str:
    """The text right after the first `label` at or after `start` (a label/value pair as the UI lays it out)."""
    try:
        i = texts.index(label, start)
    except ValueError:
        raise AssertionError(f"{label!r} is not on the page: {texts[start:start + 200]}") from None
    assert i + 1 < len(texts), f"nothing follows {label!r}"
    return texts[i + 1]


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height, from its IHDR chunk; fails on anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


class Browser:
    """One headless Chromium for all of the test's pages, driven over the DevTools protocol on a pipe
    (`--remote-debugging-pipe`: it reads commands on fd 3 and answers on fd 4, NUL-terminated JSON; no port and no
    client library). A Chromium per page (`--dump-dom`) cost a browser's start and a 20 s virtual-time budget
    each: five starts were most of the test's time. Each page opens in a browser context of its own (its own
    storage and cache, as a fresh profile had), and is read as soon as it is ready, not after a fixed budget."""

    def __init__(self, chromium: str, workdir: Path):
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir)
        # The pipe's ends above 9, so that putting them on fds 3 and 4 cannot overwrite one of them.
        cmd_read, self.cmd_write, self.out_read, out_write = (_high_fd(fd) for fd in (*os.pipe(), *os.pipe()))
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{cmd_read} 4>&{out_write}', chromium, *CHROMIUM_FLAGS,
             f"--user-data-dir={self.profile}", "--remote-debugging-pipe"],
            pass_fds=(cmd_read, out_write), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        os.close(cmd_read)
        os.close(out_write)
        self.pending, self.last_id = b"", 0
        self.server_pid: int | None = None  # the server its pages come from: its CPU is a page's progress too

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self.last_id += 1
        message: dict = {"id": self.last_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.cmd_write, json.dumps(message).encode() + b"\0")
        patience, received = Patience(f"chromium answering {method}", cap_s=3 * RENDER_TIMEOUT_S), 0
        while True:
            while b"\0" in self.pending:
                raw, _, self.pending = self.pending.partition(b"\0")
                reply = json.loads(raw)
                if reply.get("id") == self.last_id:  # else an event, or the answer to a call that timed out
                    assert "error" not in reply, f"chromium: {method}: {reply['error']}"
                    return reply["result"]
            # progress: output from the browser, or CPU its processes used (a starved renderer answers late)
            patience.check((received, cpu_steps(self.proc.pid)))
            if select.select([self.out_read], [], [], 5.0)[0]:
                chunk = os.read(self.out_read, 1 << 20)
                assert chunk, f"chromium exited (rc {self.proc.poll()}) before answering {method}"
                self.pending += chunk
                received += len(chunk)

    def close(self) -> None:
        """Kills the browser's process group (its renderer and zygote processes too): its profile is a throwaway,
        and a graceful Browser.close took seconds of its own on a busy machine."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 30
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.close(self.cmd_write)
        os.close(self.out_read)
        shutil.rmtree(self.profile, ignore_errors=True)


def _high_fd(fd: int) -> int:
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


@contextlib.contextmanager
def browser(chromium: str, workdir: Path) -> Iterator[Browser]:
    session = Browser(chromium, workdir)
    try:
        yield session
    finally:
        session.close()


def render(browser: Browser, url: str, keep_as: Path, ready, shot: str | None = None) -> Element:
    """The DOM Chromium built for `url`, once `ready(dom)` holds (read again every POLL_S while it progresses, up to
    RENDER_CAP_S: a busy machine can leave a page's data loading for a while). The last DOM is kept in `keep_as`
    for whoever reads a failure. With `shot`, a screenshot of the ready page, `ui-<shot>.png` beside `keep_as` (and
    into docs/images when ICEMAINT_UPDATE_SCREENSHOTS=1); the DOM returned is read after it."""
    context = browser.call("Target.createBrowserContext")["browserContextId"]
    target = browser.call("Target.createTarget", url="about:blank", browserContextId=context)["targetId"]
    try:
        page = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        browser.call("Emulation.setDeviceMetricsOverride", page, width=WINDOW[0], height=WINDOW[1],
                     deviceScaleFactor=1, mobile=False)
        browser.call("Page.navigate", page, url=url)

        def dom_now() -> tuple[str, Element]:
            found = browser.call("Runtime.evaluate", page, expression="document.documentElement.outerHTML",
                                 returnByValue=True)["result"]
            html = found.get("value") or ""
            return html, parse(html)

        patience = Patience(f"{url} ready", cap_s=RENDER_CAP_S)
        html, dom = dom_now()
        while not ready(dom):
            busy = [cpu_steps(pid) for pid in (browser.proc.pid, browser.server_pid) if pid]
            try:
                patience.check((html, *busy))  # the page, its JS or its server moved
            except Stalled as error:
                print(f"\n[render] {error}")
                break  # the assertions on the last DOM say what it lacks
            time.sleep(POLL_S)
            html, dom = dom_now()
        if shot and ready(dom):
            png = keep_as.parent / f"ui-{shot}.png"
            png.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", page, format="png")["data"]))
            html, dom = dom_now()
            assert png_size(png) == WINDOW, f"no {WINDOW[0]}x{WINDOW[1]} screenshot of {url}"
            assert png.stat().st_size > 10_000, f"{png} is nearly empty ({png.stat().st_size} bytes)"
            if UPDATE_SCREENSHOTS:
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(png, SCREENSHOTS / png.name)
    finally:
        browser.call("Target.closeTarget", targetId=target)
        browser.call("Target.disposeBrowserContext", browserContextId=context)
    keep_as.write_text(html)
    return dom


# -- the lineage graph as drawn -----------------------------------------------------------------

@dataclass(frozen=True)
class Box:
    name: str
    x: float
    y: float
    width: float
    height: float
    texts: tuple[str, ...]


EDGE = re.compile(r"^M\s*([-\d.]+)[ ,]([-\d.]+)\s*C.*[ ,]([-\d.]+)[ ,]([-\d.]+)$")


def graph_paths(element: Element):
    """The SVG paths drawn on the graph itself: not those inside a node or a marker definition."""
    for child in element.children:
        if isinstance(child, Element) and child.tag not in ("foreignobject", "defs"):
            if child.tag == "path":
                yield child
            yield from graph_paths(child)


def drawn_graph(dom: Element) -> tuple[dict[str, Box], set[tuple[str, str]]]:
    """The asset graph as the browser drew it: each node's box (an SVG foreignObject) and each edge, an
    SVG path from the right side of one box to the left side of another, named by the boxes it joins."""
    svgs = [svg for svg in dom.iter("svg") if any(True for _ in svg.iter("foreignobject"))]
    assert len(svgs) == 1, f"expected one asset graph, found {len(svgs)}"
    boxes = {}
    for fo in svgs[0].iter("foreignobject"):
        texts = fo.texts()
        assert texts, f"an empty graph node at {fo.attrs}"
        boxes[texts[0]] = Box(texts[0], float(fo.attrs["x"]), float(fo.attrs["y"]), float(fo.attrs["width"]),
                              float(fo.attrs["height"]), tuple(texts))

    def box_at(x: float, y: float, side: str) -> str:
        for b in boxes.values():
            edge_x = b.x + b.width if side == "right" else b.x
            if abs(x - edge_x) <= 12 and b.y <= y <= b.y + b.height:
                return b.name
        raise AssertionError(f"an edge ends at ({x}, {y}), beside no node's {side} side: {boxes}")

    edges = set()
    for path in graph_paths(svgs[0]):
        match = EDGE.match(path.attrs.get("d", "").strip())
        assert match, f"a path on the graph that is no edge: {path.attrs}"
        x1, y1, x2, y2 = map(float, match.groups())
        edges.add((box_at(x1, y1, "right"), box_at(x2, y2, "left")))
    return boxes, edges


# -- the test -----------------------------------------------------------------------------------

CHECK_STATUS_QUERY = """{ assetNodeOrError(assetKey: {path: ["compaction"]}) { ... on AssetNode {
  assetChecksOrError { ... on AssetChecks { checks { name partitionStatuses {
    ... on AssetCheckMultiPartitionStatuses { primaryDimensionName ranges { primaryDimStartKey primaryDimEndKey
      secondaryDim { ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions } } } } } } } } } } }"""


def check_partition_statuses(port: int, table: str) -> dict[str, tuple[set[str], set[str]]]:
    """Per check of `compaction`: the dates of `table` whose proof passed and those whose proof failed, as the
    checks' Partitions tab gets them (ranges of dates, each with its tables' statuses)."""
    import datetime as dt

    out = {}
    node = graphql(port, CHECK_STATUS_QUERY)["assetNodeOrError"]
    for check in node["assetChecksOrError"]["checks"]:
        statuses = check["partitionStatuses"]
        assert statuses["primaryDimensionName"] == "date", statuses
        passed, failed = set(), set()
        for r in statuses["ranges"]:
            first, last = dt.date.fromisoformat(r["primaryDimStartKey"]), dt.date.fromisoformat(r["primaryDimEndKey"])
            dates = {(first + dt.timedelta(days=i)).isoformat() for i in range((last - first).days + 1)}
            if table in r["secondaryDim"]["succeededPartitions"]:
                passed |= dates
            if table in r["secondaryDim"]["failedPartitions"]:
                failed |= dates
        out[check["name"]] = (passed, failed)
    assert set(out) == set(CHECKS), out
    return out


def sensor_ticks(port: int, sensor: str) -> list[dict]:
    query = """{ sensorOrError(sensorSelector: {repositoryName: "%s", repositoryLocationName: "%s", sensorName: "%s"})
      { ... on Sensor { sensorState { ticks(limit: 10) { status skipReason runIds } } } } }""" % (
        REPOSITORY, LOCATION, sensor)
    return graphql(port, query)["sensorOrError"]["sensorState"]["ticks"]


def wait_for_ticks(port: int, proc, log_path: Path, done, cap_s: float = 720.0) -> dict[str, list[dict]]:
    """Each sensor's ticks once `done(ticks)` holds (the daemon ticks a sensor a few seconds after it loads); fails
    when no new tick came for 300 s, or after `cap_s` (3x the 240 s bound it replaced)."""
    patience = Patience("the sensors' ticks showing it", cap_s=cap_s)
    while True:
        assert proc.poll() is None, f"dagster dev exited:\n{log_path.read_text()[-4000:]}"
        ticks = {s: sensor_ticks(port, s) for s in ("compaction_sensor", "retention_sensor")}
        if done(ticks):
            return ticks
        patience.check(repr(ticks), ticks)
        time.sleep(3)


def partition_ready(dom: Element) -> bool:
    """A partition's page with its data: the label "Latest materialization" comes first, followed by "None" until the
    partition's status arrives (at 0.3 of a core, still so when the label was all the wait looked for)."""
    texts = dom.texts()
    if "Latest materialization" not in texts:
        return False
    i = texts.index("Latest materialization")
    return texts[i - 1] == "Materialized" and texts[i + 1:i + 2] != ["None"]


def test_the_ui_renders_lineage_a_compaction_partition_and_its_proofs(spark, chromium, tmp_path, lake_root,
                                                                       isolated_dagster_home):
    from icemaint.app.runner import MaintenanceRunner

    namespace = f"ui_{uuid.uuid4().hex[:8]}"
    table = f"{namespace}.events"
    # Only this test's namespace is in scope: the daemon leaves the shared warehouse's other tables alone. The date
    # axis starts where the data does. No `automation` key: the shipped default, no orphan removal.
    common = dict(state_dir=str(tmp_path / "state"), scope={"include": [f"{namespace}.*"]}, dates_start=DATES[0])
    path = write_config(tmp_path / "maintenance.yaml", lake_root, **common)
    # What `dagster dev` serves: the same estate, with a writer-idle window that the third day's writer is inside.
    served = write_config(tmp_path / "served.yaml", lake_root, **common, tables={table: {"writer_idle": "1d"}})
    # Three small files and a delete file per date; the first two dates compacted in one run over both (a
    # batch: each date its own proof, as `icemaint tick` and backfills run them), the third left to the sensor.
    streaming_table(spark, "lake", table, batches=3, days=len(DATES) + 1, rows_per_day=10, delete_every=3)
    runner = MaintenanceRunner(load_config(path), str(path))
    assert runner.health(table).success
    report = runner.compact_dates(table, list(DATES))
    keys = [f"{d}|{table}" for d in DATES]
    assert report.success and all(report.outcomes[k]["published"] for k in keys), report
    runner.instance.dispose()
    home = ensure_dagster_home(load_config(path))
    key = keys[-1]
    outcome = report.outcomes[key]

    workdir = tmp_path / "pages"
    workdir.mkdir()
    # The compacted dates hold nothing to do, the third is deferred: the daemon's sensors start no run while the
    # pages render, and opening the UI deletes nothing.
    # The browser closes first: the webserver's graceful stop waited for the connections it still held open.
    with dagster_dev(tmp_path / "dev", served, home) as (proc, port, log_path), browser(chromium, workdir) as pages:
        base = f"http://127.0.0.1:{port}"
        pages.server_pid = proc.pid
        nodes = graphql(port, GROUP_QUERY)["assetNodes"]
        declared = {("/".join(d["path"]), "/".join(n["assetKey"]["path"])) for n in nodes for d in n["dependencyKeys"]}
        # every asset of the group, with or without an edge (landed_batches depends on none of the others)
        declared_assets = {"/".join(n["assetKey"]["path"]) for n in nodes} | {a for edge in declared for a in edge}

        # (a) The group's lineage: every asset of the group drawn as a node, every dependency as an edge.
        group_url = f"{base}/locations/{REPOSITORY}@{LOCATION}/asset-groups/{GROUP}"
        dom = render(pages, group_url, workdir / "lineage.html", shot="lineage",
                     ready=lambda d: "3 / 3 Passed" in d.texts() and any(True for _ in d.iter("foreignobject")))
        texts = dom.texts()
        heading = texts.index("Asset Group in")
        assert texts[heading - 1:heading + 2] == [GROUP, "Asset Group in", LOCATION], texts[:40]
        boxes, edges = drawn_graph(dom)
        assert {"table_health", "compaction", "validation_report"} <= set(boxes), sorted(boxes)
        assert set(boxes) == declared_assets, (sorted(boxes), sorted(declared_assets))
        assert edges == declared, (sorted(edges), sorted(declared))
        assert {("table_health", "compaction"), ("compaction", "validation_report")} <= edges, edges
        node = {name: list(b.texts) for name, b in boxes.items()}
        assert after(node["compaction"], "Asset checks") == "3 / 3 Passed", node["compaction"]
        for name in ("table_health", "compaction", "validation_report"):  # each has materialized
            assert after(node[name], "Latest event").endswith("ago"), node[name]
        assert after(node["table_health"], "Partitions") == "100% filled", node["table_health"]  # our one table

        # (b) One `compaction` partition: its key, its materialization by our run, and the run's evidence, sizes
        # readable beside the raw numbers.
        partition_url = f"{base}/assets/compaction?view=partitions&partition={urllib.parse.quote(key, safe='')}"
        dom = render(pages, partition_url, workdir / "partition.html", shot="partition",
                     ready=partition_ready)
        texts = dom.texts()
        detail = texts.index("Latest materialization")
        assert texts[detail - 2:detail] == [key, "Materialized"], texts[detail - 4:detail + 2]
        assert f"Materialized ({len(DATES)})" in texts, [t for t in texts if t.startswith("Materialized")]
        assert table in texts and all(d in texts for d in DATES)  # the two dimensions' keys
        assert after(texts, "Run", detail) == report.run_id[:8]
        assert after(texts, "Job", detail) == "compaction_job"
        for label, expected in (("files_before", outcome["files_before"]), ("files_after", 1),
                                ("delete_files_before", outcome["delete_files_before"]), ("delete_files_after", 0),
                                ("decision", "run"), ("published", "true"),
                                ("before_snapshot_id", outcome["before_snapshot_id"]),
                                ("after_snapshot_id", outcome["after_snapshot_id"])):
            assert after(texts, label, detail) == str(expected), label
        assert re.fullmatch(r"\d+(\.\d)? (B|KiB)", after(texts, "avg_file_size_before", detail)), texts[detail:]

        # (c) The asset's three blocking checks, each passed on each compacted date's partition (a failed one
        # would count under Failed): the checks' partition view counts them.
        check = CHECKS[0]
        checks_url = f"{base}/assets/compaction?view=checks&checkDetail={check}"
        dom = render(pages, checks_url, workdir / f"checks-{check}.html", shot="checks",
                     ready=lambda d: "Latest execution" in d.texts())
        texts = dom.texts()
        assert f"Checks ({len(CHECKS)})" in texts, texts[:60]
        listed = [t for t in texts[texts.index(f"Checks ({len(CHECKS)})"):texts.index("Latest execution")]
                  if t in CHECKS or t in ("Succeeded", "Failed")]
        # Each name is rendered twice by the list's truncating label, then its status.
        assert listed == [t for name in CHECKS for t in (name, name, "Succeeded")] + [check], listed
        assert "blocking" in texts
        description = after(texts, "Latest execution")
        assert f"{key}: {check} passed" in description, description
        assert f"published as {outcome['after_snapshot_id']}" in description, description
        # The check detail's Partitions tab is local state (no URL opens it, and the test clicks nothing): its
        # data, as the tab asks for it, holds each compacted date passed for every check, none failed.
        for name, (passed, failed) in check_partition_statuses(port, table).items():
            assert (passed, failed) == (set(DATES), set()), (name, passed, failed)

        # (d) The third date's deferral, with its reason: on the sensor's tick, and on the date's partition.
        decided = f"{table} {DEFERRED}: defer: "  # the tick that decided it (later ticks repeat it as unchanged)
        ticks = wait_for_ticks(port, proc, log_path, lambda t: any(
            decided in (k["skipReason"] or "") for k in t["compaction_sensor"]) and t["retention_sensor"])
        [reason] = [line[len(decided):] for k in ticks["compaction_sensor"]
                    for line in (k["skipReason"] or "").splitlines() if line.startswith(decided)][:1]
        assert reason.startswith(f"writer active on {DEFERRED}: last commit") and "1d idle window" in reason, reason
        # The tick list shows "0 runs requested" and the skip reason on hover (a tooltip a page's DOM does not hold):
        # the reason is asserted above as the tick holds it. On the asset's Events tab the deferral is the newest
        # event, selected, its reason in full.
        dom = render(pages, f"{base}/assets/compaction?view=events", workdir / "events.html", shot="deferral",
                     ready=lambda d: "writer_active" in d.texts())
        texts = dom.texts()
        detail = texts.index("Metadata")
        assert after(texts, "Partition") == f"{DEFERRED}|{table}", texts[detail - 10:detail]
        assert after(texts, "decision", detail) == "defer", texts[detail:detail + 60]
        assert after(texts, "reason_kind", detail) == "writer_active"
        assert after(texts, "reason", detail) == reason, texts[detail:detail + 60]
        assert re.fullmatch(r"\d+(\.\d)?(s|m)", after(texts, "time_since_writer_commit", detail)), texts[detail:]

        # (e) Opening the UI deleted nothing: the retention sensor ticked and requested no run (no orphan removal,
        # no purge); its description says so. Every run is the test's own.
        assert not [run for k in ticks["retention_sensor"] for run in k["runIds"]], ticks["retention_sensor"]
        runs = graphql(port, "{ runsOrError { ... on Runs { results { jobName } } } }")["runsOrError"]["results"]
        assert sorted(r["jobName"] for r in runs) == ["compaction_job", "health_job"], runs
        retention_url = f"{base}/locations/{REPOSITORY}@{LOCATION}/sensors/retention_sensor"
        dom = render(pages, retention_url, workdir / "retention-sensor.html", shot="sensor",
                     ready=lambda d: any("never orphan-file removal" in t for t in d.texts()))
        assert any("never orphan-file removal" in t for t in dom.texts()), dom.texts()[:100]
