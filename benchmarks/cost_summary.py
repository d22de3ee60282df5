"""The cost of one proven table-date, warm and cold, beside the peer: one section of benchmarks/RESULTS.md drawn
from the newest figures of three benchmarks (issue 50, item 4).

    python -m benchmarks.cost_summary [--out benchmarks/RESULTS.md] [--results benchmarks/results]

Reads, each the newest of its kind in --results: warm_profile_*.json (`make bench-warm-profile`: each part of a
warm table-date), warm_vs_per_run_*.json (`make bench-warm-vs-run`: a process per run against one warm process)
and peer_*.json (`make bench-peer`: the peer's shapes, fresh and warm). Measures nothing itself: `make bench`
runs the three, then this. A missing kind is named in the section, not guessed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.stack_bench import write_section

HERE = Path(__file__).resolve().parent
SECTION = "## The cost of one proven table-date: warm, cold and the peer"
TARGET_WARM_MS = 200  # issue 50, item 1: a warm table-date of the estate's shape, inside the contract

# (label in warm_profile's JSON, what the line says, why it costs what it does)
PARTS = (
    ("Spark's write (with the fed digest)", "Spark's write of the staged files",
     "a Spark job: the driver plans and schedules it, Iceberg's writer writes; the digest of the replaced rows "
     "rides on it"),
    ("after side's read (digest)", "the proof's read of the staged files",
     "a Spark job reading what was written, so the proof is of the files on disk, not of the rows sent"),
    ("GX checks (four, pandas)", "Great Expectations' four checks", "on the two digests, no Spark job"),
    ("staging branch commit", "the staging branch's commit", "a catalog commit"),
    ("publish", "the publish", "the second and last catalog commit; the branch goes with it"),
    ("plan the date's files (Java scan)", "planning the date's files", "Iceberg's scan planning in the JVM"),
    ("decide (health, audit read, decision)", "the decision", "health, the table's audit records, the policy"),
)


def newest(results: Path, kind: str) -> tuple[Path | None, dict | None]:
    """The newest figures of `kind` that stand for the default deployment: a warm profile of one side (not a
    comparison of two versions or storages) on Dagster's default storage."""
    for path in sorted(results.glob(f"{kind}_*.json"), reverse=True):
        data = json.loads(path.read_text())
        if kind != "warm_profile" or ("against_rows" not in data and data.get("dagster_storage", "sqlite") == "sqlite"):
            return path, data
    return None, None


