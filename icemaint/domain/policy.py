"""Per-table maintenance policy: thresholds, retention, cost ceiling, and who may do what.

A `TablePolicy` is the config file's `defaults` with the table's own overrides applied. It is
plain data; the decision functions read it, nothing here talks to Spark or Dagster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from icemaint.domain.units import parse_duration, parse_size, shown
from icemaint.errors import UserError

OPERATIONS = ("compact", "expire", "orphans", "manifests", "statistics", "revert", "ingest")
# What an AI agent may be given (`agent_operations`): requests that run under the operating contract with a proof
# or a policy window. Orphan removal deletes files and revert undoes a person's decision: never an agent's.
AGENT_OPERATIONS = ("compact", "expire", "manifests", "statistics")
SORT_STRATEGIES = ("binpack", "sort", "zorder")
WRITER_SCOPES = ("partition", "table")

MiB = 2**20


class PolicyError(UserError, ValueError):
    """A policy value that is not allowed; the message names the key and what is allowed."""


# Snapshot summary keys writers put their resume point in: Flink's committed checkpoint (per job id),
# Spark structured streaming's epoch (per query id) and the Kafka Connect sink's commit.
DEFAULT_CHECKPOINT_MARKERS = ("flink.max-committed-checkpoint-id@flink.job-id",
                              "spark.sql.streaming.epochId@spark.sql.streaming.queryId",
                              "kafka.connect.commit-id")
_MARKER = re.compile(r"[A-Za-z0-9_.\-]{1,200}(@[A-Za-z0-9_.\-]{1,200})?")


def _markers(v: Any) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(m, str) and _MARKER.fullmatch(m) for m in v):
        raise ValueError(f"{shown(v)} is not a list of snapshot summary keys, each optionally followed by "
                         "@ and the key naming the writer's job (e.g. flink.max-committed-checkpoint-id@flink.job-id)")
    return tuple(v)


@dataclass(frozen=True)
class TablePolicy:
    owner: str | None = None
    enabled: bool = True
    read_only: bool = False
    # compaction
    small_file_size_bytes: int = 32 * MiB
    target_file_size_bytes: int = 128 * MiB
    min_input_files: int = 5
    max_delete_ratio: float = 0.10
    delete_file_threshold: int = 1
    # a date with this many position-delete files, whose data files are not due, gets its deletes rewritten
    min_position_delete_files: int = 10
    partial_progress: bool = False
    max_file_group_size_bytes: int = 10 * 2**30  # with partial progress: each group its own proven publish
    strategy: str = "binpack"
    sort_order: str | None = None
    time_column: str | None = None
    # layout drift (`icemaint.domain.drift`): a date whose data files written under an old partition spec or
    # sort order, or above max_file_size_ratio x target, reach drift_min_files or drift_min_bytes is due
    layout_drift: bool = True
    drift_min_files: int = 1
    drift_min_bytes: int = 64 * MiB
    max_file_size_ratio: float = 1.8
    max_commit_retries: int = 3
    retry_backoff_seconds: float = 2.0
    # gates
    claim_wait_seconds: float = 180.0  # runs a person or a backfill launched wait this long for a busy claim
    writer_idle_seconds: float = 300.0
    # what writer_idle is measured on: "partition" (a date a writer committed into within the window is
    # deferred, the dates it finished with are maintained while it writes) or "table" (any writer commit)
    writer_scope: str = "partition"
    # how long a publish that only lost races (another commit landed first, nothing conflicts) keeps retrying
    publish_timeout_seconds: float = 120.0
    hot_partition_age_seconds: float = 3600.0
    max_rewrite_bytes: int = 10 * 2**30
    allowed_operations: frozenset[str] | None = None
    allowed_identities: frozenset[str] | None = None
    # what agents (`icemaint mcp`) may request on the table; none by default: an agent only reads until given more
    agent_operations: frozenset[str] = frozenset()
    # validation
    sample_fraction: float = 0.05
    # retention
    snapshot_older_than_seconds: float = 7 * 86400.0
    snapshot_retain_last: int = 1
    snapshot_min_age_seconds: float = 0.0
    snapshot_max_count: int = 100
    keep_files: bool = False
    orphan_older_than_seconds: float = 72 * 3600.0
    manifest_min_count: int = 20
    manifest_small_bytes: int = 8 * MiB
    # expiry keeps each streaming writer job's newest checkpoint snapshot (summary key[@job key])
    checkpoint_markers: tuple[str, ...] = DEFAULT_CHECKPOINT_MARKERS
    # metadata bloat: table properties the expiry step sets on the tables this policy owns (None: left alone)
    metadata_versions_max: int | None = None
    metadata_delete_after_commit: bool | None = None
    # the expiry step removes metadata.json files that dropped out of the table's metadata log (None: on, unless
    # metadata_delete_after_commit is false: an owner who keeps them keeps them from us too)
    metadata_cleanup: bool | None = None
    # column statistics (Puffin NDV sketches): kept fresh by the retention sensor when on
    statistics: bool = False
    statistics_stale_fraction: float = 0.10  # rows changed since the statistics' snapshot, of the rows it had
    statistics_columns: tuple[str, ...] | None = None  # None: every top-level primitive column

    @property
    def max_file_size_bytes(self) -> int:
        """A data file above this size is oversized (layout drift)."""
        return int(self.target_file_size_bytes * self.max_file_size_ratio)

    def allows_operation(self, operation: str) -> bool:
        return self.allowed_operations is None or operation in self.allowed_operations

    def allows_identity(self, identity: str) -> bool:
        return self.allowed_identities is None or identity in self.allowed_identities


# YAML key -> (dataclass field, parser). Durations and sizes accept units; the YAML keys are the
# names operators write, the fields carry their unit in the name.
def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{shown(v)} is not a boolean; use true or false")
    return v


# Whole-number keys reach Iceberg and Spark as Java ints (retain_last, previous-versions-max, min-input-files, ...).
MAX_WHOLE = 2**31 - 1


def _int(minimum: int) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{shown(v)} is not a whole number")
        if v < minimum:
            raise ValueError(f"{shown(v)} is below the minimum {minimum}")
        if v > MAX_WHOLE:
            raise ValueError(f"{shown(v)} is above the maximum {MAX_WHOLE} (a Java int)")
        return v
    return parse


def _ratio(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"{shown(v)} is not a ratio between 0 and 1")
    return float(v)


def _size_ratio(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1 < v <= 100:
        raise ValueError(f"{shown(v)} is not a ratio above 1 and at most 100 (a multiple of target_file_size)")
    return float(v)


def _fraction(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ValueError(f"{shown(v)} is not a fraction in (0, 1]")
    return float(v)


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{shown(v)} is not a non-empty string")
    return v


def _columns(v: Any) -> tuple[str, ...]:
    if (not isinstance(v, (list, tuple)) or not v
            or not all(isinstance(c, str) and c.strip() and len(c) <= 200 for c in v)):
        raise ValueError(f"{shown(v)} is not a non-empty list of column names")
    return tuple(dict.fromkeys(v))


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        if not isinstance(v, str) or v not in allowed:
            raise ValueError(f"{shown(v)} is not allowed; allowed: {', '.join(allowed)}")
        return v
    return parse


def _operations(v: Any) -> frozenset[str]:
    if not isinstance(v, list):
        raise ValueError(f"{shown(v)} is not a list; use a list of: {', '.join(OPERATIONS)}")
    if "rollback" in v:
        raise ValueError("'rollback' is no longer an operation: a failed proof publishes nothing, so nothing is rolled "
                         "back (an operator's forward undo is 'revert'); remove it")
    bad = [x for x in v if x not in OPERATIONS]
    if bad:
        raise ValueError(f"{shown(bad)} not allowed; allowed operations: {', '.join(OPERATIONS)}")
    return frozenset(v)


def _agent_operations(v: Any) -> frozenset[str]:
    if not isinstance(v, list):
        raise ValueError(f"{shown(v)} is not a list; use a list of: {', '.join(AGENT_OPERATIONS)}")
    never = [x for x in v if x in OPERATIONS and x not in AGENT_OPERATIONS]
    if never:
        raise ValueError(f"{shown(never)} cannot be given to agents (orphan removal deletes files, revert undoes a "
                         f"person's decision); allowed: {', '.join(AGENT_OPERATIONS)}")
    bad = [x for x in v if x not in AGENT_OPERATIONS]
    if bad:
        raise ValueError(f"{shown(bad)} not allowed; agent operations: {', '.join(AGENT_OPERATIONS)}")
    return frozenset(v)


def _identities(v: Any) -> frozenset[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise ValueError(f"{shown(v)} is not a list of identity names")
    return frozenset(v)


def _column(v: Any) -> str:
    from icemaint.domain.names import check_column

    return check_column(v)


def _sort_order(v: Any) -> str:
    # Passed to Iceberg as a string literal: refuse quotes and statement separators outright.
    text = _text(v)
    if any(c in text for c in "'\";\\`"):
        raise ValueError(f"{shown(v)} contains quotes or ';'; write e.g. 'id ASC NULLS LAST, ts' or 'zorder(a, b)'")
    return text


def _retain_last(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > MAX_WHOLE:
        raise ValueError(f"{shown(v)} is not allowed; retain_last must be a whole number of at least 1 (the "
                         f"current snapshot is always kept) and at most {MAX_WHOLE}")
    return v


# Files younger than this may belong to a commit in flight: orphan removal refuses such a cutoff unless a person
# forces it on the command line (`icemaint orphans --older-than 1h --force`, audited); a policy never can.
ORPHAN_MIN_AGE_SECONDS = 24 * 3600.0


def _orphan_age(v: Any) -> float:
    seconds = parse_duration(v)
    if seconds < ORPHAN_MIN_AGE_SECONDS:
        raise ValueError(f"{shown(v)} is under 24h: files that young may belong to a commit in flight, so orphan "
                         "removal would refuse every run; use 24h or more (a one-off younger cutoff: "
                         "icemaint orphans TABLE --older-than DURATION --force)")
    return seconds


# Keys older configs may hold that no longer do anything: refused with the reason, never silently ignored.
RETIRED_KEYS = {
    "max_concurrent_file_group_rewrites": "no longer used: a date's file groups are staged one after the other, "
                                          "each proven and published before the next; remove the key",
}


POLICY_KEYS: dict[str, tuple[str, Any]] = {
    "owner": ("owner", _text),
    "enabled": ("enabled", _bool),
    "read_only": ("read_only", _bool),
    "small_file_size_bytes": ("small_file_size_bytes", parse_size),
    "target_file_size_bytes": ("target_file_size_bytes", parse_size),
    "min_input_files": ("min_input_files", _int(2)),
    "max_delete_ratio": ("max_delete_ratio", _ratio),
    "delete_file_threshold": ("delete_file_threshold", _int(1)),
    "min_position_delete_files": ("min_position_delete_files", _int(2)),
    "partial_progress": ("partial_progress", _bool),
    "max_file_group_size_bytes": ("max_file_group_size_bytes", parse_size),
    "strategy": ("strategy", _choice(SORT_STRATEGIES)),
    "sort_order": ("sort_order", _sort_order),
    "time_column": ("time_column", _column),
    "layout_drift": ("layout_drift", _bool),
    "drift_min_files": ("drift_min_files", _int(1)),
    "drift_min_bytes": ("drift_min_bytes", parse_size),
    "max_file_size_ratio": ("max_file_size_ratio", _size_ratio),
    "max_commit_retries": ("max_commit_retries", _int(0)),
    "retry_backoff": ("retry_backoff_seconds", parse_duration),
    "writer_idle": ("writer_idle_seconds", parse_duration),
    "writer_scope": ("writer_scope", _choice(WRITER_SCOPES)),
    "publish_timeout": ("publish_timeout_seconds", parse_duration),
    "claim_wait": ("claim_wait_seconds", parse_duration),
    "hot_partition_age": ("hot_partition_age_seconds", parse_duration),
    "max_rewrite_bytes": ("max_rewrite_bytes", parse_size),
    "allowed_operations": ("allowed_operations", _operations),
    "allowed_identities": ("allowed_identities", _identities),
    "agent_operations": ("agent_operations", _agent_operations),
    "sample_fraction": ("sample_fraction", _fraction),
    "snapshot_older_than": ("snapshot_older_than_seconds", parse_duration),
    "retain_last": ("snapshot_retain_last", _retain_last),
    "snapshot_min_age": ("snapshot_min_age_seconds", parse_duration),
    "snapshot_max_count": ("snapshot_max_count", _int(1)),
    "keep_files": ("keep_files", _bool),
    "orphan_older_than": ("orphan_older_than_seconds", _orphan_age),
    "manifest_min_count": ("manifest_min_count", _int(2)),
    "manifest_small_bytes": ("manifest_small_bytes", parse_size),
    "checkpoint_markers": ("checkpoint_markers", _markers),
    "metadata_versions_max": ("metadata_versions_max", _int(1)),
    "metadata_delete_after_commit": ("metadata_delete_after_commit", _bool),
    "metadata_cleanup": ("metadata_cleanup", _bool),
    "statistics": ("statistics", _bool),
    "statistics_stale_fraction": ("statistics_stale_fraction", _fraction),
    "statistics_columns": ("statistics_columns", _columns),
}

# Iceberg's table properties behind the metadata policy keys.
METADATA_VERSIONS_MAX = "write.metadata.previous-versions-max"
METADATA_DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"


def metadata_properties(policy: TablePolicy) -> dict[str, str]:
    """The table properties the policy asks for (only the keys it sets), as Iceberg spells their values."""
    wanted = {}
    if policy.metadata_versions_max is not None:
        wanted[METADATA_VERSIONS_MAX] = str(policy.metadata_versions_max)
    if policy.metadata_delete_after_commit is not None:
        wanted[METADATA_DELETE_AFTER_COMMIT] = str(policy.metadata_delete_after_commit).lower()
    return wanted


def cleans_metadata(policy: TablePolicy) -> bool:
    """Whether the expiry step removes metadata.json files that dropped out of the table's metadata log."""
    if policy.metadata_cleanup is not None:
        return policy.metadata_cleanup
    return policy.metadata_delete_after_commit is not False


