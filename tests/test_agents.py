"""What an agent may ask for and how much (pure): agent_operations, the agent trigger in the decisions, the limits
counted from past requests, and the config's `agents:` section."""

from __future__ import annotations

import datetime as dt

import pytest

from icemaint.config import parse_config
from icemaint.config.parse import ConfigError
from icemaint.domain.agents import IN_PROCESS, QUEUED, AgentSpec, PastRequest, launch_mode, operation_refusal, \
    permissions, request_limit_refusal, rewrite_budget_refusal, usage
from icemaint.domain.decisions import refusal_for
from icemaint.domain.verdicts import AGENT_TRIGGER, AUTOMATIC_TRIGGERS, REFUSE, launched_by_a_person
from icemaint.domain.policy import PolicyError, TablePolicy, apply_overrides

NOW = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.timezone.utc)
GIVEN = TablePolicy(agent_operations=frozenset({"compact", "expire"}))


def test_agents_are_given_no_operation_by_default():
    assert TablePolicy().agent_operations == frozenset()
    assert refusal_for(TablePolicy(), "compact", "bot", AGENT_TRIGGER) == (
        "operation 'compact' is not given to agents by policy (agent_operations: none)")
    assert refusal_for(TablePolicy(), "compact", "bot") is None  # a person or a sensor: unchanged


@pytest.mark.parametrize("policy, operation, expected", [
    (GIVEN, "compact", None),
    (GIVEN, "manifests", "not given to agents by policy (agent_operations: compact, expire)"),
    (GIVEN, "orphans", "never offered to agents"),
    (GIVEN, "revert", "never offered to agents"),
    (GIVEN, "purge_quarantine", "never offered to agents"),
    (TablePolicy(agent_operations=frozenset({"compact"}), allowed_identities=frozenset({"alice"})), "compact",
     "identity 'bot' is not allowed by policy (allowed_identities: alice)"),
    (TablePolicy(agent_operations=frozenset({"compact"}), read_only=True), "compact", "read-only"),
    (TablePolicy(agent_operations=frozenset({"compact"}), allowed_operations=frozenset({"expire"})), "compact",
     "operation 'compact' is not allowed by policy"),
])
def test_operation_refusal(policy, operation, expected):
    refused = operation_refusal(policy, operation, "bot")
    assert (refused is None) if expected is None else expected in refused


def test_permissions_name_every_operation():
    allowed = permissions(GIVEN, "bot")
    assert {op for op, why in allowed.items() if why is None} == {"compact", "expire"}
    assert set(allowed) == {"compact", "expire", "orphans", "manifests", "statistics", "revert", "ingest"}


def test_an_agent_does_not_wait_like_a_person():
    assert AGENT_TRIGGER in AUTOMATIC_TRIGGERS and not launched_by_a_person(AGENT_TRIGGER)


def test_the_compaction_decision_refuses_an_agent_the_policy_gives_nothing():
    from dataclasses import replace

    from test_decisions import DAY, NOW as DNOW, POLICY, SMALL3, health
    from icemaint.domain.decisions import Gates, decide_compaction
    from icemaint.domain.verdicts import RUN

    h = health(SMALL3)
    agent = Gates(now=DNOW, identity="bot", trigger=AGENT_TRIGGER)
    refused = decide_compaction(h, DAY, POLICY, agent)
    assert refused.verdict == REFUSE and "agent_operations: none" in refused.reason
    assert decide_compaction(h, DAY, replace(POLICY, agent_operations=frozenset({"compact"})), agent).verdict == RUN


@pytest.mark.parametrize("value, message", [
    (["orphans"], "cannot be given to agents"),
    (["revert", "compact"], "cannot be given to agents"),
    (["rollback"], "not allowed; agent operations"),
    ("compact", "is not a list"),
])
def test_agent_operations_key_refuses_what_agents_never_get(value, message):
    with pytest.raises(PolicyError) as info:
        apply_overrides(TablePolicy(), {"agent_operations": value}, "tables.db.t")
    assert str(info.value).startswith("tables.db.t.agent_operations: ") and message in str(info.value)


