"""The docs site's reference pages are generated from the code (scripts/gen_reference.py): they fail here when
stale, and every config key, policy key, audit decision, reason kind and operation must carry its meaning.
Pure: no Java, no Spark."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from icemaint.config import parse_config
from icemaint.config.parse import ConfigError
from icemaint.config.keys import CONFIG_KEYS
from icemaint.domain import glossary
from icemaint.domain.verdicts import Operation, ReasonKind, Verdict
from icemaint.domain.policy import POLICY_KEY_DOCS, POLICY_KEYS

ROOT = Path(__file__).resolve().parents[1]


def gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    module = sys.modules["gen_reference"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_what_the_code_generates(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # the pages must not depend on the terminal
    stale = [str(path.relative_to(ROOT)) for path, text in gen_reference().rendered().items()
             if not path.is_file() or path.read_text() != text]
    assert not stale, f"stale reference pages: {stale}; run `make docs` (scripts/gen_reference.py) and commit them"


def test_every_policy_key_has_a_type_and_a_meaning():
    assert set(POLICY_KEY_DOCS) == set(POLICY_KEYS), set(POLICY_KEY_DOCS) ^ set(POLICY_KEYS)
    assert all(kind and len(meaning) > 15 for kind, meaning in POLICY_KEY_DOCS.values())


def test_every_config_key_has_a_meaning_and_the_parser_takes_no_other():
    assert all(kind and default and len(meaning) > 15 for kind, default, meaning in CONFIG_KEYS.values())
    # the parser's allowed keys are read from CONFIG_KEYS: a key without its line is an unknown key
    for where, doc in [("catalog.flavour", {"catalog": {"flavour": "x"}}), ("spark.cores", {"spark": {"cores": 2}}),
                       ("alerts.owners.ops.pager", {"alerts": {"owners": {"ops": {"pager": True}}}}),
                       ("config.extras", {"extras": 1})]:
        with pytest.raises(ConfigError, match=f"{where}: unknown key; allowed: "):
            parse_config(doc, ROOT)


def test_every_decision_reason_kind_and_operation_has_a_meaning():
    from icemaint.operations.contract import UNPROVEN
    from icemaint.safety.alerts import AlertKind
    from icemaint.safety.audit import INTERRUPTED, STARTED

    assert set(glossary.VERDICTS) == set(Verdict)
    assert set(glossary.REASONS) == set(ReasonKind)
    assert set(glossary.OPERATIONS) == set(Operation)
    assert {STARTED, INTERRUPTED, UNPROVEN, "approved", *map(str, AlertKind)} <= set(glossary.OTHER_DECISIONS)
    assert {"approve", "alert", "lineage"} <= set(glossary.OTHER_OPERATIONS)  # `audit --operation` takes them too


def test_every_link_of_the_readme_into_the_docs_names_a_page_of_the_site():
    """mkdocs --strict checks the site's own links; the README is outside it."""
    import re

    import yaml

    links = re.findall(r"\]\((docs/[^)#]+)", (ROOT / "README.md").read_text())
    assert len(links) > 10
    assert [link for link in links if not (ROOT / link).is_file()] == []
    nav = yaml.load((ROOT / "mkdocs.yml").read_text().replace("!!python/name:", ""), Loader=yaml.SafeLoader)["nav"]

    def pages(entries):
        for entry in entries:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]
    assert {link[len("docs/"):] for link in links} <= set(pages(nav))
