"""The `agents:` section: the AI agents `icemaint mcp` serves, by name (their identity), each with its bearer
token's variable and its budgets. The token itself stays in the environment, never in the file.
"""

from __future__ import annotations

from typing import Any

from icemaint.config.keys import section_keys
from icemaint.config.parse import ConfigError, env_name, key_name, mapping, only, size, whole_number
from icemaint.domain.agents import AGENT_NAME, DEFAULT_REQUESTS_PER_HOUR, DEFAULT_REWRITE_BYTES_PER_DAY, AgentSpec

_AGENT_KEYS = section_keys("agents.<name>")


def parse_agents(value: Any) -> dict[str, AgentSpec]:
    """`agents:` name -> {token_env, requests_per_hour, rewrite_bytes_per_day}."""
    out = {}
    for name, settings in mapping(value, "agents").items():
        if not isinstance(name, str) or not AGENT_NAME.fullmatch(name):
            raise ConfigError(f"agents.{key_name(name)}: an agent's name is its identity: a letter, then up to 63 "
                              "letters, digits, '_', '.' or '-'")
        where = f"agents.{name}"
        section = mapping(settings, where)
        if "token" in section:  # the token itself: never repeat it in a message
            raise ConfigError(f"{where}.token: a bearer token is a secret and is not read from the file; set it in "
                              f"the environment and name the variable in {where}.token_env")
        only(section, _AGENT_KEYS, where)
        env = section.get("token_env")
        token_env = None if env is None else env_name(env, f"{where}.token_env", "the token")
        per_hour = whole_number(section.get("requests_per_hour", DEFAULT_REQUESTS_PER_HOUR),
                                f"{where}.requests_per_hour", 1, 1_000_000)
        per_day = size(section.get("rewrite_bytes_per_day", DEFAULT_REWRITE_BYTES_PER_DAY),
                       f"{where}.rewrite_bytes_per_day")
        out[name] = AgentSpec(name, token_env, per_hour, per_day)
    return out
