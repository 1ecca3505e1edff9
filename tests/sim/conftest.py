"""Shared helpers for the simulated-engine tests: build either engine from a few knobs."""

from __future__ import annotations

import dataclasses
import random

import pytest

from loadgen.sim.cost import StepCostModel
from loadgen.sim.engine import EngineConfig, SimEngine

from .reference_engine import ReferenceEngine

ENGINE_CLASSES = (SimEngine, ReferenceEngine)

# A round-number cost model: per-step 5 ms, 50 us/token, 3 ns/token^2, 50 ns/token of decode context.
COST = StepCostModel(t0_s=0.005, a_s_per_token=50e-6, b_s_per_token2=3e-9, g_s_per_token=50e-9, name="test")


def make_engine(cls, cost: StepCostModel = COST, **knobs):
    """``cls(EngineConfig(**knobs), cost)``, with a 64-block pool of 16-token blocks by default."""
    knobs.setdefault("num_blocks", 64)
    return cls(EngineConfig(**knobs), cost)


@pytest.fixture(params=ENGINE_CLASSES, ids=lambda c: c.__name__)
def engine_cls(request):
    return request.param


def with_gpu_terms(cost: StepCostModel, seed: int) -> StepCostModel:
    """A decode-token cost apart from a prefill token's and a host time per step, each half the
    time, from their own generator (the rest of the workload is seed's as before)."""
    gpu_rng = random.Random(f"gpu-terms/{seed}")
    if cost.name == "zero":
        return cost
    if gpu_rng.random() < 0.5:
        cost = dataclasses.replace(cost, decode_s_per_token=gpu_rng.uniform(0.1, 1.5) * max(cost.a_s_per_token, 1e-6))
    if gpu_rng.random() < 0.5:
        cost = dataclasses.replace(cost, host_s_per_step=gpu_rng.uniform(0.1, 2.0) * max(cost.t0_s, 1e-4))
    return cost
