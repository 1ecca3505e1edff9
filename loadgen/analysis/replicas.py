"""Per-replica outcomes of a run on a deployment (summary.json ``replicas``), and imbalance over time.

A run on a deployment (run.json ``replicas`` > 1) records the ``replica`` of each turn and the
attribution of its missed tokens (docs/deployments.md#records). Its summary entry gets:
- per replica: turns, sessions (a session counts at the replica of its first turn), prompt and
  cached tokens, hit ratio, the missed tokens by cause (workload, routing, eviction), and
  ``persistently_degraded`` over that replica's turns (docs/experiments.md#measurements; None
  for a replica that served no turn);
- ``deployment``: the same counts summed over the replicas (they equal the run's totals);
- imbalance over time from replica_samples.parquet: at each sample, the hottest replica's
  requests (running + waiting) over the replicas' mean (1: even; N: all on one replica), and
  the spread of KV usage (hottest minus coolest); their mean and maximum over the run, and the
  replica most often the hottest with its share of the samples.
"""

from __future__ import annotations

import math

from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.arrow_numpy import array
from .runs import RunData, float_column, json_float, read_parquet, success_mask
from .windows import busy_sample_times, persistently_degraded

COUNTS = ("turns", "sessions", "prompt_tokens", "cached_tokens", "miss_workload_tokens", "miss_routing_tokens",
          "miss_eviction_tokens")


def replica_outcome(run: RunData) -> dict:
    """``{"replicas": {...}}`` for a run on a deployment; {} for one engine (whose entry is as before)."""
    num_replicas = run.run_json.get("replicas")
    if not isinstance(num_replicas, int) or num_replicas < 2 or "replica" not in run.turns.column_names:
        return {}
    turns = run.turns
    samples = read_replica_samples(run.run_dir) if run.run_dir is not None else None
    ok = success_mask(turns)
    replica = float_column(turns, "replica")
    prompt = np.nan_to_num(float_column(turns, "prompt_tokens"))
    cached = np.nan_to_num(float_column(turns, "cached_tokens"))
    routing = np.nan_to_num(float_column(turns, "miss_routing_tokens"))
    eviction = np.nan_to_num(float_column(turns, "miss_eviction_tokens"))
    home = _home_replicas(turns)
    info = run.run_json
    # live runs (a router's replica header) cannot attribute misses: their columns are null, and
    # a zero would read as "no routing or eviction misses"
    attributed = turns.column("miss_routing_tokens").null_count < turns.num_rows
    per_replica = []
    for i in range(num_replicas):
        on = ok & (replica == i)
        row = {"replica": i, "turns": int(on.sum()), "sessions": int((home == i).sum()),
               "prompt_tokens": int(prompt[on].sum()), "cached_tokens": int(cached[on].sum()),
               "miss_routing_tokens": int(routing[on].sum()), "miss_eviction_tokens": int(eviction[on].sum())}
        row["miss_workload_tokens"] = row["prompt_tokens"] - row["cached_tokens"] - row["miss_routing_tokens"] \
            - row["miss_eviction_tokens"]
        if not attributed:
            for name in ("miss_routing_tokens", "miss_eviction_tokens", "miss_workload_tokens"):
                row[name] = None
        row["hit_ratio"] = json_float(row["cached_tokens"] / row["prompt_tokens"]) if row["prompt_tokens"] else None
        # a replica the router never used is idle, not degraded (None); one it stopped using has
        # idle windows, which are not judged (stalled ones, with requests pending, are)
        row["persistently_degraded"] = persistently_degraded(
            turns.filter(array(replica == i, pa.bool_())), info.get("reference_trigger_end_s"),
            float(info["duration_s"]), busy_s=_busy_s(samples, i)) if row["turns"] else None
        per_replica.append(row)
    total = {name: sum(r[name] for r in per_replica) if attributed or not name.startswith("miss_") else None
             for name in COUNTS}
    total["hit_ratio"] = json_float(total["cached_tokens"] / total["prompt_tokens"]) if total["prompt_tokens"] else None
    return {"replicas": {"router": info.get("router"), "num_replicas": num_replicas, "per_replica": per_replica,
                         "deployment": total, **imbalance_outcome(samples, num_replicas)}}


def _busy_s(samples: Optional[pa.Table], index: int) -> Optional[np.ndarray]:
    """The sample times at which replica ``index`` had requests running or waiting."""
    if samples is None:
        return None
    mine = samples.filter(pc.equal(samples.column("replica_index"), index))
    return busy_sample_times(mine, ("num_running", "num_waiting"))


