"""What a deployment run costs: examples/deployment-paired.yaml (4 replicas at 4x the main
example's rate), its burst arm under each router, against four single-engine runs of the main
example's burst arm (examples/paired-burst.yaml: one replica's share of the load when balanced).

    python benchmarks/bench_deployment.py [--seed 501] [--repeats 3] [--routers a,b] [--json OUT]

Reports per router the median wall time of a whole run (planning, simulation, Parquet, run.json),
the engine steps simulated (all replicas) and the turns completed, and the ratio of the run's wall
time to 4 x one single-engine run. Timings on a shared machine are noisy: compare figures of one
invocation (they run back to back).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.core.runner import RunKey, run_simulated  # noqa: E402
from loadgen.core.spec import load_spec  # noqa: E402
from routers import ROUTERS  # noqa: E402


def timed(spec, key: RunKey, out: Path, repeats: int) -> tuple[float, dict]:
    times, info = [], {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        info = run_simulated(spec, key, out)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), info


def bench(seed: int, repeats: int, routers: list[str]) -> dict:
    single = load_spec(ROOT / "examples" / "paired-burst.yaml")
    deployment = load_spec(ROOT / "examples" / "deployment-paired.yaml")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        wall, info = timed(single, RunKey("burst", seed), Path(tmp), repeats)
        results["single-engine burst x1"] = {"wall_s": wall, "engine_steps": info["counts"]["engine_steps"],
                                             "turns": info["counts"]["turns_completed"]}
        base = 4 * wall
        arms = [(router, f"{router.replace('_', '-')}-burst") for router in routers]
        if "dynamo_kv" in routers:  # and without KV events (use_kv_events: false)
            arms.append(("dynamo_kv approximate", "dynamo-kv-approx-burst"))
        for router, arm in arms:
            wall, info = timed(deployment, RunKey(arm, seed), Path(tmp), repeats)
            results[router] = {"wall_s": wall, "engine_steps": info["counts"]["engine_steps"],
                               "turns": info["counts"]["turns_completed"], "vs_4_single_runs": wall / base,
                               "us_per_turn": 1e6 * wall / max(info["counts"]["turns_completed"], 1)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=501)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results = bench(args.seed, args.repeats, [r for r in args.routers.split(",") if r])
    print(f"{'run':26s} {'wall s':>7s} {'steps':>8s} {'turns':>6s} {'vs 4 single':>11s} {'us/turn':>8s}")
    for name, r in results.items():
        print(f"{name:26s} {r['wall_s']:7.2f} {r['engine_steps']:8d} {r['turns']:6d} "
              f"{r.get('vs_4_single_runs', float('nan')):11.2f} {r.get('us_per_turn', float('nan')):8.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
