"""The layers are folders, and imports only point down (see README, "Architecture").

domain < config < observe < safety < engine < operations < orchestration < app: a module may import
its own layer and the layers below it, never one above. The domain is pure: no Spark, JVM,
pyiceberg, Dagster, Great Expectations, database or network library, not even inside a function.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("domain", "config", "observe", "safety", "engine", "operations", "orchestration", "app")
IMPURE = ("pyspark", "py4j", "pyiceberg", "dagster", "dagster_pyspark", "great_expectations", "psycopg2",
          "sqlalchemy", "requests", "urllib.request", "http", "socket", "boto3", "pyarrow", "pandas")


def layer_of(module: str) -> str | None:
    """The layer of a module of ours (dotted name), or None for a third-party module."""
    parts = module.split(".")
    if parts[0] in ("maint_assets", "sensors", "resources"):
        return "orchestration"
    if parts[0] != "icemaint" or len(parts) < 2:
        return None
    if parts[1] == "config":
        return "config"
    if parts[1] == "errors":  # the error tree: pure, beside the domain, so that every layer can raise its errors
        return "domain"
    return parts[1] if parts[1] in ORDER else "unplaced"


def imports_of(source: str, module: str) -> list[str]:
    """Every module a source imports, at any depth (function-level imports included)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[:-node.level]
                out.append(".".join(base + ([node.module] if node.module else [])))
            else:
                out.append(node.module or "")
    return out


def violations(module: str, source: str) -> list[str]:
    own = layer_of(module)
    found = []
    for imported in imports_of(source, module):
        target = layer_of(imported)
        if own == "domain" and any(imported == p or imported.startswith(p + ".") for p in IMPURE):
            found.append(f"{module} (domain) imports {imported}")
        if target == "unplaced":
            found.append(f"{module} imports {imported}, a module in no layer")
        elif target and own and own != "unplaced" and ORDER.index(target) > ORDER.index(own):
            found.append(f"{module} ({own}) imports {imported} ({target}), a higher layer")
    return found


def product_modules():
    for package in ("icemaint", "maint_assets", "sensors", "resources"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def test_every_icemaint_module_sits_in_a_layer():
    unplaced = [name for name, _ in product_modules()
                if name.startswith("icemaint.") and layer_of(name) in (None, "unplaced")]
    assert not unplaced, f"modules outside the layer folders: {unplaced}"
    layers = {layer_of(name) for name, _ in product_modules()}
    assert set(ORDER) <= layers, f"missing layers: {set(ORDER) - layers}"


def test_imports_only_point_down_and_the_domain_is_pure():
    found = [v for name, path in product_modules() for v in violations(name, path.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module, source, expected", [
    ("icemaint.domain.decisions", "import pyspark.sql", "imports pyspark.sql"),
    ("icemaint.domain.tick", "def f():\n    from dagster import asset", "imports dagster"),
    ("icemaint.domain.tick", "from icemaint.config import MaintenanceConfig", "a higher layer"),
    ("icemaint.engine.staging", "from icemaint.operations.compaction import Compactor", "a higher layer"),
    ("icemaint.operations.compaction", "from maint_assets.partitions import TABLE_TAG", "a higher layer"),
    ("icemaint.observe.catalog", "from icemaint.flat_module import x", "a module in no layer"),
    ("icemaint.domain.health", "from . import policy", None),
    ("icemaint.app.cli", "from maint_assets.definitions import defs", None),
])
def test_the_rule_catches_what_it_must(module, source, expected):
    found = violations(module, source)
    if expected is None:
        assert found == []
    else:
        assert any(expected in v for v in found), found
