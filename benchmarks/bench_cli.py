"""Whole-process timings of the command line, best of N (default 3), one after another.

    python benchmarks/bench_cli.py [--repeats N]

- `loadgen --help`
- `loadgen run examples/paired-burst.yaml --seeds 501 --no-figures --no-report` (one 90-minute
  pair of runs, simulated)
- the main job: README's first command after the install, `loadgen run examples/paired-burst.yaml`
  (12 seeds x 2 arms, summary, table and figures)

Each into a fresh results directory, after one run not counted, with Python writing and reading
its bytecode cache as it does by default (PYTHONDONTWRITEBYTECODE, set on some machines, is
dropped: compiling the ~100 modules a run imports anew each time costs ~0.1 s). Targets (issue
54): 0.15 s, 0.35 s and 3 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOADGEN = str(Path(sys.executable).with_name("loadgen"))
SPEC = "examples/paired-burst.yaml"


def best_of(repeats: int, command: list[str], fresh_out: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times = []
    for _ in range(repeats + 1):
        with tempfile.TemporaryDirectory() as tmp:
            argv = command + (["--out", str(Path(tmp) / "out")] if fresh_out else [])
            start = time.perf_counter()
            subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    return min(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cases = [
        ("loadgen --help", [LOADGEN, "--help"], False, 0.15),
        ("run, one seed, --no-figures --no-report", [LOADGEN, "run", SPEC, "--seeds", "501", "--no-figures", "--no-report"],
         True, 0.35),
        ("the main job (12 seeds, figures)", [LOADGEN, "run", SPEC], True, 3.0),
    ]
    for name, command, fresh_out, target_s in cases:
        seconds = best_of(args.repeats, command, fresh_out)
        print(f"{name:45s} {seconds:6.3f} s  (target {target_s:g} s)", flush=True)


if __name__ == "__main__":
    main()
