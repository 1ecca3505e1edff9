"""What a serving engineer reads for an open-loop run (a replayed trace, docs/replay.md), named as
``vllm bench serve`` names it: request count, mean / median / p90 / p99 of TTFT, TPOT, ITL and E2E
latency (ms), request and token throughput.

Per successful request (turns.parquet; a retried request counts from its first attempt):

- TTFT: first_token_s - ready_s (ready: when the request was due; the send, unless a gateway held it);
- TPOT: (finish_s - first_token_s) / (output_tokens - 1), requests of two or more output tokens;
- ITL: every gap between consecutive tokens of every request, pooled: run.json
  ``counts.inter_token_gaps`` (loadgen/core/gap_histogram.py: the engines' gaps in simulation, the
  streamed ones live), an exact mean and percentiles within 0.5%; without it (a run that streamed
  no per-token chunks) the mean alone, from each request's mean gap;
- E2E: finish_s - ready_s.

Throughput is over the benchmark's duration, from the first request's send to the last answer
(vllm bench serve's ``duration``). Percentiles are nearest-rank, as in loadgen/analysis/latency.py.
Send lateness: each request's send minus when it was due (``send_lateness_s``), read back from the trace.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..core.gap_histogram import GapHistogram
from .attempts import turn_of_row
from .latency import nearest_rank
from .runs import RunData, float_column, json_float, success_mask


def is_replay(run_json: dict) -> bool:
    spec = run_json.get("spec")
    workload = spec.get("workload") if isinstance(spec, dict) else None
    return isinstance(workload, dict) and workload.get("replay") is not None


def _stats(name: str, values_s: np.ndarray) -> dict:
    ms = values_s[np.isfinite(values_s)] * 1e3
    out = {f"mean_{name}_ms": json_float(float(ms.mean())) if len(ms) else None}
    for key, q in (("median", 0.5), ("p90", 0.9), ("p99", 0.99)):
        out[f"{key}_{name}_ms"] = json_float(nearest_rank(ms, q)) if len(ms) else None
    return out


def _request_rows(run: RunData) -> dict:
    """Per request (the last attempt of each turn), its times and lengths."""
    turns = run.turns
    if turns.num_rows == 0:
        return {**{k: np.zeros(0) for k in _COLUMNS}, "num_requests": 0}
    turn = turn_of_row(turns)
    ok = success_mask(turns)
    ready = float_column(turns, "ready_s")
    sent = float_column(turns, "submitted_s") if "submitted_s" in turns.column_names else ready
    # a retried request: the first attempt's send, the answering attempt's times
    first_sent = np.full(int(turn.max()) + 1, np.inf)
    np.minimum.at(first_sent, turn, sent)
    return {"ready": ready[ok], "sent": first_sent[turn][ok], "first": float_column(turns, "first_token_s")[ok],
            "finish": float_column(turns, "finish_s")[ok], "prompt": float_column(turns, "prompt_tokens")[ok],
            "output": float_column(turns, "output_tokens")[ok], "itl": float_column(turns, "itl_mean_s")[ok],
            "num_requests": int(turn.max()) + 1}


_COLUMNS = ("ready", "sent", "first", "finish", "prompt", "output", "itl")


def _gap_histogram(runs: Sequence[RunData]) -> Optional[GapHistogram]:
    """The runs' inter-token gaps together (run.json counts.inter_token_gaps), None if one lacks them."""
    total = GapHistogram()
    for run in runs:
        data = (run.run_json.get("counts") or {}).get("inter_token_gaps")
        if not isinstance(data, dict):
            return None
        try:
            total.merge(GapHistogram.from_json(data))
        except (KeyError, TypeError, ValueError):
            return None
    return total


def serving_metrics(runs: Sequence[RunData]) -> dict:
    """The vllm-bench-serve fields over ``runs`` pooled (their requests together; durations summed)."""
    parts = [_request_rows(run) for run in runs]
    cat = {k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0) for k in _COLUMNS}
    num_requests = sum(p["num_requests"] for p in parts)
    duration = sum(float(p["finish"].max() - p["sent"].min()) for p in parts if len(p["finish"]))
    output = cat["output"]
    gaps = np.maximum(output - 1, 0)
    tpot = np.where(output > 1, (cat["finish"] - cat["first"]) / np.maximum(gaps, 1), np.nan)
    completed = len(output)
    out = {
        "num_requests": num_requests, "completed": completed, "failed": num_requests - completed,
        "duration_s": json_float(duration) if completed else None,
        "total_input_tokens": int(cat["prompt"].sum()), "total_output_tokens": int(output.sum()),
        "request_throughput": json_float(completed / duration) if duration > 0 else None,
        "output_throughput": json_float(output.sum() / duration) if duration > 0 else None,
        "total_token_throughput": json_float((cat["prompt"].sum() + output.sum()) / duration) if duration > 0 else None,
    }
    out.update(_stats("ttft", cat["first"] - cat["ready"]))
    out.update(_stats("tpot", tpot))
    hist = _gap_histogram(runs)
    if hist is not None and hist.num_gaps:  # every gap of the runs: vllm bench serve's pooled ITL
        out["mean_itl_ms"] = json_float(hist.mean_s() * 1e3)
        for key, q in (("median", 0.5), ("p90", 0.9), ("p99", 0.99)):
            out[f"{key}_itl_ms"] = json_float(hist.quantile_s(q) * 1e3)
    else:  # results without the histogram (a stream without per-token chunks): the mean alone, from
        # each request's mean gap weighted by its gaps
        itl_ok = np.isfinite(cat["itl"]) & (gaps > 0)
        mean_itl_s = (cat["itl"][itl_ok] * gaps[itl_ok]).sum() / gaps[itl_ok].sum() if itl_ok.any() else None
        out.update({"mean_itl_ms": json_float(float(mean_itl_s) * 1e3) if mean_itl_s is not None else None,
                    "median_itl_ms": None, "p90_itl_ms": None, "p99_itl_ms": None})
    out.update(_stats("e2el", cat["finish"] - cat["ready"]))
    return out