def median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return (values[n // 2] + values[(n - 1) // 2]) / 2 if values else 0.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def warm_lines(name: str, profile: dict) -> list[str]:
    rows = [r for r in profile["rows"] if r.get("published") and r.get("branch_removal", "in_publish") == "in_publish"]
    if not rows:
        return [f"- The warm parts: {name} holds no published table-date."]
    contract = median([r["parts"].get("contract (Compactor.run)", 0.0) for r in rows])
    run = median([r["parts"].get("Dagster run (runner.compact)", 0.0) for r in rows])
    loads = [r["load1"] for r in rows]
    verdict = "met" if contract * 1000 <= TARGET_WARM_MS else "**missed**"
    out = [f"- **Warm, its parts** ({name}, {profile['when']}; {len(rows)} table-dates after {profile['warm_up']} "
           f"warm-up, {profile['files']} files of {profile['rows_per_file']} rows; 1-minute load "
           f"{min(loads):.1f}-{max(loads):.1f}): the contract {_ms(contract)} at the median (target "
           f"<= {TARGET_WARM_MS} ms: {verdict}), the Dagster run around it {_ms(run)}."
           + _floor(rows), "",
           "| part of a warm table-date | median | share of the contract | why it costs this |", "|---|---|---|---|"]
    listed = 0.0
    for label, what, why in PARTS:
        value = median([r["parts"].get(label, 0.0) for r in rows])
        listed += value
        out.append(f"| {what} | {_ms(value)} | {value / contract:.0%} | {why} |" if contract else
                   f"| {what} | {_ms(value)} | - | {why} |")
    if contract:  # the parts above do not nest in one another; what they leave is the contract's own driver work
        rest = max(contract - listed, 0.0)
        out.append(f"| everything else in the contract | {_ms(rest)} | {rest / contract:.0%} | the stage's and the "
                   "proof's own driver work around their Spark jobs, the claim, the health after and the audit "
                   "record |")
    return out


def _floor(rows: list[dict]) -> str:
    """What Iceberg's own rewrite of a twin of each table-date took in the same JVM (`warm_profile --bare`)."""
    bare = [r["bare"]["wall"] for r in rows if "bare" in r]
    if not bare:
        return ""
    return (f" Iceberg's own `rewrite_data_files` of a twin of each table-date, in the same JVM with no proof, took "
            f"{_ms(median(bare))}: the floor under any rewrite on Spark here.")


def cold_lines(name: str, result: dict) -> list[str]:
    rows = result["rows"]

    def med(side: str, key: str) -> float:
        if key == "cpu":
            return median([r[side]["cpu_python"] + r[side]["cpu_jvm"] for r in rows])
        return median([r[side][key] for r in rows])

    loads = [r["load1"] for r in rows]
    return [f"- **Cold against warm** ({name}, {result['when']}; {len(rows)} pairs, 1-minute load "
            f"{min(loads):.1f}-{max(loads):.1f}): a table-date in a fresh process (Dagster's default launcher, "
            f"`icemaint compact`) {med('per_run', 'wall'):.2f} s of wall and {med('per_run', 'cpu'):.1f} CPU-s; in "
            f"a warm process (`serve`'s ticks) {med('warm', 'wall'):.2f} s and {med('warm', 'cpu'):.1f} CPU-s: "
            f"{med('per_run', 'wall') / med('warm', 'wall'):.1f}x the wall. Why: a fresh JVM loads and compiles "
            "the same classes for every run, and Python imports Dagster, Spark's gateway and Great Expectations "
            "again."]


def peer_lines(name: str, result: dict) -> list[str]:
    from benchmarks.peer import FULL, TARGETS

    out = [f"- **Beside the peer** ({name}, {result['date']}; iceberg-zamboni {result['peer_version']}, no JVM, "
           "no proof beyond a row count). *Fresh*: our process starts for the work, as the peer's does; *warm*: "
           "our process had already caught up other tables (`serve`).", "",
           "| shape | icemaint, fresh | icemaint, warm | zamboni | fresh / zamboni | warm / zamboni | target |",
           "|---|---|---|---|---|---|---|"]
    order = list(FULL)
    for r in sorted(result["shapes"], key=lambda r: order.index(r["shape"]["name"]) if r["shape"]["name"] in order
                    else len(order)):
        warm, target = r.get("icemaint_warm"), TARGETS.get(r["shape"]["name"])
        out.append(f"| {r['shape']['what']} | {r['icemaint']['seconds']:.1f} s | "
                   + (f"{warm['seconds']:.1f} s" if warm else "not measured") + f" | {r['zamboni']['seconds']:.1f} s"
                   f" | {r['ratio']:.2f}x | " + (f"{r['warm_ratio']:.2f}x" if warm else "-")
                   + f" | {'-' if target is None else f'<= {target}x'} |")
    return out + ["", "- Why each shape costs what it does: *Side by side with a peer* below. Warm, the process start is "
                  "gone; what is left is each table-date's own run (the parts above and Dagster's run around them, "
                  "two lanes on two cores), where the peer rewrites each table with no proof beyond a row count."]


def render(results: Path) -> str:
    lines = [SECTION, "", "Drawn by `python -m benchmarks.cost_summary` from the newest figures of three benchmarks "
             "(`make bench` runs them, then this); each line says when its figures were measured.", ""]
    for kind, draw in (("warm_profile", warm_lines), ("warm_vs_per_run", cold_lines), ("peer", peer_lines)):
        path, data = newest(results, kind)
        if data is None:
            lines += [f"- No `{kind}_*.json` in {results.name}/: run its benchmark first.", ""]
            continue
        assert path is not None
        lines += draw(path.name, data) + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cost_summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--results", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    section = render(Path(args.results))
    write_section(Path(args.out), section, SECTION)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
