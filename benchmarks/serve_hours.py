"""`icemaint serve`'s memory over hours: the process's and its JVM's resident set, and the JVM heap, sampled every
minute for a given duration (issue 50, item 3: "bounded memory over hours").

    python -m benchmarks.serve_hours [--duration 90m] [--sample-every 60s] [--interval 45s] [--tables 3]
                                     [--writer-every 15] [--histogram-every 15m] [--out-dir benchmarks/results]
                                     [--results benchmarks/RESULTS.md] [--from-results JSON]

A small estate (`--tables` streaming tables of the simulator, 3 days each, a Hadoop catalog under
benchmarks/.work/serve_hours/) keeps receiving small files from a writer process (its own JVM, a micro-batch into
every table every `--writer-every` seconds), so every tick compacts real dates, and expiry keeps the snapshot count
of each table bounded (policy: older than 10m, the newest 10 kept, due over 50), as a deployment's streaming tables
would. One `icemaint serve --interval` runs beside it for `--duration`, then gets SIGTERM (its exit is recorded).

Every `--sample-every` this harness reads, from outside the serve process: its resident set and its JVM's (/proc),
the JVM heap's used, committed and old-generation bytes and metaspace (`jstat -gc`), and the load average; every
`--histogram-every` `jcmd GC.class_histogram` (a full collection: the heap's live bytes, and the largest classes
kept in a file, which is what shows a leak's type). Samples go to `<out-dir>/serve_hours_<stamp>.csv` as they are
taken (a run cut short still has them); the summary (start after warm-up, peak, end, least-squares slope per hour
over the whole run and over its second half) to `<out-dir>/serve_hours_<stamp>.json` and a section of RESULTS.md.
SIGTERM or Ctrl-C to this harness ends the run early and still summarizes it.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import serve_memory
from benchmarks.machine import describe_machine, load_average
from benchmarks.serve_memory import start_estate
from benchmarks.stack_bench import write_section
from icemaint.app.process_memory import rss_bytes
from icemaint.domain.units import counted, parse_duration

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / ".work" / "serve_hours"
SECTION = "## A long-lived engine over hours: `icemaint serve`'s memory, sampled every minute"
MiB = 2**20
FIELDS = ("utc", "elapsed_s", "load1", "ticks", "published", "rss_python", "rss_jvm", "jvm_heap_used",
          "jvm_heap_committed", "jvm_old_used", "jvm_metaspace_used", "jvm_young_gcs", "jvm_full_gcs", "jvm_live",
          "rss_writer_tree", "rss_python_brk", "rss_python_anon", "rss_python_file", "python_anon_maps")
SERIES = (("serve process (Python)", "rss_python"), ("- its brk heap (glibc's main arena)", "rss_python_brk"),
          ("- its other anonymous memory (thread arenas, mmap'd blocks, pyarrow's pool)", "rss_python_anon"),
          ("- its file-backed pages (libraries, mapped files)", "rss_python_file"), ("its JVM (resident set)", "rss_jvm"),
          ("JVM heap used", "jvm_heap_used"), ("JVM heap committed", "jvm_heap_committed"),
          ("JVM old generation used", "jvm_old_used"), ("JVM metaspace used", "jvm_metaspace_used"),
          ("JVM live heap after a full GC (histogram)", "jvm_live"))

# Expiry keeps each table's snapshot count bounded, as in a deployment's streaming tables.
EXPIRY = {"snapshot_older_than": "10m", "retain_last": 10, "snapshot_max_count": 50}

_stop_requested = False


def log(message: str) -> None:
    serve_memory.log(message, "serve-hours")


# --- reading a process from outside ------------------------------------------------------------------------------

def descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def java_child(root: int) -> int | None:
    """The Spark driver JVM under `root`: a java process running SparkSubmit. Not merely the first java process:
    serve starts short-lived ones too, and a harness that kept one of those read no JVM for the whole run."""
    for pid in descendants(root):
        try:
            if (Path(f"/proc/{pid}/comm").read_text().strip() == "java"
                    and b"SparkSubmit" in Path(f"/proc/{pid}/cmdline").read_bytes()):
                return pid
        except OSError:
            continue
    return None


def tree_rss(root: int) -> int:
    return sum(rss_bytes(p) or 0 for p in [root, *descendants(root)])


def memory_regions(pid: int) -> dict[str, int]:
    """Where a process's resident set lies (/proc/<pid>/smaps): the brk heap (glibc's main arena), other anonymous
    mappings (glibc's per-thread arenas, large blocks malloc maps on its own, pyarrow's jemalloc pool, thread
    stacks), file-backed pages; and how many anonymous mappings there are. Growth in one of them names its kind."""
    out = {"rss_python_brk": 0, "rss_python_anon": 0, "rss_python_file": 0, "python_anon_maps": 0}
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return {}
    kind = "rss_python_anon"
    for line in text.splitlines():
        head = line.split(None, 6)
        if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's header line
            path = head[5] if len(head) > 5 else ""
            kind = ("rss_python_brk" if path == "[heap]" else
                    "rss_python_file" if path.startswith("/") else "rss_python_anon")
            if kind == "rss_python_anon":
                out["python_anon_maps"] += 1
        elif line.startswith("Rss:"):
            out[kind] += int(line.split()[1]) * 1024
    return out


def jstat_gc(pid: int) -> dict[str, int]:
    """Heap used / committed, old generation used and metaspace used (bytes), and the collection counts."""
    out = subprocess.run(["jstat", "-gc", str(pid)], capture_output=True, text=True, timeout=30).stdout.split("\n")
    if len(out) < 2:
        return {}
    row = dict(zip(out[0].split(), out[1].split()))

    def kib(*names: str) -> int:
        return int(sum(float(row[n]) for n in names) * 1024)

    try:
        return {"jvm_heap_used": kib("S0U", "S1U", "EU", "OU"), "jvm_heap_committed": kib("S0C", "S1C", "EC", "OC"),
                "jvm_old_used": kib("OU"), "jvm_metaspace_used": kib("MU"), "jvm_young_gcs": int(row["YGC"]),
                "jvm_full_gcs": int(row["FGC"])}
    except (KeyError, ValueError):
        return {}


def class_histogram(pid: int, path: Path, top: int = 30) -> int | None:
    """`jcmd GC.class_histogram` (a full collection first): the live heap's bytes; the largest classes to `path`."""
    out = subprocess.run(["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=300).stdout
    lines = out.splitlines()
    total = next((line for line in reversed(lines) if line.startswith("Total")), None)
    path.write_text("\n".join(lines[:top + 3] + ([total] if total else [])) + "\n")
    return int(total.split()[2]) if total else None


def tick_lines(path: Path, event: str = "tick") -> list[dict]:
    """serve's `--json` objects of one kind (`tick`, `recycle`, `start`) so far."""
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if item.get("event") == event:
            found.append(item)
    return found


# --- the run -----------------------------------------------------------------------------------------------------

def _request_stop(signum, frame) -> None:
    global _stop_requested
    _stop_requested = True


def measure(args, stamp: str) -> dict:
    work = Path(args.work)
    if work.exists() and any(work.iterdir()) and not (work / "icemaint.yaml").exists():
        raise SystemExit(f"serve_hours: --work {work} holds files that are not an earlier run's estate: "
                         "it is emptied first, so give a new or an earlier run's directory")
    estate = start_estate(work, args.tables, args.writer_every, scope="serve-hours", defaults=EXPIRY)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, hist_dir = out_dir / f"serve_hours_{stamp}.csv", work / "histograms"
    hist_dir.mkdir()
    load_before, machine = load_average(), describe_machine()
    ticks_path, serve_err = work / "serve.jsonl", work / "serve.stderr"
    log(f"serve: --interval {args.interval} for {args.duration}; samples every {args.sample_every} into {csv_path}")
    started, started_utc = time.monotonic(), dt.datetime.now(dt.timezone.utc)
    with open(ticks_path, "w") as out, open(serve_err, "w") as err:
        serve = subprocess.Popen([str(Path(sys.executable).parent / "icemaint"), "--config", str(estate.config),
                                  "serve", "--interval", args.interval, "--recycle-above", args.recycle_above,
                                  "--json"], cwd=REPO, env=estate.env, stdout=out, stderr=err)
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    duration, every = parse_duration(args.duration), parse_duration(args.sample_every)
    hist_every = parse_duration(args.histogram_every) if args.histogram_every else None
    samples: list[dict] = []
    jvm, next_hist = None, started + (hist_every or 0)
    with open(csv_path, "w", newline="") as f:
        writer_csv = csv.DictWriter(f, fieldnames=FIELDS)
        writer_csv.writeheader()
        next_sample = started
        while not _stop_requested and time.monotonic() - started < duration and serve.poll() is None:
            if time.monotonic() < next_sample:
                time.sleep(min(1.0, next_sample - time.monotonic()))
                continue
            next_sample += every
            if jvm is None or rss_bytes(jvm) is None:  # not found yet, or gone: look again
                jvm = java_child(serve.pid)
            ticks = tick_lines(ticks_path)
            sample: dict = {"utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            "elapsed_s": round(time.monotonic() - started, 1), "load1": os.getloadavg()[0],
                            "ticks": len(ticks), "published": sum(t["published"] for t in ticks),
                            "rss_python": rss_bytes(serve.pid), "rss_jvm": rss_bytes(jvm) if jvm else None,
                            "rss_writer_tree": tree_rss(estate.writer.pid), **memory_regions(serve.pid)}
            if jvm is not None:
                sample.update(jstat_gc(jvm))
                if hist_every and time.monotonic() >= next_hist and ticks:
                    next_hist = time.monotonic() + hist_every
                    sample["jvm_live"] = class_histogram(jvm, hist_dir / f"histogram_{len(samples):03d}.txt")
            samples.append(sample)
            writer_csv.writerow(sample)
            f.flush()
            if len(samples) % 10 == 1:
                log(f"{sample['elapsed_s'] / 60:.0f} min: {len(ticks)} ticks, python "
                    f"{(sample['rss_python'] or 0) / MiB:.0f} MiB, jvm {(sample['rss_jvm'] or 0) / MiB:.0f} MiB, "
                    f"heap used {sample.get('jvm_heap_used', 0) / MiB:.0f} MiB, load {sample['load1']:.2f}")
    exited_early = serve.poll()
    wall = time.monotonic() - started
    log("stopping serve (SIGTERM)")
    term_at = time.monotonic()
    serve.send_signal(signal.SIGTERM)
    try:
        serve_rc = serve.wait(timeout=600)
    except subprocess.TimeoutExpired:
        serve.kill()
        serve_rc = None
    stop_seconds = time.monotonic() - term_at
    batches = estate.stop_writer()
    ticks = tick_lines(ticks_path)
    histograms = {p.name: p.read_text() for p in sorted(hist_dir.glob("*.txt"))}
    return {"samples": samples, "ticks": ticks, "tables": args.tables, "interval": args.interval,
            "writer_every": args.writer_every, "writer_batches": batches, "duration": args.duration,
            "wall_seconds": round(wall, 1), "started": started_utc.isoformat(timespec="seconds"),
            "recycle_above": args.recycle_above, "recycles": tick_lines(ticks_path, "recycle"),
            "serve_exited_before_the_end": exited_early, "serve_exit_code_after_sigterm": serve_rc,
            "serve_stop_seconds": round(stop_seconds, 1), "serve_stderr_tail": serve_err.read_text()[-3000:],
            "load_before": load_before, "load_after": load_average(), "machine": machine,
            "allocators": allocator_settings(),
            "csv": str(csv_path.relative_to(REPO)) if csv_path.is_relative_to(REPO) else str(csv_path),
            "histograms": histograms}


def allocator_settings() -> dict[str, str]:
    """The environment's allocator settings serve inherited (what runs side by side differ in), and the pool
    pyarrow picks under them."""
    import pyarrow

    settings = {key: os.environ[key] for key in ("ARROW_DEFAULT_MEMORY_POOL", "MALLOC_ARENA_MAX",
                                                  "MALLOC_TRIM_THRESHOLD_") if key in os.environ}
    return {**settings, "pyarrow's pool": pyarrow.default_memory_pool().backend_name}


# --- the summary -------------------------------------------------------------------------------------------------

def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, bytes) points, in MiB per hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var * 3600 / MiB if var else None


def summarize(result: dict) -> dict:
    """Per series: the first sample after warm-up (the first tick done, 10 minutes in), the peak, the end, and the
    slope per hour over all the warm samples and over their second half."""
    samples = [s for s in result["samples"] if s.get("ticks")]
    warm = [s for s in samples if float(s["elapsed_s"]) >= 600] or samples
    summary: dict = {}
    for _, key in SERIES:
        points = [(float(s["elapsed_s"]), float(s[key])) for s in warm if s.get(key) not in (None, "")]
        if not points:
            continue
        summary[key] = {"start": points[0][1], "start_at_s": points[0][0], "peak": max(y for _, y in points),
                        "end": points[-1][1], "end_at_s": points[-1][0],
                        "slope_mib_per_hour": slope_per_hour(points),
                        "slope_mib_per_hour_second_half": slope_per_hour(points[len(points) // 2:])}
    ticks = result["ticks"]
    seconds = sorted(t["seconds"] for t in ticks) or [0.0]
    loads = [float(s["load1"]) for s in result["samples"]]
    summary["ticks"] = {"count": len(ticks), "published": sum(t["published"] for t in ticks),
                        "failed": sum(1 for t in ticks if t["failed"]), "jvms": len({t.get("jvm_pid") for t in ticks}),
                        "median_seconds": seconds[len(seconds) // 2], "max_seconds": seconds[-1]}
    summary["load1"] = {"min": min(loads, default=None), "median": sorted(loads)[len(loads) // 2] if loads else None,
                        "max": max(loads, default=None)}
    return summary


def render(result: dict, summary: dict) -> str:
    m, t = result["machine"], summary["ticks"]

    def mib(x: float | None) -> str:
        return "-" if x is None else f"{x / MiB:.0f}"

    def slope(x: float | None) -> str:
        return "-" if x is None else f"{x:+.1f}"

    rows = [f"| {name} | {mib(s['start'])} | {mib(s['peak'])} | {mib(s['end'])} | {slope(s['slope_mib_per_hour'])} "
            f"| {slope(s['slope_mib_per_hour_second_half'])} |"
            for name, key in SERIES if (s := summary.get(key))]
    load = summary["load1"]
    return "\n".join([
        SECTION, "",
        f"- Date: {result['started']} for {result['wall_seconds'] / 60:.0f} minutes; command: `make "
        f"bench-serve-memory SERVE_MEMORY_ARGS=\"--duration {result['duration']}\"` (benchmarks/serve_hours.py; "
        f"samples in `{result['csv']}`); machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu_model']}; "
        f"Python {m['python']}, Spark {m['spark']}, `spark.driver.memory` 1g; allocators: "
        f"{', '.join(f'`{k}={v}`' for k, v in result.get('allocators', {}).items()) or 'not recorded'}.",
        f"- Load: the machine was shared with other work (other sessions' tests and benchmarks) the whole time: load "
        f"average {result['load_before']} at the start, {result['load_after']} at the end, the 1-minute load "
        f"{load['min']:.2f}-{load['max']:.2f} (median {load['median']:.2f}) over the samples.",
        f"- Work: `icemaint serve --interval {result['interval']}` over {result['tables']} streaming tables (3 dates "
        f"each) a writer process (its own JVM) fed a micro-batch each every {result['writer_every']:g}s "
        f"({result['writer_batches']} rounds); expiry on (older than 10m, newest 10 kept). {t['count']} ticks, "
        f"{t['published']} table-dates published, {counted(t['failed'], 'tick')} with a failed run, "
        f"{_jvms(t['jvms'], result)}; "
        f"a tick took {t['median_seconds']:.1f}s at the median, {t['max_seconds']:.1f}s at most. SIGTERM at the "
        f"end: exit code {result['serve_exit_code_after_sigterm']} after {result['serve_stop_seconds']:.1f}s.", "",
        *restart_lines(result, summary),
        "Warm samples (from 10 minutes in); slopes are least-squares lines through the samples:", "",
        "| MiB | start | peak | end | slope per hour | slope per hour, second half |",
        "|---|---|---|---|---|---|", *rows, ""])


def restart_lines(result: dict, summary: dict) -> list[str]:
    """With `--recycle-above`: the Python process's peak against the limit over the whole run, and what each fresh
    start cost (from serve's own tick lines: the gap between the tick before it and the tick after, and how long
    that first tick on a new JVM took)."""
    recycles = result.get("recycles") or []
    if not recycles:
        return []
    ticks = {t["tick"]: t for t in result["ticks"]}
    gaps, firsts = [], []
    for r in recycles:
        before, after = ticks.get(r["tick"]), ticks.get(r["tick"] + 1)
        if before and after:
            gaps.append(after["finished_at"] - after["seconds"] - before["finished_at"])
            if not after.get("failed"):  # a first tick cut short (the harness's SIGTERM) says nothing of its length
                firsts.append(after["seconds"])
    peak = max((float(x["rss_python"]) for x in result["samples"] if x.get("rss_python") not in (None, "")),
               default=0.0)
    limit = recycles[0]["recycle_above_bytes"]
    after = ", ".join(str(r["tick"]) for r in recycles)
    at = ", ".join(f"{r['rss_python_bytes'] / MiB:.0f}" for r in recycles)
    lines = [f"- **Bounded by `--recycle-above {result['recycle_above']}`:** the Python process's resident set peaked "
             f"at {peak / MiB:.0f} MiB over the whole run (every sample, warm-up included), against the limit of "
             f"{limit / MiB:.0f} MiB. serve started afresh {counted(len(recycles), 'time')}, after ticks {after} (at {at} MiB), "
             "each in the same process (the harness samples one pid throughout) with a new JVM."]
    if gaps:
        median_tick = summary["ticks"]["median_seconds"]
        first = (f", and that first tick on a new JVM took {min(firsts):.0f}-{max(firsts):.0f} s against the run's "
                 f"median tick of {median_tick:.0f} s" if firsts else
                 ", and that first tick was cut short by the harness's SIGTERM")
        lines.append(f"- **What a fresh start cost:** the next tick began {min(gaps):.0f}-{max(gaps):.0f} s after "
                     f"the last one ended (otherwise the interval, {result['interval']}, separates ticks; a fresh "
                     f"start has no wait: this is the exec, the imports and the JVM's start){first}.")
    return lines + [""]


def _jvms(count: int, result: dict) -> str:
    """How many JVMs served the run; the fresh starts behind them are `restart_lines`'."""
    limit = result.get("recycle_above", "off")
    if result.get("recycles"):
        return f"{count} JVMs (fresh starts: below)"
    return f"{count} JVM for all" + (f" (`--recycle-above {limit}`, not reached)" if limit != "off" else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_hours", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", default="90m", help="how long serve runs (default 90m)")
    parser.add_argument("--sample-every", default="60s")
    parser.add_argument("--interval", default="45s", help="serve's --interval (default 45s)")
    parser.add_argument("--recycle-above", default="off",
                        help="serve's --recycle-above (default off here: the harness measures the growth itself)")
    parser.add_argument("--tables", type=int, default=3)
    parser.add_argument("--writer-every", type=float, default=15.0, help="seconds between the writer's rounds")
    parser.add_argument("--histogram-every", default="15m", help="a JVM class histogram (full GC); '' for none")
    parser.add_argument("--work", default=str(WORK),
                        help="where the estate is built (a run beside another needs its own; default %(default)s)")
    parser.add_argument("--out-dir", default=str(HERE / "results"))
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"), help="the file whose section is written")
    parser.add_argument("--from-results", metavar="JSON", help="only render the section from a previous run's JSON")
    args = parser.parse_args(argv)
    for name in ("duration", "sample_every", "interval"):
        try:
            parse_duration(getattr(args, name))
        except ValueError as exc:
            parser.error(f"--{name.replace('_', '-')}: {exc}")
    if args.from_results:
        result = json.loads(Path(args.from_results).read_text())
    else:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M")
        result = measure(args, stamp)
        result["summary"] = summarize(result)
        (Path(args.out_dir) / f"serve_hours_{stamp}.json").write_text(json.dumps(result, indent=1))
    summary = result.get("summary") or summarize(result)
    section = render(result, summary)
    write_section(Path(args.results), section, SECTION)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
