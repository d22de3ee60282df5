"""Nothing in the product moves a table's `main` backwards.

A ref rewind (rollback, set-current, cherry-pick over a rollback) drops the commits of writers that
do not take our claim. Safety against them comes from staging and Iceberg's optimistic concurrency;
this test fails if a rewinding call comes back into any product package.
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("icemaint", "maint_assets", "sensors", "resources")
# SQL procedures and their Java API counterparts (ManageSnapshots).
REWINDS = ("rollback_to_snapshot", "rollback_to_timestamp", "set_current_snapshot", "cherrypick_snapshot",
           "rollbackTo", "rollbackToTime", "setCurrentSnapshot", ".cherrypick(")


def product_sources():
    for package in PRODUCT:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_the_product_sources_are_found():
    files = list(product_sources())
    assert len(files) > 20 and any(f.name == "compaction.py" for f in files)


@pytest.mark.parametrize("call", REWINDS)
def test_no_product_module_rewinds_a_ref(call):
    offenders = [str(f.relative_to(ROOT)) for f in product_sources() if call in f.read_text()]
    assert not offenders, f"{call} appears in {offenders}: nothing may move main backwards"
