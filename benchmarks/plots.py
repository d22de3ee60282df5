"""The benchmark figures as plots for the documentation (docs/images/bench-*.png, `make bench-plots`).

They are drawn from the tables benchmarks/RESULTS.md records (the figures the reports rendered), so a plot
shows what the page states: the cost of a compaction by phase, against the bare procedure (section 1), and
icemaint against the peer per workload (*Side by side with a peer*). A section or column that is missing is
a one-line error naming it.

    python -m benchmarks.plots [--results benchmarks/RESULTS.md] [--out docs/images]
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COST_SECTION = "## 1. Cost: compaction before and after stage-prove-publish"
PEER_SECTION = "## Side by side with a peer"
SECONDS = re.compile(r"^([\d.]+) s$")


class PlotError(ValueError):
    """RESULTS.md lacks a table or a column a plot is drawn from."""


def section_table(markdown: str, heading: str) -> list[dict[str, str]]:
    """The rows of the first table under the heading that starts with `heading`, as dicts by column."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    if start is None:
        raise PlotError(f"no section {heading!r} in the results")
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    if len(rows) < 3:
        raise PlotError(f"no table under {heading!r}")
    header = rows[0]
    return [dict(zip(header, row, strict=False)) for row in rows[2:]]


def seconds(cell: str, what: str) -> float:
    """`12.3 s` as 12.3; an empty cell (a phase the variant does not have) as 0."""
    if not cell:
        return 0.0
    match = SECONDS.match(cell)
    if not match:
        raise PlotError(f"{what}: {cell!r} is not a duration in seconds")
    return float(match.group(1))


def column(row: dict[str, str], name: str, heading: str) -> str:
    if name not in row:
        raise PlotError(f"the table under {heading!r} has no column {name!r}")
    return row[name]


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def plot_cost(rows: list[dict[str, str]]) -> tuple[str, bytes]:
    """Stacked bars: the median wall time of each version's compaction with its proof, by phase, per size."""
    import matplotlib.pyplot as plt

    phases = ("stage / rewrite", "proof", "publish", "rest")
    picked = [r for r in rows if column(r, "variant", COST_SECTION).startswith(("before: with proof",
                                                                                  "after: with proof"))]
    bare = [r for r in rows if r["variant"].startswith("bare") and "after-worker" in r["variant"]]
    if not picked:
        raise PlotError(f"the table under {COST_SECTION!r} has no 'with proof' rows")
    labels = [f"{r['size']}\n{r['variant'].split(':')[0]}" for r in picked]
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    bottom = [0.0] * len(picked)
    for phase in phases:
        values = [seconds(column(r, phase, COST_SECTION), f"{r['size']} {r['variant']} {phase}") for r in picked]
        ax.bar(labels, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for r in bare:
        wall = seconds(column(r, "wall (median)", COST_SECTION), f"{r['size']} bare")
        xs = [i for i, p in enumerate(picked) if p["size"] == r["size"]]
        if xs:
            ax.hlines(wall, min(xs) - 0.4, max(xs) + 0.4, colors="black", linestyles="dashed")
            ax.annotate("bare rewrite_data_files", (max(xs) + 0.4, wall), ha="right", va="bottom", fontsize=8)
    ax.set_ylabel("wall time, median (s)")
    ax.set_title("Compaction with its proof, by phase: before and after stage-prove-publish")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return "bench-cost.png", _png(fig)


def _wrap(label: str) -> str:
    """A workload's label on two lines: before its parenthesis, or after its colon."""
    head, sep, tail = label.partition(": ")
    if sep:
        return f"{head}:\n{tail}"
    return re.sub(r"\s*\(", "\n(", label, count=1)


def plot_peer(rows: list[dict[str, str]]) -> tuple[str, bytes]:
    """Paired horizontal bars: icemaint and the peer's wall time per workload, with the ratio."""
    import matplotlib.pyplot as plt

    shapes = [column(r, "shape", PEER_SECTION) for r in rows]
    ours = [seconds(column(r, "icemaint", PEER_SECTION), f"{r['shape']} icemaint") for r in rows]
    theirs = [seconds(column(r, "zamboni", PEER_SECTION), f"{r['shape']} zamboni") for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.9 * len(rows) + 1.4), dpi=100)
    ys = range(len(rows))
    height = 0.38
    ax.barh([y - height / 2 for y in ys], ours, height, label="icemaint (with its proof)")
    ax.barh([y + height / 2 for y in ys], theirs, height, label="iceberg-zamboni (row count)")
    # The ratio as the report computed it from unrounded times (else from the rounded ones shown).
    ratios = [r.get("icemaint / zamboni") or (f"{a / b:.2f}x" if b else "") for r, a, b in zip(rows, ours, theirs,
                                                                                               strict=True)]
    for y, a, ratio in zip(ys, ours, ratios, strict=True):
        ax.annotate(ratio, (a, y - height / 2), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(list(ys), [_wrap(s) for s in shapes], fontsize=8)
    ax.set_xlim(0, max(ours + theirs) * 1.12)  # room for the ratios
    ax.invert_yaxis()
    ax.set_xlabel("wall time, one run (s)")
    ax.set_title("Side by side with a peer, per workload")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return "bench-peer.png", _png(fig)


def draw(results: Path, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    markdown = results.read_text()
    # Every plot drawn before any is written: a bad table leaves the images as they were.
    drawn = [plot_cost(section_table(markdown, COST_SECTION)), plot_peer(section_table(markdown, PEER_SECTION))]
    out.mkdir(parents=True, exist_ok=True)
    for name, data in drawn:
        (out / name).write_bytes(data)
    return [out / name for name, _ in drawn]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    try:
        paths = draw(args.results, args.out)
    except (PlotError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
