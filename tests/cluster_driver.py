"""Maintenance processes for the cluster tests: one with a fault the test process cannot inject from outside,
and one that runs several CLI commands in one Spark application.

Spark allows one session per process and the test process already has a local one, so a compaction on
the Spark cluster runs here: `python tests/cluster_driver.py corrupt-proof CONFIG TABLE DATE` compacts
the date with the product's Compactor, and between staging and the proof changes one value inside a
staged file on S3 (same length: what bad memory or a buggy writer leaves), then waits until a writer's
commit lands on `main`. Prints the outcome as one JSON line.

`python tests/cluster_driver.py commands FD` runs `icemaint <argv>` through the CLI's `main` for each JSON
request `{"argv": [...], "env": {...}}` read from its standard input (and the fault above for
`{"corrupt-proof": [CONFIG, TABLE, DATE], "env": {...}}`), with `env` set in os.environ for it (each test's own
Dagster database), one session for all of them, and answers each on file descriptor FD
with one JSON line (exit code, stdout, stderr; an exception's traceback as stderr with exit code 1, as a
process of its own would end). A command of its own process pays a driver JVM and two
executor JVMs (10-20 s on 2 cores); where the process boundary is not what a test is about, this pays them once.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_stack import stack_module  # noqa: E402  (tests/ is this script's own directory)

CORRUPT = 987_654_321_000


def corrupt_first_id(fs, locations) -> int:
    """Replaces the first event_id of the first staged file by CORRUPT in its bytes; returns the victim."""
    import pyarrow.parquet as pq

    path = locations[0].split("://", 1)[1]
    victim = int(pq.read_table(path, filesystem=fs, columns=["event_id"]).column(0)[0].as_py())
    with fs.open_input_file(path) as fh:
        data = fh.read()
    before, after = struct.pack("<q", victim), struct.pack("<q", CORRUPT)
    assert data.count(before) >= 1, "the staged file is compressed: the value's bytes are not there"
    with fs.open_output_stream(path) as out:
        out.write(data.replace(before, after))
    return victim


def corrupt_proof(config_path: str, table: str, date: str) -> dict:
    from icemaint.config import load_config
    from icemaint.engine.spark_session import get_spark, iceberg_table
    from icemaint.observe.catalog import CatalogReader
    from icemaint.operations.compaction import CompactionRequest, Compactor
    from icemaint.safety.audit import open_audit
    from icemaint.safety.claims import open_claims
    from icemaint.domain.names import TableName

    config = load_config(config_path)
    spark = get_spark(config)
    fs = stack_module().s3_filesystem(config)
    seen: dict = {}

    def fault(staged) -> None:
        seen["victim"] = corrupt_first_id(fs, list(staged.new_files))
        seen["staged_snapshot_id"] = staged.staged_snapshot_id
        seen["base_snapshot_id"] = staged.base_snapshot_id
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # a writer's commit lands while the proof is pending
            current = iceberg_table(spark, config.catalog.name, TableName.parse(table)).currentSnapshot()
            if int(current.snapshotId()) != staged.base_snapshot_id:
                seen["writer_snapshot_id"] = int(current.snapshotId())
                return
            time.sleep(0.5)
        raise AssertionError("no writer commit landed within 90 s")

    compactor = Compactor(config, spark, CatalogReader(config), open_claims(config), open_audit(config),
                          after_stage=fault)
    for _ in range(20):  # a writer commit during the health read defers a 0s idle window: the next tick's run
        outcome = compactor.run(CompactionRequest(table, date))
        if not (outcome.decision == "defer" and outcome.reason.startswith("writer active")):
            break
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().keySet().size() - 1
    return {"decision": outcome.decision, "reason": outcome.reason, "published": bool(outcome.published),
            "validation_passed": outcome.validation.passed, "executors": executors,
            "master": spark.sparkContext.master, "app_id": spark.sparkContext.applicationId, **seen}


def serve_commands(requests, answers) -> None:
    """Each line of `requests` a JSON request (CLI arguments or the fault): run in this process, answered on
    `answers`."""
    import contextlib
    import io
    import os

    from icemaint.app.cli import main

    for line in requests:
        request = json.loads(line)
        os.environ.update(request.pop("env", {}))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if "argv" in request:
                    code = main(request["argv"])
                else:  # {"corrupt-proof": [CONFIG, TABLE, DATE]}: the fault, in this session
                    [(name, args)] = request.items()
                    assert name == "corrupt-proof", f"unknown request {name!r}"
                    print(json.dumps(corrupt_proof(*args)))
                    code = 0
            except SystemExit as exc:  # argparse's own exits
                code = exc.code  # type: ignore[assignment]  # None or a message: reported as it is
            except Exception:  # noqa: BLE001  (a bug: reported as the command's own process would end)
                import traceback

                traceback.print_exc()
                code = 1
        answers.write(json.dumps({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
        answers.flush()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "corrupt-proof":
        print(json.dumps(corrupt_proof(*args)))
    elif command == "commands":
        import os

        serve_commands(sys.stdin, os.fdopen(int(args[0]), "w"))
    else:
        raise SystemExit(f"unknown command {command!r}")
