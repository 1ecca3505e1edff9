"""The 24 runs of examples/paired-burst.yaml: in-process `loadgen run` vs `loadgen sweep` on Ray.

    python benchmarks/bench_sweep.py [--seeds 501-512] [--json OUT]

Three ways, the same runs, checked to give the same Parquet bytes:
  1. in process, one run after another (what `loadgen run` does);
  2. `loadgen sweep` on a local Ray cluster of this machine's CPUs (each run a Ray task);
  3. the same sweep on a fake 4-node cluster (ray.cluster_utils.Cluster: a head and 3 nodes of
     one CPU each, all on this machine).
For the sweeps: the sweep alone, the sweep with the cluster's start-up, and the same sweep again
on the warm cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from actors.sweep import run_sweep  # noqa: E402
from loadgen import run_experiment, run_keys  # noqa: E402
from loadgen.core.spec import load_spec, parse_seeds  # noqa: E402

QUIET = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
NUM_FAKE_NODES = 4
TABLES = ("turns.parquet", "samples.parquet", "sessions.parquet")


def timed_sweep(spec, keys, out: Path, start_cluster) -> dict:
    """The sweep on a fresh cluster (its workers still starting and importing the tool), then
    again on the same cluster, whose workers are warm (into another directory: no resume)."""
    t0 = time.perf_counter()
    stop = start_cluster()
    try:
        t1 = time.perf_counter()
        cold = run_sweep(spec, out, keys)
        t2 = time.perf_counter()
        warm = run_sweep(spec, out.with_name(out.name + "-warm"), keys)
        t3 = time.perf_counter()
    finally:
        stop()
    assert all(r["status"] == "completed" for r in cold + warm)
    return {"sweep_s": t2 - t1, "with_cluster_start_s": t2 - t0, "warm_sweep_s": t3 - t2}


def local_cluster(temp_dir: str):
    def start():
        ray.init(address="local", object_store_memory=200 * 2**20, _temp_dir=temp_dir, **QUIET)
        return ray.shutdown

    return start


def fake_cluster(temp_dir: str):
    def start():
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 100 * 2**20,
                                                                "include_dashboard": False,
                                                                "temp_dir": temp_dir})
        for _ in range(NUM_FAKE_NODES - 1):
            cluster.add_node(num_cpus=1, object_store_memory=100 * 2**20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, **{k: v for k, v in QUIET.items() if k != "include_dashboard"})

        def stop():
            ray.shutdown()
            cluster.shutdown()

        return stop

    return start


def same_files(a: Path, b: Path, keys) -> bool:
    return all((a / "runs" / k.run_id / name).read_bytes() == (b / "runs" / k.run_id / name).read_bytes()
               for k in keys for name in TABLES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", help="only these seeds (default: the spec's 12)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    spec = load_spec(ROOT / "examples" / "paired-burst.yaml")
    keys = run_keys(spec, parse_seeds(args.seeds) if args.seeds else None)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        tmp_path = Path(tmp)
        t0 = time.perf_counter()
        run_experiment(spec, tmp_path / "in-process", keys)
        in_process_s = time.perf_counter() - t0
        figures = {"runs": len(keys), "cpus": os.cpu_count(), "in_process_s": in_process_s}
        for name, start in (("local", local_cluster(tempfile.mkdtemp(prefix="bs-", dir=tmp))),
                            ("fake_4_nodes", fake_cluster(tempfile.mkdtemp(prefix="bf-", dir=tmp)))):
            out = tmp_path / name
            figures[name] = timed_sweep(spec, keys, out, start)
            figures[name]["speed_up"] = in_process_s / figures[name]["sweep_s"]
            figures[name]["speed_up_with_cluster_start"] = in_process_s / figures[name]["with_cluster_start_s"]
            figures[name]["warm_speed_up"] = in_process_s / figures[name]["warm_sweep_s"]
            figures[name]["same_parquet_bytes"] = same_files(tmp_path / "in-process", out, keys)
            print(name, figures[name], flush=True)
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
