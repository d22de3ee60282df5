"""Driver settings tried against the peer misses (issue 20): JIT, garbage collector, manifest cache, codec level.

    python -m benchmarks.driver_settings [--shapes estate,commits] [--variants default,c1_only,...] [--reps 2]
                                         [--tables 40] [--commits 1000] [--out benchmarks/RESULTS.md] [--note TEXT]
    python -m benchmarks.driver_settings --from-results benchmarks/.work/driver_settings/results.json

The two shapes where icemaint is furthest behind the peer, each built once and copied afresh before every
measurement (a Hadoop catalog, the embedded default):

- estate: `--tables` tables of one date of 100 small files (100 rows each), caught up by `icemaint tick
  --until-idle` with `max_runs_total` 2: many small table-dates on one JVM, where its JIT compilers used 54 of
  135 CPU-seconds in an earlier profile (RESULTS.md, the peer section);
- commits: one date built by `--commits` single-file commits of 4,000 rows (one manifest each), compacted by
  `icemaint compact --date`: one large rewrite, a publish that filters every manifest.

Each variant is the product's configuration with one Spark setting added (`VARIANTS`); each measurement is a
fresh process (its JVM included), the variants interleaved and their order reversed on every repetition.
Afterwards the rows are checked with pyiceberg, an independent reader: every table of the estate holds one
file and exactly its ids, the commits table every id once with every column as written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import concurrent_tick, streaming
from benchmarks.jvm_archive import ready as ready_class_archive

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "driver_settings"
SECTION = "## Driver settings tried against the peer misses"
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
ICEMAINT = str(Path(sys.executable).parent / "icemaint")

def _java(what: str, options: str, aside: str = "") -> tuple[str, dict[str, str]]:
    """A variant that adds Java options to the driver JVM, labelled with them."""
    return f"{what} (`{options}`{'; ' + aside if aside else ''})", {JAVA_OPTIONS: options}


# name -> (what it is, the Spark settings it adds to the shape's configuration)
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "default": ("the product as it ships", {}),
    "c1_only": _java("JIT: C1 only", "-XX:TieredStopAtLevel=1"),
    "c2_later": _java("JIT: C2 thresholds x8", "-XX:Tier4InvocationThreshold=40000 -XX:Tier4CompileThreshold=120000 "
                                               "-XX:Tier4MinInvocationThreshold=4800"),
    "serial_gc": _java("collector: Serial", "-XX:+UseSerialGC", "G1 is the JDK's choice on 2 cores"),
    "parallel_gc": _java("collector: Parallel", "-XX:+UseParallelGC"),
    "manifest_cache": ("Iceberg's manifest content cache (catalog `io.manifest.cache-enabled`: the publish re-reads "
                       "the manifests the plan read)", {"spark.sql.catalog.{catalog}.io.manifest.cache-enabled": "true"}),
    "zstd_level_1": ("zstd level 1, pyarrow's default (`spark.sql.iceberg.compression-level`; Iceberg Java's is 3)",
                     {"spark.sql.iceberg.compression-level": "1"}),
}
SHAPES = ("estate", "commits")
DEFAULT_VARIANTS = {"estate": "default,c1_only,c2_later,serial_gc",
                    "commits": "default,c1_only,serial_gc,manifest_cache,zstd_level_1"}
ESTATE_FILES, ESTATE_ROWS = 100, 100
COMMIT_ROWS = 4000


def log(message: str) -> None:
    print(f"[driver-settings {dt.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def _with_variant(doc: dict, variant: str, catalog: str) -> dict:
    for key, value in VARIANTS[variant][1].items():
        doc["spark"]["conf"][key.format(catalog=catalog)] = value
    return doc


def build(shape: str, seed: Path, args) -> None:
    shutil.rmtree(seed, ignore_errors=True)
    seed.mkdir(parents=True)
    if shape == "estate":
        concurrent_tick.build_estate(seed, args.tables, ESTATE_FILES, ESTATE_ROWS)
        return
    code = f"""
from benchmarks import streaming
from icemaint.config import load_config
from icemaint.engine.spark_session import get_spark
spark = get_spark(load_config({str(streaming.write_config(seed, 'state'))!r}))
streaming.build_table(spark, {args.commits}, {COMMIT_ROWS})
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True)