def _past(minutes_ago: float, rewrite_bytes: int = 0, rate_limited: bool = False) -> PastRequest:
    return PastRequest(NOW - dt.timedelta(minutes=minutes_ago), rewrite_bytes, rate_limited)


def test_usage_counts_the_windows_and_leaves_out_rate_limited_requests():
    past = [_past(5, 100), _past(59), _past(61, 1000), _past(23 * 60, 10), _past(25 * 60, 99999),
            _past(1, rate_limited=True)]
    used = usage(past, NOW)
    assert used.requests_last_hour == 2 and used.rewrite_bytes_last_day == 1110


@pytest.mark.parametrize("requests, refused", [(2, False), (3, True), (4, True)])
def test_request_limit(requests, refused):
    agent = AgentSpec("bot", requests_per_hour=3)
    why = request_limit_refusal(agent, usage([_past(1)] * requests, NOW))
    assert (why is not None) == refused
    if refused:
        assert why.startswith("rate limit: agent 'bot' made") and "requests_per_hour 3" in why


def test_rewrite_budget():
    agent = AgentSpec("bot", rewrite_bytes_per_day=1000)
    used = usage([_past(60, 600)], NOW)
    assert rewrite_budget_refusal(agent, used, 400) is None
    assert "rewrite_bytes_per_day 1000 B" in rewrite_budget_refusal(agent, used, 401)


def _config(agents, tmp_path):
    return parse_config({"state_dir": str(tmp_path), "agents": agents}, tmp_path)


def test_agents_section_is_read(tmp_path):
    cfg = _config({"ops-bot": {"token_env": "OPS_BOT_TOKEN", "requests_per_hour": 5,
                               "rewrite_bytes_per_day": "1GiB"}, "reader": None}, tmp_path)
    assert cfg.agents["ops-bot"] == AgentSpec("ops-bot", "OPS_BOT_TOKEN", 5, 2**30)
    assert cfg.agents["reader"] == AgentSpec("reader")
    assert parse_config({"state_dir": str(tmp_path)}, tmp_path).agents == {}


@pytest.mark.parametrize("agents, message", [
    ({"bot": {"token": "s3cr3t-value"}}, "agents.bot.token: a bearer token is a secret and is not read from the file"),
    ({"bot": {"token_env": "not a name"}}, "agents.bot.token_env: 'not a name' is not an environment variable name"),
    ({"bot": {"requests_per_hour": 0}}, "agents.bot.requests_per_hour: 0 must be a whole number from 1"),
    ({"bot": {"requests_per_hour": True}}, "agents.bot.requests_per_hour: True must be"),
    ({"bot": {"rewrite_bytes_per_day": "lots"}}, "agents.bot.rewrite_bytes_per_day: "),
    ({"bot": {"tokens_env": "X"}}, "agents.bot.tokens_env: unknown key; allowed: token_env, requests_per_hour"),
    ({"a bot": {}}, "agents.a bot: an agent's name is its identity"),
    (["bot"], "agents: expected a mapping"),
])
def test_a_bad_agents_section_is_one_line_naming_the_key(agents, message, tmp_path):
    with pytest.raises(ConfigError) as info:
        _config(agents, tmp_path)
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text and "s3cr3t-value" not in text


@pytest.mark.parametrize("queued, age, location, mode, why", [
    (True, 5.0, "maint_assets.definitions", QUEUED, "last heartbeat 5 s ago"),
    (True, 119.0, "maint_assets.definitions", QUEUED, "code location maint_assets.definitions"),
    (True, 121.0, "maint_assets.definitions", IN_PROCESS, "last heartbeat was 121 s ago, over 120 s"),
    (True, None, "maint_assets.definitions", IN_PROCESS, "none has ever run"),
    (False, 5.0, "maint_assets.definitions", IN_PROCESS, "does not queue runs"),
    (True, 5.0, None, IN_PROCESS, "code location is unknown"),
])
def test_an_agents_run_is_queued_only_while_a_daemon_serves_the_queue(queued, age, location, mode, why):
    decided = launch_mode(queued, age, location)
    assert decided.mode == mode and why in decided.why, decided
