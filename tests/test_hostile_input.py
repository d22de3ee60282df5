"""Hostile input, fuzzed: the CLI and the config loader turn every bad table name, date, duration, type,
key and config file into exit 2 with exactly one `error: ...` line, no traceback, and no change to the
table, the warehouse or the audit log.

Table-driven (hypothesis is not installed in this environment). Validation happens before Spark does
any work; one module-scoped real table is made once so that "changed nothing" is measured on a table
that exists.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import files_under, run_cli, streaming_table, write_config
from icemaint.config import load_config
from icemaint.config.parse import ConfigError
from icemaint.config.yaml_reader import MAX_CONFIG_BYTES
from icemaint.observe.catalog import CatalogReader

MAX_MESSAGE = 1000  # "clear": a message an operator reads, not a dump of the input


pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


@pytest.fixture(scope="module")
def estate(spark, lake_root, tmp_path_factory):
    """One real table (made once, with Spark) and a config for it with its own state dir."""
    root = tmp_path_factory.mktemp("hostile")
    table = f"hostile_{uuid.uuid4().hex[:8]}.events"
    streaming_table(spark, "lake", table, batches=2, days=2, rows_per_day=5, delete_every=0)
    path = write_config(root / "maintenance.yaml", lake_root, state_dir=str(root / "state"))
    audit = root / "state" / "audit" / "audit.jsonl"
    audit.parent.mkdir(parents=True, exist_ok=True)
    audit.write_text("")
    return SimpleNamespace(table=table, path=str(path), config=load_config(path), audit=audit,
                           warehouse=Path(lake_root) / "warehouse")


def state_of(estate) -> tuple:
    """What a rejected command must leave as it was: the table's metadata, every warehouse file, the audit log."""
    return (CatalogReader(estate.config).metadata_location(estate.table), files_under(estate.warehouse),
            estate.audit.read_bytes())


def assert_rejected(code, out: str, err: str, *mentions: str) -> str:
    """Exit 2, one clear `error:` line on stderr naming what is wrong, no traceback anywhere."""
    assert "Traceback" not in out + err, err
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert len(lines[0]) <= MAX_MESSAGE, f"{len(lines[0])} characters: {lines[0][:200]}..."
    for mention in mentions:
        assert mention in lines[0], lines[0]
    return lines[0]


def case(*values, reason: str | None = None, id: str | None = None):
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(*values, marks=marks, id=id)


# -- inputs ---------------------------------------------------------------------------------------

TABLE_NAMES = [
    ("", "empty"),
    ("events", "no namespace"),
    ("t.x'; DROP TABLE t.y; --", "quote and SQL"),
    ("t.`x`", "backticks"),
    ('t."x"', "double quotes"),
    ("t.x;y", "semicolon"),
    ("t.tëst", "unicode letter"),
    ("t.表", "CJK"),
    ("../etc.passwd", "path up"),
    ("t..x", "empty part"),
    ("..", "dots only"),
    ("t.x\n", "newline"),
    ("t.x\x00", "NUL"),
    ("t.x\u2028y", "unicode line separator"),
    ("t." + "a" * 300, "300 characters"),
    (" t.x", "leading space"),
    ("$(touch pwned).x", "shell"),
    ("t.x/../../y", "slashes"),
]

# Commands that name a table, with the table's place marked by None.
TABLE_COMMANDS = {
    "health": ["health", None],
    "compact": ["compact", None, "--date", "2026-01-01"],
    "expire": ["expire", None, "--older-than", "7d"],
    "orphans": ["orphans", None, "--older-than", "72h"],
    "manifests": ["manifests", None],
    "approve": ["approve", None, "--date", "2026-01-01"],
}


def _table_cases():
    # every name through the cheap commands; a spread of names through the ones that load the definitions
    spread = {"", "t.x'; DROP TABLE t.y; --", "t.`x`", "t.tëst", "../etc.passwd", "t.x\n"}
    for command, template in TABLE_COMMANDS.items():
        for name, label in TABLE_NAMES:
            if command in ("approve",) or name in spread:
                yield case(command, [name if part is None else part for part in template], id=f"{command}-{label}")
    for name, label in TABLE_NAMES:
        yield case("audit", ["audit", "--table", name], id=f"audit-{label}")


