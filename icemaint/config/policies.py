"""The `defaults:` and `tables:` sections: the policy every table gets and the per-table overrides, as a
`PolicyBook`, with sizes and ages bounded to what Iceberg and date arithmetic can hold.
"""

from __future__ import annotations

from typing import Any

from icemaint.config.parse import ConfigError, key_name, mapping
from icemaint.domain.names import InvalidTableName, TableName
from icemaint.domain.policy import POLICY_KEYS, PolicyBook, PolicyError, TablePolicy, apply_overrides
from icemaint.domain.units import MAX_DURATION_SECONDS, MAX_SIZE_BYTES, human_size, parse_duration, parse_size


def parse_policies(defaults_value: Any, tables_value: Any) -> PolicyBook:
    try:
        defaults = apply_overrides(TablePolicy(), mapping(defaults_value, "defaults"), "defaults")
        _check_bounds(defaults, "defaults")
        tables = {}
        for name, overrides in mapping(tables_value, "tables").items():
            try:
                key = TableName.parse(str(name)).key
            except InvalidTableName as exc:
                raise ConfigError(f"tables.{key_name(name)}: {exc}") from None
            where = f"tables.{key}"
            tables[key] = apply_overrides(defaults, mapping(overrides, where), where)
            _check_bounds(tables[key], where)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    return PolicyBook(defaults, tables)


def _check_bounds(policy: TablePolicy, where: str) -> None:
    """Sizes that fit a Java long (they reach Iceberg as one) and ages date arithmetic can hold; a file group that
    can hold a file."""
    for key, (attr, parse) in POLICY_KEYS.items():
        value = getattr(policy, attr)
        if parse is parse_size and isinstance(value, int) and value > MAX_SIZE_BYTES:
            raise ConfigError(f"{where}.{key}: {value} bytes is too large; at most {MAX_SIZE_BYTES} (a Java long)")
        if parse is parse_duration and isinstance(value, (int, float)) and value > MAX_DURATION_SECONDS:
            raise ConfigError(f"{where}.{key}: {value:g} seconds is too long; at most 100 years")
    if policy.max_file_group_size_bytes <= 0:
        raise ConfigError(f"{where}.max_file_group_size_bytes: {human_size(policy.max_file_group_size_bytes)} holds "
                          "no file: with partial_progress no date would ever be compacted; give a size such as 10GiB")
