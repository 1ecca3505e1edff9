"""A step-cost model for a GPU run that has no kernel profile: the roofline of the model on the GPU,
with one efficiency per term fitted on other real runs (sim_to_real.py names the split).

    t = h + k_w * W/BW + k_ar * 2 L log2(tp) + k_f * N_tok * F/peak + k_f * attn2 * A/peak + k_kv * ctx * K/BW

W: the weight bytes one GPU streams a step; F: the FLOPs of one token (2 x active parameters / tp);
A: the FLOPs of one query-key pair (4 x layers x heads x head_dim / tp); K: the KV bytes of one
context token on one GPU; L: layers, each with two all-reduces under tensor parallelism, whose latency
grows with the depth of the reduction, log2(tp) (against one constant per all-reduce, the fit runs'
residuals fall from median 3.1% / max 7.4% to 1.4% / 3.8%); BW and peak from the hardware table. The five constants (h, k_w, k_ar, k_f, k_kv) are the same for every model and
GPU; each term is one term of loadgen's StepCostModel (t0, a, b, g), so the fitted model runs in
the simulated engine unchanged.

The fit needs no simulation: in a stage of steady open-loop load, the requests decoding at a time
are n = rate x (E2E - TTFT) (Little's law on measured means), and every step advances each of them
one token, so the measured time per output token is the mean step time, whose features follow
from n and the workload's lengths: ``stage_features``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from loadgen.sim.cost import StepCostModel, TransformerShape, nnls_small

# architectures the vendored configs leave out, from each model's published config.json
EXTRA_CONFIGS = {
    "llama-2-70b-hf": {"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                       "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 32000},
    "mixtral-8x22b": {"num_hidden_layers": 56, "hidden_size": 6144, "num_attention_heads": 48,
                      "num_key_value_heads": 8, "intermediate_size": 16384, "vocab_size": 32768,
                      "num_local_experts": 8, "num_experts_per_tok": 2},
}
CONSTANTS = ("h_s", "k_weights", "k_allreduce_s", "k_flops", "k_kv")


@dataclass(frozen=True)
class Architecture:
    """A model's sizes (loadgen's TransformerShape, one expert's MLP for an MoE model) and what the
    roofline needs beyond them: its parameter counts with every expert and with the active ones."""

    shape: TransformerShape
    total_params: int
    active_params: int
    weight_bytes_per_param: float  # 1 for FP8 weights

    def kv_bytes_per_token(self, tp: int) -> int:
        """One context token's K and V on one GPU (a KV head is replicated when tp exceeds them)."""
        s = self.shape
        return s.kv_bytes_per_token() // s.num_kv_heads * max(1, s.num_kv_heads // tp)


def architecture(name: str, config: dict, fp8_weights: bool = False) -> Architecture:
    """Parameter counts from a Hugging Face config (gated MLPs; MoE experts with a shared expert
    where the config says so, as Llama 4's)."""
    c = config.get("text_config", config)
    h, heads = c["hidden_size"], c["num_attention_heads"]
    experts = c.get("num_local_experts") or c.get("num_experts") or 0
    shape = TransformerShape(name, c["num_hidden_layers"], h, heads, c.get("num_key_value_heads") or heads,
                             c.get("head_dim") or h // heads,
                             (c.get("moe_intermediate_size") or c["intermediate_size"]) if experts else c["intermediate_size"],
                             c["vocab_size"], bool(c.get("tie_word_embeddings")))
    # the shape counts one MLP a layer; an MoE layer has its experts (and a shared one), top_k of them active
    expert = shape.num_layers * 3 * h * shape.intermediate_size
    shared = 1 if experts and c.get("model_type") == "llama4_text" else 0
    extra_total = (experts + shared - 1) * expert if experts else 0
    extra_active = ((c.get("num_experts_per_tok") or 0) + shared - 1) * expert if experts else 0
    return Architecture(shape, shape.weight_params() + extra_total,
                        shape.non_embedding_params() + extra_active + shape.vocab_size * h,
                        1.0 if fp8_weights else 2.0)


def load_architecture(model_configs: Path, model: str) -> Optional[Architecture]:
    """The architecture of a Hugging Face model name from a folder of configs named by its lowered
    basename (BLIS's model_configs/ layout); None when neither it nor EXTRA_CONFIGS has it."""
    base = model.split("/")[-1].lower()
    fp8 = "fp8" in base
    for key in (base, base.removesuffix("-instruct-v0.1"), base.removesuffix("-v0.1")):
        path = model_configs / key / "config.json"
        if path.is_file():
            return architecture(key, json.loads(path.read_text()), fp8)
        if key in EXTRA_CONFIGS:
            return architecture(key, EXTRA_CONFIGS[key], fp8)
    return None


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float
    peak_fp8_flops: float
    bw_bytes_per_s: float
    memory_bytes: float


def load_hardware(path: Path, name: str) -> Optional[Hardware]:
    table = json.loads(path.read_text())
    key = {"A100-80GB": "A100-80"}.get(name, name)
    if key not in table:
        return None
    row = table[key]
    return Hardware(name, row["TFlopsPeak"] * 1e12, (row.get("TFlopsFP8") or row["TFlopsPeak"]) * 1e12,
                    row["BwPeakTBs"] * 1e12, row["MemoryGiB"] * 2**30)


