"""Faults injected (issue 12): maintenance never mutates a table it cannot record. When the audit sink is
unavailable (a file that cannot be appended to, PostgreSQL down) the run stops before acting: one readable
line names the sink, `main` and the metadata location are unchanged, no staging branch is left.

Chosen way: refuse to act. The contract stores its `started` marker in the audit log under the claim and
before the act; if that write fails the act never runs (an unrecorded rewrite is worse than a late one).
"""

from __future__ import annotations

import pytest

from conftest import current_snapshot, streaming_table, write_config
from icemaint.app.cli import main
from icemaint.config import load_config
from icemaint.observe.catalog import CatalogReader
from staged_faults import staging_refs


@pytest.fixture(autouse=True)
def _dagster_home(monkeypatch, tmp_path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "unused-dagster-home"))


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_untouched(spark, config, table: str, sql: str, location: str, head: int) -> None:
    assert CatalogReader(config).metadata_location(table) == location
    assert current_snapshot(spark, sql) == head
    assert staging_refs(config, table) == {}


def test_an_audit_file_that_cannot_be_written_stops_the_run_before_it_acts(capsys, spark, lake_root, tmp_path,
                                                                           table_name):
    writer = streaming_table(spark, "lake", table_name, batches=4, days=1)
    sql = writer.name.sql("lake")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"))
    config = load_config(path)
    (tmp_path / "state" / "audit" / "audit.jsonl").mkdir(parents=True)  # a disk that refuses the append
    location, head = CatalogReader(config).metadata_location(table_name), current_snapshot(spark, sql)
    code, out, err = run_cli(capsys, "--config", str(path), "compact", table_name, "--date", "2026-01-01")
    assert code == 1 and out == "" and "Traceback" not in err
    [line] = err.strip().splitlines()
    assert "audit.jsonl" in line and "main is unchanged" in line, line
    assert_untouched(spark, config, table_name, sql, location, head)


def test_postgresql_down_for_the_audit_stops_the_run_before_it_acts(capsys, spark, lake_root, tmp_path, table_name,
                                                                     monkeypatch):
    writer = streaming_table(spark, "lake", table_name, batches=4, days=1)
    sql = writer.name.sql("lake")
    monkeypatch.setenv("ICEMAINT_PG_DSN", "postgresql://icemaint@127.0.0.1:1/none?connect_timeout=2")
    path = write_config(tmp_path / "m.yaml", lake_root, state_dir=str(tmp_path / "state"), audit={"sink": "postgres"})
    config = load_config(path)
    location, head = CatalogReader(config).metadata_location(table_name), current_snapshot(spark, sql)
    code, out, err = run_cli(capsys, "--config", str(path), "compact", table_name, "--date", "2026-01-01")
    assert code == 1 and "Traceback" not in err
    [line] = err.strip().splitlines()
    assert "127.0.0.1" in line or "connect" in line.lower(), line
    assert "main is unchanged" in line, line
    assert_untouched(spark, config, table_name, sql, location, head)
