"""How long one simulated 90-minute run of examples/paired-burst.yaml takes, with recording.

    python benchmarks/bench_sim.py [--repeats 5] [--seeds 501-512] [--json OUT]

Pin it to one core for the issue's figure: ``taskset -c 0 python benchmarks/bench_sim.py``.
Reports per flavour of the simulated engine (``--flavors vllm,sglang``) and arm the median wall time of a whole run (workload planning, simulation, Parquet
writing, run.json), the engine steps simulated, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.core.runner import RunKey, run_simulated  # noqa: E402
from loadgen.core.spec import load_spec, parse_seeds  # noqa: E402


def bench(repeats: int, seeds: list[int], flavors: list[str]) -> dict:
    base = load_spec(ROOT / "examples" / "paired-burst.yaml")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
      for flavor in flavors:
        # the same spec on each engine: only engine.flavor changes
        spec = base.model_copy(update={"engine": base.engine.model_copy(update={"flavor": flavor})})
        for arm in [a.name for a in spec.arms]:
            times, steps, turns = [], [], []
            for seed in seeds:
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    info = run_simulated(spec, RunKey(arm, seed), Path(tmp))
                    times.append(time.perf_counter() - t0)
                steps.append(info["counts"]["engine_steps"])
                turns.append(info["counts"]["turns_completed"])
            results[f"{flavor}/{arm}"] = {
                "runs_timed": len(times),
                "wall_s_median": statistics.median(times),
                "wall_s_max": max(times),
                "engine_steps_mean": statistics.mean(steps),
                "turns_mean": statistics.mean(turns),
                "simulated_s_per_wall_s": spec.duration_s / statistics.median(times),
            }
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", default="501-504")
    parser.add_argument("--flavors", default="vllm,sglang", help="simulated engines to time, comma-separated")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results = bench(args.repeats, parse_seeds(args.seeds), args.flavors.split(","))
    for arm, r in results.items():
        if isinstance(r, dict):
            print(f"{arm:18s} median {r['wall_s_median'] * 1000:7.1f} ms per 90-min run (max {r['wall_s_max'] * 1000:.1f}), "
                  f"{r['engine_steps_mean']:,.0f} engine steps, {r['turns_mean']:,.0f} turns, "
                  f"{r['simulated_s_per_wall_s']:,.0f}x real time")
    print(f"peak RSS {results['peak_rss_mib']:.0f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
