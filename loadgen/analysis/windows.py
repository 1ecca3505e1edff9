"""Windows over a run: hit ratio, throughput and turn counts per window, and the degradation flag.

Window convention: a turn belongs to the window in which it *finishes*; windows are half-open
``[start, start + width)`` except that the last window of a series also takes turns finishing
exactly at its end (a turn finishing at the run's end belongs to the run). Only successful turns
(``error`` null) count. Definitions: docs/experiments.md#measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from .runs import float_column, successful_turns

LAST_HIT_WINDOW_S = 600.0
LAST_SESSIONS_WINDOW_S = 300.0
DEGRADED_HIT_RATIO = 0.5
DEGRADED_WINDOW_S = 300.0

# Tolerance for "a window ends by the run's end" so float rounding never drops a full window.
EPS_S = 1e-9


@dataclass
class WindowSeries:
    """Per-window statistics of successful turns; index i is the window at window_starts_s[i]."""

    window_starts_s: np.ndarray
    window_widths_s: np.ndarray  # width_s except possibly a shorter last window
    hit_ratio: np.ndarray  # sum cached / sum prompt, NaN when no turns (or no prompt tokens)
    turns_per_s: np.ndarray
    recomputed_prompt_tokens_per_s: np.ndarray  # sum (prompt - cached) / width
    num_turns: np.ndarray  # int64

def count_windows(start_s: float, end_s: float, width_s: float) -> int:
    if end_s <= start_s:
        return 0
    return int(math.ceil((end_s - start_s) / width_s - EPS_S))

def window_series(turns: pa.Table, start_s: float, end_s: float, width_s: float) -> WindowSeries:
    """Token-weighted hit ratio, turns/s, recomputed prompt tokens/s and turn counts per window.

    Windows tile [start_s, end_s) with width width_s; the last one is shorter when the span is
    not a multiple of width_s, and its rates use its own width.
    """
    if width_s <= 0:
        raise ValueError(f"width_s must be positive, got {width_s}")
    num_windows = count_windows(start_s, end_s, width_s)
    window_starts_s = start_s + width_s * np.arange(num_windows, dtype=np.float64)
    window_widths_s = np.minimum(width_s, end_s - window_starts_s)

    ok = successful_turns(turns)
    in_span = (ok.finish_s >= start_s) & (ok.finish_s <= end_s) & (num_windows > 0)
    index = np.floor((ok.finish_s[in_span] - start_s) / width_s).astype(np.int64)
    # A turn finishing exactly at end_s belongs to the last window, not to one past it.
    index = np.minimum(index, max(num_windows - 1, 0))

    num_turns = np.bincount(index, minlength=num_windows).astype(np.int64)
    prompt_sum = np.bincount(index, weights=ok.prompt_tokens[in_span], minlength=num_windows)
    cached_sum = np.bincount(index, weights=ok.cached_tokens[in_span], minlength=num_windows)

    with np.errstate(divide="ignore", invalid="ignore"):
        hit_ratio = np.where(prompt_sum > 0, cached_sum / prompt_sum, np.nan)
    return WindowSeries(
        window_starts_s=window_starts_s,
        window_widths_s=window_widths_s,
        hit_ratio=hit_ratio.astype(np.float64),
        turns_per_s=num_turns / window_widths_s if num_windows else np.zeros(0),
        recomputed_prompt_tokens_per_s=(
            (prompt_sum - cached_sum) / window_widths_s if num_windows else np.zeros(0)
        ),
        num_turns=num_turns,
    )

def hit_ratio_between(turns: pa.Table, start_s: float, end_s: float) -> float:
    """Token-weighted hit ratio of successful turns finishing in [start_s, end_s]; NaN if none."""
    ok = successful_turns(turns)
    in_span = (ok.finish_s >= start_s) & (ok.finish_s <= end_s)
    prompt_tokens = float(ok.prompt_tokens[in_span].sum())
    if prompt_tokens <= 0:
        return math.nan
    return float(ok.cached_tokens[in_span].sum()) / prompt_tokens

def num_turns_between(turns: pa.Table, start_s: float, end_s: float) -> int:
    ok = successful_turns(turns)
    return int(np.count_nonzero((ok.finish_s >= start_s) & (ok.finish_s <= end_s)))

def window_hit_ratios(turns: pa.Table, starts_s: np.ndarray, width_s: float, run_end_s: float) -> np.ndarray:
    """Hit ratio of successful turns finishing in each [start, start + width_s), NaN when none.

    Windows may overlap; one ending at the run's end also takes turns finishing exactly then.
    """
    ok = successful_turns(turns)
    order = np.argsort(ok.finish_s, kind="stable")
    finish_s = ok.finish_s[order]
    prompt_cum = np.concatenate([[0.0], np.cumsum(ok.prompt_tokens[order])])
    cached_cum = np.concatenate([[0.0], np.cumsum(ok.cached_tokens[order])])
    ends_s = starts_s + width_s
    lo = np.searchsorted(finish_s, starts_s, side="left")
    hi = np.where(ends_s >= run_end_s - EPS_S, np.searchsorted(finish_s, ends_s, side="right"),
                  np.searchsorted(finish_s, ends_s, side="left"))
    prompt_tokens = prompt_cum[hi] - prompt_cum[lo]
    cached_tokens = cached_cum[hi] - cached_cum[lo]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(prompt_tokens > 0, cached_tokens / prompt_tokens, np.nan)

def window_states(
    turns: pa.Table,
    reference_trigger_end_s: Optional[float],
    duration_s: float,
    threshold: float = DEGRADED_HIT_RATIO,
    window_s: float = DEGRADED_WINDOW_S,
    busy_s: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Each full window after the trigger: 1.0 degraded, 0.0 healthy, NaN idle (possibly no window).

    Windows are [te + window_s*k, te + window_s*(k+1)) for those ending by duration_s, with te
    = reference_trigger_end_s (0 when the experiment has no trigger). A window is degraded when
    its hit ratio is below threshold. One with no finished turn is idle, neither healthy nor
    degraded (a replica the router stopped using, a light load's quiet stretch), unless requests
    were pending in it (``busy_s``: the sample times at which some were): then it is stalled, and
    degraded.
    """
    trigger_end_s = 0.0 if reference_trigger_end_s is None else float(reference_trigger_end_s)
    if duration_s <= trigger_end_s:
        return np.zeros(0)
    num_full_windows = int(math.floor((duration_s - trigger_end_s) / window_s + EPS_S))
    if num_full_windows == 0:
        return np.zeros(0)
    series = window_series(
        turns, trigger_end_s, trigger_end_s + num_full_windows * window_s, window_s
    )
    states = np.where(np.isnan(series.hit_ratio), np.nan, (series.hit_ratio < threshold).astype(np.float64))
    if busy_s is not None:
        k = np.floor((np.asarray(busy_s, dtype=np.float64) - trigger_end_s) / window_s).astype(np.int64)
        busy = np.zeros(num_full_windows, dtype=bool)
        busy[k[(k >= 0) & (k < num_full_windows)]] = True
        states[np.isnan(states) & busy] = 1.0
    return states


