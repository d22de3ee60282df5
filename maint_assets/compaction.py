"""`compaction` and `validation_report` (table x date), and `table_compaction` (table) for tables without a
time column, with Great Expectations proofs as blocking checks on both compaction assets."""


import json
import warnings
from pathlib import Path

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (  # not exported at the top level in 1.13
    AssetCheckEvaluationTargetMaterializationData,
)

from icemaint.operations.compaction import CompactionOutcome, CompactionRequest, Compactor
from icemaint.domain.verdicts import NOOP, NOT_PUBLISHED, RUN
from icemaint.engine.validation import READ_COMPLETENESS, ROW_COUNT_PARITY
from maint_assets.health import table_health
from maint_assets.metadata import as_json, materializes, numeric, partition_error, report_outcome, run_failure
from maint_assets.partitions import PLANNED_SCHEMA_TAG, PLANNED_SNAPSHOT_TAG, TABLE_DIMENSION, TRIGGER_TAG, \
    run_agent_reason, run_identity, split_table_date, table_partitions
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource
from resources.spark import SparkResource

VALIDATION_CHECKS = {
    "row_count_parity": "Rows of the replaced files before the rewrite == rows of the new files "
                        "(GX ExpectColumnPairValuesToBeEqual over each side's count); when the rewrite's own "
                        "read digested the replaced rows, also that read complete: its rows and file-weighted "
                        "hash sum == what the files' manifests list (GX read_completeness).",
    "sample_comparison": "Sampled rows before are found unchanged after, and the reverse (GX UnexpectedRowsExpectation).",
    "column_aggregates": "Per-column non-null counts, min/max and sums/hashes equal before and after.",
}


class CompactionConfig(dg.Config):
    dry_run: bool = False
    approved: bool = False


def outcome_metadata(outcome: CompactionOutcome) -> dict:
    doc = outcome.to_dict()
    numbers = {k: v for k, v in doc.items() if k in (
        "files_before", "files_after", "small_files_before", "small_files_after", "avg_file_bytes_before",
        "avg_file_bytes_after", "delete_files_before", "delete_files_after", "rewritten_files", "added_files",
        "rewritten_bytes", "rewritten_delete_files", "added_delete_files", "attempts", "publish_attempts")}
    numbers.update({f"read_before_{k}": v for k, v in doc["read_before"].items()})
    numbers.update({f"read_after_{k}": v for k, v in doc["read_after"].items()})
    numbers.update({f"{k}": v for k, v in outcome.durations.items()})
    meta = {**numeric(numbers),
            "decision": dg.MetadataValue.text(str(outcome.decision)),
            "reason": dg.MetadataValue.text(outcome.reason),
            "before_snapshot_id": dg.MetadataValue.text(str(outcome.before_snapshot_id)),
            "after_snapshot_id": dg.MetadataValue.text(str(outcome.after_snapshot_id)),
            "published": dg.MetadataValue.bool(outcome.published),
            "outcome": as_json(doc)}
    return meta


def partition_label(outcome: dict) -> str:
    """The partition an outcome belongs to, as its asset keys it: "<date>|<table>", or the table alone."""
    return f"{outcome['date']}|{outcome.get('table')}" if outcome.get("date") else str(outcome.get("table"))


