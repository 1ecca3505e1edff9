"""How long one simulated 90-minute run of examples/paired-burst.yaml takes, with recording.

    python benchmarks/bench_sim.py [--repeats 5] [--seeds 501-512] [--json OUT]

Pin it to one core for the issue's figure: ``taskset -c 0 python benchmarks/bench_sim.py``.
Reports per flavour of the simulated engine (``--flavors vllm,sglang,vllm+offload``) and arm the median wall time of a whole run (workload planning, simulation, Parquet
writing, run.json), its CPU time (what a busy, shared machine changes least), the engine steps
simulated, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.compiled import COMPILED_MODULES, compiled_modules  # noqa: E402
from loadgen.core.runner import RunKey, run_simulated  # noqa: E402
from loadgen.core.spec import load_spec, parse_seeds  # noqa: E402


def bench(repeats: int, seeds: list[int], flavors: list[str]) -> dict:
    base = load_spec(ROOT / "examples" / "paired-burst.yaml")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
      for flavor in flavors:
        # the same spec on each engine: only engine.flavor changes ("vllm+offload": vLLM with the
        # 900K-token CPU tier of examples/offload-paired.yaml)
        if flavor == "vllm+offload":
            engine = base.engine.model_validate({**base.engine.model_dump(exclude_unset=True), "flavor": "vllm",
                                                 "offload": {"cpu_tokens": 900_000}})
        else:
            engine = base.engine.model_copy(update={"flavor": flavor})
        spec = base.model_copy(update={"engine": engine})
        for arm in [a.name for a in spec.arms]:
            times, cpu_times, steps, turns = [], [], [], []
            for seed in seeds:
                for _ in range(repeats):
                    t0, c0 = time.perf_counter(), time.process_time()
                    info = run_simulated(spec, RunKey(arm, seed), Path(tmp))
                    times.append(time.perf_counter() - t0)
                    cpu_times.append(time.process_time() - c0)
                steps.append(info["counts"]["engine_steps"])
                turns.append(info["counts"]["turns_completed"])
            # one more run of the first seed under tracemalloc: the peak of Python memory one run takes
            tracemalloc.start()
            run_simulated(spec, RunKey(arm, seeds[0]), Path(tmp))
            peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            results[f"{flavor}/{arm}"] = {
                "runs_timed": len(times),
                "wall_s_median": statistics.median(times),
                "wall_s_max": max(times),
                "cpu_s_median": statistics.median(cpu_times),
                "engine_steps_mean": statistics.mean(steps),
                "turns_mean": statistics.mean(turns),
                "simulated_s_per_wall_s": spec.duration_s / statistics.median(times),
                "peak_traced_mib": peak_mib,
            }
    results["compiled_modules"] = len(compiled_modules())
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", default="501-504")
    parser.add_argument("--flavors", default="vllm,sglang,vllm+offload",
                        help="simulated engines to time, comma-separated (vllm, sglang, vllm+offload)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results = bench(args.repeats, parse_seeds(args.seeds), args.flavors.split(","))
    for arm, r in results.items():
        if isinstance(r, dict):
            print(f"{arm:18s} median {r['wall_s_median'] * 1000:7.1f} ms per 90-min run (max {r['wall_s_max'] * 1000:.1f}, "
                  f"CPU {r['cpu_s_median'] * 1000:.1f}), "
                  f"{r['engine_steps_mean']:,.0f} engine steps, {r['turns_mean']:,.0f} turns, "
                  f"{r['simulated_s_per_wall_s']:,.0f}x real time, peak {r['peak_traced_mib']:.1f} MiB traced")
    print(f"peak RSS {results['peak_rss_mib']:.0f} MiB; compiled modules: {results['compiled_modules']} "
          f"of {len(COMPILED_MODULES)} (LOADGEN_PURE_PYTHON=1 runs them as Python)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
