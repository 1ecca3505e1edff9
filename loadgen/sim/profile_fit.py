"""The step-cost model fitted to a kernel profile's composed steps (loadgen/sim/kernel_profile.py),
and how well it fits each kind of step.

Every profiled point a vLLM step can be (prefill-only, decode-only, mixed; at most the step
budget of tokens) is a row: its features are the model's (``Measurement``: one step, T tokens,
the chunk's attention c (p + c / 2), the decodes' context n kv, and that context again when the
step also prefills) and its seconds the composed kernel time. The fit is least squares on
relative error with constants >= 0, as ``fit_cost_model``, each kind weighing the same however
many rows it has (the profile's grid holds ~100 mixed points for every decode-only one).

Beside the model's own fit, the same rows are fitted with one more constant, a cost per decode
token apart from a prefill token's (on a GPU a decode token in a batch costs less: the weights
stream once per step). That term enters the written model only where the profile shows it: when
its 95% interval excludes the prefill token's cost (``decode_token_supported``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .cost import StepCostModel, nnls_small
from .kernel_profile import KernelProfile, ProfiledStep

KINDS = ("prefill", "decode", "mixed")
NAMES = ("t0_s", "a_s_per_token", "b_s_per_token2", "g_s_per_token", "mixed_decode_s_per_token")
DECODE_TOKEN = "decode_s_per_token"


def _features(step: ProfiledStep, decode_apart: bool) -> list[float]:
    c, p, n, kv = step.prefill_chunk, step.kv_prefill, step.n_decode, step.kv_decode
    tokens = [float(c), float(n)] if decode_apart else [float(c + n)]
    return [1.0, *tokens, c * (p + c / 2.0), float(n * kv), float(n * kv) if c else 0.0]


@dataclass(frozen=True)
class _Design:
    """The fit's rows, built once: features (tokens together, or decode tokens apart), seconds, kinds."""

    X: np.ndarray
    X_apart: np.ndarray
    y: np.ndarray
    kinds: np.ndarray

    @classmethod
    def of(cls, steps: Sequence[ProfiledStep]) -> "_Design":
        return cls(np.array([_features(s, False) for s in steps], dtype=float),
                   np.array([_features(s, True) for s in steps], dtype=float),
                   np.array([s.kernel_s for s in steps], dtype=float), np.array([s.kind for s in steps]))

    def solve(self, rows: np.ndarray, decode_apart: bool) -> np.ndarray:
        X = (self.X_apart if decode_apart else self.X)[rows]
        y, kinds = self.y[rows], self.kinds[rows]
        counts = {k: int(np.count_nonzero(kinds == k)) for k in KINDS}
        w = np.array([1.0 / math.sqrt(counts[k]) for k in kinds])  # each kind weighs the same
        scale = X.max(axis=0)
        scale[scale == 0] = 1.0
        A = (X / scale) / y[:, None] * w[:, None]
        return nnls_small(A, w) / scale

    def relative(self, coef: np.ndarray, decode_apart: bool) -> list[float]:
        X = self.X_apart if decode_apart else self.X
        return [float(r) for r in (X @ coef - self.y) / self.y]


