"""What a turn cost its agent in time: TTFT, inter-token latency, turn latency and gateway wait.

Per successful turn (turns.parquet, docs/results-format.md#latency):

- ``ttft_s``: first_token_s - ready_s, the wait the agent sees from wanting the turn to its
  first token, gateway wait included (the engine's own share is ttft_s - gateway_wait_s); a
  retried turn counts from its first attempt's ready_s, failed attempts and backoffs included;
- ``itl_s``: itl_mean_s, the mean gap between consecutive tokens of the turn (NaN for a
  one-token output; live: per streamed token, simulated: the engine's step times);
- ``turn_s``: finish_s - ready_s, the end-to-end turn latency;
- ``gateway_wait_s``: admit_s - ready_s.

A turn belongs to the window in which it finishes (as for the hit ratio). Percentiles are
nearest-rank (the ceil(q n)-th smallest value, no interpolation: p99 of fewer than 100 turns
is their maximum), over the turns with a finite value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from .attempts import turn_of_row
from .runs import float_column, json_float, success_mask

LATENCY_METRICS = ("ttft_s", "itl_s", "turn_s", "gateway_wait_s")
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


@dataclass
class TurnLatencies:
    """Successful turns: when each finished and what it cost; index i is one turn."""

    session_id: np.ndarray
    turn_index: np.ndarray
    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    itl_s: np.ndarray
    turn_s: np.ndarray
    gateway_wait_s: np.ndarray

    def select(self, mask: np.ndarray) -> "TurnLatencies":
        return TurnLatencies(**{name: getattr(self, name)[mask] for name in self.__dataclass_fields__})

    def between(self, start_s: float, end_s: float) -> "TurnLatencies":
        """Turns finishing in [start_s, end_s]."""
        return self.select((self.finish_s >= start_s) & (self.finish_s <= end_s))

    def __len__(self) -> int:
        return len(self.finish_s)


def _column_or_nan(turns: pa.Table, name: str) -> np.ndarray:
    if name in turns.column_names:
        return float_column(turns, name)
    return np.full(turns.num_rows, math.nan)


def _earliest_per_turn(turn: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` with each row's replaced by the smallest over its turn's rows (``turn``:
    attempts.turn_of_row): a retried turn's attempts each have a row, and results written before
    the attempt column reset ready_s and admit_s at every retry, so the first row holds the times
    the agent wanted the turn and it was admitted."""
    earliest = np.full(int(turn.max()) + 1, np.inf)
    np.fmin.at(earliest, turn, values)
    earliest[np.isinf(earliest)] = math.nan
    return earliest[turn]


def turn_latencies(turns: pa.Table) -> TurnLatencies:
    """The latencies of every successful turn of a turns.parquet table, from when the agent
    wanted the turn: a retried turn's wait spans every attempt and backoff."""
    ok = success_mask(turns)
    ready_s = float_column(turns, "ready_s") if "ready_s" in turns.column_names else np.full(turns.num_rows, math.nan)
    admit_s = _column_or_nan(turns, "admit_s")
    if not ok.all() and {"session_id", "turn_index"} <= set(turns.column_names):  # retries follow failures
        turn = turn_of_row(turns)
        ready_s, admit_s = _earliest_per_turn(turn, ready_s), _earliest_per_turn(turn, admit_s)
    ready_s, admit_s = ready_s[ok], admit_s[ok]
    finish_s = float_column(turns, "finish_s")[ok]
    return TurnLatencies(
        session_id=_column_or_nan(turns, "session_id")[ok],
        turn_index=_column_or_nan(turns, "turn_index")[ok],
        finish_s=finish_s,
        prompt_tokens=np.nan_to_num(float_column(turns, "prompt_tokens")[ok]),
        cached_tokens=np.nan_to_num(float_column(turns, "cached_tokens")[ok]),
        output_tokens=np.nan_to_num(_column_or_nan(turns, "output_tokens")[ok]),
        ttft_s=_column_or_nan(turns, "first_token_s")[ok] - ready_s,
        itl_s=_column_or_nan(turns, "itl_mean_s")[ok],
        turn_s=finish_s - ready_s,
        gateway_wait_s=admit_s - ready_s,
    )


def nearest_rank(values: np.ndarray, q: float) -> float:
    """The nearest-rank q-quantile of the finite values (NaN when there are none)."""
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan
    rank = min(len(values), max(1, math.ceil(q * len(values) - 1e-12)))
    return float(np.partition(values, rank - 1)[rank - 1])


