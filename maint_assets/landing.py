"""`landed_batches` (per landing source): one batch of a source's small landed files appended to its table as a
few large files, exactly once, by `icemaint.operations.ingest`; and the job the landing sensor and `icemaint ingest`
run it with.

A batch appended materializes (files, bytes, rows, the snapshot); nothing due, a dry run or a deferral is an
observation; a refusal observes and fails naming the policy.
"""

import dagster as dg

from icemaint.domain.verdicts import NOT_PUBLISHED, RUN
from icemaint.domain.units import human_size
from icemaint.operations.ingest import IngestRequest, Ingestor
from maint_assets.metadata import as_json, materializes, report_outcome, run_failure
from maint_assets.partitions import TRIGGER_TAG, run_identity
from resources.catalog import IcebergCatalogResource
from resources.claims import AuditResource, TableClaimResource
from resources.spark import SparkResource

LANDING_DIMENSION = "landing_source"
landing_partitions = dg.DynamicPartitionsDefinition(name=LANDING_DIMENSION)
INGEST_JOB = "ingest_job"


class IngestConfig(dg.Config):
    dry_run: bool = False
    force: bool = False  # a batch of whatever has landed, even below every threshold


def batch_metadata(outcome) -> dict:
    return {
        "decision": dg.MetadataValue.text(str(outcome.decision)),
        "reason": dg.MetadataValue.text(outcome.reason),
        "table": dg.MetadataValue.text(outcome.table),
        "batch_id": dg.MetadataValue.text(str(outcome.batch_id)),
        "files": dg.MetadataValue.int(outcome.files),
        "bytes": dg.MetadataValue.int(outcome.bytes),
        "size": dg.MetadataValue.text(human_size(outcome.bytes)),
        "rows": dg.MetadataValue.int(outcome.rows),
        "new_files": dg.MetadataValue.int(outcome.new_files),
        "rejected_files": dg.MetadataValue.int(len(outcome.rejected)),
        "waiting_files": dg.MetadataValue.int(outcome.waiting),
        "snapshot_id": dg.MetadataValue.text(str(outcome.after_snapshot_id)),
        "outcome": as_json(outcome.to_dict()),
    }


@dg.asset(partitions_def=landing_partitions, group_name="maintenance",
          description="Batches of a landing source's small files appended to its table as a few large files, each "
                      "exactly once (batch id in the snapshot summary), proven with Great Expectations first.")
def landed_batches(context: dg.AssetExecutionContext, config: IngestConfig, spark: SparkResource,
                   catalog: IcebergCatalogResource, claims: TableClaimResource, audit: AuditResource):
    tags = context.run.tags
    trigger = tags.get(TRIGGER_TAG, "manual")
    ingestor = Ingestor(spark.settings.config, spark.lazy_session, catalog.reader, claims.claims, audit.log,
                        progress=context.log.info)
    outcome = ingestor.run(IngestRequest(context.partition_key, trigger=trigger, run_id=context.run_id,
                                         force=config.force, dry_run=config.dry_run, identity=run_identity(tags)))
    metadata = batch_metadata(outcome)
    done = outcome.decision == RUN
    yield from report_outcome(
        context, "landed_batches", metadata,
        materialize=materializes(trigger, str(outcome.decision), outcome.dry_run, done=done),
        refusal=f"NOT APPENDED: {outcome.reason}" if outcome.decision == NOT_PUBLISHED else run_failure(
            trigger, str(outcome.decision), refused=f"refused: {outcome.reason}",
            not_done=f"not ingested: {outcome.reason}"))


ingest_job = dg.define_asset_job(INGEST_JOB, selection=["landed_batches"], executor_def=dg.in_process_executor)