def measure(shape: str, seed: Path, variant: str, args) -> dict:
    import yaml

    root = WORK / shape / variant
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    if shape == "estate":
        shutil.copytree(seed / "wh", root / "wh")
        doc = _with_variant(concurrent_tick.config_doc(root, 2), variant, "local")
        argv = ["tick", "--until-idle", "--json"]
    else:
        shutil.copytree(seed / "warehouse", root / "warehouse")
        doc = _with_variant(streaming.config_doc(root, "state"), variant, streaming.CATALOG)
        argv = ["compact", streaming.TABLE, "--date", streaming.DAY.isoformat(), "--json"]
    config = root / "icemaint.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, "ICEMAINT_IDENTITY": "benchmark"}
    ready_class_archive(config, env)  # no timed process records the JVM class archive
    started = time.perf_counter()
    proc = subprocess.run([ICEMAINT, "--config", str(config), *argv], env=env, capture_output=True, text=True, cwd=root)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{shape} / {variant} exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
    out = json.loads(proc.stdout)
    if shape == "estate":
        published = sum(1 for r in out for d in r["decisions"] if d.get("published"))
        if published != args.tables:
            raise RuntimeError(f"estate / {variant}: {published} of {args.tables} table-dates published")
        concurrent_tick.check_estate(root, args.tables, ESTATE_FILES, ESTATE_ROWS)
        return {"shape": shape, "variant": variant, "seconds": round(seconds, 2), "ticks": len(out)}
    rows = streaming.check_rows(streaming.table_dir(root), args.commits * COMMIT_ROWS)
    if not rows["ok"] or out[0].get("files_after") != 1:
        raise RuntimeError(f"commits / {variant}: {out[0].get('files_after')} files after, rows {rows}")
    return {"shape": shape, "variant": variant, "seconds": round(seconds, 2), "durations": out[0].get("durations", {})}


def render(result: dict) -> str:
    lines = [SECTION, "",
             f"- Date: {result['date']}; command: `{result['command']}`; commit measured: `{result['commit']}`"
             f"{_uncommitted(result)}; "
             f"machine: {result['machine']}; load average at the start {result['load_start']}, at the end "
             f"{result['load_end']}.",
             f"- Shapes (Hadoop catalog, a fresh copy per measurement, a fresh process each, variants interleaved, "
             f"{result['reps']} runs each): *estate*, {result['tables']} tables of one date of {ESTATE_FILES} small "
             f"files caught up by `icemaint tick --until-idle` (max_runs_total 2); *commits*, one date built by "
             f"{result['commits']:,} single-file commits ({result['commits'] * COMMIT_ROWS:,} rows) compacted by "
             "`icemaint compact --date`. Rows checked afterwards with pyiceberg in every measurement.", "",
             "| shape | variant | wall (median) | each run | / default |", "|---|---|---|---|---|"]
    by = _runs_by(result)
    for (shape, variant), runs in by.items():
        med = statistics.median(runs)
        lines.append(f"| {shape} | {VARIANTS[variant][0]} | {med:.1f} s | "
                     f"{', '.join(f'{s:.1f}' for s in runs)} | {med / statistics.median(by[shape, 'default']):.2f}x |")
    spread = [max(v) / min(v) for v in by.values() if len(v) > 1]
    if spread:
        lines += ["", f"- The same setting's runs differ by up to {100 * (max(spread) - 1):.0f}% on this machine: "
                      "a difference smaller than that is not resolved by these runs."]
    if result.get("note"):
        lines.append(f"- {result['note']}")
    return "\n".join(lines) + "\n"


def _uncommitted(result: dict) -> str:
    changed = result.get("uncommitted") or []
    return f" with uncommitted changes to {', '.join(f'`{p}`' for p in changed)}" if changed else ""


def _runs_by(result: dict) -> dict[tuple[str, str], list[float]]:
    """Each (shape, variant)'s seconds, shapes in the order measured."""
    out: dict[tuple[str, str], list[float]] = {}
    for m in sorted(result["measurements"], key=lambda m: result["shapes"].index(m["shape"])):
        out.setdefault((m["shape"], m["variant"]), []).append(m["seconds"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.driver_settings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated, of {', '.join(VARIANTS)} (default per shape: {DEFAULT_VARIANTS})")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--tables", type=int, default=40)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--note", default="", help="a line for the section")
    parser.add_argument("--from-results", metavar="JSON", help="only render the section from a previous run's figures")
    args = parser.parse_args(argv)
    from benchmarks.machine import describe_machine, load_average
    from benchmarks.stack_bench import write_section
    from benchmarks.versions import describe_source

    if args.from_results:
        write_section(Path(args.out), render(json.loads(Path(args.from_results).read_text())), SECTION)
        return 0
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES] + [v for v in (args.variants or "").split(",") if v and v not in VARIANTS]
    if unknown:
        parser.error(f"unknown shape or variant: {', '.join(unknown)}")
    machine = describe_machine()
    source = describe_source(REPO)
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join(["python", "-m", "benchmarks.driver_settings",
                                     *(argv if argv is not None else sys.argv[1:])]),
              "commit": source["commit"][:9], "uncommitted": source["uncommitted_changes"],
              "machine": f"{machine['cores']} cores, {machine['cpu_model']}",
              "load_start": load_average(), "shapes": shapes, "reps": args.reps, "tables": args.tables,
              "commits": args.commits, "note": args.note, "measurements": []}
    for shape in shapes:
        variants = ["default", *[v for v in (args.variants or DEFAULT_VARIANTS[shape]).split(",") if v != "default"]]
        seed = WORK / shape / "seed"
        log(f"{shape}: building the shape")
        build(shape, seed, args)
        for rep in range(args.reps):
            for variant in variants if rep % 2 == 0 else list(reversed(variants)):
                m = measure(shape, seed, variant, args)
                log(f"{shape} / {variant}: {m['seconds']:.1f} s")
                result["measurements"].append(m)
    result["load_end"] = load_average()
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(json.dumps(result, indent=1))
    write_section(Path(args.out), render(result), SECTION)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
