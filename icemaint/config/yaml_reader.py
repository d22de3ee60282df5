"""Reading the config file as one YAML document: bounded in size, UTF-8, YAML's safe loader with dates left as text
and a key given twice refused; every failure a `ConfigError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Hashable

import yaml

from icemaint.config.parse import ConfigError

# A maintenance config is a few KB; anything this large is not one (and would take seconds to parse).
MAX_CONFIG_BYTES = 1 << 20


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, reading a date such as `dates_start: 2020-13-01` as text: the key's own check then
    names it (YAML's date constructor only says "month must be in 1..12"), and refusing a key given twice in one
    mapping (YAML keeps the last silently: a policy edited in two places would apply only one of them)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        merges = 0
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: keys after it override the base's
                merges += 1
                if merges > 1:  # YAML would apply the first alone (merge several with `<<: [*a, *b]`)
                    raise yaml.constructor.ConstructorError(
                        None, None, "the merge key '<<' is given twice in one mapping; merge several with "
                        "<<: [*a, *b]", key_node.start_mark)
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the constructor below names it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def read_document(p: Path) -> Any:
    """The YAML document of the file at `p`, which exists (never None)."""
    try:
        if p.is_file() and p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: {p.stat().st_size} bytes is not a maintenance config (at most "
                              f"{MAX_CONFIG_BYTES} bytes)")
        raw = yaml.load(p.read_bytes().decode("utf-8"), Loader=_ConfigLoader)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the configuration file: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    except (ValueError, OverflowError) as exc:  # a YAML scalar that is no value, e.g. the date 2024-02-30
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    except RecursionError:  # PyYAML parses nesting recursively
        raise ConfigError(f"{p}: not valid YAML: nested too deeply") from None
    if raw is None:
        raise ConfigError(f"{p}: the file holds no settings (empty, or only comments); write at least one key, "
                          "e.g. catalog.warehouse")
    return raw
