"""Every key the config file takes, with its type as written, its default and its meaning.

The parser (`icemaint.config` and its section modules) accepts exactly these keys (each section's allowed keys come
from `section_keys`), and the docs site's configuration reference is generated from this table
(scripts/gen_reference.py), so a key cannot be added without its description.
"""

from __future__ import annotations

from icemaint.domain.agents import DEFAULT_REQUESTS_PER_HOUR, DEFAULT_REWRITE_BYTES_PER_DAY
from icemaint.domain.landing import COLUMN_TYPES as LANDING_TYPES, FORMATS as LANDING_FORMATS
from icemaint.domain.units import human_size

CATALOG_TYPES = ("hadoop", "jdbc", "rest", "glue")
CLAIM_BACKENDS = ("file", "postgres")
DAGSTER_STORAGES = ("sqlite", "postgres")
AUDIT_SINKS = ("file", "postgres")
ICEBERG_RUNTIMES = ("auto", "provided", "bundled")


# Every key the file takes: (type as written, default, meaning). The parser accepts exactly these (each section's
# allowed keys are read from here, `section_keys`), and the docs site's configuration reference is generated from this
# table (scripts/gen_reference.py), so a key cannot be added without its description. `<owner>`, `<name>`: any name.
CONFIG_KEYS: dict[str, tuple[str, str, str]] = {
    "catalog.name": ("identifier", "lake", "the catalog's name in Spark: tables are `<name>.<namespace>.<table>`"),
    "catalog.type": (" | ".join(CATALOG_TYPES), "hadoop", "the Iceberg catalog implementation"),
    "catalog.warehouse": ("path or URI", ".icemaint/warehouse", "hadoop and jdbc: a directory, relative to the file; "
                          "rest: the warehouse as the server names it"),
    "catalog.uri": ("URI", "none", "required for jdbc (`jdbc:postgresql://host/db`) and rest; a password in it is "
                    "masked wherever it is shown"),
    "catalog.properties": ("map of text", "{}", "passed to Spark's catalog and to pyiceberg alike; no secrets "
                           "(those come from ICEMAINT_CATALOG_<KEY> variables)"),
    "catalog.timeout": ("duration", "30s", "every catalog request gives up after this, in one line, never hangs"),
    "catalog.concurrent_reads": ("whole number 1-64", "1 for hadoop, else 8",
                                 "tables whose metadata a sensor tick reads at once"),
    "spark.master": ("text", "local[*]", "`local[*]`, `spark://host:7077`, `k8s://...` or `yarn`"),
    "spark.conf": ("map of text", "{}", "any spark.* setting, spark.jars.packages and spark.jars included"),
    "spark.iceberg_runtime": (" | ".join(ICEBERG_RUNTIMES), "auto", "auto: the bundled Iceberg runtime unless "
                              "spark.conf names one; provided: the cluster's classpath has it; bundled: always ours"),
    "spark.class_archive": ("boolean", "true", "the driver JVM maps Spark's classes from an archive this machine "
                            "recorded (~1.4 s less per start)"),
    "state_dir": ("path", ".icemaint", "Dagster instance, claims, audit, reports, tick cursor and logs"),
    "claims.backend": (" | ".join(CLAIM_BACKENDS), "file", "where table claims live: file locks, or PostgreSQL "
                       "advisory locks"),
    "claims.dsn_env": ("variable name", "ICEMAINT_PG_DSN", "postgres: the environment variable holding the DSN"),
    "audit.sink": (" | ".join(AUDIT_SINKS), "file", "where the audit trail lives: JSONL under the state dir, or an "
                   "append-only PostgreSQL table"),
    "audit.dsn_env": ("variable name", "ICEMAINT_PG_DSN", "postgres: the environment variable holding the DSN"),
    "scope.include": ("list of patterns", "[\"*\"]", "fnmatch patterns over `namespace.table`: the tables maintained"),
    "scope.exclude": ("list of patterns", "[]", "tables left alone even when included"),
    "dates_start": ("YYYY-MM-DD", "2020-01-01", "the first date of the `date` partitions (the UI's date axis): "
                    "where your tables' data starts"),
    "max_runs_total": ("whole number 1-10000", "2", "maintenance runs at once across the estate (the run queue)"),
    "defaults": ("policy keys", "the policy defaults", "the policy every table gets (reference: policy keys)"),
    "tables": ("map of policy keys", "{}", "per-table overrides, keyed `namespace.table`; `icemaint doctor` fails on "
               "a name the catalog does not have"),
    "alerts.webhook_url_env": ("variable name", "none", "the environment variable holding the default webhook URL"),
    "alerts.audit": ("boolean", "false", "also write each alert to the audit log as an `alert` record"),
    "alerts.owners": ("map", "{}", "per table owner (policy `owner`): its own route"),
    "alerts.owners.<owner>.enabled": ("boolean", "true", "false: no alerts for this owner's tables"),
    "alerts.owners.<owner>.webhook_url_env": ("variable name", "alerts.webhook_url_env", "this owner's webhook"),
    "alerts.owners.<owner>.audit": ("boolean", "alerts.audit", "this owner's alerts also as audit records"),
    "dagster.storage": (" | ".join(DAGSTER_STORAGES), "sqlite", "where the Dagster instance keeps runs, event logs "
                        "and schedules"),
    "dagster.dsn_env": ("variable name", "ICEMAINT_PG_DSN", "postgres: the environment variable holding the DSN"),
    "quarantine_dir": ("path or URI", "<state_dir>/quarantine", "where `orphans --quarantine` moves files "
                       "(a directory or s3://bucket/prefix)"),
    "agents.<name>.token_env": ("variable name", "none", "HTTP: the variable holding the agent's bearer token"),
    "agents.<name>.requests_per_hour": ("whole number", str(DEFAULT_REQUESTS_PER_HOUR),
                                        "maintenance requests the agent may make per hour"),
    "agents.<name>.rewrite_bytes_per_day": ("size", human_size(DEFAULT_REWRITE_BYTES_PER_DAY),
                                            "estimated bytes of the compactions the agent may launch per day"),
    "automation.orphan_removal": ("boolean", "false", "true: the retention sensor and `icemaint tick` remove orphan "
                                 "files on their own after each expiry; false: only `icemaint orphans TABLE` (or the "
                                 "UI) does. Quarantine purge is never automatic"),
    "automation.discovery_interval": ("duration, 1s to 1d", "60s", "how often the discovery sensor looks for new "
                                      "and dropped tables at most"),
    "automation.compaction_interval": ("duration, 1s to 1d", "30s", "how often the compaction sensor reads the "
                                       "tables' health and decides at most"),
    "automation.retention_interval": ("duration, 1s to 1d", "60s", "how often the retention sensor decides expiry, "
                                      "orphans, manifests and statistics at most"),
    "landing": ("map", "{}", "landing sources, by name: directories or object-store prefixes where producers drop "
                "small files that `icemaint ingest` appends to a table as a few large files, exactly once"),
    "landing.<source>.location": ("path or URI", "required", "the landing directory (relative to the file) or "
                                  "s3://bucket/prefix; names starting with '.' or '_' and ending in .tmp are skipped"),
    "landing.<source>.format": (" | ".join(LANDING_FORMATS), "parquet", "the landed files' format"),
    "landing.<source>.schema": ("map of column: type", "required for jsonl and csv",
                                "the landed files' columns in order (" + ", ".join(LANDING_TYPES) + "); parquet "
                                "files carry their own"),
    "landing.<source>.table": ("namespace.table", "required", "the Iceberg table the batches are appended to"),
    "landing.<source>.min_files": ("whole number", "100", "a batch is due when this many files have landed"),
    "landing.<source>.min_bytes": ("size", "64 MiB", "... or when the landed files hold this many bytes"),
    "landing.<source>.max_age": ("duration", "5m", "... or when the oldest landed file has waited this long"),
    "landing.<source>.max_files": ("whole number", "10000", "files at most in one batch (the rest wait)"),
    "landing.<source>.target_file_size": ("size", "128 MiB", "the size of the files a batch is written as"),
    "landing.<source>.processed": ("path or URI", "<location>/_processed", "where ingested files are moved once "
                                   "their batch is committed"),
    "landing.<source>.delete_processed_after": ("duration or none", "none", "processed files are deleted this "
                                                "long after they landed; none: kept"),
}


def section_keys(section: str) -> tuple[str, ...]:
    """The keys CONFIG_KEYS allows directly under `section` ("" for the top level), in the table's order."""
    prefix = f"{section}." if section else ""
    found = [k[len(prefix):].split(".", 1)[0] for k in CONFIG_KEYS if k.startswith(prefix)]
    return tuple(dict.fromkeys(found))
