"""``loadgen compare REAL_DIR SIM_DIR``: the same spec and seeds on a real engine and in the
simulator (a preset or a calibrated cost model: each side's figure title says which), side by side.

Runs are matched by run id (arm x seed). Per matched run: per-window hit ratio, turn throughput
and mean sessions in the system for both; agreement figures: whether the end state (persistently
degraded or not) is the same, the mean absolute per-window hit-ratio difference, and the mean
absolute difference in throughput and sessions. Writes ``compare.json`` and one PNG per run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import numpy as np

from ..core.arrow_numpy import float_values
from .outcomes import run_outcome
from .probability import format_probabilities, load_probabilities, score_probabilities
from .runs import load_run
from .tables import lag_warning
from .windows import window_series
from ..core.recording import write_json_atomic
from ..core.same_spec import compared_fields, describe_differences, spec_differences


def _sessions_per_window(samples, starts: np.ndarray, width_s: float) -> np.ndarray:
    t = float_values(samples.column("t_s"))
    n = float_values(samples.column("sessions_in_system"))
    out = np.full(len(starts), math.nan)
    for i, start in enumerate(starts):
        mask = (t >= start) & (t < start + width_s)
        if mask.any():
            out[i] = n[mask].mean()
    return out


def _mean_abs_diff(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    mask = np.isfinite(a) & np.isfinite(b)
    return float(np.abs(a[mask] - b[mask]).mean()) if mask.any() else None


def _completed_runs(results_dir: Path, side: str, left_out: list[dict]) -> dict[str, tuple[Path, dict]]:
    """Run id -> (directory, run.json) of the runs that completed. A run that ended engine_lost or
    failed stopped early, or ran on an engine that was not serving: its windows would compare a
    broken engine with the simulator. Those and runs not ended are appended to ``left_out``."""
    runs = {}
    for path in sorted((Path(results_dir) / "runs").glob("*")):
        try:
            info = json.loads((path / "run.json").read_text())
        except (OSError, ValueError):
            continue
        status = info.get("status") if isinstance(info, dict) else None
        if status == "completed":
            runs[path.name] = (path, info)
        else:
            left_out.append({"side": side, "run_id": path.name, "status": status})
    return runs


def _check_same_workload(real_dir: Path, sim_dir: Path, run_id: str, real: dict, sim: dict) -> None:
    """ValueError unless both runs ran the same workload, triggers, controller and seed."""
    a, b = real.get("spec"), sim.get("spec")
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return  # results from before run.json recorded the spec: nothing to check
    arm = str(real.get("arm", run_id))
    fa, fb = compared_fields(a, arm), compared_fields(b, arm)
    paths = spec_differences(fa, fb, exempt=())
    if paths:
        raise ValueError(f"{run_id}: {real_dir} and {sim_dir} did not run the same experiment: "
                         f"{describe_differences(fa, fb, paths)} (real vs sim). compare needs the same workload, "
                         "triggers, controller and seeds on both sides; only the engine may differ")


def default_out_dir(real_dir: Path, sim_dir: Path) -> Path:
    """Where a comparison goes without --out: under the real directory, named by the simulated
    one, so comparing one real directory with two simulations keeps both."""
    return Path(real_dir) / f"compare-vs-{Path(sim_dir).resolve().name}"


def check_out_dir(out_dir: Path, real_dir: Path, sim_dir: Path) -> None:
    """ValueError when ``out_dir`` holds the comparison of another pair of directories: a new
    comparison never overwrites it silently."""
    path = Path(out_dir) / "compare.json"
    if not path.is_file():
        return
    try:
        previous = json.loads(path.read_text())
        pair = (Path(previous["real_dir"]).resolve(), Path(previous["sim_dir"]).resolve())
    except (OSError, ValueError, KeyError, TypeError):
        pair = None
    if pair != (Path(real_dir).resolve(), Path(sim_dir).resolve()):
        what = f"the comparison of {pair[0]} with {pair[1]}" if pair else "a compare.json it cannot read"
        raise ValueError(f"{path} holds {what}; give --out DIR for this one (or remove it)")


def describe_engine(info: dict) -> str:
    """What ran a side's runs, from run.json's spec: a simulator says which cost model it used,
    a preset or a calibrated one (a cost.json), so a figure never calls a preset calibrated."""
    from ..sim.cost import PRESETS

    engine = (info.get("spec") or {}).get("engine") or {}
    kind = engine.get("kind") or info.get("engine")
    if kind != "sim":
        return f"engine {kind or 'unknown'}"
    model = engine.get("cost_model", "qwen3-8b-mi300x")
    if isinstance(model, dict):
        preset = PRESETS.get(str(model.get("name")))
        if preset is not None and preset.to_json() == model:
            return f"simulator, preset {model['name']}"
        return f"simulator, calibrated cost model {model.get('name', 'custom')!r}"
    if model in PRESETS:
        return f"simulator, preset {model}"
    return f"simulator, calibrated cost model {Path(str(model)).name}"


def compare_runs(real_dir: Path, sim_dir: Path, width_s: float = 300.0) -> dict:
    left_out: list[dict] = []
    real_runs = _completed_runs(real_dir, "real", left_out)
    sim_runs = _completed_runs(sim_dir, "sim", left_out)
    common = sorted(set(real_runs) & set(sim_runs))
    if not common:
        raise ValueError(f"no completed run ids in common between {real_dir} ({sorted(real_runs)}) and "
                         f"{sim_dir} ({sorted(sim_runs)})" + (f"; left out: {_left_out_text(left_out)}"
                                                              if left_out else ""))
    for run_id in common:
        _check_same_workload(real_dir, sim_dir, run_id, real_runs[run_id][1], sim_runs[run_id][1])
    runs = []
    for run_id in common:
        real, sim = load_run(real_runs[run_id][0]), load_run(sim_runs[run_id][0])
        duration = min(real.run_json["duration_s"], sim.run_json["duration_s"])
        rw = window_series(real.turns, 0.0, duration, width_s)
        sw = window_series(sim.turns, 0.0, duration, width_s)
        r_sess = _sessions_per_window(real.samples, rw.window_starts_s, width_s)
        s_sess = _sessions_per_window(sim.samples, sw.window_starts_s, width_s)
        r_out, s_out = run_outcome(real), run_outcome(sim)
        runs.append({
            "run_id": run_id,
            "real_engine": describe_engine(real_runs[run_id][1]), "sim_engine": describe_engine(sim_runs[run_id][1]),
            "window_starts_s": rw.window_starts_s.tolist(),
            "real": {"hit_ratio": _nan_list(rw.hit_ratio), "turns_per_s": _nan_list(rw.turns_per_s),
                     "sessions_in_system": _nan_list(r_sess), "persistently_degraded": r_out["persistently_degraded"],
                     "hit_ratio_last10min": r_out["hit_ratio_last10min"]},
            "sim": {"hit_ratio": _nan_list(sw.hit_ratio), "turns_per_s": _nan_list(sw.turns_per_s),
                    "sessions_in_system": _nan_list(s_sess), "persistently_degraded": s_out["persistently_degraded"],
                    "hit_ratio_last10min": s_out["hit_ratio_last10min"]},
            "end_state_agrees": r_out["persistently_degraded"] == s_out["persistently_degraded"],
            "hit_ratio_mean_abs_diff": _mean_abs_diff(rw.hit_ratio, sw.hit_ratio),
            "turns_per_s_mean_abs_diff": _mean_abs_diff(rw.turns_per_s, sw.turns_per_s),
            "sessions_mean_abs_diff": _mean_abs_diff(r_sess, s_sess),
        })
    diffs = [r["hit_ratio_mean_abs_diff"] for r in runs if r["hit_ratio_mean_abs_diff"] is not None]
    replicates = load_probabilities(sim_dir)
    probabilities = (score_probabilities(replicates, {r["run_id"]: r["real"]["persistently_degraded"] for r in runs})
                     if replicates is not None else None)
    return {"probabilities": probabilities,"real_dir": str(real_dir), "sim_dir": str(sim_dir), "window_s": width_s, "runs": runs,
            "only_real": sorted(set(real_runs) - set(sim_runs)), "only_sim": sorted(set(sim_runs) - set(real_runs)),
            "left_out": left_out,
            # live runs whose driver or serve-sim fell behind the time scale (run.json "lagging"):
            # where they disagree with the simulator, the lag may be why
            "lagging": [{"side": side, "run_id": run_id} for run_id in common
                        for side, runs_of_side in (("real", real_runs), ("sim", sim_runs))
                        if runs_of_side[run_id][1].get("lagging")],
            "end_state_agreement": sum(r["end_state_agrees"] for r in runs) / len(runs),
            "hit_ratio_mean_abs_diff": float(np.mean(diffs)) if diffs else None}


def _left_out_text(left_out: list[dict]) -> str:
    return ", ".join(f"{e['side']} {e['run_id']} ({e['status']})" for e in left_out)


def _nan_list(values: np.ndarray) -> list:
    return [None if not math.isfinite(v) else float(v) for v in values]


def format_comparison(result: dict) -> str:
    lines = [f"{'run':24s} {'end state real/sim':>20s} {'hit10m real/sim':>17s} {'|d hit|':>8s} "
             f"{'|d turns/s|':>11s} {'|d sessions|':>12s}"]
    for r in result["runs"]:
        state = lambda d: "degraded" if d["persistently_degraded"] else "healthy"
        hit = lambda d: "n/a" if d["hit_ratio_last10min"] is None else f"{d['hit_ratio_last10min']:.2f}"
        num = lambda v, f: "n/a" if v is None else format(v, f)
        lines.append(f"{r['run_id']:24s} {state(r['real']) + '/' + state(r['sim']):>20s} "
                     f"{hit(r['real']) + '/' + hit(r['sim']):>17s} {num(r['hit_ratio_mean_abs_diff'], '.3f'):>8s} "
                     f"{num(r['turns_per_s_mean_abs_diff'], '.3f'):>11s} {num(r['sessions_mean_abs_diff'], '.1f'):>12s}")
    lines.append(f"end-state agreement {100 * result['end_state_agreement']:.0f}% over {len(result['runs'])} runs; "
                 f"mean absolute hit-ratio difference per {result['window_s'] / 60:g}-min window "
                 f"{'n/a' if result['hit_ratio_mean_abs_diff'] is None else format(result['hit_ratio_mean_abs_diff'], '.3f')}")
    unmatched = [f"only in {result[side + '_dir']}: {', '.join(result['only_' + side])}"
                 for side in ("real", "sim") if result.get("only_" + side)]
    if unmatched:
        lines.append("unmatched runs (a seed or arm one side lacks; not compared): " + "; ".join(unmatched))
    if result.get("left_out"):
        lines.append(f"left out (only completed runs are compared): {_left_out_text(result['left_out'])}")
    if result.get("probabilities"):
        lines.append(format_probabilities(result["probabilities"]))
    warning = lag_warning([f"{e['side']} {e['run_id']}" for e in result.get("lagging") or []])
    if warning:
        lines.append(warning)
    return "\n".join(lines)


def comparison_figure(result: dict, r: dict):
    """One matched run: hit ratio, turns/s and sessions per window, real beside sim; the title
    says what ran each side."""
    from matplotlib.figure import Figure

    minutes = (np.array(r["window_starts_s"]) + result["window_s"] / 2) / 60
    fig = Figure(figsize=(9, 8))
    axes = fig.subplots(3, 1, sharex=True)
    for ax, key, label in zip(axes, ("hit_ratio", "turns_per_s", "sessions_in_system"),
                              ("hit ratio", "turns / s", "sessions in system")):
        for side, style in (("real", "-o"), ("sim", "--s")):
            values = np.array([math.nan if v is None else v for v in r[side][key]])
            ax.plot(minutes, values, style, label=f"{side}", markersize=3)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(0, 1.05)
    axes[0].legend()
    axes[0].set_title(f"{r['run_id']}: real ({r.get('real_engine', 'engine')}) vs sim "
                      f"({r.get('sim_engine', 'simulator')}); end state "
                      f"{'agrees' if r['end_state_agrees'] else 'differs'}", fontsize=9)
    axes[-1].set_xlabel("run time (minutes)")
    fig.tight_layout()
    return fig


def write_comparison(result: dict, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "compare.json", result)
    paths = []
    for r in result["runs"]:
        path = out_dir / f"compare-{r['run_id']}.png"
        comparison_figure(result, r).savefig(path, dpi=100)
        paths.append(path)
    return paths