def degraded_windows(
    turns: pa.Table,
    reference_trigger_end_s: Optional[float],
    duration_s: float,
    threshold: float = DEGRADED_HIT_RATIO,
    window_s: float = DEGRADED_WINDOW_S,
    busy_s: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Whether each judged window after the trigger is degraded (bool array, in time order,
    possibly empty): ``window_states`` without its idle windows."""
    states = window_states(turns, reference_trigger_end_s, duration_s, threshold, window_s, busy_s)
    return states[~np.isnan(states)].astype(bool)


def persistently_degraded(
    turns: pa.Table,
    reference_trigger_end_s: Optional[float],
    duration_s: float,
    threshold: float = DEGRADED_HIT_RATIO,
    window_s: float = DEGRADED_WINDOW_S,
    busy_s: Optional[np.ndarray] = None,
) -> bool:
    """Whether the run ends degraded for good: its last judged window after the trigger is
    degraded (and so is the stretch of judged windows back to the last healthy one; a recovery
    before that stretch does not clear it). Idle windows are not judged. No judged window: False.
    A run degraded only in its final window counts (``degraded_only_in_final_window`` tells those
    apart)."""
    return degraded_to_the_end(degraded_windows(turns, reference_trigger_end_s, duration_s, threshold, window_s, busy_s))


def degraded_stretch_start_s(
    turns: pa.Table,
    reference_trigger_end_s: Optional[float],
    duration_s: float,
    busy_s: Optional[np.ndarray] = None,
) -> Optional[float]:
    """When the degraded stretch a persistently degraded run ends in began: the start of its first
    window (idle windows inside it are not judged and do not break it); None when the run does not
    end degraded."""
    states = window_states(turns, reference_trigger_end_s, duration_s, busy_s=busy_s)
    judged = np.flatnonzero(~np.isnan(states))
    if not len(judged) or states[judged[-1]] != 1.0:
        return None
    healthy = judged[states[judged] == 0.0]
    first = judged[0] if not len(healthy) else judged[judged > healthy[-1]][0]
    return (0.0 if reference_trigger_end_s is None else float(reference_trigger_end_s)) + first * DEGRADED_WINDOW_S


def degraded_to_the_end(degraded: np.ndarray) -> bool:
    """Of ``degraded_windows``: the last judged window is degraded (``persistently_degraded``)."""
    return bool(len(degraded) and degraded[-1])


def degraded_only_in_final_window(degraded: np.ndarray) -> bool:
    """Of ``degraded_windows``: the degraded stretch the run ends in is its final window alone (the
    judged window before it is healthy): a late dip, not a collapse. Needs two windows at least: a
    run with a single window after the trigger shows no healthy stretch before."""
    return bool(len(degraded) >= 2 and degraded[-1] and not degraded[-2])


def busy_sample_times(samples: Optional[pa.Table], plus: tuple[str, ...],
                      minus: tuple[str, ...] = ()) -> Optional[np.ndarray]:
    """The sample times at which requests were pending: the ``plus`` columns less the ``minus``
    ones above 0; None when the samples lack a column (an older run: idle and stalled windows
    cannot be told apart, and both go unjudged)."""
    if samples is None or samples.num_rows == 0 or any(n not in samples.column_names for n in plus + minus):
        return None
    total = sum(np.nan_to_num(float_column(samples, n)) for n in plus) - sum(
        np.nan_to_num(float_column(samples, n)) for n in minus)
    return float_column(samples, "t_s")[total > 0]


def run_busy_times(samples: Optional[pa.Table]) -> Optional[np.ndarray]:
    """A run's busy sample times (samples.parquet): some session in the system was not thinking
    (waiting at the gateway, parked or in the engine)."""
    return busy_sample_times(samples, ("sessions_in_system",), ("sessions_thinking",))


def ends_degraded(hit_ratio_last10min: float, threshold: float = DEGRADED_HIT_RATIO) -> bool:
    """The run's last 10 minutes are degraded: hit ratio below threshold, or no finished turn."""
    return not hit_ratio_last10min >= threshold