@pytest.mark.parametrize("command, argv", list(_table_cases()))
def test_hostile_table_names_are_rejected_before_anything_runs(estate, capsys, command, argv):
    before = state_of(estate)
    code, out, err = run_cli(capsys, "--config", estate.path, *argv)
    assert_rejected(code, out, err, "table name" if command != "audit" else "")
    assert state_of(estate) == before


DATES = [
    case("2024-01-01' OR '1'='1", id="sql"),
    case("2024-02-30", id="no such day"),
    case("2024-W01-1", id="week date"),
    case("2024-1-1", id="unpadded"),
    case("20240101", id="basic format"),
    case("", id="empty"),
    case("2024-01-01T00:00", id="timestamp"),
    case("２０２４-０１-０１", id="fullwidth digits"),
    case("0000-01-01", id="year zero"),
    case("1999-12-31", id="before dates_start"),
    case("2024-01-01\n", id="newline"),
    case("2024-13-01", id="month 13"),
    case("-2024-01-01", id="negative year"),
]


@pytest.mark.parametrize("date", DATES)
@pytest.mark.parametrize("command", ["compact --date", "compact --from", "approve --date"])
def test_hostile_dates_are_rejected(estate, capsys, command, date):
    argv = {"compact --date": ["compact", estate.table, "--date", date],
            "compact --from": ["compact", estate.table, "--from", date, "--to", "2026-01-02"],
            "approve --date": ["approve", estate.table, "--date", date]}[command]
    before = state_of(estate)
    code, out, err = run_cli(capsys, "--config", estate.path, *argv)
    line = assert_rejected(code, out, err)
    assert "date" in line or "--from" in line, line
    assert state_of(estate) == before


@pytest.mark.parametrize("argv, mention", [
    case(["compact", "{table}", "--date", "9999-12-31"], "after the maintained range", id="compact far future"),
    case(["approve", "{table}", "--date", "9999-12-31"], "date", id="approve far future"),
    case(["compact", "{table}", "--from", "2026-01-10", "--to", "2026-01-01"], "before --from", id="range backwards"),
    case(["compact", "{table}", "--from", "2026-01-01"], "go together", id="range without end"),
    case(["compact", "{table}"], "--date", id="no date"),
    case(["approve", "{table}"], "give the date to approve", id="approve a dated table without --date"),
    case(["approve", "nowhere.nothing", "--date", "2026-01-01"], "not found", id="approve no such table"),
])
def test_bad_date_ranges_and_scopes_are_rejected(estate, capsys, argv, mention):
    before = state_of(estate)
    code, out, err = run_cli(capsys, "--config", estate.path, *[a.format(table=estate.table) for a in argv])
    assert_rejected(code, out, err, mention)
    assert state_of(estate) == before


DURATIONS = [case(d, id=d) for d in ["7 days", "1e400d", "99999999999999d", "", "7d; rm -rf /", "NaN", "0x10s",
                                       "7", "7dd", "∞d", "1.5.2d", "7d\n1h", "=-5d"]] + [
    case(d, id=d) for d in ["-5d", "-0.5h"]]


@pytest.mark.parametrize("duration", DURATIONS)
@pytest.mark.parametrize("command", ["expire", "orphans"])
def test_hostile_durations_are_rejected(estate, capsys, command, duration):
    before = state_of(estate)
    code, out, err = run_cli(capsys, "--config", estate.path, command, estate.table, "--older-than", duration)
    assert_rejected(code, out, err, "--older-than")
    assert state_of(estate) == before




