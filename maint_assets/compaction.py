"""`compaction` and `validation_report` (table x date), and `table_compaction` (table) for tables without a
time column, with Great Expectations proofs as blocking checks on both compaction assets."""


import json
import warnings
from pathlib import Path

import dagster as dg

from icemaint.operations.compaction import CompactionOutcome, CompactionRequest, Compactor
from icemaint.domain.decisions import DEFER, NOOP, NOT_PUBLISHED, REFUSE, RUN, launched_by_a_person
from maint_assets.health import table_health
from maint_assets.metadata import as_json, numeric, report_outcome
from maint_assets.partitions import PLANNED_SCHEMA_TAG, PLANNED_SNAPSHOT_TAG, TABLE_DIMENSION, TRIGGER_TAG, split_table_date, \
    table_partitions
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource
from resources.spark import SparkResource

VALIDATION_CHECKS = {
    "row_count_parity": "Rows of the replaced files before the rewrite == rows of the new files "
                        "(GX ExpectTableRowCountToEqual).",
    "sample_comparison": "Sampled rows before are found unchanged after, and the reverse (GX UnexpectedRowsExpectation).",
    "column_aggregates": "Per-column non-null counts, min/max and sums/hashes equal before and after.",
}


class CompactionConfig(dg.Config):
    dry_run: bool = False
    approved: bool = False


def outcome_metadata(outcome: CompactionOutcome) -> dict:
    numbers = {k: v for k, v in outcome.to_dict().items() if k in (
        "files_before", "files_after", "small_files_before", "small_files_after", "avg_file_bytes_before",
        "avg_file_bytes_after", "delete_files_before", "delete_files_after", "rewritten_files", "added_files",
        "rewritten_bytes", "attempts")}
    numbers.update({f"read_before_{k}": v for k, v in outcome.read_before.items()})
    numbers.update({f"read_after_{k}": v for k, v in outcome.read_after.items()})
    numbers.update({f"{k}": v for k, v in outcome.durations.items()})
    meta = {**numeric(numbers),
            "decision": dg.MetadataValue.text(str(outcome.decision)),
            "reason": dg.MetadataValue.text(outcome.reason),
            "before_snapshot_id": dg.MetadataValue.text(str(outcome.before_snapshot_id)),
            "after_snapshot_id": dg.MetadataValue.text(str(outcome.after_snapshot_id)),
            "published": dg.MetadataValue.bool(outcome.published),
            "outcome": as_json(outcome.to_dict())}
    return meta


def partition_label(outcome: dict) -> str:
    """The partition an outcome belongs to, as its asset keys it: "<date>|<table>", or the table alone."""
    return f"{outcome['date']}|{outcome.get('table')}" if outcome.get("date") else str(outcome.get("table"))


def check_result(name: str, outcome: dict) -> dg.AssetCheckResult:
    """One GX proof of a compaction outcome, as a blocking check result."""
    commits = outcome.get("validation", {}).get("commits", [])
    per_commit = [c for r in commits for c in r["checks"] if c["name"] == name]
    if outcome.get("decision") == NOOP and not commits:
        # Nothing was rewritten, so there is nothing to prove: the rows are the rows the table had.
        return dg.AssetCheckResult(
            check_name=name, passed=True, severity=dg.AssetCheckSeverity.ERROR,
            description=f"nothing was rewritten ({outcome.get('reason')}): no proof needed",
            metadata={"rewritten": dg.MetadataValue.bool(False),
                      "snapshot_id": dg.MetadataValue.text(str(outcome.get("after_snapshot_id")))})
    passed = bool(per_commit) and all(c["passed"] for c in per_commit)
    # Dagster 1.13 does not attach a check evaluation to a partition: the description names it.
    sides = ", ".join(f"{c.get('before_snapshot_id')} -> staged {c.get('after_snapshot_id')}" for c in commits)
    return dg.AssetCheckResult(
        check_name=name,
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(f"{partition_label(outcome)}: {name} {'passed' if passed else 'FAILED'} "
                     f"(replaced files as of snapshot {sides}); "
                     f"{'published as ' + str(outcome.get('after_snapshot_id')) if outcome.get('published') else 'not published'}"),
        metadata={"partition": dg.MetadataValue.text(partition_label(outcome)),
                  "observed": as_json([c.get("observed") for c in per_commit]),
                  "gx_result": as_json([c.get("gx_result") for c in per_commit]),
                  "before_snapshot_id": dg.MetadataValue.text(str(outcome.get("before_snapshot_id"))),
                  "after_snapshot_id": dg.MetadataValue.text(str(outcome.get("after_snapshot_id"))),
                  "published": dg.MetadataValue.bool(bool(outcome.get("published")))},
    )


def outcome_of_run(context, asset_key: dg.AssetKey) -> dict:
    """The compaction outcome materialized by this run for this run's partition."""
    partition = context.run.tags.get("dagster/partition")
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition] if partition else None),
        limit=1).records
    if not records or records[0].run_id != context.run.run_id:
        raise dg.Failure(description=f"no compaction of {partition} was materialized by run {context.run.run_id}")
    return records[0].asset_materialization.metadata["outcome"].value


