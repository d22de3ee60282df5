"""What each audit decision, reason kind and operation means, in a line for people.

The docs site's audit reference is generated from these tables and the enums they describe
(scripts/gen_reference.py); tests/test_reference.py fails when a member has no line here.
"""

from __future__ import annotations

from icemaint.domain.verdicts import Operation, ReasonKind, Verdict

VERDICTS: dict[Verdict, str] = {
    Verdict.RUN: "the operation is due and allowed, and ran (or, in a dry run, would run)",
    Verdict.DEFER: "not now: a writer is active, the date is hot, the claim is busy, approval is awaited, ...; "
                   "automation decides again on a later tick",
    Verdict.REFUSE: "not allowed: the policy, the identity or the table's shape forbids it; nothing changes until "
                    "the configuration does",
    Verdict.NOOP: "nothing to do: no data, or below the thresholds",
    Verdict.NOT_PUBLISHED: "a compaction whose proof failed: its staged files were discarded and main was not changed",
    Verdict.FAILED: "the run failed (an error); the table is as writers left it",
}

# Decisions the audit log records besides the verdicts (safety/audit.py, safety/alerts.py, operations/contract.py).
OTHER_DECISIONS: dict[str, str] = {
    "started": "a call's marker, written before it acts; replaced by its decision when it ends",
    "interrupted": "a started call whose process is provably dead and that recorded no decision",
    "approved": "an `approve` record: a person let a run over the ceiling, or a held scope, go",
    "unproven": "a `lineage` record: main holds a rewrite of ours without a passing proof (logged as an error)",
    "proof_failed": "an `alert` record: a failed proof was alerted",
    "run_failed": "an `alert` record: a failed maintenance run was alerted",
}

REASONS: dict[ReasonKind, str] = {
    ReasonKind.DUE: "due: the thresholds are passed",
    ReasonKind.BELOW_THRESHOLDS: "under every threshold (small files, delete ratio, manifests, snapshots, ...)",
    ReasonKind.NO_DATA: "no data files in the scope",
    ReasonKind.NO_TIME_COLUMN: "the table has no time column for a date scope (or one that is not a plain name)",
    ReasonKind.POLICY: "the policy refuses: disabled, read-only, operation or identity not allowed, a bad sort order",
    ReasonKind.HOT_PARTITION: "the date ended less than hot_partition_age ago",
    ReasonKind.WRITER_ACTIVE: "a writer committed into the scope within writer_idle",
    ReasonKind.CLAIM_BUSY: "someone else holds the table's claim",
    ReasonKind.RUNS_IN_FLIGHT: "a maintenance run of the table is queued or running",
    ReasonKind.AWAITING_APPROVAL: "the rewrite exceeds max_rewrite_bytes: waits for `icemaint approve`",
    ReasonKind.TICK_BUDGET: "due, but ranked below this tick's budget of runs or bytes",
    ReasonKind.ALREADY_REQUESTED: "a run for it is already requested",
    ReasonKind.ORDERING: "another operation of the table goes first (expiry before orphans)",
    ReasonKind.UNSUPPORTED: "a table shape this version cannot maintain safely",
    ReasonKind.POSITION_DELETES_DUE: "due for a merge of its position-delete files alone",
    ReasonKind.LAYOUT_DRIFT: "due for a rewrite into the table's current layout: files under an older partition "
                             "spec or sort order, or oversized",
    ReasonKind.REVERTED: "an operator reverted the scope's compaction: held until approved again",
    ReasonKind.PROOF_FAILED: "automation's last run of the scope failed its proof: held until approved",
    ReasonKind.RUNS_FAILED: "automation's last runs of the scope all failed: held until approved",
}

OPERATIONS: dict[Operation, str] = {
    Operation.COMPACT: "rewrite small files (and apply deletes) of a date or partition: staged, proven, published",
    Operation.EXPIRE: "expire old snapshots by policy and delete the files only they referenced",
    Operation.ORPHANS: "remove (or quarantine) files no snapshot references",
    Operation.MANIFESTS: "rewrite small manifests into fewer, larger ones",
    Operation.STATISTICS: "write the column statistics (Puffin NDV sketches) of the current snapshot",
    Operation.PURGE_QUARANTINE: "delete quarantined files older than a cutoff",
    Operation.CLEANUP: "remove a staging branch a dead run left",
    Operation.REVERT: "an operator's forward undo of a published rewrite",
    Operation.INGEST: "append a batch of small landed files to its table as a few large files, exactly once",
}

# Operations the audit log records besides the maintenance operations.
OTHER_OPERATIONS: dict[str, str] = {
    "approve": "a person's approval (`icemaint approve`, or a run launched approved)",
    "alert": "an alert sent (or not delivered) on a failed proof or run, when alerts.audit is on",
    "lineage": "a check of main's lineage under the claim found something stage-prove-publish cannot produce",
}