def nearest_rank_by_group(values: np.ndarray, group: np.ndarray, num_groups: int,
                          qs: tuple[float, ...]) -> list[np.ndarray]:
    """For each q of ``qs``: ``[nearest_rank(values[group == k], q) for k in range(num_groups)]``
    as an array, from one sort."""
    finite = np.isfinite(values)
    values, group = values[finite], group[finite]
    order = np.argsort(values, kind="stable")
    ordered = values[order][np.argsort(group[order], kind="stable")]
    counts = np.bincount(group, minlength=num_groups)
    starts = np.cumsum(counts) - counts
    has = counts > 0
    quantiles = []
    for q in qs:
        ranks = np.minimum(counts, np.maximum(1, np.ceil(q * counts - 1e-12))).astype(np.int64)
        out = np.full(num_groups, math.nan)
        out[has] = ordered[starts[has] + ranks[has] - 1]
        quantiles.append(out)
    return quantiles


def latency_stats(values: np.ndarray) -> dict:
    """{"p50", "p90", "p99", "mean"} of the finite values (None when undefined)."""
    finite = values[np.isfinite(values)]
    stats = {name: json_float(nearest_rank(finite, q)) for name, q in PERCENTILES}
    stats["mean"] = json_float(float(finite.mean())) if len(finite) else None
    return stats


def latency_summary(lat: TurnLatencies) -> dict:
    """{metric: latency_stats} for every metric of LATENCY_METRICS, plus the number of turns."""
    return {"num_turns": len(lat), **{name: latency_stats(getattr(lat, name)) for name in LATENCY_METRICS}}


def latency_outcome(turns: pa.Table, duration_s: float, last_window_s: float = 600.0) -> dict:
    """The latency fields of a summary.json `runs` entry: the whole run and its last 10 minutes."""
    lat = turn_latencies(turns)
    return {
        "latency": latency_summary(lat),
        "latency_last10min": latency_summary(lat.between(max(0.0, duration_s - last_window_s), duration_s)),
    }


def stat(entry: dict, metric: str, name: str, key: str = "latency") -> Optional[float]:
    """One number out of a runs entry, e.g. stat(run, "ttft_s", "p90"); None when absent."""
    block = entry.get(key) or {}
    return (block.get(metric) or {}).get(name)


def latency_by_arm(runs: list, outcomes: list) -> list[dict]:
    """summary.json `latency_by_arm`: per arm (in the order of ``outcomes``), latency pooled over
    the turns of all its runs, and its runs' goodput and task outcomes (totals over runs)."""
    rows = []
    for arm in dict.fromkeys(o["arm"] for o in outcomes):
        arm_runs = [r for r in runs if str(r.run_json["arm"]) == arm]
        if not arm_runs:
            continue
        lats = [turn_latencies(r.turns) for r in arm_runs]
        pooled = TurnLatencies(**{name: np.concatenate([getattr(x, name) for x in lats])
                                  for name in TurnLatencies.__dataclass_fields__})
        arm_outcomes = [o for o in outcomes if o["arm"] == arm]
        duration_s = sum(float(r.run_json["duration_s"]) for r in arm_runs)

        def total(key: str) -> Optional[float]:
            values = [o.get(key) for o in arm_outcomes if o.get(key) is not None]
            return sum(values) if values else None

        turns_met, tasks_met = total("slo_turns_met"), total("slo_tasks_met")
        tasks_counted = total("slo_tasks_counted")
        met_tasks_counted = [o for o in arm_outcomes if o.get("slo_tasks_met_share") is not None]
        rows.append({
            "arm": arm, "controller": str(arm_runs[0].run_json.get("controller") or "none"),
            "num_runs": len(arm_runs), **latency_summary(pooled),
            # turns a gateway held before they went to the engine (parked, or queued as a new session)
            "turns_held": int((pooled.gateway_wait_s > 0).sum()),
            "turns_per_s": json_float(len(pooled) / duration_s) if duration_s > 0 else None,
            "tasks_arrived": total("tasks_arrived"), "tasks_finished": total("tasks_finished"),
            "slo_turns_met_share": json_float(turns_met / len(pooled)) if turns_met is not None and len(pooled) else None,
            "slo_goodput_turns_per_s": json_float(turns_met / duration_s) if turns_met is not None else None,
            "slo_tasks_met_share": json_float(
                sum(o["slo_tasks_met_share"] * o["slo_tasks_counted"] for o in met_tasks_counted) / tasks_counted)
            if met_tasks_counted and tasks_counted else None,
            "slo_goodput_tasks_per_s": json_float(tasks_met / duration_s) if tasks_met is not None else None,
            # beside the latency: the turns it does not show as such (loadgen/analysis/attempts.py)
            "turns_retried": total("turns_retried"), "turns_failed": total("turns_failed"),
            "turns_truncated": total("turns_truncated"),
            "failed_turns_by_cause": _summed_counts(o.get("failed_turns_by_cause") for o in arm_outcomes),
        })
    return rows


