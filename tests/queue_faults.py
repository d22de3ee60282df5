"""The project's code location with one fault, for a test's `dagster dev` (tests/test_queue_e2e.py): a staged
rewrite of the table $ICEMAINT_TEST_CORRUPT_TABLE gets one 64-bit value ($ICEMAINT_TEST_CORRUPT_VALUE) changed
before its proof, as bad memory or a buggy writer would leave it (`staged_faults.corrupt_long`). Every other table
runs as under `maint_assets.definitions`. The fault sits in the run worker, which a test cannot reach otherwise.
"""

from __future__ import annotations

import os

import dagster as dg

import maint_assets.compaction
from maint_assets.definitions import build_definitions
from staged_faults import corrupt_long

CORRUPTED = 77_000_001
_real = maint_assets.compaction.Compactor


def _corrupt(staged) -> None:
    if staged.table == os.environ.get("ICEMAINT_TEST_CORRUPT_TABLE"):
        assert corrupt_long(staged.new_files, int(os.environ["ICEMAINT_TEST_CORRUPT_VALUE"]), CORRUPTED) >= 1


class _FaultyCompactor(_real):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, after_stage=_corrupt, **kwargs)


maint_assets.compaction.Compactor = _FaultyCompactor  # type: ignore[misc]


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions()
