"""What an AI agent (`icemaint mcp`) may ask for, and how much: pure decisions over the policy and its past requests.

An agent is a configured name (`agents:` in the config). Its requests pass the same policy gates as any run
(`decisions.refusal_for` with the agent trigger, so `agent_operations` applies) and, before that, its own limits:
requests per hour and rewrite bytes per day, counted from its past requests in the audit log. A runaway agent
gets refusals, not a compute bill.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Iterable

from icemaint.domain.decisions import refusal_for
from icemaint.domain.verdicts import AGENT_TRIGGER
from icemaint.domain.policy import AGENT_OPERATIONS, OPERATIONS, TablePolicy
from icemaint.domain.units import counted, human_size

# An agent's name is its identity in audit records and `allowed_identities`: short, printable, no spaces.
AGENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")
DEFAULT_REQUESTS_PER_HOUR = 60
DEFAULT_REWRITE_BYTES_PER_DAY = 10 * 2**30  # the default max_rewrite_bytes: one ceiling's worth a day
# How a request's reason and kind are kept in its audit record's details.
AGENT_REQUEST_KEY, AGENT_REASON_KEY = "agent_request", "agent_reason"
RATE_LIMITED = "rate_limited"
HOUR, DAY = dt.timedelta(hours=1), dt.timedelta(days=1)


@dataclass(frozen=True)
class AgentSpec:
    """One configured agent. `token_env` names the variable holding its HTTP bearer token (never the token)."""

    name: str
    token_env: str | None = None
    requests_per_hour: int = DEFAULT_REQUESTS_PER_HOUR
    rewrite_bytes_per_day: int = DEFAULT_REWRITE_BYTES_PER_DAY


@dataclass(frozen=True)
class PastRequest:
    """One of the agent's past requests, as its audit record tells it."""

    at: dt.datetime
    rewrite_bytes: int = 0        # the estimate of a launched compaction (0 for anything that launched nothing)
    rate_limited: bool = False    # refused by the limits themselves: not counted against them


@dataclass(frozen=True)
class Usage:
    requests_last_hour: int
    rewrite_bytes_last_day: int

    def to_dict(self, agent: AgentSpec) -> dict[str, int]:
        return {"requests_last_hour": self.requests_last_hour, "requests_per_hour": agent.requests_per_hour,
                "rewrite_bytes_last_day": self.rewrite_bytes_last_day,
                "rewrite_bytes_per_day": agent.rewrite_bytes_per_day}


def usage(past: Iterable[PastRequest], now: dt.datetime) -> Usage:
    """Requests in the last hour and launched rewrite bytes in the last day. A request the limits refused does not
    count: an agent that keeps asking while limited is not locked out for longer than its window."""
    counted_past = [p for p in past if not p.rate_limited and p.at <= now]
    return Usage(sum(1 for p in counted_past if now - p.at < HOUR),
                 sum(p.rewrite_bytes for p in counted_past if now - p.at < DAY))


def request_limit_refusal(agent: AgentSpec, used: Usage) -> str | None:
    """Why one more request of `agent` is refused by its hourly limit, or None."""
    if used.requests_last_hour >= agent.requests_per_hour:
        return (f"rate limit: agent {agent.name!r} made {counted(used.requests_last_hour, 'request')} in the last hour "
                f"(requests_per_hour {agent.requests_per_hour}); ask again later")
    return None


def rewrite_budget_refusal(agent: AgentSpec, used: Usage, rewrite_bytes: int) -> str | None:
    """Why launching a rewrite of `rewrite_bytes` would exceed the agent's daily rewrite budget, or None."""
    if used.rewrite_bytes_last_day + rewrite_bytes > agent.rewrite_bytes_per_day:
        return (f"rate limit: a rewrite of {human_size(rewrite_bytes)} would bring agent {agent.name!r} to "
                f"{human_size(used.rewrite_bytes_last_day + rewrite_bytes)} in the last day (rewrite_bytes_per_day "
                f"{human_size(agent.rewrite_bytes_per_day)}; {human_size(used.rewrite_bytes_last_day)} used)")
    return None


def operation_refusal(policy: TablePolicy, operation: str, agent: str) -> str | None:
    """Why agent `agent` may not request `operation` on a table under `policy`, or None when it may."""
    if operation not in AGENT_OPERATIONS:
        return f"operation {operation!r} is never offered to agents (agents may ask for: {', '.join(AGENT_OPERATIONS)})"
    return refusal_for(policy, operation, agent, AGENT_TRIGGER)


def permissions(policy: TablePolicy, agent: str) -> dict[str, str | None]:
    """Every operation -> None when the agent may request it on the table, else why not."""
    return {op: operation_refusal(policy, op, agent) for op in OPERATIONS}


# How an agent's run is launched: submitted to the instance's run queue when a daemon serves it (the run waits
# there, shows in the UI, and a run worker of the daemon's code location executes it), else executed in the
# server's own process. A daemon beats every 30 s (Dagster's heartbeat interval); missing four beats, it is taken
# for gone: a run submitted then would wait in the queue until someone starts one.
QUEUED, IN_PROCESS = "queued", "in_process"
DAEMON_HEARTBEAT_TOLERANCE_S = 120.0


@dataclass(frozen=True)
class LaunchMode:
    mode: str     # QUEUED or IN_PROCESS
    why: str      # one line for the agent and the operator: why this mode


def launch_mode(queued_coordinator: bool, heartbeat_age_s: float | None, code_location: str | None,
                tolerance_s: float = DAEMON_HEARTBEAT_TOLERANCE_S) -> LaunchMode:
    """QUEUED when the instance's coordinator queues runs, its run-queue daemon beat within `tolerance_s`
    (`heartbeat_age_s`: seconds since its last beat, None when it never beat) and the daemon's code location is
    known by name; else IN_PROCESS, saying which of these is missing."""
    if not queued_coordinator:
        return LaunchMode(IN_PROCESS, "the instance's run coordinator does not queue runs")
    if heartbeat_age_s is None:
        return LaunchMode(IN_PROCESS, "no Dagster daemon serves the instance's run queue (none has ever run: "
                                      "`icemaint ui` starts one)")
    if heartbeat_age_s > tolerance_s:
        return LaunchMode(IN_PROCESS, f"no Dagster daemon serves the instance's run queue (its last heartbeat was "
                                      f"{heartbeat_age_s:.0f} s ago, over {tolerance_s:.0f} s)")
    if not code_location:
        return LaunchMode(IN_PROCESS, "the daemon's code location is unknown (no workspace.yaml beside maint_assets/)")
    return LaunchMode(QUEUED, f"submitted to the run queue, served by a Dagster daemon (last heartbeat "
                              f"{max(heartbeat_age_s, 0):.0f} s ago), to run in code location {code_location}")
