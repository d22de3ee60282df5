"""The local production stack of scripts/stack.py as a session fixture, `production_stack`:
PostgreSQL, SeaweedFS (S3 + Iceberg REST catalog) and a Spark standalone cluster of two workers.

A stack that is already up (`make stack-up`) is reused and left running; otherwise the fixture starts
what is missing and stops exactly that right after the last test that uses it (else at the end of the session,
whatever happened). The stack lives
in `$ICEMAINT_STACK_DIR`, default `.icemaint/stack` of the repository. Missing prerequisites (the
PostgreSQL server packages, Java, the weed binary) skip the tests that use it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
STACK_DIR_ENV = "ICEMAINT_STACK_DIR"


def stack_module():
    """scripts/stack.py, imported (scripts/ is no package)."""
    name = "icemaint_stack_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "stack.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


@dataclass(frozen=True)
class ProductionStack:
    """A running stack. `secrets` are the `export` lines of `<dir>/env` (AWS_*, ICEMAINT_PG_DSN,
    ICEMAINT_CATALOG_*); `config` is the icemaint YAML written for it (examples/production.yaml for the
    default stack)."""

    dir: Path
    config: Path
    env_file: Path
    secrets: dict[str, str]
    ports: dict[str, dict[str, int]]  # piece -> role -> port
    pids: dict[str, int]
    spark_master: str                 # spark://127.0.0.1:<port>
    spark_master_json: str            # http://127.0.0.1:<ui port>/json/
    s3_endpoint: str
    rest_uri: str
    table_bucket: str
    jars: list[str]                   # the AWS SDK jars (absolute paths)
    started: list[str] = field(default_factory=list)  # pieces this fixture started (and will stop)
    # What tests leave running on the stack for later tests (a process holding a Spark application on the cluster):
    # each callable ends one, before the stack stops (or at the end of the session for a stack that was up).
    on_stop: list = field(default_factory=list, compare=False)

    @property
    def pg_dsn(self) -> str:
        return self.secrets["ICEMAINT_PG_DSN"]

    @contextlib.contextmanager
    def environ(self) -> Iterator[dict[str, str]]:
        """The secrets set in os.environ for the block, restored afterwards."""
        saved = {k: os.environ.get(k) for k in self.secrets}
        os.environ.update(self.secrets)
        try:
            yield self.secrets
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _describe(stack, layout, started: list[str]) -> ProductionStack:
    state = stack.read_state(layout)
    pieces = state.get("pieces", {})
    return ProductionStack(
        dir=layout.dir, config=Path(state.get("yaml", layout.yaml)), env_file=layout.env_file,
        secrets=stack.load_secrets(layout),
        ports={name: layout.ports(name) for name in stack.PROCESS_PIECES},
        pids={name: info["pid"] for name, info in pieces.items()},
        spark_master=state["spark_master"], spark_master_json=state["spark_master_json"],
        s3_endpoint=state["s3_endpoint"], rest_uri=state["iceberg_rest_uri"],
        table_bucket=state["table_bucket"], jars=list(state["jars"]), started=list(started))


# The Spark master's and workers' JVM options when this fixture starts them: the JIT's first tier only, as for the
# other test JVMs (tests/conftest.py TEST_JAVA_OPTIONS). Tests only: `make stack-up` starts them with none.
DAEMON_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


class _StopAfterLastUser:
    """A plugin, registered while a stack this session started is up: stops it right after the last collected test
    that uses it has finished, not when the session ends. tests/conftest.py runs those tests first, on one
    pytest-xdist worker, which then goes on with other files for minutes while an idle stack still costs CPU on the
    shared cores (SeaweedFS's polling, the Spark daemons' heartbeats)."""

    def __init__(self, last_nodeid: str, stop):
        self.last_nodeid, self.stop = last_nodeid, stop

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        if nodeid == self.last_nodeid:
            self.stop()


@pytest.fixture(scope="session")
def production_stack(request) -> Iterator[ProductionStack]:
    """The local production stack: reused when up, else started here and stopped after the last test using it."""
    stack = stack_module()
    stack_dir = Path(os.environ.get(STACK_DIR_ENV) or stack.DEFAULT_DIR).resolve()
    offset = stack.read_state(stack.Layout(stack_dir)).get("port_offset", 0)
    layout = stack.Layout(stack_dir, offset, stack.default_yaml(stack_dir, offset),
                          daemon_java_options=DAEMON_JAVA_OPTIONS)
    started: list[str] = []
    plugin = None
    described: ProductionStack | None = None

    def stop() -> None:
        while described is not None and described.on_stop:
            described.on_stop.pop()()
        if started:
            stack.down(layout, pieces=list(started))
            started.clear()

    try:
        all_up, _lines = stack.status(layout)
        if not all_up:
            try:
                result = stack.up(layout)
            except stack.StackError as exc:
                if exc.missing:
                    pytest.skip("production stack: " + "; ".join(exc.lines()))
                pytest.fail("production stack did not start: " + "; ".join(exc.lines()), pytrace=False)
            started = result.started
        users = [item.nodeid for item in request.session.items if "production_stack" in item.fixturenames]
        if started and users:
            plugin = _StopAfterLastUser(users[-1], stop)
            request.config.pluginmanager.register(plugin, "icemaint-production-stack-stop")
        described = _describe(stack, layout, started)
        yield described
    finally:
        if plugin is not None:
            request.config.pluginmanager.unregister(plugin)
        stop()
