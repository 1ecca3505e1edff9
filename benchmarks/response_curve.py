"""Where the main example sits on the response curve: the paired-burst outcome as lambda, burst
size and pool change, one factor at a time around examples/paired-burst.yaml, in the simulator.

    python benchmarks/response_curve.py [--seeds 501-512] [--jobs 2] [--json OUT]

Each point runs the no-burst and burst arms over the seeds (90-minute runs, ~0.2-0.4 s each)
and prints per arm: runs persistently degraded, runs that end degraded (hit ratio < 0.5 over
the last 10 minutes), runs degraded only in their final 5-minute window, and the mean share of
degraded 5-minute windows after the burst (summary.json's fields, docs/results-format.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.analysis import load_run, run_outcome  # noqa: E402
from loadgen.core.runner import RunKey, run_simulated  # noqa: E402
from loadgen.core.spec import parse_seeds, parse_spec  # noqa: E402

EXAMPLE = ROOT / "examples" / "paired-burst.yaml"
LAMBDAS_PER_S = [0.025, 0.03, 0.035, 0.04, 0.045]
BURST_FACTORS = [0.5, 1.0, 1.5, 2.0, 3.0]
POOLS_TOKENS = [300_000, 350_000, 400_000, 450_000, 500_000]


def _spec_dict(arrival_rate_per_s: float, extra_rate_factor: float, pool_tokens: int) -> dict:
    data = yaml.safe_load(EXAMPLE.read_text())
    data = copy.deepcopy(data)
    data["workload"]["arrival_rate_per_s"] = arrival_rate_per_s
    data["engine"]["pool_tokens"] = pool_tokens
    (burst,) = [arm for arm in data["arms"] if arm["name"] == "burst"]
    burst["triggers"][0]["extra_rate_factor"] = extra_rate_factor
    return data


def _one_run(job: tuple[dict, str, int]) -> dict:
    """One simulated run's summary.json fields (run in a worker process)."""
    data, arm, seed = job
    spec = parse_spec(data)
    with tempfile.TemporaryDirectory() as tmp:
        run_simulated(spec, RunKey(arm, seed), Path(tmp))
        return run_outcome(load_run(Path(tmp) / "runs" / f"{arm}-s{seed}"))


def _tally(outcomes: list[dict]) -> dict:
    windows = [o["degraded_windows_after_trigger"] for o in outcomes if o["degraded_windows_after_trigger"] is not None]
    return {
        "num_runs": len(outcomes),
        "persistently_degraded": sum(o["persistently_degraded"] for o in outcomes),
        "ends_degraded": sum(o["ends_degraded"] for o in outcomes),
        "degraded_only_in_final_window": sum(o["degraded_only_in_final_window"] for o in outcomes),
        "degraded_windows_mean": sum(windows) / len(windows) if windows else None,
    }


def curve(seeds: list[int], jobs: int) -> dict:
    base = yaml.safe_load(EXAMPLE.read_text())
    lam0 = base["workload"]["arrival_rate_per_s"]
    factor0 = base["arms"][1]["triggers"][0]["extra_rate_factor"]
    pool0 = base["engine"]["pool_tokens"]
    points = ([("lambda", lam, (lam, factor0, pool0)) for lam in LAMBDAS_PER_S]
              + [("burst", f, (lam0, f, pool0)) for f in BURST_FACTORS]
              + [("pool", p, (lam0, factor0, p)) for p in POOLS_TOKENS])
    jobs_list, index = [], []
    for factor_name, value, params in points:
        data = _spec_dict(*params)
        for arm in ("no-burst", "burst"):
            for seed in seeds:
                jobs_list.append((data, arm, seed))
                index.append((factor_name, value, arm))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        outcomes = list(pool.map(_one_run, jobs_list, chunksize=4))
    results: dict = {"seeds": seeds, "example": {"arrival_rate_per_s": lam0, "extra_rate_factor": factor0,
                                                 "pool_tokens": pool0}, "factors": {}}
    for factor_name, value, _ in points:
        row = {"value": value}
        for arm in ("no-burst", "burst"):
            row[arm] = _tally([o for (f, v, a), o in zip(index, outcomes) if (f, v, a) == (factor_name, value, arm)])
        results["factors"].setdefault(factor_name, []).append(row)
    return results


def format_tables(results: dict) -> str:
    n = len(results["seeds"])
    ex = results["example"]
    titles = {
        "lambda": f"lambda per s (burst {ex['extra_rate_factor']:g} x lambda, pool {ex['pool_tokens'] // 1000}K)",
        "burst": f"burst extra_rate_factor (lambda {ex['arrival_rate_per_s']:g}, pool {ex['pool_tokens'] // 1000}K)",
        "pool": f"pool tokens (lambda {ex['arrival_rate_per_s']:g}, burst {ex['extra_rate_factor']:g} x lambda)",
    }
    lines = [f"paired-burst response curve: {n} seeds {results['seeds'][0]}..{results['seeds'][-1]} per point; "
             "per arm: persistently degraded / ends degraded / final window only, mean degraded window share"]
    for factor_name, rows in results["factors"].items():
        lines += ["", titles[factor_name],
                  f"{'value':>8}  {'no-burst':>24}  {'burst':>24}"]
        for row in rows:
            cells = []
            for arm in ("no-burst", "burst"):
                t = row[arm]
                share = "-" if t["degraded_windows_mean"] is None else f"{t['degraded_windows_mean']:.2f}"
                cells.append(f"{t['persistently_degraded']:>2}/{n} {t['ends_degraded']:>2}/{n} "
                             f"{t['degraded_only_in_final_window']:>2} {share:>5}")
            value = f"{row['value'] // 1000}K" if factor_name == "pool" else f"{row['value']:g}"
            lines.append(f"{value:>8}  {cells[0]:>24}  {cells[1]:>24}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="501-512")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (one run each at a time)")
    parser.add_argument("--json", help="also write the tallies here")
    args = parser.parse_args()
    t0 = time.perf_counter()
    results = curve(parse_seeds(args.seeds), args.jobs)
    print(format_tables(results))
    print(f"\n{sum(len(r) for r in results['factors'].values()) * 2 * len(results['seeds'])} runs "
          f"in {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