def _summed_counts(counts) -> dict:
    total: dict = {}
    for one in counts:
        for key, value in (one or {}).items():
            total[key] = total.get(key, 0) + value
    return dict(sorted(total.items()))


def format_turn_outcomes(rows: list[dict]) -> list[str]:
    """A line per arm that retried, failed or cut short any turn (none when all went through)."""
    lines = []
    for r in rows:
        retried, failed, truncated = (r.get(key) or 0 for key in ("turns_retried", "turns_failed", "turns_truncated"))
        if retried or failed or truncated:
            causes = ", ".join(f"{cause} {n}" for cause, n in (r.get("failed_turns_by_cause") or {}).items())
            lines.append(f"  {r['arm']}: {retried} turns retried, {failed} failed" + (f" ({causes})" if causes else "")
                         + f", {truncated} truncated (fewer output tokens than asked)")
    return (["Turns not in the latency as asked for (retried turns count every attempt's time):"] + lines
            if lines else [])


def format_latency_table(summary: dict) -> Optional[str]:
    """Latency per arm (summary.json `latency_by_arm`) as fixed-width text under 120 characters;
    None for a summary without it."""
    rows = summary.get("latency_by_arm")
    if not rows:
        return None

    def ms(value: Optional[float]) -> str:
        if value is None:
            return "-"
        return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s" if value < 100 else f"{value:.0f}s"

    def num(value: Optional[float], digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    has_slo = any(r.get("slo_goodput_turns_per_s") is not None for r in rows)
    has_held = any(r.get("turns_held") for r in rows)
    header = ["arm", "TTFT p50", "p90", "p99", "ITL p50", "p90", "turn p50", "p90", "gw p99", "gw mean"]
    header += ["held"] if has_held else []
    header += ["turns/s", "tasks done"]
    if has_slo:
        header += ["SLO turns", "SLO tasks"]
    body = []
    for r in rows:
        cells = [r["arm"], ms(r["ttft_s"]["p50"]), ms(r["ttft_s"]["p90"]), ms(r["ttft_s"]["p99"]),
                 ms(r["itl_s"]["p50"]), ms(r["itl_s"]["p90"]), ms(r["turn_s"]["p50"]), ms(r["turn_s"]["p90"]),
                 ms(r["gateway_wait_s"]["p99"]), ms(r["gateway_wait_s"]["mean"])]
        if has_held:
            cells.append(f"{r.get('turns_held', 0) / r['num_turns']:.0%}" if r["num_turns"] else "-")
        cells += [num(r["turns_per_s"], 3),
                  "-" if r["tasks_finished"] is None else f"{r['tasks_finished']}/{r['tasks_arrived']}"]
        if has_slo:
            cells += [num(r["slo_turns_met_share"], 2), num(r["slo_tasks_met_share"], 2)]
        body.append(cells)
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]

    def join(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [f"Latency per arm: experiment {summary.get('experiment')} (all turns of the arm's runs pooled)",
             join(header)]
    lines += [join(cells) for cells in body]
    lines += ["TTFT and turn latency from the moment the agent wanted the turn (gateway wait included);",
              "  gw: gateway wait; ITL: a turn's mean inter-token gap; nearest-rank percentiles over",
              "  successful turns; tasks done: sessions finished/arrived."]
    if has_held:
        lines += ["  held: the share of turns the gateway held before they went to the engine (parked, or"
                  " queued as a new session)."]
    if has_slo:
        lines.append("SLO turns/tasks: share meeting every target of the spec's slo (docs/results-format.md).")
    lines += format_turn_outcomes(rows)
    return "\n".join(lines)
