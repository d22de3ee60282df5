"""The config file's parsing primitives: one value of the YAML document checked and made typed, or a `ConfigError`
naming its key (a dotted path such as `landing.events.min_files`) and the value, shown bounded.

Every section's parser is built from these, so a count, a size, a duration or a variable's name is checked, and
refused, the same way wherever the file takes one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from icemaint.domain.units import MAX_DURATION_SECONDS, MAX_SIZE_BYTES, human_size, parse_duration, parse_size, shown
from icemaint.errors import UserError

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # whole: "$" would let "AB\n" by
_T = TypeVar("_T")
# Every character str.splitlines() breaks on: a message is one line, whatever the file held.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


class ConfigError(UserError, ValueError):
    """The configuration file is missing or has a bad key or value; the message names both."""


def one_line(text: str) -> str:
    return text.translate(_LINE_BREAKS)


def key_name(key: Any) -> str:
    """A mapping key as it is named in messages (quoted when it is not a plain printable string)."""
    return key if isinstance(key, str) and key.isprintable() and key else repr(key)


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {shown(value)}")
    return value


def only(section: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in section:
        if key not in allowed:
            raise ConfigError(f"{where}.{key_name(key)}: unknown key; allowed: {', '.join(allowed)}")


def string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {shown(value)} is not a non-empty string")
    return value


def choice(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{where}: {shown(value)} is not allowed; allowed: {', '.join(allowed)}")
    return value


def string_map(value: Any, where: str) -> dict[str, str]:
    section = mapping(value, where)
    out = {}
    for k, v in section.items():
        if isinstance(v, (dict, list)) or v is None:
            raise ConfigError(f"{where}.{key_name(k)}: {shown(v)} must be a scalar")
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {shown(value)} is not a boolean; use true or false")
    return value


def whole_number(value: Any, where: str, low: int, high: int, meaning: str = "") -> int:
    """An int from `low` to `high` (a YAML `true` is not 1); `meaning` closes the message, e.g. " (runs at once)"."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}: {shown(value)} must be a whole number from {low} to {high}{meaning}")
    return value


def size(value: Any, where: str, low: int = 0, high: int = MAX_SIZE_BYTES) -> int:
    """Bytes, from a number or a text such as `128 MiB`, from `low` to `high`."""
    number = _parsed(parse_size, value, where)
    if not low <= number <= high:
        raise ConfigError(f"{where}: must be from {human_size(low)} to {human_size(high)}")
    return number


def duration(value: Any, where: str, low: float = 0.0, high: float = MAX_DURATION_SECONDS,
             span: str = "0s to 100 years") -> float:
    """Seconds, from a number or a text such as `7d`, from `low` to `high` (`span` says that range as people
    write it)."""
    seconds = _parsed(parse_duration, value, where)
    if not low <= seconds <= high:
        raise ConfigError(f"{where}: {shown(value)} must be from {span}")
    return seconds


def _parsed(parse: Callable[[Any], _T], value: Any, where: str) -> _T:
    """`parse(value)`, its ValueError (which names the value and how to write one) named by the key."""
    try:
        return parse(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def env_name(value: Any, where: str, secret: str) -> str:
    """The name of the environment variable that holds `secret` (a DSN, a token, a URL), which the file never does."""
    if not isinstance(value, str) or not ENV_NAME.fullmatch(value):
        raise ConfigError(f"{where}: {shown(value)} is not an environment variable name ({secret} itself "
                          "stays in that variable, never in the file)")
    return value


def resolve(path: str, base: Path) -> str:
    """A path of the file relative to the file's directory (`~` expanded); a URI as it is."""
    if "://" in path:
        return path
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def local_directory(path: str, where: str) -> str:
    """A local path that is a directory or can become one (a file there, or above it, would fail every run much
    later, in a traceback)."""
    if "://" in path:
        return path
    target = Path(path)
    try:
        target.resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError in Python 3.11)
        raise ConfigError(f"{where}: {path} cannot be used: {exc}") from None
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{where}: {path} is a file, not a directory")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{where}: {path} cannot be created: {parent} is a file, not a directory")
            break
    return path
