"""The peer benchmark's shared catalog and report (no Spark, no server): what each tool is given, and what
the report says about where each shape was measured."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.peer import SECTION, Shape, icemaint_config, render
from benchmarks.shared_catalog import PASSWORD_ENV, SharedCatalog, postgres_catalog, sqlite_catalog


def shape_result(name: str, ours: float, theirs: float, catalog: str | None) -> dict:
    shape = Shape(name, 1, 100, 1000, 100, f"shape {name}")
    result = {"shape": shape.__dict__, "icemaint": {"seconds": ours}, "zamboni": {"seconds": theirs},
              "files_after": {"icemaint": [1], "zamboni": [1]}, "rows_checked": 10, "ratio": round(ours / theirs, 2)}
    if catalog is not None:  # results from before the shared PostgreSQL catalog carry no "catalog"
        result["catalog"] = catalog
    return result


def report(*shapes: dict) -> str:
    return render({"date": "2026-11-23T20:00:00+00:00", "command": "python -m benchmarks.peer", "machine": "2 cores",
                   "load_start": (1, 1, 1), "load_end": (1, 1, 1), "peer_version": "0.7.0", "note": "",
                   "shapes": list(shapes)})


def test_the_report_names_the_catalog_each_shape_was_measured_on():
    text = report(shape_result("estate_100", 10.0, 2.0, "postgres"), shape_result("files_100", 4.0, 2.0, "postgres"))
    assert text.startswith(SECTION)
    assert "PostgreSQL SQL catalog" in text and "SQLite SQL catalog" not in text
    mixed = report(shape_result("estate_100", 10.0, 2.0, "postgres"), shape_result("commits_1000", 8.0, 2.0, None))
    assert "estate_100: a PostgreSQL SQL catalog" in mixed and "commits_1000: a SQLite SQL catalog" in mixed


def test_icemaint_gets_the_shared_catalog_without_its_password(tmp_path):
    import yaml

    shared = SharedCatalog("postgres", "postgresql+psycopg2://bench:s3cret@127.0.0.1:5999/peer_x",
                           "jdbc:postgresql://127.0.0.1:5999/peer_x", {"jdbc.user": "bench"},
                           env={PASSWORD_ENV: "s3cret"})
    path = icemaint_config(tmp_path, tmp_path / "wh", shared)
    doc = yaml.safe_load(path.read_text())
    assert doc["catalog"] == {"name": "local", "type": "jdbc", "uri": "jdbc:postgresql://127.0.0.1:5999/peer_x",
                              "warehouse": str(tmp_path / "wh"), "properties": {"jdbc.user": "bench"}}
    assert "spark.jars" not in doc["spark"]["conf"]  # icemaint adds Debian's PostgreSQL jar itself
    assert "s3cret" not in path.read_text()  # the password reaches icemaint's process by its environment only
    sqlite = yaml.safe_load(icemaint_config(tmp_path, tmp_path / "wh").read_text())
    assert sqlite["catalog"]["uri"] == f"jdbc:sqlite:{tmp_path / 'wh'}/catalog.db"
    assert sqlite["spark"]["conf"]["spark.jars"] == sqlite_catalog(tmp_path / "wh").spark_jars


def test_a_database_name_that_is_not_a_plain_identifier_is_refused_before_the_server_is_asked():
    server = SimpleNamespace(dsn="postgresql://u:p@127.0.0.1:1/x", host="127.0.0.1", port=1, user="u", password="p")
    with pytest.raises(ValueError, match="lower-case letters"):
        with postgres_catalog(server, "peer; DROP DATABASE x"):
            pass


def test_the_report_puts_the_warm_process_beside_the_fresh_one_and_judges_each_against_the_target():
    estate = shape_result("estate_100", 60.0, 20.0, "postgres")
    estate["icemaint_warm"] = {"seconds": 30.0, "runs": 100, "warm_up_tables": 20}
    estate["warm_ratio"] = 1.5
    text = report(estate, shape_result("files_100", 4.0, 2.0, "postgres"))
    [row] = [line for line in text.splitlines() if line.startswith("| shape estate_100 |")]
    assert row.split(" | ")[1:6] == ["60.0 s", "30.0 s", "20.0 s", "3.00x", "1.50x"]
    assert "**missed** / met" in row  # fresh 3.0x and warm 1.5x against the estate's 2.0x
    [plain] = [line for line in text.splitlines() if line.startswith("| shape files_100 |")]
    assert plain.split(" | ")[2] == "-"  # a shape measured before the warm process has no warm figure
    assert "caught up 20 other tables" in text


def test_the_cost_summary_draws_the_newest_figures_of_each_benchmark_and_names_a_missing_one(tmp_path):
    import json

    from benchmarks.cost_summary import SECTION, render as render_cost

    parts = {"contract (Compactor.run)": 0.4, "Dagster run (runner.compact)": 0.9,
             "Spark's write (with the fed digest)": 0.1, "after side's read (digest)": 0.08}
    profile = {"when": "2026-11-29T05:00+00:00", "warm_up": 30, "files": 100, "rows_per_file": 100,
               "rows": [{"published": True, "load1": 1.0, "parts": parts}]}
    old = {**profile, "rows": [{"published": True, "load1": 1.0, "parts": {**parts, "contract (Compactor.run)": 0.1}}]}
    profile["rows"][0]["bare"] = {"wall": 0.35}  # `--bare`: Iceberg's own CALL on a twin, the floor
    (tmp_path / "warm_profile_20261129T0400.json").write_text(json.dumps(old))
    (tmp_path / "warm_profile_20261129T0500.json").write_text(json.dumps(profile))
    # newer, but not the default deployment: two versions side by side, and a profile on PostgreSQL storage
    (tmp_path / "warm_profile_20261129T0600.json").write_text(json.dumps({**old, "against_rows": old["rows"]}))
    (tmp_path / "warm_profile_20261129T0700.json").write_text(json.dumps({**old, "dagster_storage": "postgres"}))
    text = render_cost(tmp_path)
    assert text.startswith(SECTION)
    assert "warm_profile_20261129T0500.json" in text and "the contract 400 ms" in text and "**missed**" in text
    assert "no proof, took 350 ms: the floor" in text
    assert "| Spark's write of the staged files | 100 ms | 25% |" in text
    assert "No `warm_vs_per_run_*.json`" in text and "No `peer_*.json`" in text