def check_result(name: str, outcome: dict, asset_key: str = "compaction") -> dg.AssetCheckResult:
    """One GX proof of a compaction outcome, as a blocking check result."""
    commits = outcome.get("validation", {}).get("commits", [])
    # A fed proof's read_completeness reports as part of row_count_parity: the before side's rows, counted
    # against the manifests.
    names = {name, READ_COMPLETENESS} if name == ROW_COUNT_PARITY else {name}
    per_commit = [c for r in commits for c in r["checks"] if c["name"] in names]
    if outcome.get("decision") == NOOP and not commits:
        # Nothing was rewritten, so there is nothing to prove: the rows are the rows the table had.
        return dg.AssetCheckResult(
            check_name=name, asset_key=asset_key, passed=True, severity=dg.AssetCheckSeverity.ERROR,
            description=f"nothing was rewritten ({outcome.get('reason')}): no proof needed",
            metadata={"rewritten": dg.MetadataValue.bool(False),
                      "snapshot_id": dg.MetadataValue.text(str(outcome.get("after_snapshot_id")))})
    passed = bool(per_commit) and all(c["passed"] for c in per_commit)
    # The evaluation is attached to the run's partition; the description names it too (a batched run's
    # combined result has no single partition).
    sides = ", ".join(f"{c.get('before_snapshot_id')} -> staged {c.get('after_snapshot_id')}" for c in commits)
    return dg.AssetCheckResult(
        check_name=name,
        asset_key=asset_key,
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(f"{partition_label(outcome)}: {name} {'passed' if passed else 'FAILED'} "
                     f"(replaced files as of snapshot {sides}); "
                     + ('published as ' + str(outcome.get('after_snapshot_id')) if outcome.get('published')
                        else 'not published')),
        metadata={"partition": dg.MetadataValue.text(partition_label(outcome)),
                  "observed": as_json([c.get("observed") for c in per_commit]),
                  "gx_result": as_json([c.get("gx_result") for c in per_commit]),
                  "before_snapshot_id": dg.MetadataValue.text(str(outcome.get("before_snapshot_id"))),
                  "after_snapshot_id": dg.MetadataValue.text(str(outcome.get("after_snapshot_id"))),
                  "published": dg.MetadataValue.bool(bool(outcome.get("published")))},
    )


def combined_check_result(name: str, outcomes: list[dict], asset_key: str) -> dg.AssetCheckResult:
    """One check over every outcome of a run: passes when each date's proof passed (or had nothing to prove)."""
    results = [check_result(name, o, asset_key) for o in outcomes]
    if len(results) == 1:
        return results[0]
    failed = [r for r in results if not r.passed]
    return dg.AssetCheckResult(
        check_name=name, asset_key=asset_key, passed=not failed, severity=dg.AssetCheckSeverity.ERROR,
        description=(f"{len(results)} partitions, {len(failed)} failed: "
                     + "; ".join(r.description or "" for r in (failed or results))[:2000]),
        metadata={"partitions": dg.MetadataValue.text(", ".join(partition_label(o) for o in outcomes)),
                  "failed": dg.MetadataValue.int(len(failed))})


def partition_evaluation(result: dg.AssetCheckResult, asset_key: str, partition: str,
                         instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    """A check result as the evaluation of one partition. A run over several partitions (a batched backfill, the
    sensor's catch-up) reports one result per check for the run, which Dagster attaches to no partition; these
    attach each partition's own proof to it, so the partition shows passed or failed, not skipped.

    Each names the partition's latest materialization as its target, as Dagster does for a one-partition run's
    result: an evaluation without a target counts as stale once the partition has a materialization, and the
    checks' partition view would show it missing (it said "Passed (0)" after a catch-up that proved every date).
    """
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset_key), asset_partitions=[partition]), limit=1).records
    target = (AssetCheckEvaluationTargetMaterializationData(
        storage_id=records[0].storage_id, run_id=records[0].event_log_entry.run_id,
        timestamp=records[0].timestamp)
        if records else None)
    return dg.AssetCheckEvaluation(asset_key=dg.AssetKey(asset_key), check_name=result.check_name,
                                   passed=result.passed, metadata=result.metadata, severity=result.severity,
                                   description=result.description, blocking=True, partition=partition,
                                   target_materialization_data=target)


