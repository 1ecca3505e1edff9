"""A slice of the default map of examples/map.yaml three ways: one process, local processes, Ray.

    python benchmarks/bench_map.py [--seeds 1] [--nodes 4] [--skip-ray]

The slice is the default grid (17 rates x 6 trigger factors x 2 controllers) for the given seeds
(seed 1: 204 runs of 90 minutes). Prints wall seconds, runs/s and CPU seconds per run of
  1. one process (the CPU cost of a run, which the full map's time extrapolates from);
  2. `loadgen map`'s process pool (one worker per CPU, what runs without --address);
  3. Ray tasks on a fake cluster of ``--nodes`` one-CPU nodes (ray.cluster_utils.Cluster, all on
     this machine), with the cluster's start-up apart.
Every way must give the same outcome rows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.core.spec import load_spec, parse_seeds  # noqa: E402
from loadgen.map.grid import (DEFAULT_CONTROLLERS, DEFAULT_RATES, DEFAULT_TRIGGER_FACTORS, MapGrid,  # noqa: E402
                              map_job, parse_controllers, parse_values)
from loadgen.map.run import process_pool, run_in_process  # noqa: E402

FULL_MAP_RUNS = 17 * 6 * 20 * 2


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(label: str, rows_of) -> list[dict]:
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    rows = sorted(rows_of(), key=lambda r: r["run_id"])
    wall_s, cpu_s = time.perf_counter() - wall0, _cpu_s() - cpu0
    print(f"{label}: {len(rows)} runs in {wall_s:.1f} s, {len(rows) / wall_s:.2f} runs/s"
          + (f", {cpu_s / len(rows):.3f} CPU s per run" if cpu_s > 0.05 * wall_s else "")
          + f"; the full default map ({FULL_MAP_RUNS} runs) at this rate: {FULL_MAP_RUNS / len(rows) * wall_s / 60:.1f} min",
          flush=True)
    return rows


def _same(rows: list[dict], other: list[dict]) -> bool:
    return json.dumps(rows, sort_keys=True) == json.dumps(other, sort_keys=True)  # NaN equals NaN here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    spec = load_spec(ROOT / "examples" / "map.yaml")
    grid = MapGrid(tuple(parse_values(DEFAULT_RATES, "--rates")), tuple(parse_values(DEFAULT_TRIGGER_FACTORS, "f")),
                   tuple(parse_seeds(args.seeds)), parse_controllers(DEFAULT_CONTROLLERS))
    job = map_job(spec, ROOT / "examples", grid.trigger_factors)
    points = grid.grid_points(spec.duration_s)
    print(f"{len(points)} runs on {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f})", flush=True)
    one = _timed("one process", lambda: run_in_process(job, points))
    pool = _timed(f"process pool ({os.cpu_count()} workers)", lambda: process_pool()(job, points))
    assert _same(pool, one), "the process pool gave other rows"
    if args.skip_ray:
        return
    import ray
    from ray.cluster_utils import Cluster

    from actors.map import ray_executor

    start = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    cluster.wait_for_nodes()
    print(f"fake {args.nodes}-node Ray cluster up in {time.perf_counter() - start:.1f} s", flush=True)
    try:
        by_ray = _timed(f"Ray tasks on {args.nodes} nodes", lambda: ray_executor()(job, points))
        assert _same(by_ray, one), "Ray gave other rows"
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