def apply_overrides(base: TablePolicy, overrides: Mapping[str, Any], where: str) -> TablePolicy:
    """`base` with the YAML mapping `overrides` applied; `where` names the mapping in errors."""
    if not isinstance(overrides, Mapping):
        raise PolicyError(f"{where}: expected a mapping of policy keys, got {shown(overrides)}")
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in RETIRED_KEYS:
            raise PolicyError(f"{where}.{key}: {RETIRED_KEYS[key]}")
        if key not in POLICY_KEYS:
            raise PolicyError(f"{where}.{key}: unknown policy key; allowed: {', '.join(sorted(POLICY_KEYS))}")
        attr, parse = POLICY_KEYS[key]
        try:
            changes[attr] = None if value is None and attr in _NULLABLE else parse(value)
        except ValueError as exc:
            raise PolicyError(f"{where}.{key}: {exc}") from None
    policy = replace(base, **changes)
    if policy.small_file_size_bytes > policy.target_file_size_bytes:
        raise PolicyError(
            f"{where}: small_file_size_bytes ({policy.small_file_size_bytes}) is larger than "
            f"target_file_size_bytes ({policy.target_file_size_bytes})"
        )
    if policy.strategy in ("sort", "zorder"):
        if not policy.sort_order:
            raise PolicyError(f"{where}.sort_order: strategy {policy.strategy!r} needs a sort_order")
        from icemaint.domain.rewrite_plan import SortOrderError, parse_sort_order

        try:
            parse_sort_order(policy.sort_order, policy.strategy)
        except SortOrderError as exc:
            raise PolicyError(f"{where}.sort_order: {exc}") from None
    return policy


