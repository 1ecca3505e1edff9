"""Ideal vs measured hit ratio: how much of a run's miss is the engine's and how much the workload's.

The ideal hit ratio of a run is the hit ratio an infinite prefix cache would give the same
requests: each turn hits the longest prefix of its prompt that an earlier request of the run
had sent (the turn's ``cacheable_prefix_tokens``, recorded by the session when it sent the
turn, loadgen/core/session.py), in whole blocks of the engine's block size and at most
prompt - 1 tokens, as vLLM's lookup caps it (the last prompt token is always computed). The
definition, with every assumption it makes, is in docs/results-format.md#ideal-hit-ratio.

A measured hit ratio well below the ideal is the engine's doing (eviction, a flush, a router
spreading a session over replicas); an ideal ratio that is itself low is the workload's (short
sessions, large tool outputs, little shared prefix).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .runs import RunData, float_column, json_float, success_mask
from .windows import LAST_HIT_WINDOW_S

# vLLM's default --block-size: what the ideal rounds to for a run whose engine's block size is unknown
DEFAULT_BLOCK_SIZE = 16
CACHEABLE_COLUMN = "cacheable_prefix_tokens"


def ideal_cached_tokens(prompt_tokens: np.ndarray, cacheable_prefix_tokens: np.ndarray,
                        block_size: int) -> np.ndarray:
    """Per turn, the tokens an infinite cache hits: the cacheable prefix in whole blocks, capped at
    the whole blocks of prompt - 1 (vLLM computes the last prompt token whatever is cached)."""
    bs = int(block_size)
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    held = np.asarray(cacheable_prefix_tokens, dtype=np.int64)
    cap = np.maximum(prompt - 1, 0) // bs * bs
    return np.clip(held // bs * bs, 0, cap)


def run_block_size(run_json: Mapping[str, Any]) -> tuple[int, bool]:
    """(block size, whether run.json gave it): its ``prefix_cache_block_size``, else vLLM's default."""
    value = run_json.get("prefix_cache_block_size")
    if isinstance(value, int) and value > 0:
        return value, True
    return DEFAULT_BLOCK_SIZE, False


def hit_ratio_outcome(run: RunData) -> dict:
    """The summary.json fields of one run: measured and ideal hit ratio over the whole run and over
    its last 10 minutes (the window of ``hit_ratio_last10min``); the ideal ones null for turns
    recorded without ``cacheable_prefix_tokens`` (older results)."""
    turns = run.turns
    duration_s = float(run.run_json["duration_s"])
    block_size, known = run_block_size(run.run_json)
    ok = success_mask(turns)
    prompt = np.nan_to_num(float_column(turns, "prompt_tokens")[ok])
    cached = np.nan_to_num(float_column(turns, "cached_tokens")[ok])
    finish_s = float_column(turns, "finish_s")[ok]
    last = finish_s >= max(0.0, duration_s - LAST_HIT_WINDOW_S)
    ideal = None
    if CACHEABLE_COLUMN in turns.column_names:
        cacheable = float_column(turns, CACHEABLE_COLUMN)[ok]
        if np.isfinite(cacheable).all():
            ideal = ideal_cached_tokens(prompt, cacheable, block_size).astype(np.float64)

    def ratio(hit: Optional[np.ndarray], within: np.ndarray) -> Optional[float]:
        total = float(prompt[within].sum())
        if hit is None or total <= 0:
            return None
        return json_float(float(hit[within].sum()) / total)

    everything = np.ones(len(prompt), dtype=bool)
    measured_ratio, ideal_ratio = ratio(cached, everything), ratio(ideal, everything)
    return {
        "measured_hit_ratio": measured_ratio,
        "ideal_hit_ratio": ideal_ratio,
        "engine_miss_share": engine_miss_share(measured_ratio, ideal_ratio),
        "ideal_hit_ratio_last10min": ratio(ideal, last),
        # what the ideal rounded to, and where that came from (run.json, or vLLM's default)
        "ideal_block_size": block_size if ideal is not None else None,
        "ideal_block_size_assumed": (not known) if ideal is not None else None,
    }


def ideal_hit_lines(summary: Mapping[str, Any], arms: Sequence[str]) -> list[str]:
    """The report's lines: per arm, the mean over its runs of the measured and ideal hit ratios
    over the whole run; [] when no run has an ideal ratio (results recorded before it)."""
    by_arm: dict[str, list[tuple[float, float, Optional[float]]]] = {}
    assumed = False
    for run in summary.get("runs") or []:
        measured, ideal = run.get("measured_hit_ratio"), run.get("ideal_hit_ratio")
        if measured is None or ideal is None:
            continue
        by_arm.setdefault(run["arm"], []).append((measured, ideal, run.get("engine_miss_share")))
        assumed = assumed or bool(run.get("ideal_block_size_assumed"))
    if not by_arm:
        return []
    parts = []
    for arm in arms:
        pairs = by_arm.get(arm)
        if not pairs:
            continue
        measured = sum(p[0] for p in pairs) / len(pairs)
        ideal = sum(p[1] for p in pairs) / len(pairs)
        shares = [p[2] for p in pairs if p[2] is not None]
        share = f" (engine's share of the miss {sum(shares) / len(shares):.2f})" if shares else ""
        parts.append(f"{arm} {measured:.3f} / {ideal:.3f}{share}")
    note = f" (block size unknown for some runs: {DEFAULT_BLOCK_SIZE} assumed)" if assumed else ""
    return ["hit ratio over the whole run, measured / ideal (an infinite cache, the same prompts; mean of runs): "
            + ", ".join(parts) + note]


def engine_miss_share(measured: Optional[float], ideal: Optional[float]) -> Optional[float]:
    """Of the prompt tokens the run missed, the share an infinite cache would have hit: the
    engine's part of the miss (the rest, 1 - ideal, is the workload's)."""
    if measured is None or ideal is None or measured >= 1.0 or not math.isfinite(measured):
        return None
    return max(0.0, ideal - measured) / (1.0 - measured)