def validation_check_specs(asset: str, partitions_def: dg.PartitionsDefinition) -> list[dg.AssetCheckSpec]:
    """A blocking check per GX proof. The proofs run inside the compaction, under the table's claim and
    before anything is published, so a failed proof leaves `main` untouched; the asset reports each
    verdict as its check result (one per run, over every date a batched run did), which fails the run
    and stops downstream assets when a proof failed."""
    # Partitioned like their asset: a one-partition run's evaluations are attached to its partition (a
    # batched backfill run's, which cover several, to none: their description names each date).
    with warnings.catch_warnings():  # partitioned checks are a preview in Dagster 1.13
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [dg.AssetCheckSpec(name, asset=asset, description=description, blocking=True,
                                  partitions_def=partitions_def)
                for name, description in VALIDATION_CHECKS.items()]


def table_dimension_mapping() -> dg.MultiToSingleDimensionPartitionMapping:
    # Beta in Dagster 1.13, and the documented way to map `table` x `date` onto `table`.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=TABLE_DIMENSION)


# A backfill over many dates of one table runs them in batches of at most this many dates: one run, one
# Spark session, one claim wait per batch instead of per date; each date keeps its own request, proof,
# audit record and materialization.
BACKFILL_DATES_PER_RUN = 31
# The tick joins neighbouring tables due on the same dates into one run of at most this many table-dates
# (`tick.table_batches`): one run record instead of one per table (Dagster's per-run work is about a third of a
# small table's compaction on SQLite); each table-date keeps its own request, claim, proof, audit record and
# materialization.
PARTITIONS_PER_RUN = 31


def compact(context: dg.AssetExecutionContext, config: CompactionConfig, spark: SparkResource,
            catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource,
            targets: list[tuple[str, str | None, str]], asset_key: str, report: bool = False):
    """The body both compaction assets share: per (table, date, partition key) one request and its outcome
    as events on that partition, then an honest run status.

    A run of one partition materializes through its output; a batched run (several dates of a table, or the
    same dates of several tables: the tick's catch-up) materializes each partition on its own, and fails at the
    end naming every partition that was not done. Only a published rewrite (or a person's "nothing to do")
    materializes: a failed proof is observed, with its failed checks, so its partition shows failed, not green.
    With `report` each materialized partition's `validation_report` is written in the same step.
    """
    if not config.dry_run:
        spark.start_in_background()  # the JVM starts while the claims are taken and the targets decided
    tags = context.run.tags
    planned = tags.get(PLANNED_SNAPSHOT_TAG)
    planned_schema = tags.get(PLANNED_SCHEMA_TAG)
    compactor = Compactor(spark.settings.config, spark.lazy_session, catalog.reader, claims.claims, audit.log,
                          progress=context.log.info)
    batched, failures, proven = len(targets) > 1, [], []
    several_tables = len({table for table, _, _ in targets}) > 1

    def label(table: str, date: str | None) -> str:  # how the run's failure names one of its partitions
        return f"{table} {date}" if several_tables else str(date)

    for table, date, key in targets:
        request = CompactionRequest(
            table=table, date=date, dry_run=config.dry_run, approved=config.approved,
            trigger=tags.get(TRIGGER_TAG, "manual"), run_id=context.run.run_id, identity=run_identity(tags),
            agent_reason=run_agent_reason(tags),
            planned_snapshot_id=int(planned) if planned and not batched else None,
            planned_schema_id=int(planned_schema) if planned_schema and not batched else None)
        try:
            outcome = compactor.run(request)
        except Exception as exc:
            if not batched:
                raise
            # One date's error (already in its audit record) does not stop the batch's other dates.
            context.log.error(f"{table} {date}: failed: {partition_error(exc)}")
            failures.append(f"{label(table, date)}: failed: {partition_error(exc)}")
            continue
        context.log.info(f"{table} {date or '(partitions)'}: {outcome.decision}: {outcome.reason}")
        failure = run_failure(request.trigger, outcome.decision, refused=f"refused: {outcome.reason}",
                              not_done=f"not done: {outcome.reason}")
        materialize = materializes(request.trigger, outcome.decision, outcome.dry_run, done=outcome.decision == RUN)
        metadata = outcome_metadata(outcome)
        if materialize or outcome.decision == NOT_PUBLISHED:  # a proof to report, passed or not
            proven.append((key, outcome.to_dict()))
        if batched and outcome.decision == NOT_PUBLISHED:  # the run's failure names the dates its proofs failed
            failures.append(f"{label(table, date)}: proof failed, nothing published: {outcome.reason}")
        if not batched:
            yield from report_outcome(context, asset_key, metadata, materialize=materialize, refusal=failure)
            if materialize and report:
                yield dg.MaterializeResult(asset_key="validation_report", metadata=write_report(
                    spark.settings.config.state_dir, key, outcome.to_dict()))
            break
        event = dg.AssetMaterialization if materialize else dg.AssetObservation
        yield event(asset_key=asset_key, partition=key, metadata=metadata)
        if materialize and report:
            yield dg.AssetMaterialization(asset_key="validation_report", partition=key, metadata=write_report(
                spark.settings.config.state_dir, key, outcome.to_dict()))
        if failure:
            failures.append(f"{label(table, date)}: {failure}")
    if proven:  # the proofs of what was done or refused publication, as this run's blocking check results
        if batched or not context.has_partition_key:
            for key, outcome_doc in proven:
                for name in VALIDATION_CHECKS:
                    yield partition_evaluation(check_result(name, outcome_doc, asset_key), asset_key, key,
                                               context.instance)
        for name in VALIDATION_CHECKS:
            yield combined_check_result(name, [doc for _, doc in proven], asset_key)
        unproven = [doc for _, doc in proven if doc.get("decision") == NOT_PUBLISHED]
        checked = {k.name for k in context.selected_asset_check_keys}
        if unproven and not failures and not set(VALIDATION_CHECKS) <= checked:
            # Without its checks in the selection a failed proof would not fail the step: fail it here.
            raise dg.Failure(description="; ".join(str(doc.get("reason")) for doc in unproven))
    if failures:
        raise dg.Failure(description=f"{len(failures)} of {len(targets)} {'partitions' if several_tables else 'dates'} "
                                     "not done: " + "; ".join(failures))


