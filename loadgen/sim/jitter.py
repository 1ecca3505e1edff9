"""Step-time jitter: each engine step's time multiplied by a draw exp(N(-sigma^2 / 2, sigma^2))
(mean 1, so the cost model's mean step time is kept), from the run's own generator (keyed by
seed, arm, replicate and replica, loadgen/core/workload.py Stream.STEP_JITTER). ``loadgen calibrate``
measures sigma (``StepCostModel.step_jitter_sigma``); with sigma 0 no engine draws anything and
every result is bit for bit what it was. An engine with jitter takes every step one by one (no
closed-form decode stretches, whose length would need every step's draw)."""

from __future__ import annotations

import numpy as np

BLOCK = 4096  # draws made at once: one numpy call per block, not per step


class StepJitter:
    def __init__(self, sigma: float, rng: np.random.Generator) -> None:
        if not sigma > 0:
            raise ValueError(f"step jitter sigma must be > 0, got {sigma}")
        self.sigma = sigma
        self.rng = rng
        self._draws: list[float] = []

    def __call__(self) -> float:
        if not self._draws:
            s = self.sigma
            self._draws = np.exp(self.rng.normal(-s * s / 2, s, size=BLOCK))[::-1].tolist()
        return self._draws.pop()
