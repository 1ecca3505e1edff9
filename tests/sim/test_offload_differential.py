"""Differential test of the CPU KV offload tier: the fast SimEngine (run-compressed host tier,
loadgen/sim/offload.py) against the literal ReferenceEngine (vLLM's LRUOffloadingManager over
block hashes) on random closed-loop workloads, as tests/sim/test_differential.py does for the
GPU pool. Both must give every request the same cached tokens, preemptions and times, and end
with the same GPU, external (host) prefix-cache and transfer counters.
"""

from __future__ import annotations

import random

import pytest

from loadgen.sim.offload import OffloadConfig

from .reference_engine import ReferenceEngine
from .test_differential import Workload, assert_same, random_workload, run_workload


def random_offload_workload(seed: int) -> Workload:
    """``random_workload(seed)`` (odd seeds with aborted requests) with prefix caching on and a host tier drawn from its own generator:
    from one block (every store evicts) to several times the GPU pool, copies from instant to
    several steps long."""
    wl = random_workload(seed, with_aborts=seed % 2 == 1)  # aborted turns are retried: their blocks are on the host
    rng = random.Random(f"offload/{seed}")
    num_blocks = wl.knobs["num_blocks"]
    cpu_blocks = rng.choice([1, 2, num_blocks // 2 + 1, num_blocks, 3 * num_blocks, 10 * num_blocks])
    u = rng.random()
    shared_link = rng.random() < 0.5  # stores queue ahead of loads on one link, or on their own
    if u < 0.15:  # instant copies: a loaded request is scheduled in the step after its load starts
        offload = OffloadConfig(cpu_blocks, bandwidth_bytes_per_s=1e30, latency_s=0.0, kv_bytes_per_token=1,
                                shared_link=shared_link)
    else:  # 1e4 .. 1e6 tokens/s and up to 5 ms per copy: from far below a step to several steps
        offload = OffloadConfig(cpu_blocks, bandwidth_bytes_per_s=10 ** rng.uniform(4, 6),
                                latency_s=rng.choice([0.0, rng.uniform(0, 5e-3)]), kv_bytes_per_token=1,
                                shared_link=shared_link)
    knobs = dict(wl.knobs, enable_prefix_caching=True, offload=offload)
    return Workload(knobs, wl.sessions, wl.cost, wl.flush_at)


OFFLOAD_SEEDS = range(400)


@pytest.mark.parametrize("seed", OFFLOAD_SEEDS)
def test_fast_engine_matches_reference_with_a_cpu_tier(seed):
    assert_same(random_offload_workload(seed), f"offload seed={seed}")


def test_offload_workloads_exercise_the_tier():
    """The seeds reach host hits (loads), loads while other requests run, evictions from the host
    tier, and GPU preemptions with the tier on, each in a good share of the workloads."""
    seen = dict.fromkeys(("host_hit", "host_full", "preemption", "flush_with_tier", "load_queued",
                          "load_behind_store"), 0)
    for seed in OFFLOAD_SEEDS:
        wl = random_offload_workload(seed)
        res = run_workload(ReferenceEngine, wl, check_invariants=False)
        seen["host_hit"] += res.counters["external_prefix_cache_hits"] > 0
        bs = wl.knobs["block_size"]
        stored_blocks = res.counters["kv_offload_bytes_gpu_to_cpu"] // bs
        seen["host_full"] += stored_blocks > wl.knobs["offload"].cpu_blocks
        seen["preemption"] += res.counters["num_preemptions"] > 0
        seen["flush_with_tier"] += bool(res.flush_times_s) and res.counters["external_prefix_cache_hits"] > 0
        # a copy that waited for the link: behind another load, or (one shared link) behind a store
        jobs = res.copy_jobs["to_gpu"]
        waited = [i for i, (direction, submitted, start, _) in enumerate(jobs)
                  if direction == "to_gpu" and start > submitted]
        seen["load_queued"] += bool(waited)
        seen["load_behind_store"] += any(i and jobs[i - 1][0] == "to_host" for i in waited)
    assert seen["host_hit"] >= len(OFFLOAD_SEEDS) // 3, seen
    assert all(v >= len(OFFLOAD_SEEDS) // 20 for v in seen.values()), seen