@pytest.mark.parametrize("argv, mention", [
    case(["expire", "{table}", "--retain-last", "0"], "--retain-last", id="retain-last 0"),
    case(["expire", "{table}", "--retain-last", "-1"], "--retain-last", id="retain-last negative"),
    case(["audit", "--limit", "-1"], "limit", id="audit limit negative"),
    case(["expire", "{table}", "--retain-last", "abc"], "--retain-last", id="retain-last not a number"),
    case(["expire", "{table}", "--retain-last", "99999999999999999999999"], "--retain-last", id="retain-last huge"),
    case(["expire", "{table}", "--older-than=-5d"], "negative", id="older-than negative, attached"),
    case(["audit", "--limit", "abc"], "--limit", id="audit limit not a number"),
    case(["audit", "--operation", "x'; DROP TABLE audit; --"], "operation", id="audit operation"),
    case(["health"], "table", id="missing table"),
    case(["compact", "-x.y", "--date", "2026-01-01"], "table", id="table like an option"),
    case(["frobnicate"], "invalid choice: 'frobnicate'", id="unknown command"),
    case(["manifests", "hostile_nowhere.events"], "hostile_nowhere.events", id="table not found"),
])
def test_bad_arguments_are_rejected(estate, capsys, argv, mention):
    before = state_of(estate)
    code, out, err = run_cli(capsys, "--config", estate.path, *[a.format(table=estate.table) for a in argv])
    assert_rejected(code, out, err, mention)
    assert state_of(estate) == before


# -- config files ---------------------------------------------------------------------------------

def _bomb_under(path: str, levels: int, width: int) -> str:
    """A YAML alias bomb of `width ** levels` strings as the value of `path`, in a few hundred bytes."""
    value = "&a0 [" + ", ".join(['"x"'] * width) + "]"
    for i in range(1, levels):
        value = f"&a{i} [{value}, " + ", ".join([f"*a{i - 1}"] * (width - 1)) + "]"
    head, _, leaf = path.rpartition(".")
    return f"{head}:\n  {leaf}: {value}\n" if head else f"{leaf}: {value}\n"



CONFIG_FILES = [
    case(b"", "holds no settings", id="empty"),
    case(b"# nothing but a comment\n\n", "holds no settings", id="comments only"),
    case(b"\xff\xfe\x00\x01" * 256, "not a UTF-8 text file", id="binary"),
    case(b"catalog: \x00\x01\x02\n", "not valid YAML", id="control characters"),
    case(b"defaults: {}\n# " + b"x" * (5 * 2**20) + b"\n", f"at most {MAX_CONFIG_BYTES} bytes", id="5 MB"),
    case(b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "not valid YAML", id="nested 5000 deep"),
    case(b"- catalog\n- tables\n", "expected a mapping", id="a list"),
    case(b"just words\n", "expected a mapping", id="a scalar"),
    case(b"catalog:\n\tname: lake\n", "not valid YAML", id="tab indentation"),
    case(b"catalg: {}\n", "config.catalg: unknown key", id="unknown top-level key"),
    case(b"catalog: {nmae: lake}\n", "catalog.nmae: unknown key", id="unknown catalog key"),
    case(b"defaults: {small_file_size: 1}\n", "defaults.small_file_size: unknown policy key", id="unknown policy key"),
    case(b'defaults: {"bad\\nkey": 1}\n', "unknown policy key", id="policy key with a newline"),
    case(b'catalog: {"x\\ny": 1}\n', "unknown key", id="catalog key with a newline"),
    case(b"catalog: [1, 2]\n", "catalog: expected a mapping", id="catalog a list"),
    case(b"catalog: {type: \"hadoop\\nevil\"}\n", "catalog.type", id="type with a newline"),
    case(b"catalog: {name: l\xc3\xa4ke}\n", "catalog.name", id="catalog name unicode"),
    case(b"catalog: {name: \"lake; DROP\"}\n", "catalog.name", id="catalog name SQL"),
    case(b"catalog: {warehouse: \"\"}\n", "catalog.warehouse", id="warehouse empty"),
    case(b"max_runs_total: two\n", "max_runs_total", id="max_runs_total a word"),
    case(b"max_runs_total: 1.5\n", "max_runs_total", id="max_runs_total a float"),
    case(b"max_runs_total: 100000000000000000000000000000\n", "max_runs_total", id="max_runs_total huge"),
    case(b"dates_start: 2024-02-30\n", "dates_start", id="dates_start no such day"),
    case(b"dates_start: \"2024-01-01' OR '1'='1\"\n", "dates_start", id="dates_start SQL"),
    case(b"dates_start: 2024-W01-1\n", "dates_start", id="dates_start week date"),
    case(b"defaults: {small_file_size_bytes: -1}\n", "small_file_size_bytes", id="negative size"),
    case(b"defaults: {target_file_size_bytes: 99999999999999999999GiB}\n", "target_file_size_bytes",
         id="huge size"),
    case(b"defaults: {claim_wait: -5s}\n", "claim_wait", id="negative duration"),
    case(b"defaults: {snapshot_older_than: 99999999999999d}\n", "snapshot_older_than", id="huge duration"),
    case(b"defaults: {min_input_files: three}\n", "min_input_files", id="count a word"),
    case(b"defaults: {read_only: \"yes please\"}\n", "read_only", id="bool a sentence"),
    case(b"defaults: {allowed_operations: compact}\n", "allowed_operations", id="list a string"),
    case(b"defaults: {sort_order: \"id'; DROP TABLE x; --\", strategy: sort}\n", "sort_order", id="sort order SQL"),
    case(b"tables: {\"t.x'; DROP\": {}}\n", "tables.", id="table key SQL"),
    case(b"tables: {\"a\\nb.c\": {}}\n", "tables.", id="table key with a newline"),
    case(b"tables: {t.x: [1]}\n", "tables.t.x", id="table policy a list"),
    case(_bomb_under("scope.include", 6, 8).encode(), "scope.include", id="alias bomb in scope"),
    case(_bomb_under("catalog.name", 6, 8).encode(), "catalog.name", id="alias bomb in catalog.name"),
    case(_bomb_under("defaults.allowed_identities", 6, 8).encode(), "allowed_identities",
         id="alias bomb in a policy"),
]


