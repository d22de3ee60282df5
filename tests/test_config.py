"""The configuration file: every bad key gets its own message; defaults, overrides, paths and secrets."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
import yaml

from icemaint.config import CONFIG_ENV, load_config, parse_config
from icemaint.config.catalog import catalog_secret_properties, secret_env_name
from icemaint.config.parse import ConfigError
from icemaint.domain.policy import TablePolicy

MiB = 2**20

# (case id, document, substrings the error message must contain). Each message names the key, the
# bad value where there is one, and what is allowed.
BAD_CONFIGS = [
    ("unknown top-level key", {"catalogue": {}},
     ["config.catalogue", "unknown key", "allowed:", "catalog", "defaults", "tables"]),
    ("unknown catalog key", {"catalog": {"wharehouse": "/tmp/x"}},
     ["catalog.wharehouse", "unknown key", "allowed: name, type, warehouse, uri, properties"]),
    ("catalog type", {"catalog": {"type": "hive"}},
     ["catalog.type", "'hive'", "allowed: hadoop, jdbc, rest, glue"]),
    ("jdbc without uri", {"catalog": {"type": "jdbc"}},
     ["catalog.uri", "required for catalog.type 'jdbc'"]),
    ("rest without uri", {"catalog": {"type": "rest"}},
     ["catalog.uri", "required for catalog.type 'rest'"]),
    ("catalog name not an identifier", {"catalog": {"name": "my-lake"}},
     ["catalog.name", "'my-lake'", "plain identifier"]),
    ("iceberg runtime", {"spark": {"iceberg_runtime": "maven"}},
     ["spark.iceberg_runtime", "'maven'", "allowed: auto, provided, bundled"]),
    ("class archive", {"spark": {"class_archive": "yes"}},
     ["spark.class_archive", "'yes'", "is not a boolean"]),
    ("secret in the file", {"catalog": {"type": "jdbc", "uri": "jdbc:postgresql://h/db",
                                        "properties": {"jdbc.password": "hunter2"}}},
     ["catalog.properties.jdbc.password", "secrets are not read from the file",
      "ICEMAINT_CATALOG_JDBC_PASSWORD"]),
    ("claims backend", {"claims": {"backend": "redis"}},
     ["claims.backend", "'redis'", "allowed: file, postgres"]),
    ("audit sink", {"audit": {"sink": "kafka"}},
     ["audit.sink", "'kafka'", "allowed: file, postgres"]),
    ("scope.include not a list", {"scope": {"include": "t.*"}},
     ["scope.include", "'t.*'", "not a list of table-name patterns"]),
    ("scope.exclude with a non-string", {"scope": {"exclude": ["t.a", 3]}},
     ["scope.exclude", "not a list of table-name patterns"]),
    ("dates_start malformed", {"dates_start": "2024-13-01"},
     ["dates_start", "'2024-13-01'", "YYYY-MM-DD"]),
    ("dates_start week date", {"dates_start": "2024-W01-1"},
     ["dates_start", "'2024-W01-1'", "YYYY-MM-DD"]),
    ("dates_start a timestamp", {"dates_start": dt.datetime(2024, 1, 1, 12, 0)},
     ["dates_start", "datetime", "YYYY-MM-DD"]),
    ("max_runs_total 0", {"max_runs_total": 0},
     ["max_runs_total", "0", "at least 1"]),
    ("max_runs_total a bool", {"max_runs_total": True},
     ["max_runs_total", "True", "whole number"]),
    ("defaults unknown policy key", {"defaults": {"min_files": 3}},
     ["defaults.min_files", "unknown policy key", "allowed:", "min_input_files", "writer_idle"]),
    ("duration unit", {"defaults": {"writer_idle": "5 fortnights"}},
     ["defaults.writer_idle", "'5 fortnights'", "unit s, m, h, d or w"]),
    ("negative duration number", {"defaults": {"orphan_older_than": -5}},
     ["defaults.orphan_older_than", "-5", "negative"]),
    ("an orphan cutoff no run would accept", {"tables": {"db.t": {"orphan_older_than": "1h"}}},
     ["tables.db.t.orphan_older_than", "'1h' is under 24h", "--force"]),
    ("a retired key is named, not ignored", {"defaults": {"max_concurrent_file_group_rewrites": 4}},
     ["defaults.max_concurrent_file_group_rewrites", "no longer used", "remove the key"]),
    ("negative duration with unit", {"defaults": {"snapshot_older_than": "-3d"}},
     ["defaults.snapshot_older_than", "'-3d'", "negative"]),
    ("infinite size", {"defaults": {"max_rewrite_bytes": float("inf")}},
     ["defaults.max_rewrite_bytes", "inf", "not a size"]),
    ("catalog timeout zero", {"catalog": {"timeout": "0s"}}, ["catalog.timeout", "more than 0s"]),
    ("catalog timeout not a duration", {"catalog": {"timeout": "soon"}}, ["catalog.timeout", "'soon'"]),
    ("retain_last 0", {"defaults": {"retain_last": 0}},
     ["defaults.retain_last", "0", "at least 1"]),
    ("retain_last above a Java int", {"defaults": {"retain_last": 99999999999}},
     ["defaults.retain_last", "99999999999", "at most 2147483647"]),
    ("metadata_versions_max above a Java int", {"tables": {"t.events": {"metadata_versions_max": 99999999999}}},
     ["tables.t.events.metadata_versions_max", "99999999999", "maximum 2147483647"]),
    ("a file group that holds no file", {"defaults": {"partial_progress": True, "max_file_group_size_bytes": 0}},
     ["defaults.max_file_group_size_bytes", "0 B holds no file", "no date would ever be compacted"]),
    ("a hadoop warehouse on an object store", {"catalog": {"warehouse": "s3a://bucket/wh"}},
     ["catalog.warehouse", "'s3a://bucket/wh'", "local warehouse directory", "rest, jdbc or glue"]),
    ("a catalog property the config sets itself", {"catalog": {"properties": {"warehouse": "/elsewhere"}}},
     ["catalog.properties.warehouse", "set by icemaint from catalog.warehouse", "remove it"]),
    ("min_input_files 1", {"defaults": {"min_input_files": 1}},
     ["defaults.min_input_files", "1", "minimum 2"]),
    ("min_position_delete_files 1", {"tables": {"t.events": {"min_position_delete_files": 1}}},
     ["tables.t.events.min_position_delete_files", "1", "minimum 2"]),
    ("small files above target", {"defaults": {"small_file_size_bytes": "256MiB", "target_file_size_bytes": "128MiB"}},
     ["defaults", f"small_file_size_bytes ({256 * MiB})", f"target_file_size_bytes ({128 * MiB})"]),
    ("sort without sort_order", {"defaults": {"strategy": "sort"}},
     ["defaults.sort_order", "strategy 'sort' needs a sort_order"]),
    ("unknown strategy", {"defaults": {"strategy": "shuffle"}},
     ["defaults.strategy", "'shuffle'", "allowed: binpack, sort, zorder"]),
    ("sort_order with a quote", {"defaults": {"strategy": "sort", "sort_order": "id'); DROP TABLE x; --"}},
     ["defaults.sort_order", "quotes or ';'"]),
    ("operation not known", {"defaults": {"allowed_operations": ["compact", "vacuum"]}},
     ["defaults.allowed_operations", "'vacuum'", "compact, expire, orphans, manifests, statistics, revert"]),
    ("allowed_operations rollback", {"defaults": {"allowed_operations": ["compact", "rollback"]}},
     ["defaults.allowed_operations", "'rollback' is no longer an operation", "'revert'"]),
    ("time_column not an identifier", {"defaults": {"time_column": "ts; drop"}},
     ["defaults.time_column", "'ts; drop'", "plain identifier"]),
    ("tables key not a table name", {"tables": {"a.b;drop": {"min_input_files": 3}}},
     ["tables.a.b;drop", "'a.b;drop'", "not allowed"]),
    ("tables key without namespace", {"tables": {"events": {}}},
     ["tables.events", "no namespace"]),
    ("table override bad value", {"tables": {"t.events": {"max_delete_ratio": 1.5}}},
     ["tables.t.events.max_delete_ratio", "1.5", "ratio between 0 and 1"]),
    ("table override not a mapping", {"tables": {"t.events": ["compact"]}},
     ["tables.t.events", "expected a mapping"]),
    ("dagster storage unknown", {"dagster": {"storage": "mysql"}},
     ["dagster.storage", "'mysql'", "allowed: sqlite, postgres"]),
    ("dagster dsn in the file", {"dagster": {"storage": "postgres", "dsn_env": "postgresql://u:p@h/db"}},
     ["dagster.dsn_env", "not an environment variable name"]),
    ("dagster unknown key", {"dagster": {"url": "x"}}, ["dagster.url", "unknown key", "storage, dsn_env"]),
    ("claims dsn_env not a variable name", {"claims": {"dsn_env": "X; rm -rf /"}},
     ["claims.dsn_env", "'X; rm -rf /'", "not an environment variable name"]),
    ("dsn_env with a trailing newline", {"dagster": {"dsn_env": "AB\n"}},
     ["dagster.dsn_env", "'AB\\n'", "not an environment variable name"]),
    ("audit dsn in the file", {"audit": {"dsn_env": "postgresql://u:p@h/db"}},
     ["audit.dsn_env", "not an environment variable name"]),
    ("concurrent reads zero", {"catalog": {"concurrent_reads": 0}},
     ["catalog.concurrent_reads", "0", "from 1 to 64"]),
    ("concurrent reads not a number", {"catalog": {"concurrent_reads": "many"}},
     ["catalog.concurrent_reads", "'many'", "whole number"]),
    ("document not a mapping", ["catalog"],
     ["config", "expected a mapping"]),
    ("automation flag not a boolean", {"automation": {"orphan_removal": "yes"}},
     ["automation.orphan_removal", "'yes'", "not a boolean"]),
    ("automation unknown key", {"automation": {"expiry": False}}, ["automation.expiry", "unknown key", "orphan_removal"]),
    ("poll interval below a second", {"automation": {"compaction_interval": "0s"}},
     ["automation.compaction_interval", "'0s'", "from 1s to 1d"]),
    ("poll interval not a duration", {"automation": {"discovery_interval": "often"}},
     ["automation.discovery_interval", "often"]),
    ("automatic quarantine purge", {"automation": {"quarantine_purge": True}},
     ["automation.quarantine_purge", "never automatic", "icemaint purge-quarantine"]),
]


def test_automation_that_deletes_is_off_unless_the_file_turns_it_on(tmp_path):
    assert parse_config({}, tmp_path).automation.orphan_removal is False
    assert parse_config({"automation": {"orphan_removal": True}}, tmp_path).automation.orphan_removal is True


def test_each_sensor_polls_as_often_as_the_file_says(tmp_path):
    from maint_assets.definitions import build_definitions

    defaults = parse_config({}, tmp_path).automation
    assert (defaults.discovery_interval, defaults.compaction_interval, defaults.retention_interval) == (60, 30, 60)
    path = tmp_path / "m.yaml"
    path.write_text("automation: {discovery_interval: 5s, compaction_interval: 2m, retention_interval: 1h}\n")
    sensors = {s.name: s.minimum_interval_seconds for s in build_definitions(str(path)).sensors}
    assert (sensors["table_discovery"], sensors["compaction_sensor"], sensors["retention_sensor"]) == (5, 120, 3600)


@pytest.mark.parametrize("doc, expected", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_names_key_value_and_allowed(tmp_path, doc, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(doc, tmp_path)
    message = str(info.value)
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_secret_value_is_not_echoed_in_the_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        parse_config({"catalog": {"properties": {"s3.secret-access-key": "AKIA-hunter2"}}}, tmp_path)
    assert "hunter2" not in str(info.value)
    assert "ICEMAINT_CATALOG_S3_SECRET__ACCESS__KEY" in str(info.value)


def test_empty_document_gives_the_defaults(tmp_path):
    config = parse_config(None, tmp_path)
    assert config.catalog.name == "lake" and config.catalog.type == "hadoop"
    assert config.claims.backend == "file" and config.audit.sink == "file"
    assert config.dates_start == dt.date(2020, 1, 1) and config.max_runs_total == 2
    assert config.policy("t.anything") == TablePolicy()
    assert config.scope.admits("t.anything")


def test_defaults_apply_to_tables_and_table_overrides_win(tmp_path):
    config = parse_config({
        "defaults": {"min_input_files": 7, "writer_idle": "30m", "small_file_size_bytes": "4MiB"},
        "tables": {
            "t.events": {"min_input_files": 9, "read_only": True},
            "t.orders": {"owner": "sales"},
            "a.b.c": {"strategy": "sort", "sort_order": "id ASC NULLS LAST, ts"},
        },
    }, tmp_path)
    events, orders, deep, other = (config.policy(t) for t in ("t.events", "t.orders", "a.b.c", "t.other"))
    assert (events.min_input_files, events.read_only, events.writer_idle_seconds) == (9, True, 1800.0)
    assert events.small_file_size_bytes == 4 * MiB  # inherited from defaults, not TablePolicy()
    assert (orders.min_input_files, orders.owner, orders.read_only) == (7, "sales", False)
    assert (deep.strategy, deep.sort_order, deep.min_input_files) == ("sort", "id ASC NULLS LAST, ts", 7)
    assert other == config.policies.defaults
    assert (other.min_input_files, other.writer_idle_seconds) == (7, 1800.0)


def test_scope_include_and_exclude(tmp_path):
    config = parse_config({"scope": {"include": ["sales.*", "t.*"], "exclude": ["t.tmp_*"]}}, tmp_path)
    assert config.scope.admits("sales.orders")
    assert config.scope.admits("t.events")
    assert not config.scope.admits("t.tmp_scratch")
    assert not config.scope.admits("hr.people")


def test_relative_paths_resolve_against_the_file_directory(tmp_path, monkeypatch):
    conf_dir = tmp_path / "etc" / "icemaint"
    conf_dir.mkdir(parents=True)
    path = conf_dir / "m.yaml"
    path.write_text("catalog:\n  warehouse: wh\nstate_dir: ../state\n")
    monkeypatch.chdir(tmp_path)  # the file is named relative to the working directory, its paths are not
    config = load_config("etc/icemaint/m.yaml")
    assert config.catalog.warehouse == str((conf_dir / "wh").resolve())
    assert config.state_dir == str((tmp_path / "etc" / "state").resolve())
    assert config.dagster_home == Path(config.state_dir) / "dagster"
    assert config.source == "etc/icemaint/m.yaml"


def test_spark_jars_resolve_against_the_file_directory_and_urls_are_kept(tmp_path):
    doc = {"spark": {"conf": {"spark.jars": "jars/a.jar, /opt/b.jar,s3://bucket/c.jar"}}}
    config = parse_config(doc, tmp_path / "etc")
    assert config.spark.conf["spark.jars"].split(",") == [
        str((tmp_path / "etc" / "jars" / "a.jar").resolve()), "/opt/b.jar", "s3://bucket/c.jar"]
    assert config.dagster.storage == "sqlite"


def test_uris_and_absolute_paths_are_kept(tmp_path):
    config = parse_config({"catalog": {"type": "jdbc", "uri": "jdbc:postgresql://h/db", "warehouse": "s3://bucket/wh"},
                           "state_dir": str(tmp_path / "s")}, tmp_path / "elsewhere")
    assert config.catalog.warehouse == "s3://bucket/wh"
    assert config.state_dir == str(tmp_path / "s")


def test_a_key_given_twice_in_the_file_is_refused_naming_it(tmp_path):
    """YAML keeps the last of two equal keys silently: a policy edited in two places applied only one of them."""
    path = tmp_path / "maintenance.yaml"
    path.write_text("defaults:\n  min_input_files: 3\n  writer_idle: 5m\n  min_input_files: 10\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (f"{path}: not valid YAML at line 4, column 3: the key 'min_input_files' is given "
                               "twice in one mapping")
    path.write_text("defaults:\n  <<: {min_input_files: 3}\n  <<: {min_input_files: 7}\n")
    with pytest.raises(ConfigError, match="the merge key '<<' is given twice"):
        load_config(path)
    path.write_text("base: &base {min_input_files: 3}\ndefaults:\n  <<: *base\n  writer_idle: 5m\n")
    with pytest.raises(ConfigError, match="config.base"):  # merge keys still read; the unknown key is named
        load_config(path)


def test_a_hadoop_warehouse_given_as_a_file_uri_is_its_local_path(tmp_path):
    for uri in (f"file://{tmp_path}/wh", f"file:{tmp_path}/wh"):
        assert parse_config({"catalog": {"warehouse": uri}}, tmp_path).catalog.warehouse == f"{tmp_path}/wh"


def test_a_state_dir_that_cannot_be_created_is_named_at_load(tmp_path):
    """A state dir below a regular file failed every command later, in a NotADirectoryError traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ConfigError) as info:
        parse_config({"state_dir": str(blocker / "state")}, tmp_path)
    assert str(info.value) == f"state_dir: {blocker / 'state'} cannot be created: {blocker} is a file, not a directory"
    with pytest.raises(ConfigError, match="catalog.warehouse: .* cannot be created"):
        parse_config({"catalog": {"warehouse": str(blocker / "deep" / "wh")}}, tmp_path)
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    with pytest.raises(ConfigError, match="state_dir: .*loop1/state cannot be used: Symlink loop"):
        parse_config({"state_dir": str(tmp_path / "loop1" / "state")}, tmp_path)