def build_validation_checks(compaction: dg.AssetsDefinition) -> list[dg.AssetChecksDefinition]:
    """A blocking check per GX proof. The proofs run inside the compaction, under the table's claim and
    before anything is published, so a failed proof leaves `main` untouched; the checks make each
    verdict visible, fail the run and stop downstream assets."""
    def make(name: str, description: str) -> dg.AssetChecksDefinition:
        @dg.asset_check(asset=compaction, name=name, description=description, blocking=True)
        def proof(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
            return check_result(name, outcome_of_run(context, compaction.key))

        return proof

    checks = [make(name, description) for name, description in VALIDATION_CHECKS.items()]
    return checks


def table_dimension_mapping() -> dg.MultiToSingleDimensionPartitionMapping:
    # Beta in Dagster 1.13, and the documented way to map `table` x `date` onto `table`.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=TABLE_DIMENSION)


def compact(context: dg.AssetExecutionContext, config: CompactionConfig, spark: SparkResource,
            catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource,
            table: str, date: str | None, asset_key: str):
    """The body both compaction assets share: one request, its outcome as events, an honest run status."""
    tags = context.run.tags
    planned = tags.get(PLANNED_SNAPSHOT_TAG)
    planned_schema = tags.get(PLANNED_SCHEMA_TAG)
    request = CompactionRequest(
        table=table, date=date, dry_run=config.dry_run, approved=config.approved,
        trigger=tags.get(TRIGGER_TAG, "manual"), run_id=context.run.run_id,
        planned_snapshot_id=int(planned) if planned else None,
        planned_schema_id=int(planned_schema) if planned_schema else None)
    compactor = Compactor(spark.settings.config, spark.session, catalog.reader, claims.claims, audit.log,
                          progress=context.log.info)
    outcome = compactor.run(request)
    context.log.info(f"{table} {date or '(partitions)'}: {outcome.decision}: {outcome.reason}")
    person = launched_by_a_person(request.trigger)
    # A run a person or a backfill asked for never ends green without doing its work: a deferral
    # fails it with the reason (a busy claim names its holder); "nothing to do" is a materialization
    # of the partition as it is, so its state is known.
    failure = {REFUSE: f"refused: {outcome.reason}",
               DEFER: f"not done: {outcome.reason}" if person else None}.get(outcome.decision)
    yield from report_outcome(
        context, asset_key, outcome_metadata(outcome),
        materialize=not outcome.dry_run and (outcome.decision in (RUN, NOT_PUBLISHED)
                                             or (person and outcome.decision == NOOP)),
        refusal=failure)


@dg.asset(
    partitions_def=table_partitions,
    group_name="maintenance",
    kinds={"spark", "iceberg"},
    deps=[table_health],
    output_required=False,
    description="Compaction of a table without a time column (partitioned only by identity/bucket/truncate "
                "fields, or not at all): its due partitions, ranked by benefit and bounded by the cost ceiling, "
                "each staged on a branch, proven with Great Expectations and published only when proven. "
                "Tables with a time column are compacted per date by `compaction`.",
)
def table_compaction(context: dg.AssetExecutionContext, config: CompactionConfig, spark: SparkResource,
                     catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
    yield from compact(context, config, spark, catalog, claims, audit, str(context.partition_key), None,
                       "table_compaction")


def build_compaction_assets(partitions_def: dg.MultiPartitionsDefinition):
    @dg.asset(
        partitions_def=partitions_def,
        group_name="maintenance",
        kinds={"spark", "iceberg"},
        deps=[dg.AssetDep(table_health, partition_mapping=table_dimension_mapping())],
        output_required=False,
        description="Rewrites one date of one table's small files under the table's claim: stages the new files "
                    "on a branch at the planned snapshot, proves them with Great Expectations against the files "
                    "they replace, and publishes one forward replace commit only when the proof passed. "
                    "Materializes when a rewrite was staged (published or not); defers and refusals are observations.",
    )
    def compaction(context: dg.AssetExecutionContext, config: CompactionConfig, spark: SparkResource,
                   catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
        table, date = split_table_date(context.partition_key)
        yield from compact(context, config, spark, catalog, claims, audit, table, date, "compaction")

    @dg.asset(
        partitions_def=partitions_def,
        group_name="maintenance",
        kinds={"iceberg"},
        deps=[compaction],
        description="The evidence of the latest compaction of a date: snapshot ids before and after, and the "
                    "Great Expectations results of every proof. Also written to <state_dir>/reports/.",
    )
    def validation_report(context: dg.AssetExecutionContext, spark: SparkResource) -> dg.MaterializeResult:
        table, date = split_table_date(context.partition_key)
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("compaction"), asset_partitions=[str(context.partition_key)]),
            limit=1).records
        if not records:
            raise dg.Failure(description=f"no compaction of {table} {date} has been materialized yet")
        event = records[0].asset_materialization
        outcome = event.metadata["outcome"].value
        report_dir = Path(spark.settings.config.state_dir, "reports", table)
        report_dir.mkdir(parents=True, exist_ok=True)
        report_path = report_dir / f"{date}.json"
        report = {"table": table, "date": date, "before_snapshot_id": outcome["before_snapshot_id"],
                  "after_snapshot_id": outcome["after_snapshot_id"], "validation": outcome["validation"],
                  "published": outcome.get("published"), "staged": outcome.get("staged", [])}
        report_path.write_text(json.dumps(report, indent=2, default=str))
        commits = outcome["validation"].get("commits", [])
        return dg.MaterializeResult(metadata={
            "passed": dg.MetadataValue.bool(bool(outcome["validation"].get("passed"))),
            "before_snapshot_id": dg.MetadataValue.text(str(outcome["before_snapshot_id"])),
            "after_snapshot_id": dg.MetadataValue.text(str(outcome["after_snapshot_id"])),
            "validation_seconds": dg.MetadataValue.float(float(sum(c.get("duration_seconds", 0) for c in commits))),
            "report_path": dg.MetadataValue.path(str(report_path)),
            "report": as_json(report),
        })

    return compaction, validation_report, build_validation_checks(compaction) + build_validation_checks(table_compaction)
