"""`icemaint --help` as people know it from gh and kubectl: a description and examples per command, help for every
flag (the examples themselves parse); `audit` newest first under a header; deferrals with a hint of what lets them
go. Pure: no Java, no Spark."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex

import pytest

from conftest import run_cli, write_config
from icemaint.app.cli import build_parser
from icemaint.app.cli_estate import audit_header
from icemaint.app.cli_help import COMMANDS
from icemaint.domain.decisions import Decision
from icemaint.domain.verdicts import ReasonKind, Verdict
from icemaint.domain.hints import decision_hint, hint
from icemaint.safety.audit import AuditRecord, open_audit
from icemaint.config import load_config

pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_command_has_a_description_examples_and_help_on_every_flag():
    commands = subcommands()
    assert set(commands) == set(COMMANDS), "a command without its words in cli_help.COMMANDS, or the reverse"
    for name, parser in commands.items():
        assert parser.description and len(parser.description) > 60, name
        assert parser.epilog.startswith("Examples:\n  icemaint"), name
        bare = [a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction) and not a.help]
        assert not bare, f"icemaint {name}: no help for {bare}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_example_parses(name):
    """An example that names a flag the parser no longer has fails here, not in a reader's terminal."""
    parser = build_parser()
    for line in COMMANDS[name].examples:
        argv = shlex.split(line.split("  #")[0].split(" | ")[0])
        assert argv[0] == "icemaint", line
        args = parser.parse_args(argv[1:])
        assert args.command == name, line


def test_help_shows_the_description_and_examples(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["audit", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "Newest first under a\nheader" in out and "Examples:\n  icemaint audit --limit 20" in out
    assert "--oldest-first" in out and "at most N records, the newest" in out


def _records(state_dir) -> list[str]:
    """Three audit records a minute apart, oldest first."""
    config = load_config(state_dir)
    audit = open_audit(config)
    start = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.timezone.utc)
    for n, decision in enumerate(("defer", "run", "noop")):
        audit.append(AuditRecord(ts=start + dt.timedelta(minutes=n), table="db.events", operation="compact",
                                 decision=decision, reason=f"record {n}", date="2026-11-27"))
    return ["record 0", "record 1", "record 2"]


def test_audit_prints_a_header_then_newest_first_and_oldest_first_on_request(capsys, tmp_path, lake_root):
    path = write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))
    reasons = _records(path)

    code, out, err = run_cli(capsys, "--config", str(path), "audit")
    lines = out.splitlines()
    assert code == 0 and lines[0] == audit_header() and lines[0].startswith("TIME (UTC)"), out
    assert [line.rsplit(" ", 2)[-2:] for line in lines[1:]] == [r.split() for r in reversed(reasons)], out

    code, out, err = run_cli(capsys, "--config", str(path), "audit", "--oldest-first", "--limit", "2")
    assert code == 0 and [line.split()[-1] for line in out.splitlines()[1:]] == ["1", "2"], out  # the newest 2

    code, out, err = run_cli(capsys, "--config", str(path), "audit", "--json")
    assert [r["reason"] for r in json.loads(out)] == list(reversed(reasons))

    code, out, err = run_cli(capsys, "--config", str(path), "audit", "--table", "db.other")
    assert code == 0 and out == "" and err.strip() == "no audit records for db.other"


def _decision(kind: ReasonKind, verdict=Verdict.DEFER, **fields) -> Decision:
    return Decision(table="db.events", operation="compact", verdict=verdict, reason="...", date="2026-11-27",
                    kind=kind, **fields)


def test_a_writer_deferral_says_when_it_goes_and_which_key_sets_the_window():
    writer = {"scope": "partition", "partition": "2026-11-27", "seconds_since_writer_commit": 40.0,
              "writer_idle_seconds": 300.0, "idle": False}
    said = hint(_decision(ReasonKind.WRITER_ACTIVE, writer_check=writer))
    assert "after 5m without writer commits on 2026-11-27" in said and "about 4.3m from now" in said, said
    assert "tables.db.events.writer_idle" in said and "writer_scope" not in said
    table_wide = hint(_decision(ReasonKind.WRITER_ACTIVE, writer_check={**writer, "scope": "table"}))
    assert "on the table" in table_wide and "writer_scope: partition" in table_wide


@pytest.mark.parametrize("kind, says", [
    (ReasonKind.AWAITING_APPROVAL, "icemaint approve db.events --date 2026-11-27"),
    (ReasonKind.AWAITING_APPROVAL, "max_rewrite_bytes"),
    (ReasonKind.REVERTED, "icemaint approve db.events --date 2026-11-27"),
    (ReasonKind.PROOF_FAILED, "icemaint explain db.events --date 2026-11-27"),
    (ReasonKind.HOT_PARTITION, "hot_partition_age"),
    (ReasonKind.CLAIM_BUSY, "claim_wait"),
    (ReasonKind.TICK_BUDGET, "max_runs_total"),
])
def test_each_deferral_kind_names_what_lets_it_go(kind, says):
    assert says in hint(_decision(kind))


def test_a_refusal_names_the_policy_keys_and_runs_and_noops_get_no_hint():
    assert "allowed_operations" in hint(_decision(ReasonKind.POLICY, verdict=Verdict.REFUSE))
    assert hint(_decision(ReasonKind.DUE, verdict=Verdict.RUN)) is None
    assert hint(_decision(ReasonKind.BELOW_THRESHOLDS, verdict=Verdict.NOOP)) is None
    # as the CLI builds it from a run's outcome (its decision_detail), an unknown kind gives none
    assert decision_hint("defer", "awaiting_approval", "db.t", None).startswith("to let it run: icemaint approve db.t ")
    assert decision_hint("defer", "not_a_kind", "db.t", None) is None