@dataclass(frozen=True)
class Roofline:
    """The per-unit times of one model on one GPU at one tensor-parallel degree."""

    weights_s: float  # W/BW: every step streams the weights once
    allreduce_hops: float  # 2 L log2(tp): all-reduces a step, each log2(tp) deep
    token_s: float  # F/peak
    pair_s: float  # A/peak
    kv_token_s: float  # K/BW

    @classmethod
    def of(cls, arch: Architecture, hw: Hardware, tp: int) -> "Roofline":
        peak = hw.peak_fp8_flops if arch.weight_bytes_per_param == 1.0 else hw.peak_flops
        return cls(arch.total_params * arch.weight_bytes_per_param / tp / hw.bw_bytes_per_s,
                   2 * arch.shape.num_layers * math.log2(tp),
                   2 * arch.active_params / tp / peak,
                   4 * arch.shape.attention_width() / tp / peak,
                   arch.kv_bytes_per_token(tp) / hw.bw_bytes_per_s)

    def cost_model(self, constants: dict, name: str) -> StepCostModel:
        c = constants
        return StepCostModel(t0_s=c["h_s"] + c["k_weights"] * self.weights_s + c["k_allreduce_s"] * self.allreduce_hops,
                             a_s_per_token=c["k_flops"] * self.token_s, b_s_per_token2=c["k_flops"] * self.pair_s,
                             g_s_per_token=c["k_kv"] * self.kv_token_s, name=name, flavor="vllm")


@dataclass(frozen=True)
class Stage:
    """One load stage of a measured run, as the fit reads it."""

    roofline: Roofline
    rate_per_s: float
    prompt_tokens: float
    uncached_tokens: float  # what a prompt prefills after its prefix-cache hit
    output_tokens: float
    tpot_s: float  # measured (E2E - TTFT) / (output - 1)
    decode_s: float  # measured E2E - TTFT


def step_features(r: Roofline, running: float, prefills: float, prompt_tokens: float, uncached_tokens: float,
                  output_tokens: float) -> np.ndarray:
    """The features of a step, in the order of CONSTANTS, that decodes ``running`` requests (half way
    through their output on average) and prefills ``prefills`` prompts' uncached tokens."""
    tokens = running + prefills * uncached_tokens
    pairs = prefills * uncached_tokens * (prompt_tokens - uncached_tokens / 2)
    context = running * (prompt_tokens + output_tokens / 2)
    return np.array([1.0, r.weights_s, r.allreduce_hops, r.token_s * tokens + r.pair_s * pairs, r.kv_token_s * context])


def stage_features(s: Stage) -> np.ndarray:
    """The mean step of a stage: ``n`` requests decode (Little's law), and a step of length tpot
    carries rate x tpot prompts."""
    return step_features(s.roofline, s.rate_per_s * s.decode_s, s.rate_per_s * s.tpot_s, s.prompt_tokens,
                         s.uncached_tokens, s.output_tokens)


def saturated_features(r: Roofline, running: float, prompt_tokens: float, uncached_tokens: float,
                       output_tokens: float) -> np.ndarray:
    """The mean step of an engine whose queue never empties: ``running`` requests decode, and each
    that finishes (one in ``output_tokens`` a step per request) lets one waiting prompt in."""
    return step_features(r, running, running / output_tokens, prompt_tokens, uncached_tokens, output_tokens)


def fit_constants(stages: list[Stage]) -> tuple[dict, list[float]]:
    """Non-negative least squares on relative residuals; returns the constants and each stage's
    relative residual (predicted / measured - 1)."""
    x = np.array([stage_features(s) / s.tpot_s for s in stages])
    coef = nnls_small(x, np.ones(len(stages)))
    residuals = [float(v) for v in x @ coef - 1.0]
    return dict(zip(CONSTANTS, (float(v) for v in coef))), residuals


def kv_pool_tokens(arch: Architecture, hw: Hardware, tp: int, gpu_memory_utilization: float,
                   overhead_bytes: float, block_tokens: int = 16) -> int:
    """vLLM's KV pool: what ``gpu_memory_utilization`` of the GPU leaves after the weights and the
    profiled activation peak (``overhead_bytes``), in tokens (whole blocks)."""
    free = hw.memory_bytes * gpu_memory_utilization - arch.total_params * arch.weight_bytes_per_param / tp - overhead_bytes
    return max(0, int(free // arch.kv_bytes_per_token(tp)) // block_tokens * block_tokens)


def overhead_bytes(arch: Architecture, hw: Hardware, tp: int, gpu_memory_utilization: float, pool_tokens: int) -> float:
    """The activation peak a recorded pool size implies (``kv_pool_tokens`` solved for it)."""
    return (hw.memory_bytes * gpu_memory_utilization - arch.total_params * arch.weight_bytes_per_param / tp
            - pool_tokens * arch.kv_bytes_per_token(tp))