_NULLABLE = {f.name for f in fields(TablePolicy) if f.default is None}


@dataclass(frozen=True)
class PolicyBook:
    """The estate's policies: defaults and per-table overrides keyed by `namespace.table`."""

    defaults: TablePolicy = field(default_factory=TablePolicy)
    tables: Mapping[str, TablePolicy] = field(default_factory=dict)

    def for_table(self, table: str) -> TablePolicy:
        return self.tables.get(table, self.defaults)


# What each policy key means, for people: the docs site's policy reference is generated from this table, the
# keys above and TablePolicy's defaults (scripts/gen_reference.py); tests/test_reference.py fails when a key of
# POLICY_KEYS has no entry here. Each entry: (type as written in YAML, meaning).
POLICY_KEY_DOCS: dict[str, tuple[str, str]] = {
    "owner": ("text", "who owns the table: alerts are routed by it (alerts.owners)"),
    "enabled": ("boolean", "false: no maintenance at all for the table (every decision refuses)"),
    "read_only": ("boolean", "true: every mutating step refuses; health, explain and plan still read it"),
    "small_file_size_bytes": ("size", "a data file smaller than this counts as small"),
    "target_file_size_bytes": ("size", "the size rewritten files are packed to"),
    "min_input_files": ("whole number >= 2", "a date is due when it has at least this many small files"),
    "max_delete_ratio": ("ratio 0-1", "a date is due when deleted rows exceed this share of its rows"),
    "delete_file_threshold": ("whole number >= 1", "a data file with at least this many delete files is rewritten"),
    "min_position_delete_files": ("whole number >= 2", "a date whose data files are not due but which holds this "
                                  "many position-delete files gets only its delete files merged"),
    "partial_progress": ("boolean", "split a date into file groups, each staged, proven and published alone"),
    "max_file_group_size_bytes": ("size", "with partial_progress: the largest file group"),
    "strategy": ("binpack | sort | zorder", "how rewritten rows are laid out"),
    "sort_order": ("text", "with sort: `id DESC NULLS LAST, ts`; with zorder: `a, b` or `zorder(a, b)`"),
    "time_column": ("column name", "date the table by this column when its partition spec has no time transform"),
    "layout_drift": ("boolean", "true: a date whose data files drifted from the table's layout (written under an "
                     "older partition spec or sort order, or oversized) is due for a rewrite"),
    "drift_min_files": ("whole number >= 1", "layout drift: a date is due when it has at least this many drifted "
                        "files and drift_min_bytes of them"),
    "drift_min_bytes": ("size", "layout drift: a date is due when its drifted files hold at least this much (and "
                        "number drift_min_files)"),
    "max_file_size_ratio": ("ratio > 1", "a data file above this multiple of target_file_size_bytes is oversized "
                            "(layout drift)"),
    "max_commit_retries": ("whole number >= 0", "re-plans after a writer's conflicting commit before deferring"),
    "retry_backoff": ("duration", "the wait between those re-plans"),
    "writer_idle": ("duration", "a scope a writer committed into within this window is deferred"),
    "writer_scope": ("partition | table", "partition: only the dates a writer is committing into wait; table: "
                     "any writer commit holds the whole table"),
    "publish_timeout": ("duration", "how long a staging or publish commit that only lost races is made again"),
    "claim_wait": ("duration", "how long a run a person, a backfill or the CLI launched waits for a busy claim "
                   "(sensor, schedule and tick runs never wait: they defer)"),
    "hot_partition_age": ("duration", "a date is not compacted until this long after it ended"),
    "max_rewrite_bytes": ("size", "the cost ceiling: a bigger rewrite waits for `icemaint approve`"),
    "allowed_operations": ("list of operations", "the operations maintenance may run on the table (unset: all of "
                           + ", ".join(OPERATIONS) + ")"),
    "allowed_identities": ("list of names", "who maintenance may run as ($ICEMAINT_IDENTITY, else the OS user; "
                           "unset: anyone)"),
    "agent_operations": ("list of operations", "what AI agents (icemaint mcp) may request: of "
                         + ", ".join(AGENT_OPERATIONS) + "; none by default"),
    "sample_fraction": ("fraction (0, 1]", "the share of rows the proof compares row for row (16 bytes each reach "
                        "the driver)"),
    "snapshot_older_than": ("duration", "expiry removes snapshots older than this"),
    "retain_last": ("whole number >= 1", "expiry always keeps the newest this many snapshots"),
    "snapshot_min_age": ("duration", "the owner's window: never expire snapshots younger than this"),
    "snapshot_max_count": ("whole number >= 1", "expiry is due when the table has more snapshots than this"),
    "keep_files": ("boolean", "expiry leaves the expired snapshots' files for orphan removal"),
    "orphan_older_than": ("duration >= 24h", "orphan removal only touches files older than this"),
    "manifest_min_count": ("whole number >= 2", "a manifest rewrite is due at this many small manifests"),
    "manifest_small_bytes": ("size", "a manifest smaller than this counts as small"),
    "checkpoint_markers": ("list of summary keys", "expiry keeps each streaming job's newest snapshot carrying "
                           "the key (`key@job-key`: per job)"),
    "metadata_versions_max": ("whole number >= 1", "sets the table's write.metadata.previous-versions-max "
                              "(unset: the table's own)"),
    "metadata_delete_after_commit": ("boolean", "sets the table's write.metadata.delete-after-commit.enabled "
                                     "(unset: the table's own)"),
    "metadata_cleanup": ("boolean", "after its commit the expiry step removes the metadata.json files below the "
                         "table's metadata log (default on; off when metadata_delete_after_commit is false)"),
    "statistics": ("boolean", "true: the retention sensor keeps the table's column statistics fresh"),
    "statistics_stale_fraction": ("fraction (0, 1]", "statistics are stale when rows added or deleted since reach "
                                  "this share of the rows they describe"),
    "statistics_columns": ("list of columns", "the columns statistics cover (unset: every top-level primitive "
                           "column)"),
}
