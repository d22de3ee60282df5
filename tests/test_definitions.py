"""The code location: what it defines, how it is partitioned, and that loading it is cheap and quiet."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from conftest import write_config
from maint_assets.definitions import build_definitions
from maint_assets.partitions import split_table_date, table_date_key

REPO = Path(__file__).resolve().parent.parent
OUR_PACKAGES = ("icemaint", "maint_assets", "resources", "sensors")
CORE_ASSETS = {"table_health", "compaction", "validation_report", "table_compaction", "expired_snapshots",
               "orphan_files", "rewritten_manifests", "column_statistics"}
VALIDATION_CHECKS = {"row_count_parity", "sample_comparison", "column_aggregates"}


@pytest.fixture
def defs(config_file) -> dg.Definitions:
    return build_definitions(str(config_file))


def asset_specs(defs: dg.Definitions) -> dict[str, dg.AssetSpec]:
    return {spec.key.to_user_string(): spec for spec in defs.resolve_all_asset_specs()}


def test_location_has_the_maintenance_assets_each_partitioned(defs):
    specs = asset_specs(defs)
    assert CORE_ASSETS <= set(specs), sorted(specs)
    for key, spec in specs.items():
        assert spec.partitions_def is not None, f"asset {key} is not partitioned"
        assert spec.group_name == "maintenance", key
    assert isinstance(specs["table_health"].partitions_def, dg.DynamicPartitionsDefinition)
    assert specs["table_health"].partitions_def.name == "table"
    # validation_report reads what compaction committed: it must depend on it, per partition
    deps = {d.asset_key.to_user_string() for d in specs["validation_report"].deps}
    assert "compaction" in deps
    # expiry follows the compaction of either kind of table (per date, or per partition without a time column)
    assert {d.asset_key.to_user_string() for d in specs["expired_snapshots"].deps} >= {"compaction", "table_compaction"}


def all_check_specs(defs) -> list:
    """The check specs of every asset (the proofs are declared on the compaction assets themselves)."""
    return [spec for asset in defs.assets or [] for spec in getattr(asset, "check_specs", [])]


def test_compaction_carries_the_three_blocking_validation_checks(defs):
    checks = {(c.asset_key.to_user_string(), c.name): c for c in all_check_specs(defs)}
    on_compaction = {name for asset, name in checks if asset == "compaction"}
    assert on_compaction == VALIDATION_CHECKS
    for name in VALIDATION_CHECKS:
        assert checks[("compaction", name)].blocking, f"{name} must block downstream assets"
    graph = defs.resolve_asset_graph()
    assert {k.name for k in graph.asset_check_keys if k.asset_key == dg.AssetKey("compaction")} == VALIDATION_CHECKS


def test_every_job_and_the_asset_job_run_in_process(defs):
    repo = defs.get_repository_def()
    names = set(repo.job_names)
    assert {"health_job", "compaction_job"} <= names
    for name in names:
        assert repo.get_job(name).executor_def.name == "in_process", (
            f"job {name} would start one Spark session per step")
    # UI materializations and asset backfills run the implicit asset job
    assert defs.resolve_implicit_global_asset_job_def().executor_def.name == "in_process"
    compaction_job = repo.get_job("compaction_job")
    selected = {k.to_user_string() for k in compaction_job.asset_layer.executable_asset_keys}
    assert selected == {"compaction", "validation_report"}
    assert {k.name for k in compaction_job.asset_layer.asset_graph.asset_check_keys} >= VALIDATION_CHECKS


def test_table_compaction_is_per_table_with_the_same_blocking_proofs(defs):
    specs = {s.key.to_user_string(): s for s in defs.resolve_all_asset_specs()}
    assert specs["table_compaction"].partitions_def.name == "table"
    checks = {(c.asset_key.to_user_string(), c.name): c for c in all_check_specs(defs)}
    on_table = {name for asset, name in checks if asset == "table_compaction"}
    assert on_table == VALIDATION_CHECKS and all(checks[("table_compaction", n)].blocking for n in on_table)
    job = defs.get_repository_def().get_job("table_compaction_job")
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {"table_compaction"}


def test_sensors_target_their_jobs(defs):
    sensors = {s.name: s for s in defs.sensors}
    assert {"table_discovery", "compaction_sensor"} <= set(sensors)
    assert sensors["table_discovery"].job_name == "health_job"
    # dated compactions run compaction_job; tables without a time column table_compaction_job
    assert {j.name for j in sensors["compaction_sensor"].jobs} == {"compaction_job", "table_compaction_job"}
    for sensor in sensors.values():
        assert sensor.description, f"sensor {sensor.name} says nothing about what it does"


def test_compaction_is_table_by_date_with_date_pipe_table_keys(defs):
    specs = asset_specs(defs)
    multi = specs["compaction"].partitions_def
    assert isinstance(multi, dg.MultiPartitionsDefinition)
    dims = {d.name: d.partitions_def for d in multi.partitions_defs}
    assert set(dims) == {"date", "table"}
    assert isinstance(dims["table"], dg.DynamicPartitionsDefinition) and dims["table"].name == "table"
    assert isinstance(dims["date"], dg.TimeWindowPartitionsDefinition)
    assert dims["date"].start.date() == dt.date(2020, 1, 1)  # the default dates_start
    assert specs["validation_report"].partitions_def == multi

    key = table_date_key("t.orders", "2024-01-02")
    assert str(key) == "2024-01-02|t.orders"
    assert split_table_date(str(key)) == ("t.orders", "2024-01-02")
    assert split_table_date(key) == ("t.orders", "2024-01-02")

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("table", ["t.orders"])
    keys = multi.get_partition_keys(dynamic_partitions_store=instance)
    assert "2024-01-02|t.orders" in keys
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        assert multi.has_partition_key("2024-01-02|t.orders")
        assert not multi.has_partition_key("2024-01-02|t.unknown")
        assert not multi.has_partition_key("2019-12-31|t.orders")  # before dates_start


def test_date_dimension_starts_at_the_configured_dates_start(tmp_path, lake_root):
    path = write_config(tmp_path / "custom.yaml", lake_root, state_dir=str(tmp_path / "state"),
                        dates_start="2024-03-05")
    specs = asset_specs(build_definitions(str(path)))
    for asset in ("compaction", "validation_report"):
        date_dim = {d.name: d.partitions_def for d in specs[asset].partitions_def.partitions_defs}["date"]
        assert date_dim.start.date() == dt.date(2024, 3, 5), asset
        keys = date_dim.get_partition_keys()
        assert keys[0] == "2024-03-05"
        assert "2024-03-04" not in keys
        # today is a partition too (streaming tables write into it)
        assert dt.datetime.now(dt.timezone.utc).date().isoformat() in keys


def test_loading_does_not_start_spark_and_emits_no_warnings_from_our_code(config_file, tmp_path):
    # A fresh interpreter: import-time warnings and a Spark start would be hidden by this process's state.
    script = textwrap.dedent(f"""
        import json, os, sys, warnings
        warnings.simplefilter("always")
        # our own modules: any warning they cause is an error
        warnings.filterwarnings("error", module=r"({'|'.join(OUR_PACKAGES)})(\\..*)?$")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from dagster._core.workspace.autodiscovery import loadable_targets_from_python_module
            from dagster._core.definitions.reconstruct import repository_def_from_target_def
            targets = loadable_targets_from_python_module("maint_assets.definitions", {str(REPO)!r})
            repo = repository_def_from_target_def(targets[0].target_definition)
            jobs = sorted(repo.job_names)
            sensors = sorted(s.name for s in repo.sensor_defs)
            repo.asset_graph  # forces the asset graph and partition mappings
        ours = [dict(category=w.category.__name__, file=w.filename, line=w.lineno, message=str(w.message))
                for w in caught if any(os.sep + p + os.sep in w.filename for p in {OUR_PACKAGES!r})]
        spark_modules_before = "pyspark.sql" in sys.modules
        from pyspark.sql import SparkSession
        from pyspark import SparkContext
        print(json.dumps(dict(jobs=jobs, sensors=sensors, ours=ours,
                              active_session=SparkSession.getActiveSession() is not None,
                              spark_context=SparkContext._active_spark_context is not None,
                              jvm_gateway=SparkContext._gateway is not None,
                              dagster_home=os.environ.get("DAGSTER_HOME"))))
    """)
    env = {**os.environ, "ICEMAINT_CONFIG": str(config_file)}
    env.pop("DAGSTER_HOME", None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ours"] == [], report["ours"]
    assert not report["active_session"] and not report["spark_context"] and not report["jvm_gateway"]
    assert {"health_job", "compaction_job"} <= set(report["jobs"])
    assert {"table_discovery", "compaction_sensor"} <= set(report["sensors"])
    # loading has no side effects: no DAGSTER_HOME set, no instance file written
    assert report["dagster_home"] is None
    assert not (config_file.parent / "state" / "dagster" / "dagster.yaml").exists()


def test_the_spark_resource_is_dagster_pysparks_lazy_resource_on_the_projects_session(spark, config_file):
    """Dagster users meet `LazyPySparkResource` (`spark_session`, `spark_context`); the session is the project's
    own (one per process, its catalog configured), not one dagster-pyspark builds from `spark_config`."""
    from dagster_pyspark import LazyPySparkResource

    from resources.settings import MaintenanceSettings
    from resources.spark import SparkResource

    resource = SparkResource(settings=MaintenanceSettings(config_path=str(config_file)))
    assert isinstance(resource, LazyPySparkResource) and resource._spark_session is None  # nothing started yet
    assert resource.spark_session is spark and resource.spark_context is spark.sparkContext
    assert resource.spark_session.conf.get("spark.sql.catalog.lake") == "org.apache.iceberg.spark.SparkCatalog"


def test_what_runs_when_the_ui_starts_is_said_and_deletes_nothing_by_default(tmp_path, lake_root):
    """The shipped default starts the sensors but no orphan removal, and says so where a person looks: the retention
    sensor's description (the UI) and the start-up line (`icemaint ui`, `icemaint doctor`)."""
    from icemaint.config import load_config
    from sensors.startup import startup_summary

    for automation, says in ((None, "never orphan-file removal"), ({"orphan_removal": True},
                                                                    "orphan-file removal once an expiry finished")):
        extra = {"automation": automation} if automation else {}
        path = write_config(tmp_path / f"{bool(automation)}.yaml", lake_root, **extra)
        defs = build_definitions(str(path))
        assert says in defs.resolve_sensor_def("retention_sensor").description
        line = startup_summary(load_config(path), defs)
        assert line.startswith("running at start: table_discovery, compaction_sensor, retention_sensor"), line
        assert ("orphan removal ON" in line) == bool(automation) and "quarantine purge never" in line, line
        assert "stopped until started in the UI: nightly_maintenance_window" in line, line