@dataclass
class ProfileFit:
    profile: KernelProfile
    steps: list[ProfiledStep]
    coefficients: dict  # the model's constants (NAMES)
    intervals: dict  # name -> (low, high), bootstrap over rows within each kind
    with_decode_token: dict  # the fit with a decode-token constant (NAMES + DECODE_TOKEN)
    intervals_decode_token: dict  # its bootstrap intervals
    residuals: list[float]  # relative, per step, of the model's fit
    residuals_decode_token: list[float]

    @property
    def decode_token_supported(self) -> bool:
        """The profile prices a decode token apart: the decode constant's interval excludes the
        prefill token's, and the prefill token's its."""
        d, a = self.intervals_decode_token[DECODE_TOKEN], self.intervals_decode_token["a_s_per_token"]
        return d[1] < a[0] or d[0] > a[1]

    def p90_by_kind(self) -> dict:
        """Of the written model, the 90th percentile of |relative residual| per step kind."""
        res = self.residuals_decode_token if self.decode_token_supported else self.residuals
        out = {}
        for kind in KINDS:
            picked = [abs(r) for s, r in zip(self.steps, res) if s.kind == kind]
            if picked:
                out[kind] = float(np.percentile(picked, 90))
        return out

    def model(self, name: str, host_s_per_step: float = 0.0) -> StepCostModel:
        """The written model: with the decode-token constant where the profile supports it."""
        c = self.with_decode_token if self.decode_token_supported else self.coefficients
        return StepCostModel(c["t0_s"], c["a_s_per_token"], c["b_s_per_token2"], c["g_s_per_token"], name=name,
                             mixed_decode_s_per_token=c["mixed_decode_s_per_token"], flavor="vllm",
                             decode_s_per_token=c.get(DECODE_TOKEN), host_s_per_step=host_s_per_step)

    def residual_rows(self, residuals: Sequence[float]) -> list[dict]:
        """Per step kind and context band: rows, mean signed and p90 |relative residual|."""
        out = []
        for kind in KINDS:
            for lo, hi in ((0, 1024), (1024, 4096), (4096, math.inf)):
                picked = [r for s, r in zip(self.steps, residuals) if s.kind == kind and lo <= _context(s) < hi]
                if not picked:
                    continue
                a = np.abs(picked)
                out.append({"kind": kind, "context": f"{lo}-{'' if hi == math.inf else int(hi)}", "rows": len(picked),
                            "mean": float(np.mean(picked)), "p90_abs": float(np.percentile(a, 90))})
        return out

    def table(self) -> str:
        p = self.profile
        lines = [f"kernel profile {p.folder}: {p.model} ({p.architecture}), tp {p.tp}, {p.num_layers} layers; "
                 f"{len(self.steps)} steps ({', '.join(f'{k} {sum(s.kind == k for s in self.steps)}' for k in KINDS)})"]
        lines += [f"  note: {n}" for n in p.notes]
        units = {"t0_s": (1e3, "ms"), "a_s_per_token": (1e6, "us/token"), "b_s_per_token2": (1e9, "ns/token^2"),
                 "g_s_per_token": (1e9, "ns/token"), "mixed_decode_s_per_token": (1e9, "ns/token"),
                 DECODE_TOKEN: (1e6, "us/token")}
        lines.append("fitted step model (95% bootstrap intervals, rows resampled within each kind):")
        for name in NAMES:
            k, unit = units[name]
            lo, hi = self.intervals[name]
            lines.append(f"  {name:26s} {self.coefficients[name] * k:10.4g} {unit:10s} [{lo * k:.4g}, {hi * k:.4g}]")
        lines.append("residuals (model - profile) / profile by step kind and context (tokens attended):")
        lines += _residual_lines(self.residual_rows(self.residuals))
        d, di = self.with_decode_token, self.intervals_decode_token
        verdict = ("supported: written to the model" if self.decode_token_supported
                   else "not supported (its interval holds a's): left out")
        lines.append(f"with a decode-token cost apart ({verdict}): "
                     f"a={d['a_s_per_token'] * 1e6:.4g} us/prefill token [{di['a_s_per_token'][0] * 1e6:.4g}, "
                     f"{di['a_s_per_token'][1] * 1e6:.4g}], decode={d[DECODE_TOKEN] * 1e6:.4g} us/decode token "
                     f"[{di[DECODE_TOKEN][0] * 1e6:.4g}, {di[DECODE_TOKEN][1] * 1e6:.4g}], "
                     f"t0={d['t0_s'] * 1e3:.4g} ms:")
        lines += _residual_lines(self.residual_rows(self.residuals_decode_token))
        if p.skew:
            lines.append("skew.csv: decodes over mixed contexts, alpha 0 = their mean context's time (the model's "
                         "g * sum of contexts), 1 = their longest's:")
            lines += [f"  {s['regime']:15s} {s['batch']:8s}: {s['rows']:5d} batches, median alpha "
                      f"{s['median_alpha']:+.2f}, p90 {s['p90_alpha']:+.2f}" for s in p.skew]
        lines.append("kernel time only: a profile has no host time (scheduling, input preparation, output "
                     "processing), which a real step adds")
        return "\n".join(lines)

    def to_json(self) -> dict:
        p = self.profile
        return {"profile": str(p.folder), "model": p.model, "architecture": p.architecture, "tp": p.tp,
                "num_layers": p.num_layers, "notes": p.notes, "num_steps": len(self.steps), "skew": p.skew,
                "coefficients": self.coefficients,
                "intervals": {k: {"low": lo, "high": hi} for k, (lo, hi) in self.intervals.items()},
                "residuals": self.residual_rows(self.residuals),
                "with_decode_token": {"coefficients": self.with_decode_token, "supported": self.decode_token_supported,
                                      "intervals": {k: {"low": lo, "high": hi}
                                                    for k, (lo, hi) in self.intervals_decode_token.items()},
                                      "residuals": self.residual_rows(self.residuals_decode_token)}}


def _context(step: ProfiledStep) -> int:
    return step.kv_decode if step.kind == "decode" else step.kv_prefill + step.prefill_chunk


def _residual_lines(rows: list[dict]) -> list[str]:
    return [f"  {r['kind']:8s} context {r['context']:>10s}: {r['rows']:6d} steps, mean {100 * r['mean']:+6.1f}%, "
            f"p90 |resid| {100 * r['p90_abs']:5.1f}%" for r in rows]


def _named(coef: np.ndarray, decode_apart: bool) -> dict:
    names = (["t0_s", "a_s_per_token", DECODE_TOKEN] if decode_apart else ["t0_s", "a_s_per_token"]) + list(NAMES[2:])
    return {n: float(v) for n, v in zip(names, coef)}


def fit_profile(profile: KernelProfile, rng: np.random.Generator, num_resamples: int = 100) -> ProfileFit:
    steps = profile.steps()
    present = {s.kind for s in steps}
    if not {"prefill", "decode"} <= present:
        raise ValueError(f"{profile.folder}: the fit needs prefill-only and decode-only steps; the profile has "
                         f"{sorted(present)}")
    design = _Design.of(steps)
    every = np.arange(len(steps))
    coef, apart = design.solve(every, False), design.solve(every, True)
    by_kind = [every[design.kinds == k] for k in KINDS]
    draws, draws_apart = [], []
    for _ in range(num_resamples):
        sample = np.concatenate([m[rng.integers(0, len(m), size=len(m))] for m in by_kind if len(m)])
        draws.append(_named(design.solve(sample, False), False))
        draws_apart.append(_named(design.solve(sample, True), True))
    return ProfileFit(profile, steps, _named(coef, False), _intervals(draws), _named(apart, True),
                      _intervals(draws_apart), design.relative(coef, False), design.relative(apart, True))


def _intervals(draws: list[dict]) -> dict:
    return {n: (float(np.percentile([d[n] for d in draws], 2.5)), float(np.percentile([d[n] for d in draws], 97.5)))
            for n in draws[0]}
