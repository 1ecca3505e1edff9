"""Tasks that are session trees: completion times and the exposed context after joins.

Only runs whose tables carry the tree columns (docs/results-format.md#session-trees) have them;
summary.json `trees_by_arm` is absent otherwise.

* task completion: a tree's root arrival to the end of the last of its sessions
  (sessions.parquet ``tree_finish_s - arrival_s`` on root rows), percentiles over the trees that
  ended, with how many arrived (the rest were still running at the end: a percentile over the
  ended ones alone would flatter a run that left many open);
* exposed context: the token-weighted hit ratio of parents' turns right after a join
  (turns.parquet ``after_join``; ``joined_tokens > 0`` in results written before that column),
  whose context sat idle for the children's whole lifetime, beside that of every other
  successful turn after the first (successful as the run's hit ratio counts them).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.arrow_numpy import bool_values, int_values
from .runs import float_column, success_mask


def trees_by_arm(runs: list, arms: list[str]) -> Optional[list[dict]]:
    """Per arm (in ``arms`` order), pooled over its runs; None when no run has session trees."""
    if not any("tree_id" in run.sessions.column_names for run in runs):
        return None
    rows = []
    for arm in arms:
        arm_runs = [r for r in runs if r.run_json.get("arm") == arm and "tree_id" in r.sessions.column_names]
        if not arm_runs:
            continue
        completion, arrived, sizes = [], 0, []
        join_hit = join_prompt = other_hit = other_prompt = 0
        for run in arm_runs:
            s = run.sessions
            roots = s.filter(pc.equal(s["depth"], 0))
            arrived += roots.num_rows
            for arrival, finish, size in zip(roots["arrival_s"].to_pylist(), roots["tree_finish_s"].to_pylist(),
                                             roots["tree_num_sessions"].to_pylist()):
                if finish is not None and not math.isnan(finish):
                    completion.append(finish - arrival)
                    sizes.append(size)
            t = run.turns
            ok = success_mask(t) & (int_values(t.column("turn_index")) > 0)
            after = _after_join(t)
            cached = np.nan_to_num(float_column(t, "cached_tokens"))
            prompt = np.nan_to_num(float_column(t, "prompt_tokens"))
            join_hit += int(cached[ok & after].sum())
            join_prompt += int(prompt[ok & after].sum())
            other_hit += int(cached[ok & ~after].sum())
            other_prompt += int(prompt[ok & ~after].sum())
        completion.sort()
        rows.append({
            "arm": arm, "trees_arrived": arrived, "trees_ended": len(completion),
            "sessions_per_tree_mean": sum(sizes) / len(sizes) if sizes else None,
            "task_s_p50": _pct(completion, 50), "task_s_p90": _pct(completion, 90), "task_s_p99": _pct(completion, 99),
            "hit_ratio_after_join": join_hit / join_prompt if join_prompt else None,
            "hit_ratio_other_turns": other_hit / other_prompt if other_prompt else None,
        })
    return rows


def _after_join(turns: pa.Table) -> np.ndarray:
    """True for turns whose prompt follows a join."""
    if "after_join" in turns.column_names:
        return bool_values(pc.fill_null(turns.column("after_join"), False))
    return np.nan_to_num(float_column(turns, "joined_tokens")) > 0  # results written before after_join


def _pct(sorted_values: list[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (as the latency table's)."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def format_trees_table(summary: dict) -> Optional[str]:
    """summary.json `trees_by_arm` as fixed-width text; None without trees."""
    rows = summary.get("trees_by_arm")
    if not rows:
        return None

    def minutes(x):
        return "-" if x is None else f"{x / 60:.1f}"

    def ratio(x):
        return "-" if x is None else f"{x:.3f}"

    width = max(len("arm"), *(len(r["arm"]) for r in rows))
    lines = [f"Tasks (session trees) per arm: experiment {summary.get('experiment')} (all runs of the arm pooled)",
             f"{'arm':<{width}}  ended/arrived  sessions/task  task min p50   p90   p99  hit after join  other turns"]
    for r in rows:
        size = "-" if r["sessions_per_tree_mean"] is None else f"{r['sessions_per_tree_mean']:.1f}"
        lines.append(f"{r['arm']:<{width}}  {r['trees_ended']:>6}/{r['trees_arrived']:<6}  {size:>13}  "
                     f"{minutes(r['task_s_p50']):>12} {minutes(r['task_s_p90']):>5} {minutes(r['task_s_p99']):>5}  "
                     f"{ratio(r['hit_ratio_after_join']):>14}  {ratio(r['hit_ratio_other_turns']):>11}")
    lines += ["task: a tree's root arrival to the end of its last session, over the trees that ended;",
              "  hit after join: token-weighted hit ratio of parents' turns right after a join (their context",
              "  waited for the children); other turns: every other turn after a session's first."]
    return "\n".join(lines)