def test_yaml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("catalog:\n  name: [lake\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "not valid YAML" in str(info.value)


def test_missing_file_names_the_path_and_how_to_set_it(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "not found" in str(info.value) and CONFIG_ENV in str(info.value)


def test_directory_instead_of_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the configuration file"):
        load_config(tmp_path)


def test_bad_key_in_a_file_names_the_file_once_and_the_key(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("claims:\n  backend: redis\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: claims.backend: 'redis'")
    assert message.count(str(path)) == 1


def test_file_that_is_not_a_mapping_names_the_file_once(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- catalog\n- tables\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: config: expected a mapping, got ['catalog', 'tables']"


def test_config_env_var_is_used_when_no_path_given(tmp_path, monkeypatch):
    path = tmp_path / "from_env.yaml"
    path.write_text("max_runs_total: 5\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    config = load_config()
    assert config.max_runs_total == 5 and config.source == str(path)

    explicit = tmp_path / "explicit.yaml"
    explicit.write_text("max_runs_total: 3\n")
    assert load_config(explicit).max_runs_total == 3  # an explicit path wins over the variable


def test_default_file_name_in_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "maintenance.yaml").write_text("dates_start: 2023-02-01\n")
    assert load_config().dates_start == dt.date(2023, 2, 1)


def test_catalog_secrets_come_from_the_environment(tmp_path, monkeypatch):
    for name in [n for n in os.environ if n.startswith("ICEMAINT_CATALOG_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ICEMAINT_CATALOG_JDBC_PASSWORD", "pw1")
    monkeypatch.setenv("ICEMAINT_CATALOG_S3_SECRET__ACCESS__KEY", "pw2")
    monkeypatch.setenv("ICEMAINT_CATALOG_TOKEN", "")  # empty values are not properties
    config = parse_config({"catalog": {"type": "jdbc", "uri": "jdbc:postgresql://h/db",
                                       "properties": {"jdbc.user": "maint"}}}, tmp_path)
    assert config.catalog.properties == {"jdbc.user": "maint"}
    assert catalog_secret_properties(config.catalog) == {"jdbc.password": "pw1", "s3.secret-access-key": "pw2"}


@pytest.mark.parametrize("key", ["jdbc.password", "s3.secret-access-key", "token", "rest.credential",
                                 "s3.session-token"])
def test_secret_hint_round_trips_to_the_same_property(tmp_path, monkeypatch, key):
    for name in [n for n in os.environ if n.startswith("ICEMAINT_CATALOG_")]:
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError) as info:
        parse_config({"catalog": {"properties": {key: "x"}}}, tmp_path)
    env_name = secret_env_name(key)
    assert env_name in str(info.value)
    monkeypatch.setenv(env_name, "value")
    assert catalog_secret_properties(parse_config(None, tmp_path).catalog) == {key: "value"}


def test_identity_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ICEMAINT_IDENTITY", "ops-bot")
    assert parse_config(None, tmp_path).identity() == "ops-bot"


def test_identity_without_user_in_the_environment_is_the_processes_own_user(tmp_path, monkeypatch):
    """cron and systemd units often set no $USER: the identity is still the OS user, not 'unknown'."""
    import pwd

    monkeypatch.delenv("ICEMAINT_IDENTITY", raising=False)
    monkeypatch.delenv("USER", raising=False)
    assert parse_config(None, tmp_path).identity() == pwd.getpwuid(os.getuid()).pw_name


def test_a_jdbc_sqlite_catalog_uri_keeps_its_absolute_path_for_pyiceberg():
    from icemaint.observe.catalog import jdbc_to_sqlalchemy

    assert jdbc_to_sqlalchemy("jdbc:sqlite:/tmp/wh/catalog.db", {}) == "sqlite:////tmp/wh/catalog.db"
    assert jdbc_to_sqlalchemy("jdbc:sqlite:catalog.db", {}) == "sqlite:///catalog.db"


def test_concurrent_reads_default_by_catalog_type_and_an_explicit_value_wins(tmp_path):
    """A hadoop catalog's metadata is local files (a read parses, holding the GIL): one at a time by
    default; a catalog over the network waits on each read: eight at a time."""
    def workers(catalog):
        return parse_config({"catalog": catalog}, tmp_path).catalog.read_workers

    assert workers({"type": "hadoop"}) == 1
    assert workers({"type": "rest", "uri": "http://catalog:8181"}) == 8
    assert workers({"type": "hadoop", "concurrent_reads": 4}) == 4
    assert workers({"type": "rest", "uri": "http://catalog:8181", "concurrent_reads": 2}) == 2


def test_a_rest_catalogs_warehouse_is_a_name_kept_as_given_and_a_hadoop_warehouse_a_path(tmp_path):
    """Polaris, Lakekeeper, Gravitino and Unity take a logical warehouse name; only the path-based catalogs'
    warehouse is a directory relative to the file."""
    rest = parse_config({"catalog": {"type": "rest", "uri": "http://catalog:8181",
                                     "warehouse": "my_polaris_catalog"}}, tmp_path).catalog
    assert rest.warehouse == "my_polaris_catalog" and rest.warehouse_root is None
    assert parse_config({"catalog": {"type": "glue", "warehouse": "s3://bucket/wh"}}, tmp_path).catalog.warehouse \
        == "s3://bucket/wh"
    hadoop = parse_config({"catalog": {"type": "hadoop", "warehouse": "wh"}}, tmp_path).catalog
    assert hadoop.warehouse == str((tmp_path / "wh").resolve())
    with pytest.raises(ConfigError, match="catalog.warehouse: '' is not a non-empty string"):
        parse_config({"catalog": {"type": "rest", "uri": "http://catalog:8181", "warehouse": ""}}, tmp_path)


@pytest.mark.parametrize("text, message", [
    ("dates_start: 2020-13-01\n", "dates_start: '2020-13-01' is not a date (YYYY-MM-DD)"),
    ("dates_start: 2024-02-30\n", "dates_start: '2024-02-30' is not a date (YYYY-MM-DD)"),
])
def test_an_impossible_date_in_the_file_is_named_by_its_key(tmp_path, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: {message}"


def test_a_date_in_the_file_is_read(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("dates_start: 2024-02-29\n")
    assert load_config(path).dates_start == dt.date(2024, 2, 29)


@pytest.mark.parametrize("key", [
    "header.Authorization", "header.X-Api-Key", "token", "credential", "jdbc.password", "s3.secret-access-key",
    "s3.session-token", "client.session-token", "adls.account-key", "adls.sas-token.acct", "gcs.oauth2.token",
    "s3.sse.key", "rest.private-key", "api_key", "PASSWD",
])
def test_every_secret_bearing_catalog_property_is_refused_naming_the_variable(tmp_path, capsys, key):
    """A bearer token as `header.Authorization` was read from the file while `jdbc.password` was refused."""
    from conftest import run_cli

    value = "Bearer eyJ-secret-4b1d"
    with pytest.raises(ConfigError) as info:
        parse_config({"catalog": {"type": "rest", "uri": "http://rest:8181", "properties": {key: value}}}, tmp_path)
    message = str(info.value)
    assert f"catalog.properties.{key}: secrets are not read from the file" in message
    assert f"set {secret_env_name(key)} in the environment instead" in message and value not in message
    path = tmp_path / "maintenance.yaml"
    path.write_text(yaml.safe_dump({"catalog": {"type": "rest", "uri": "http://rest:8181",
                                                "properties": {key: value}}, "state_dir": str(tmp_path / "s")}))
    code, out, err = run_cli(capsys, "--config", str(path), "audit")
    assert code == 2 and err.strip().splitlines() == [f"error: {path}: {message}"], err
    assert not (tmp_path / "s").exists(), "nothing is created on a refusal"


@pytest.mark.parametrize("key", ["jdbc.user", "s3.endpoint", "s3.access-key-id", "s3.path-style-access",
                                 "header.X-Iceberg-Access-Delegation", "oauth2-server-uri", "rest.signing-name",
                                 "client.region", "io-impl"])
def test_plain_catalog_properties_are_read_from_the_file(tmp_path, key):
    config = parse_config({"catalog": {"type": "rest", "uri": "http://rest:8181", "properties": {key: "v"}}},
                          tmp_path)
    assert config.catalog.properties == {key: "v"}


def test_a_refused_header_reaches_the_catalog_from_its_variable(monkeypatch):
    monkeypatch.setenv(secret_env_name("header.Authorization"), "Bearer t")
    config = parse_config({"catalog": {"type": "rest", "uri": "http://rest:8181"}}, Path("."))
    assert catalog_secret_properties(config.catalog)["header.authorization"] == "Bearer t"