def send_lateness_s(run: RunData) -> Optional[np.ndarray]:
    """Per request of a replayed run, how late it was sent: its send time (first attempt) minus when
    it was due (its recorded time / speed; a session's later turn, no earlier than its previous
    answer). None when the trace cannot be read again (moved or edited since the run)."""
    from ..core.spec.sessions import timed_trace

    replay = run.run_json["spec"]["workload"]["replay"]
    try:  # read once per file version for every run of the arm, as the spec read it
        sessions = timed_trace(replay["path"], replay.get("format"), replay.get("block_tokens", 512)).sessions()
    except (OSError, ValueError):
        return None
    speed = float(replay.get("speed", 1.0))
    turns = run.turns
    if turns.num_rows == 0:
        return np.zeros(0)
    sid = turns.column("session_id").to_pylist()
    k = turns.column("turn_index").to_pylist()
    sent = turns.column("submitted_s").to_pylist()
    finish = turns.column("finish_s").to_pylist()
    errors = turns.column("error").to_pylist()
    first_sent: dict = {}
    answered: dict = {}
    for s, t, x, f, e in zip(sid, k, sent, finish, errors):
        first_sent[(s, t)] = min(x, first_sent.get((s, t), x))
        if e is None:
            answered[(s, t)] = f
    late = []
    for (s, t), x in first_sent.items():
        if s >= len(sessions) or t >= len(sessions[s]):
            return None  # not this trace's requests
        due = sessions[s][t].t_s / speed
        if t:
            due = max(due, answered.get((s, t - 1), due))
        late.append(x - due)
    return np.asarray(late, dtype=float)


def serving_by_arm(runs: Sequence[RunData], arms: Sequence[str]) -> Optional[list[dict]]:
    """Per arm, the serving metrics of its replayed runs; None when no run replays a trace."""
    replays = [r for r in runs if is_replay(r.run_json)]
    if not replays:
        return None
    rows = []
    for arm in arms:
        mine = [r for r in replays if r.run_json.get("arm") == arm]
        if mine:
            row = {"arm": arm, "num_runs": len(mine), **serving_metrics(mine)}
            late = [send_lateness_s(r) for r in mine]
            if all(x is not None for x in late):
                late_ms = np.concatenate(late) * 1e3
                row["p99_send_lateness_ms"] = json_float(nearest_rank(late_ms, 0.99)) if len(late_ms) else None
                row["max_abs_send_lateness_ms"] = json_float(float(np.abs(late_ms).max())) if len(late_ms) else None
            else:
                row["p99_send_lateness_ms"] = row["max_abs_send_lateness_ms"] = None
            rows.append(row)
    return rows


def format_serving_table(summary: dict) -> Optional[str]:
    """summary.json's ``serving_by_arm`` as text, one block of lines per arm."""
    rows = summary.get("serving_by_arm")
    if not rows:
        return None

    def ms(value: Optional[float]) -> str:
        return "-" if value is None else f"{value:,.1f}"

    lines = [f"Serving metrics: experiment {summary.get('experiment')} (vllm bench serve's names; ms)"]
    for row in rows:
        dur = row["duration_s"]
        lines.append(f"arm {row['arm']} ({row['num_runs']} run{'s' if row['num_runs'] != 1 else ''}): "
                     f"{row['completed']}/{row['num_requests']} requests completed ({row['failed']} failed) in "
                     f"{'-' if dur is None else f'{dur:.2f}'} s; request throughput "
                     f"{'-' if row['request_throughput'] is None else format(row['request_throughput'], '.2f')} req/s, "
                     f"output {'-' if row['output_throughput'] is None else format(row['output_throughput'], ',.0f')} "
                     f"tok/s, total {'-' if row['total_token_throughput'] is None else format(row['total_token_throughput'], ',.0f')} tok/s")
        lines.append(f"  {'':6}{'mean':>10}{'median':>10}{'p90':>10}{'p99':>10}")
        for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E")):
            lines.append(f"  {label:6}" + "".join(f"{ms(row[f'{k}_{name}_ms']):>10}"
                                                   for k in ("mean", "median", "p90", "p99")))
        if row.get("max_abs_send_lateness_ms") is not None:
            lines.append(f"  sent on time: send - due p99 {row['p99_send_lateness_ms']:.3f} ms, "
                         f"largest |send - due| {row['max_abs_send_lateness_ms']:.3f} ms")
        else:
            lines.append("  send lateness unknown: the trace cannot be read again (moved or edited since the run)")
    lines.append("TTFT and E2E from when each request was due (its recorded time / speed, or its session's "
                 "previous answer);\n  ITL: every token gap of every request pooled (percentiles within 0.5%).")
    return "\n".join(lines)
