"""CPU time of a results directory's figures, per figure and per kind of figure.

    python benchmarks/bench_figures.py RESULTS_DIR [--repeats 3] [--out DIR]

Draws every PNG ``loadgen report`` draws (latency_figure_jobs + figure_jobs) in this process, one
after another, ``--repeats`` times, into ``--out`` (default: a temporary directory, so RESULTS_DIR
is left as it is). The runs are read once before timing, as the report does (its summary has read
them already). Reports each kind's median CPU time per figure over the repeats (process time: what
a busy, shared machine changes least), and the total. The first repeat pays matplotlib's warm-up
(font cache, first text layout) like each of the report's worker processes does once; the medians
leave it out.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.analysis.figures import figure_jobs  # noqa: E402
from loadgen.analysis.latency_figures import latency_figure_jobs  # noqa: E402
from loadgen.analysis.runs import load_run  # noqa: E402


def figure_kind(path: Path) -> str:
    """pair-s501.png -> pair; overview.png -> overview."""
    return re.sub(r"-s\d+$", "", path.stem)


def bench(results_dir: Path, out_dir: Path, repeats: int) -> dict:
    summary = json.loads((results_dir / "summary.json").read_text())
    if out_dir.resolve() != results_dir.resolve():  # the figures' functions read OUT/runs/<run_id>
        (out_dir / "runs").unlink(missing_ok=True)
        (out_dir / "runs").symlink_to((results_dir / "runs").resolve())
    load = lru_cache(maxsize=None)(load_run)
    for entry in summary.get("runs", []):
        load(out_dir / "runs" / entry["run_id"])
    cpu_s: dict[str, list[list[float]]] = defaultdict(list)  # kind -> per repeat, each figure's seconds
    totals = []
    for _ in range(repeats):
        jobs = latency_figure_jobs(out_dir, summary, load) + figure_jobs(out_dir, summary, load)
        per_kind: dict[str, list[float]] = defaultdict(list)
        for path, draw in jobs:
            start = time.process_time()
            draw()
            per_kind[figure_kind(path)].append(time.process_time() - start)
        for kind, seconds in per_kind.items():
            cpu_s[kind].append(seconds)
        totals.append(sum(sum(s) for s in per_kind.values()))
    later = slice(1, None) if repeats > 1 else slice(None)
    return {
        "kinds": {kind: {"figures": len(runs[0]),
                         "median_per_figure_s": statistics.median(s for run in runs[later] for s in run)}
                  for kind, runs in cpu_s.items()},
        "total_s_per_repeat": totals,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="draw the PNGs here (kept) instead of a temporary directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.out or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        result = bench(args.results_dir, out_dir, args.repeats)
        if args.out is None:
            shutil.rmtree(out_dir / "figures", ignore_errors=True)
    for kind, row in sorted(result["kinds"].items()):
        print(f"{kind:24s} {row['figures']:3d} figure(s)  {row['median_per_figure_s'] * 1000:7.1f} ms CPU each")
    print("total CPU per repeat: " + ", ".join(f"{s:.2f} s" for s in result["total_s_per_repeat"]))


if __name__ == "__main__":
    main()