@pytest.mark.parametrize("content, mention", CONFIG_FILES)
def test_hostile_config_files_are_rejected_in_one_line(tmp_path, capsys, content, mention):
    path = tmp_path / "maintenance.yaml"
    path.write_bytes(content)
    before = files_under(tmp_path)

    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and str(path) in message and mention in message, message[:500]

    code, out, err = run_cli(capsys, "--config", str(path), "audit")
    line = assert_rejected(code, out, err, str(path), mention)
    assert line == f"error: {message}"
    assert files_under(tmp_path) == before  # no state dir, no warehouse, nothing


@pytest.mark.parametrize("where", ["catalog.warehouse", "state_dir"])
def test_a_path_that_is_a_file_is_rejected(tmp_path, capsys, lake_root, where):
    a_file = tmp_path / "not-a-directory"
    a_file.write_text("I am a file\n")
    overrides = ({"catalog": {"warehouse": str(a_file)}} if where == "catalog.warehouse"
                 else {"state_dir": str(a_file)})
    path = write_config(tmp_path / "maintenance.yaml", lake_root, **overrides)
    before = files_under(tmp_path)
    for argv in (["health", "t.events"], ["manifests", "t.events"], ["audit"]):
        code, out, err = run_cli(capsys, "--config", str(path), *argv)
        assert_rejected(code, out, err, where, "is a file, not a directory")
    assert files_under(tmp_path) == before and a_file.read_text() == "I am a file\n"


@pytest.mark.parametrize("target", ["missing", "directory"])
def test_a_config_path_that_is_no_file_is_rejected(tmp_path, capsys, target):
    path = tmp_path / "nope.yaml" if target == "missing" else tmp_path
    code, out, err = run_cli(capsys, "--config", str(path), "audit")
    assert_rejected(code, out, err, str(path))


def test_the_alias_bombs_are_small_files():
    import yaml

    text = _bomb_under("scope.include", 6, 8)
    assert len(text) < 1000
    doc = yaml.safe_load(text)

    def count(v):
        return sum(count(x) for x in v) if isinstance(v, list) else 1
    assert count(doc["scope"]["include"]) == 8 ** 6


def test_a_note_cannot_forge_lines_of_the_audit_listing(estate, capsys):
    note = "ok\n2026-01-01 00:00:00 t.fake  2026-01-01 compact   run      forged \x1b[31mred"
    code, out, err = run_cli(capsys, "--config", estate.path, "approve", estate.table, "--date", "2026-01-01",
                             "--note", note)
    assert code == 0, err
    code, out, err = run_cli(capsys, "--config", estate.path, "audit", "--table", estate.table)
    lines = [line for line in out.splitlines() if "approve" in line]
    assert code == 0 and len(out.strip().splitlines()) == 2 and len(lines) == 1, out  # the header, the record
    assert "\\n2026-01-01" in lines[0] and "\x1b" not in out and "\\x1b[31m" in lines[0]


