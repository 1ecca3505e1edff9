"""A GPU's step cost from a kernel profile: LLMServingSim's per-layer tables of vLLM, composed
into whole steps and fitted by the step-cost model (``loadgen calibrate --from-profile``).

The profile folder (LLMServingSim's layout, ``profiler/perf/<GPU>/<org>/<model>/<dtype>/``):
``meta.yaml`` (the model, its architecture, the TP degrees, the engine's settings) and per TP
degree ``tp<N>/``: ``dense.csv`` (``layer``, ``tokens``, ``time_us``: one layer's kernel time for a
step of that many tokens), ``per_sequence.csv`` (``lm_head`` and ``sampler`` by ``sequences``),
``attention.csv`` (``prefill_chunk``, ``kv_prefill``, ``n_decode``, ``kv_decode``, ``time_us``: one
attention layer for a step of at most one prefill chunk of that many new tokens over that many
cached ones and that many decodes over that context each). Times are microseconds for one layer.

A step's kernel time is the architecture's order of layers (``profiler/models/<arch>.yaml``
``sequence``, found above the folder; without it: every dense layer once per block, the
layernorm twice, the embedding and final layernorm once per step):

    embedding(T) + layers x [block's dense layers(T) + attention(step)] + final_layernorm(T)
      + lm_head(S) + sampler(S)

with T the step's tokens (chunk + decodes) and S its sequences (decodes, and the chunk's request,
whose logits vLLM computes too). ``dense`` and ``per_sequence`` are interpolated linearly between
profiled sizes; attention is read at profiled points only (the fit's steps are those points).

An MoE block's ``moe`` layer (``moe.csv``: ``tokens``, ``activated_experts``, ``time_us``) is read
at the experts a step of T tokens activates, assuming the router spreads tokens uniformly and
independently: E = N (1 - (1 - k / N)^T) of N experts with k per token (the model config's
``num_experts`` and ``num_experts_per_tok``), interpolated linearly in experts, then in tokens.

A kernel profile has no host time (scheduling, input preparation, output processing): it is the
GPU's share of a step only. TP all-reduce and EP all-to-all are not in the tables and not added.
"""

from __future__ import annotations

import csv
import json
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml


class ProfileError(ValueError):
    """A profile that cannot be read: the message names the file, column or value."""


@dataclass(frozen=True)
class ProfiledStep:
    """One attention row as a whole step: its shape and its composed kernel time."""

    prefill_chunk: int
    kv_prefill: int
    n_decode: int
    kv_decode: int
    kernel_s: float

    @property
    def kind(self) -> str:
        if self.prefill_chunk and self.n_decode:
            return "mixed"
        return "prefill" if self.prefill_chunk else "decode"

    @property
    def num_tokens(self) -> int:
        return self.prefill_chunk + self.n_decode


def _read_csv(path: Path, columns: tuple[str, ...], text: tuple[str, ...] = ("layer",)) -> list[dict]:
    if not path.is_file():
        raise ProfileError(f"{path}: missing (a profile folder holds tp<N>/{path.name})")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ProfileError(f"{path}: missing column(s) {missing}; expected {list(columns)}")
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                rows.append({c: (row[c] if c in text else float(row[c])) for c in columns})
            except (TypeError, ValueError):
                raise ProfileError(f"{path}: line {line}: expected numbers in {list(columns)}, got {row}") from None
    if not rows:
        raise ProfileError(f"{path}: no rows")
    return rows


class _Curve:
    """time(x) through the profiled points, linear between them, clamped to the largest's slope."""

    def __init__(self, points: dict[float, float]) -> None:
        self.xs = sorted(points)
        self.ys = [points[x] for x in self.xs]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:  # one profiled size (one token activates only k experts): that time
            return ys[0]
        if x <= xs[0]:
            return ys[0] * (x / xs[0]) if xs[0] > 0 else ys[0]
        i = bisect_left(xs, x)
        if i == len(xs):
            i -= 1  # beyond the table: the last segment's slope
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class _MoeTable:
    """moe(T): the profiled time at the experts T tokens activate (see the module docstring)."""

    def __init__(self, rows: list[dict], num_experts: int, experts_per_token: int) -> None:
        self.num_experts, self.per_token = num_experts, experts_per_token
        by_tokens: dict[float, dict[float, float]] = {}
        for r in rows:
            by_tokens.setdefault(r["tokens"], {})[r["activated_experts"]] = r["time_us"]
        self.tokens = sorted(by_tokens)
        self.curves = [_Curve(by_tokens[t]) for t in self.tokens]

    def activated(self, tokens: float) -> float:
        n, k = self.num_experts, self.per_token
        return n * (1.0 - (1.0 - k / n) ** tokens)

    def __call__(self, tokens: float) -> float:
        experts = self.activated(tokens)
        at = [curve(experts) for curve in self.curves]
        return _Curve(dict(zip(self.tokens, at)))(tokens)


