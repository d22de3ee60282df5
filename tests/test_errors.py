"""One error tree: the operator's input (exit 2) apart from operational failures (exit 1) apart from bugs
(exit 1, one line naming the log that holds the trace); and an exception as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli, write_config
from icemaint.errors import IcemaintError, OperationalError, UsageError, UserError, is_user_error, one_line

pytestmark = pytest.mark.usefixtures("isolated_dagster_home")


def _classes():
    from icemaint.app.simulator import LedgerBehindTable, SchemaMismatch
    from icemaint.config.parse import ConfigError
    from icemaint.domain.names import InvalidTableName
    from icemaint.domain.policy import PolicyError
    from icemaint.domain.retention import (ConcurrentExpiry, GcDisabled, QuarantineMoveFailed, RetentionError,
                                           StaleExpiryPlan)
    from icemaint.domain.rewrite_plan import SortOrderError
    from icemaint.domain.scope import InvalidDate
    from icemaint.domain.statistics import StatisticsError
    from icemaint.engine.retention import RetentionCommitUnknown, RetentionConflict
    from icemaint.engine.revert import RevertRefused
    from icemaint.engine.spark_session import JavaMissing, PackagesUnresolved, SparkDidNotStart, UnsupportedIceberg
    from icemaint.engine.staging_errors import PublishConflict, PublishStateUnknown, StagingError
    from icemaint.engine.statistics import StatisticsSnapshotGone
    from icemaint.engine.validation import ValidationError
    from icemaint.observe.catalog import CatalogDenied, CatalogUnavailable, TableNotFound, WarehouseMissing
    from icemaint.operations.compaction import CompactionError
    from icemaint.safety.approvals import ApprovalRefused
    from icemaint.safety.audit import AuditLogCorrupt
    from icemaint.safety.claims import ClaimBusy

    user = [(ConfigError, ValueError), (InvalidTableName, ValueError), (InvalidDate, ValueError),
            (TableNotFound, LookupError), (PolicyError, ValueError), (SortOrderError, ValueError),
            (StatisticsError, ValueError), (RetentionError, ValueError), (GcDisabled, ValueError),
            (RevertRefused, ValueError), (ValidationError, ValueError), (ApprovalRefused, PermissionError),
            (UsageError, ValueError)]
    operational = [(CatalogUnavailable, RuntimeError), (WarehouseMissing, RuntimeError),
                   (CatalogDenied, RuntimeError), (ClaimBusy, Exception), (JavaMissing, RuntimeError),
                   (UnsupportedIceberg, RuntimeError), (PackagesUnresolved, RuntimeError),
                   (SparkDidNotStart, RuntimeError),
                   (StagingError, RuntimeError), (PublishConflict, RuntimeError), (PublishStateUnknown, RuntimeError),
                   (StatisticsSnapshotGone, RuntimeError), (RetentionConflict, RuntimeError),
                   (RetentionCommitUnknown, RuntimeError), (AuditLogCorrupt, RuntimeError),
                   (CompactionError, RuntimeError), (SchemaMismatch, RuntimeError), (LedgerBehindTable, RuntimeError),
                   (StaleExpiryPlan, ValueError), (ConcurrentExpiry, ValueError), (QuarantineMoveFailed, ValueError)]
    return [(cls, kept, "user") for cls, kept in user] + [(cls, kept, "operational") for cls, kept in operational]


@pytest.mark.parametrize("cls, kept, kind", _classes(), ids=lambda v: getattr(v, "__name__", v))
def test_every_error_of_ours_is_in_one_family_and_keeps_its_old_base(cls, kept, kind):
    """Callers that catch the old bases (ValueError, LookupError, ...) still do; the CLI maps by the family."""
    assert issubclass(cls, IcemaintError) and issubclass(cls, kept)
    assert issubclass(cls, OperationalError if kind == "operational" else UserError)
    error = cls.__new__(cls)
    assert is_user_error(error) is (kind == "user"), "a retention failure that is a RetentionError is operational"


@pytest.mark.parametrize("value, limit, expected", [
    (ValueError("first\nsecond"), 300, "first"),
    (ValueError("\n\n  padded  \nrest"), 300, "padded"),
    (RuntimeError(""), 300, ""),
    (None, 300, ""),
    ("x" * 50, 10, "xxxxxxx..."),
    (OSError("catalog at jdbc:postgresql://db/lake?user=u&password=hunter2 did not answer"), 300,
     "catalog at jdbc:postgresql://db/lake?user=u&password=*** did not answer"),
])
def test_one_line_is_the_first_line_cut_and_masked(value, limit, expected):
    assert one_line(value, limit) == expected


@pytest.fixture
def cli_config(tmp_path, lake_root) -> Path:
    return write_config(tmp_path / "maintenance.yaml", lake_root, state_dir=str(tmp_path / "state"))


def test_a_bug_is_one_line_naming_the_log_and_exit_1_not_the_users_mistake(capsys, cli_config, tmp_path,
                                                                            monkeypatch):
    """A plain ValueError from inside a command used to read as bad input (exit 2)."""
    import icemaint.app.cli as cli

    def broken(config, args):
        raise ValueError("invalid literal for int() with base 10: 'x'\nsecond line")

    monkeypatch.setattr(cli, "cmd_audit", broken)
    code, out, err = run_cli(capsys, "--config", str(cli_config), "audit")
    log = tmp_path / "state" / "logs" / "cli.log"
    assert code == 1, err
    assert "Traceback" not in out + err
    [line] = err.strip().splitlines()
    assert line == (f"error: icemaint audit failed on a bug: ValueError: invalid literal for int() with base 10: "
                    f"'x'; its trace is in {log} (please report it with that file)")
    assert "Traceback" in log.read_text() and "in broken" in log.read_text()


@pytest.mark.parametrize("argv, says", [
    (["audit", "--operation", "nonsense"], "--operation 'nonsense' is not an operation"),
    (["tick", "--max-ticks", "3"], "--max-ticks bounds --until-idle"),
    (["audit", "--table", "no_namespace"], "table name"),
])
def test_bad_input_still_exits_2_with_one_line(capsys, cli_config, argv, says):
    code, out, err = run_cli(capsys, "--config", str(cli_config), *argv)
    [line] = err.strip().splitlines()
    assert code == 2 and line.startswith("error: ") and says in line, err


def test_an_operational_failure_exits_1_with_one_line(capsys, cli_config, monkeypatch):
    import icemaint.app.cli as cli
    from icemaint.safety.claims import ClaimBusy

    def busy(config, args):
        raise ClaimBusy("db.events")

    monkeypatch.setattr(cli, "cmd_audit", busy)
    code, out, err = run_cli(capsys, "--config", str(cli_config), "audit")
    [line] = err.strip().splitlines()
    assert code == 1 and line.startswith("error: ") and "db.events" in line and "bug" not in line, err