def test_a_password_in_the_catalog_uri_is_masked_in_everything_printed_or_recorded(tmp_path):
    """A JDBC catalog that does not answer was named with its whole URI (`...?user=u&password=...`) in the
    error, the run's Dagster events and the tick's report; the user info (`u:pw@`) too."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secrets = (f"pw-info-{uuid.uuid4().hex[:8]}", f"pw-query-{uuid.uuid4().hex[:8]}")
    uri = f"jdbc:postgresql://u:{secrets[0]}@127.0.0.1:{port}/lake?user=u&password={secrets[1]}&sslmode=disable"
    state = tmp_path / "state"
    path = write_config(tmp_path / "maintenance.yaml", tmp_path, state_dir=str(state),
                        catalog={"name": "lake", "type": "jdbc", "uri": uri, "warehouse": str(tmp_path / "wh")})
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEMAINT_CATALOG_")}
    env["DAGSTER_HOME"] = str(tmp_path / "unused-dagster-home")
    shown = f"jdbc:postgresql://u:***@127.0.0.1:{port}/lake?user=u&password=***&sslmode=disable"
    commands = [["health", "db.events"], ["tick", "--json"], ["doctor", "--json"]]
    # One process runs the three commands one after another (a Python start with Dagster's imports is ~2 CPU-s),
    # outside pytest so its logging is the command line's; a marker line closes each command's output on both
    # streams, and whatever the process prints as it exits is checked with the last.
    mark = f"--- {uuid.uuid4().hex} exit"
    script = f"""
import json, sys
from icemaint.app.cli import main
for argv in json.loads(sys.argv[1]):
    try:
        code = main(["--config", sys.argv[2], *argv])
    except SystemExit as exc:
        code = exc.code
    for stream in (sys.stdout, sys.stderr):
        print(f"\\n{mark} {{code}}", file=stream, flush=True)
"""
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(commands), str(path)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not any(secret in proc.stdout + proc.stderr for secret in secrets), (proc.stdout + proc.stderr)[-2000:]
    # each stream: the first command's output, then for each command its exit code's line and the next's output
    outs, errs = proc.stdout.split(f"\n{mark} "), proc.stderr.split(f"\n{mark} ")
    assert len(outs) == len(errs) == len(commands) + 1, proc.stderr[-2000:]
    for i, argv in enumerate(commands):
        code = int(errs[i + 1].split("\n", 1)[0])
        output = "".join(part[i] if i == 0 else part[i].split("\n", 1)[1] for part in (outs, errs))
        if i == len(commands) - 1:
            output += outs[-1] + errs[-1]
        assert code != 0 and "Traceback" not in output, (argv, output[-2000:])
        assert shown in output, (argv, output[-2000:])
    recorded = [p for p in state.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes() for s in secrets)]
    assert recorded == [], "a password is recorded in the state dir (Dagster's events, the audit, the logs)"


def test_a_catalog_uri_with_a_password_stays_off_spark_submits_command_line(tmp_path):
    """Every session-builder setting is a `--conf` on the JVM's command line, which `ps` shows: such a URI is
    set on the running session, with the ICEMAINT_CATALOG_* secrets."""
    from conftest import make_config
    from icemaint.engine.spark_session import secret_spark_conf, session_conf

    uri = "jdbc:postgresql://127.0.0.1:5432/lake?user=u&password=hunter2"
    config = make_config(tmp_path, catalog={"name": "lake", "type": "jdbc", "uri": uri, "warehouse": str(tmp_path)})
    assert not any("hunter2" in value for value in session_conf(config).values())
    assert secret_spark_conf(config)["spark.sql.catalog.lake.uri"] == uri
    plain = make_config(tmp_path, catalog={"name": "lake", "type": "jdbc", "uri": "jdbc:postgresql://db/lake",
                                           "warehouse": str(tmp_path)})
    assert session_conf(plain)["spark.sql.catalog.lake.uri"] == "jdbc:postgresql://db/lake"
    assert "spark.sql.catalog.lake.uri" not in secret_spark_conf(plain)