@dataclass
class KernelProfile:
    folder: Path
    model: str
    architecture: str
    tp: int
    num_layers: int
    max_num_batched_tokens: int
    block_layers: list[str]  # the dense layers of one decoder block, in order (attention excluded)
    step_layers: list[str]  # the dense layers once per step (embedding, final layernorm)
    notes: list[str]
    dense: dict[str, _Curve]
    per_sequence: dict[str, _Curve]
    attention: dict[tuple[int, int, int, int], float]  # seconds for one layer
    moe: Optional[_MoeTable] = None  # an MoE block's expert layer
    skew: Optional[list[dict]] = None  # skew.csv's summary (``skew_summary``), None without one

    def kernel_s(self, prefill_chunk: int, kv_prefill: int, n_decode: int, kv_decode: int) -> float:
        """The composed kernel time of a step at a profiled attention point."""
        key = (prefill_chunk, kv_prefill, n_decode, kv_decode)
        attention = self.attention.get(key)
        if attention is None:
            raise ProfileError(f"attention.csv has no row for prefill_chunk={prefill_chunk}, kv_prefill={kv_prefill}, "
                               f"n_decode={n_decode}, kv_decode={kv_decode}")
        tokens = prefill_chunk + n_decode
        sequences = n_decode + (1 if prefill_chunk else 0)
        dense_us = sum(self.dense[layer](tokens) for layer in self.block_layers if layer != "moe")
        if self.moe is not None:
            dense_us += self.moe(tokens)
        block = dense_us * 1e-6 + attention
        once = sum(self.dense[layer](tokens) for layer in self.step_layers) * 1e-6
        head = sum(curve(sequences) for curve in self.per_sequence.values()) * 1e-6
        return once + self.num_layers * block + head

    def steps(self) -> list[ProfiledStep]:
        """Every profiled attention point a vLLM step can be (at most the step budget of tokens),
        as a whole step."""
        out = []
        for (c, p, n, kv) in sorted(self.attention):
            if c + n == 0 or c + n > self.max_num_batched_tokens:
                continue
            out.append(ProfiledStep(c, p, n, kv, self.kernel_s(c, p, n, kv)))
        return out


def _walk_up(folder: Path, relative: Path) -> Optional[Path]:
    for parent in [folder, *folder.parents]:
        candidate = parent / relative
        if candidate.is_file():
            return candidate
    return None


def load_profile(folder: str | Path, tp: Optional[int] = None, num_layers: Optional[int] = None) -> KernelProfile:
    folder = Path(folder)
    meta_path = folder / "meta.yaml"
    if not meta_path.is_file():
        raise ProfileError(f"{folder}: no meta.yaml (expected a profile folder in LLMServingSim's layout: "
                           "meta.yaml and tp<N>/{attention,dense,per_sequence}.csv)")
    try:
        meta = yaml.safe_load(meta_path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{meta_path}: not valid YAML ({exc})") from None
    model = str(meta.get("model", ""))
    architecture = str(meta.get("architecture", ""))
    degrees = sorted(int(d) for d in meta.get("tp_degrees") or [] if (folder / f"tp{int(d)}").is_dir())
    if not degrees:
        degrees = sorted(int(p.name[2:]) for p in folder.glob("tp*") if p.name[2:].isdigit())
    if tp is None:
        if not degrees:
            raise ProfileError(f"{folder}: no tp<N>/ folder")
        tp = degrees[0]
    elif tp not in degrees:
        raise ProfileError(f"--tp {tp}: the profile has tp {degrees} ({folder})")
    notes: list[str] = []
    config_path = _walk_up(folder, Path("configs/model") / f"{model}.json")
    config = json.loads(config_path.read_text()) if config_path is not None else {}
    if num_layers is None:
        if "num_hidden_layers" not in config:
            raise ProfileError(f"the layer count of {model or 'the model'} is unknown: pass --layers N (no "
                               f"configs/model/{model}.json above {folder})")
        num_layers = int(config["num_hidden_layers"])
        notes.append(f"{num_layers} layers, from {config_path}")
    moe = None
    moe_path = folder / f"tp{tp}" / "moe.csv"
    if moe_path.is_file():
        if not {"num_experts", "num_experts_per_tok"} <= set(config):
            raise ProfileError(f"{moe_path}: an MoE profile needs the model's num_experts and num_experts_per_tok "
                               f"(configs/model/{model}.json above {folder})")
        moe = _MoeTable(_read_csv(moe_path, ("tokens", "activated_experts", "time_us")), int(config["num_experts"]),
                        int(config["num_experts_per_tok"]))
        notes.append(f"MoE: {moe.num_experts} experts, {moe.per_token} a token, spread uniformly (a 128-token step "
                     f"activates {moe.activated(128):.1f})")
    if num_layers < 1:
        raise ProfileError(f"--layers {num_layers}: expected a layer count >= 1")
    engine = meta.get("engine_effective") or {}
    budget = int(engine.get("max_num_batched_tokens") or 2048)
    tp_dir = folder / f"tp{tp}"
    dense_rows = _read_csv(tp_dir / "dense.csv", ("layer", "tokens", "time_us"))
    seq_rows = _read_csv(tp_dir / "per_sequence.csv", ("layer", "sequences", "time_us"))
    att_rows = _read_csv(tp_dir / "attention.csv", ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))
    dense_points: dict[str, dict[float, float]] = {}
    for r in dense_rows:
        dense_points.setdefault(r["layer"], {})[r["tokens"]] = r["time_us"]
    seq_points: dict[str, dict[float, float]] = {}
    for r in seq_rows:
        seq_points.setdefault(r["layer"], {})[r["sequences"]] = r["time_us"]
    block_layers, step_layers = _layer_order(folder, architecture, sorted(dense_points), notes)
    missing = [layer for layer in block_layers + step_layers if layer not in dense_points
               and not (layer == "moe" and moe is not None)]
    if missing:
        raise ProfileError(f"{tp_dir / 'dense.csv'}: no rows for layer(s) {missing} of the {architecture} block")
    attention = {(int(r["prefill_chunk"]), int(r["kv_prefill"]), int(r["n_decode"]), int(r["kv_decode"])):
                 r["time_us"] * 1e-6 for r in att_rows}
    skew_path = tp_dir / "skew.csv"
    skew = skew_summary(_read_skew(skew_path)) if skew_path.is_file() else None
    return KernelProfile(folder, model, architecture, tp, num_layers, budget, block_layers, step_layers, notes,
                         {k: _Curve(v) for k, v in dense_points.items()},
                         {k: _Curve(v) for k, v in seq_points.items()}, attention, moe, skew)