def test_a_batched_runs_per_partition_proofs_count_on_their_partitions():
    """`partition_evaluation` names each partition's materialization as the proof's target: without it Dagster's
    check state counts the evaluation stale once the partition materialized, and the checks' partition view said
    "Passed (0)" after a run over several dates (measured: [] without the target, both partitions with it)."""
    import warnings

    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionResolvedStatus as Status

    from maint_assets.compaction import partition_evaluation

    parts = dg.StaticPartitionsDefinition(["2026-01-01", "2026-01-02"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        spec = dg.AssetCheckSpec("proof", asset="x", blocking=True, partitions_def=parts)

    @dg.multi_asset(specs=[dg.AssetSpec("x")], partitions_def=parts, can_subset=True, check_specs=[spec])
    def x(context):
        for key in context.partition_keys:  # as `compact` does for a batch: each date's event, then its proof
            yield dg.AssetMaterialization(asset_key="x", partition=key)
        for key, passed in zip(context.partition_keys, (True, False)):
            yield partition_evaluation(dg.AssetCheckResult(check_name="proof", asset_key="x", passed=passed), "x",
                                       key, context.instance)
        yield dg.AssetCheckResult(check_name="proof", asset_key="x", passed=False)

    with dg.instance_for_test() as instance:
        dg.materialize([x], instance=instance, raise_on_error=False,
                       tags={"dagster/asset_partition_range_start": "2026-01-01",
                             "dagster/asset_partition_range_end": "2026-01-02"})
        key = dg.AssetCheckKey(dg.AssetKey("x"), "proof")
        state = instance.event_log_storage.get_asset_check_state([(key, parts)])[key]
        assert list(state.subsets[Status.SUCCEEDED].value.get_partition_keys()) == ["2026-01-01"]
        assert list(state.subsets[Status.FAILED].value.get_partition_keys()) == ["2026-01-02"]  # red on its date


def test_sizes_and_durations_in_metadata_get_a_readable_twin_beside_the_raw_number():
    from maint_assets.metadata import numeric

    meta = numeric({"avg_file_bytes_before": 4712.333, "small_file_size_bytes": 8 << 20, "plan_seconds": 0.812,
                    "oldest_snapshot_age_seconds": 3 * 86400.0, "seconds_since_writer_commit": 95.0,
                    "files_before": 20, "published": True})
    assert {k: v.value for k, v in meta.items()} == {
        "avg_file_bytes_before": 4712.333, "avg_file_size_before": "4.6 KiB",
        "small_file_size_bytes": 8 << 20, "small_file_size": "8 MiB",
        "plan_seconds": 0.812, "plan_duration": "0.8s",
        "oldest_snapshot_age_seconds": 3 * 86400.0, "oldest_snapshot_age": "3d",
        "seconds_since_writer_commit": 95.0, "time_since_writer_commit": "1.6m",
        "files_before": 20}
    assert list(meta)[:2] == ["avg_file_bytes_before", "avg_file_size_before"]  # the twin right after its number