def _home_replicas(turns: pa.Table) -> np.ndarray:
    """The replica of each session's first turn (one entry per session)."""
    if turns.num_rows == 0:
        return np.array([])
    first = turns.group_by("session_id").aggregate([("turn_index", "min")])
    keyed = turns.join(first, keys=["session_id", "turn_index"], right_keys=["session_id", "turn_index_min"],
                       join_type="inner")
    keyed = keyed.group_by("session_id").aggregate([("replica", "min")])
    return float_column(keyed, "replica_min")


def imbalance_over_time(replica_samples: pa.Table, num_replicas: int) -> dict[str, np.ndarray]:
    """Per sample time: ``load_imbalance`` (max / mean of running + waiting; NaN when all idle),
    ``kv_usage_spread`` (max - min) and ``hottest`` (the replica with the most requests)."""
    t = float_column(replica_samples, "t_s")
    times = np.unique(t)
    load = np.zeros((len(times), num_replicas))
    kv = np.full((len(times), num_replicas), np.nan)
    where = np.searchsorted(times, t)
    index = float_column(replica_samples, "replica_index").astype(int)
    load[where, index] = (float_column(replica_samples, "num_running")
                          + float_column(replica_samples, "num_waiting"))
    kv[where, index] = float_column(replica_samples, "kv_usage")
    mean = load.mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        imbalance = np.where(mean > 0, load.max(axis=1) / mean, np.nan)
    return {"t_s": times, "load_imbalance": imbalance, "kv_usage_spread": kv.max(axis=1) - kv.min(axis=1),
            "hottest": np.where(mean > 0, load.argmax(axis=1), -1)}


def read_replica_samples(run_dir: Path) -> Optional[pa.Table]:
    path = Path(run_dir) / "replica_samples.parquet"
    return read_parquet(path) if path.is_file() else None


def imbalance_outcome(table: Optional[pa.Table], num_replicas: int) -> dict:
    if table is None or table.num_rows == 0:
        return {"load_imbalance_mean": None, "load_imbalance_max": None, "kv_usage_spread_mean": None,
                "hottest_replica": None, "hottest_replica_share": None}
    series = imbalance_over_time(table, num_replicas)
    busy = np.isfinite(series["load_imbalance"])
    hottest = series["hottest"][busy]
    counts = np.bincount(hottest, minlength=num_replicas) if len(hottest) else np.zeros(num_replicas)
    top = int(np.argmax(counts)) if len(hottest) else None
    return {
        "load_imbalance_mean": json_float(np.mean(series["load_imbalance"][busy])) if busy.any() else None,
        "load_imbalance_max": json_float(np.max(series["load_imbalance"][busy])) if busy.any() else None,
        "kv_usage_spread_mean": json_float(np.nanmean(series["kv_usage_spread"])),
        "hottest_replica": top,
        "hottest_replica_share": json_float(counts[top] / len(hottest)) if top is not None else None,
    }


def replica_lines(summary: dict, arms) -> list[str]:
    """The report's lines for runs on a deployment (means over each arm's runs); [] for none."""
    by_arm: dict[str, list[dict]] = {}
    for run in summary.get("runs") or []:
        if run.get("replicas"):
            by_arm.setdefault(run["arm"], []).append(run["replicas"])
    if not by_arm:
        return []
    lines = ["deployment, per arm (mean of runs): router; replicas persistently degraded; of the missed tokens, "
             "routing / eviction; load imbalance (hottest / mean requests); hottest replica's share of samples"]
    for arm in arms:
        reps = by_arm.get(arm)
        if not reps:
            continue
        missed = [max(r["deployment"]["prompt_tokens"] - r["deployment"]["cached_tokens"], 1) for r in reps]

        def share(name: str) -> str:  # n/a: live runs, whose misses are not attributed
            value = _mean([r["deployment"][name] / m if r["deployment"][name] is not None else None
                           for r, m in zip(reps, missed)])
            return "n/a" if math.isnan(value) else f"{value:.2f}"

        lines.append(
            f"  {arm}: {reps[0]['router']}; {_mean([sum(bool(p['persistently_degraded']) for p in r['per_replica']) for r in reps]):.1f}"
            f"/{reps[0]['num_replicas']} degraded; routing {share('miss_routing_tokens')}"
            f" / eviction {share('miss_eviction_tokens')}; "
            f"imbalance {_mean([r['load_imbalance_mean'] for r in reps]):.2f}; "
            f"hottest {_mean([r['hottest_replica_share'] for r in reps]):.2f}")
    return lines


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")