def _read_skew(path: Path) -> list[dict]:
    """skew.csv's rows with an alpha (it is empty where the longest context took no longer than the
    mean, t_max <= t_mean: nothing to say)."""
    rows = _read_csv(path, ("regime", "n", "pc", "alpha"), text=("regime", "alpha"))
    out = []
    for r in rows:
        if r["alpha"].strip():
            try:
                out.append({**r, "alpha": float(r["alpha"])})
            except ValueError:
                raise ProfileError(f"{path}: alpha {r['alpha']!r} is not a number") from None
    return out


def skew_summary(rows: list[dict]) -> list[dict]:
    """Does a batch of decodes over mixed contexts take its mean context's time (alpha 0: the model's
    g * sum of contexts) or its longest's (alpha 1)? skew.csv's alpha = (t_skew - t_mean) / (t_max -
    t_mean) per batch, summarised by regime (decode-only "pure", or beside a prefill chunk) and size."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        regime = "decode-only" if r["regime"] == "pure" and not r["pc"] else "beside a chunk"
        groups.setdefault((regime, "n < 32" if r["n"] < 32 else "n >= 32"), []).append(r["alpha"])
    out = []
    for (regime, size), alphas in sorted(groups.items()):
        alphas.sort()
        out.append({"regime": regime, "batch": size, "rows": len(alphas),
                    "median_alpha": alphas[len(alphas) // 2], "p90_alpha": alphas[(9 * len(alphas)) // 10]})
    return out


def _layer_order(folder: Path, architecture: str, dense_layers: list[str], notes: list[str]) -> tuple[list, list]:
    """(a block's dense layers, the once-per-step dense layers) in the architecture's order."""
    catalog = _walk_up(folder, Path("profiler/models") / f"{architecture}.yaml") if architecture else None
    if catalog is not None:
        seq = (yaml.safe_load(catalog.read_text()) or {}).get("sequence") or {}
        block = [layer for part in ("pre_attn", "post_attn", "mlp_dense", "mlp_moe") for layer in seq.get(part) or []
                 if layer != "attention"]
        once = list(seq.get("prologue") or []) + [layer for layer in seq.get("head") or []
                                                   if layer not in ("lm_head", "sampler")]
        notes.append(f"layer order from {catalog}")
        return block, once
    once = [layer for layer in ("embedding", "final_layernorm") if layer in dense_layers]
    block = [layer for layer in dense_layers if layer not in once]
    if "layernorm" in block:
        block.append("layernorm")  # before attention and before the MLP
    notes.append(f"no profiler/models/{architecture}.yaml above the folder: every dense layer once per block "
                 "(layernorm twice), embedding and final layernorm once per step")
    return block, once