# The compaction assets are one-spec multi_assets only so that their proofs (check specs reported by the
# asset itself) are optional outputs: a dry run, a deferral or a refusal materializes nothing and so has
# no check result, and a plain @asset would fail for the missing check output.
@dg.multi_asset(
    specs=[dg.AssetSpec(
        "table_compaction", group_name="maintenance", kinds={"spark", "iceberg"}, deps=[table_health],
        description="Compaction of a table without a time column (partitioned only by identity/bucket/truncate "
                    "fields, or not at all): its due partitions, ranked by benefit and bounded by the cost ceiling, "
                    "each staged on a branch, proven with Great Expectations and published only when proven. "
                    "Tables with a time column are compacted per date by `compaction`.")],
    partitions_def=table_partitions,
    check_specs=validation_check_specs("table_compaction", table_partitions),
    can_subset=True,
)
def table_compaction(context: dg.AssetExecutionContext, config: CompactionConfig, spark: SparkResource,
                     catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
    table = str(context.partition_key)
    yield from compact(context, config, spark, catalog, claims, audit, [(table, None, table)], "table_compaction")


def latest_outcome(context, key: str) -> dict:
    """The outcome of the latest compaction materialized for `key` (date|table)."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("compaction"), asset_partitions=[key]), limit=1).records
    if not records:
        table, date = split_table_date(key)
        raise dg.Failure(description=f"no compaction of {table} {date} has been materialized yet")
    return records[0].asset_materialization.metadata["outcome"].value


def write_report(state_dir: str, key: str, outcome: dict) -> dict:
    """The report of one date's compaction, written under <state_dir>/reports/, as metadata."""
    table, date = split_table_date(key)
    report_dir = Path(state_dir, "reports", table)
    report_dir.mkdir(parents=True, exist_ok=True)
    report_path = report_dir / f"{date}.json"
    report = {"table": table, "date": date, "before_snapshot_id": outcome["before_snapshot_id"],
              "after_snapshot_id": outcome["after_snapshot_id"], "validation": outcome["validation"],
              "published": outcome.get("published"), "staged": outcome.get("staged", [])}
    report_path.write_text(json.dumps(report, indent=2, default=str))
    commits = outcome["validation"].get("commits", [])
    # A date with nothing rewritten needed no proof: it passes, as its checks say ("nothing was rewritten").
    passed = outcome["validation"].get("passed") if commits else outcome.get("decision") == NOOP
    return {
        "passed": dg.MetadataValue.bool(bool(passed)),
        "proofs": dg.MetadataValue.int(len(commits)),
        "before_snapshot_id": dg.MetadataValue.text(str(outcome["before_snapshot_id"])),
        "after_snapshot_id": dg.MetadataValue.text(str(outcome["after_snapshot_id"])),
        **numeric({"validation_seconds": float(sum(c.get("duration_seconds", 0) for c in commits))}),
        "report_path": dg.MetadataValue.path(str(report_path)),
        "report": as_json(report),
    }


def _multi_asset(**kwargs):
    # Backfill policies are beta in Dagster 1.13; ours (BACKFILL_DATES_PER_RUN) is deliberate.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.multi_asset(**kwargs)


VALIDATION_REPORT = dg.AssetSpec(
    "validation_report", group_name="maintenance", kinds={"iceberg"}, deps=["compaction"],
    description="The evidence of the latest compaction of a date: snapshot ids before and after, and the Great "
                "Expectations results of every proof. Also written to <state_dir>/reports/. Written in the "
                "compaction's own step when its rewrite was published (a separate step would show as skipped "
                "whenever nothing was published); materialized alone, it is written again from the latest "
                "compaction.")


def build_compaction_assets(partitions_def: dg.MultiPartitionsDefinition):
    @_multi_asset(
        specs=[dg.AssetSpec(
            "compaction", group_name="maintenance", kinds={"spark", "iceberg"},
            deps=[dg.AssetDep(table_health, partition_mapping=table_dimension_mapping())],
            description="Rewrites one date of one table's small files under the table's claim: stages the new "
                        "files on a branch at the planned snapshot, proves them with Great Expectations against the "
                        "files they replace, and publishes one forward replace commit only when the proof passed. "
                        "Materializes when a rewrite was published; a failed proof (its checks failed, the run "
                        "failed, main unchanged), defers and refusals are observations."),
            VALIDATION_REPORT],
        partitions_def=partitions_def,
        check_specs=validation_check_specs("compaction", partitions_def),
        can_subset=True,
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=BACKFILL_DATES_PER_RUN),
    )
    def compaction(context: dg.AssetExecutionContext, config: CompactionConfig, spark: SparkResource,
                   catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
        selected = {k.to_user_string() for k in context.selected_asset_keys}
        if "compaction" in selected:
            # One key, a batched backfill's dates of one table (BACKFILL_DATES_PER_RUN), or the tick's dates of
            # neighbouring tables (`table_batches`).
            targets = [(*split_table_date(key), str(key)) for key in context.partition_keys]
            yield from compact(context, config, spark, catalog, claims, audit, targets, "compaction",
                               report="validation_report" in selected)
            return
        keys = [str(k) for k in context.partition_keys]  # the report alone, from the latest compaction
        for key in keys:
            metadata = write_report(spark.settings.config.state_dir, key, latest_outcome(context, key))
            if len(keys) == 1:
                yield dg.MaterializeResult(asset_key="validation_report", metadata=metadata)
            else:
                yield dg.AssetMaterialization(asset_key="validation_report", partition=key, metadata=metadata)

    return compaction
