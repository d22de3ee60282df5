"""An agent's arguments, checked before anything is decided (pure): each bad one is refused with one line naming it;
a good one comes back in its canonical form. The MCP test sends the hostile ones through the server."""

from __future__ import annotations

import datetime as dt

import pytest

from icemaint.app import agent_requests as inputs
from icemaint.app.agent_requests import AgentInputError
from icemaint.config import parse_config
from icemaint.domain.scope import InvalidDate
from icemaint.errors import UsageError

TODAY = dt.date(2026, 11, 28)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent_requests")
    return parse_config({"state_dir": str(root), "dates_start": "2026-01-01",
                         "scope": {"include": ["shop.*"]}}, root)


@pytest.mark.parametrize("check, value, message", [
    (inputs.reason, None, "give a reason"),
    (inputs.reason, "  \n", "give a reason"),
    (inputs.reason, "x" * 1001, "a reason is at most 1000 characters (this one has 1001)"),
    (inputs.run_id, "../../etc/passwd", "run id '../../etc/passwd' is not a run id (a UUID)"),
    (inputs.audit_limit, 0, "limit 0 must be a whole number from 1 to 100"),
    (inputs.audit_limit, 101, "limit 101 must be a whole number from 1 to 100"),
    (inputs.audit_limit, True, "limit True must be a whole number"),
    (inputs.audit_limit, "5", "limit '5' must be a whole number"),
    (inputs.retention_operation, "orphans", "'orphans' is not a retention request: one of expire, manifests, statistics"),
    (lambda dates: inputs.request_dates(dates, str), "2026-11-01", "dates must be a list of 1 to 31 dates"),
    (lambda dates: inputs.request_dates(dates, str), [], "dates must be a list of 1 to 31 dates"),
    (lambda dates: inputs.request_dates(dates, str), ["2026-11-01"] * 32, "dates must be a list of 1 to 31 dates"),
])
def test_a_bad_argument_is_refused_in_one_line(check, value, message):
    with pytest.raises(AgentInputError, match="^" + message.replace("(", r"\(").replace(")", r"\)")) as caught:
        check(value)
    assert "\n" not in str(caught.value) and isinstance(caught.value, UsageError)


def test_good_arguments_come_back_canonical(config):
    assert inputs.reason("  D3 has small files \n") == "D3 has small files"
    assert inputs.run_id("0F8FAD5B-D9CB-469F-A165-70867728950E") == "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert inputs.audit_limit(100) == 100 and inputs.retention_operation("expire") == "expire"
    date = lambda text: inputs.request_date(config, TODAY, text)  # noqa: E731
    assert inputs.request_dates(None, date) is None
    assert inputs.request_dates(["2026-11-29", "2026-01-01", "2026-11-29"], date) == ["2026-11-29", "2026-01-01"]


@pytest.mark.parametrize("text, error, message", [
    ("2026-11-30", InvalidDate, "after the maintained range, which ends at 2026-11-29"),  # tomorrow is the last
    ("2025-12-31", InvalidDate, "before the maintained range, which starts at 2026-01-01"),
    ("today; rm -rf /", InvalidDate, "is not a calendar date"),
])
def test_a_date_is_within_the_maintained_range(config, text, error, message):
    with pytest.raises(error, match=message):
        inputs.request_date(config, TODAY, text)


@pytest.mark.parametrize("text, message", [
    (42, "table 42 is not a string"),
    ("other.orders", "table other.orders is not in this server's scope"),
])
def test_a_table_outside_the_scope_is_refused_before_the_catalog_is_read(config, text, message):
    with pytest.raises(AgentInputError, match=message):
        inputs.table_key(config, text)
