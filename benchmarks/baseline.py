"""The bare procedure the compaction figures are measured against: Iceberg's `rewrite_data_files` CALL.

A private copy of what the Compactor called before stage-prove-publish (commit 4b85ad6,
`icemaint.operations.compaction.rewrite_sql` and `Compactor._options`): it is the baseline, not product code.
The previous version's own recorded call is checked against it in every run (see compaction_cost).
"""

from __future__ import annotations

from icemaint.domain.names import TableName


def rewrite_options(policy) -> dict[str, str]:
    """The procedure's options for a table policy, as the Compactor passed them before staging."""
    return {
        "target-file-size-bytes": str(policy.target_file_size_bytes),
        "min-file-size-bytes": str(policy.small_file_size_bytes),
        "max-file-size-bytes": str(max(policy.target_file_size_bytes * 2, policy.small_file_size_bytes + 1)),
        "min-input-files": "2",
        "delete-file-threshold": str(policy.delete_file_threshold),
        "partial-progress.enabled": str(policy.partial_progress).lower(),
        "max-concurrent-file-group-rewrites": "2",  # the policy's default then
        "remove-dangling-deletes": "true",
        "use-starting-sequence-number": "false",
    }


def rewrite_sql(catalog: str, table: TableName, scope: str, options: dict[str, str], strategy: str = "binpack",
                sort_order: str | None = None) -> str:
    """The CALL statement (scope from icemaint's DateScope, options from `rewrite_options`: no user text)."""
    opts = ", ".join(f"'{k}', '{v}'" for k, v in sorted(options.items()))
    args = [f"table => {table.procedure_arg()}", f"strategy => '{'sort' if strategy == 'zorder' else strategy}'",
            f'where => "{scope}"', f"options => map({opts})"]
    if strategy == "sort":
        args.append(f"sort_order => '{sort_order}'")
    elif strategy == "zorder":
        args.append(f"sort_order => 'zorder({sort_order})'")
    return f"CALL `{catalog}`.system.rewrite_data_files({', '.join(args)})"
