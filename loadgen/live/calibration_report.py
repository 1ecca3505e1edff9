"""The end of ``loadgen calibrate``: intervals, noise and the check printed, cost.json and its
.fit.json written, and the exit code (0 fine; 1 when --check fails, a coefficient is not pinned
down (no cost.json then, unless --force), or with --strict the rows were noisy or the machine busy)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Optional

from ..core.lateness import LAG_BOUND_FRACTION
from ..sim.cost import StepCostModel
from .calibrate import NOISY_SPREAD, CalibrationPlan, CalibrationResult, host_description
from .calibration_stats import check_rows, identify, step_jitter


def noise_warnings(result: CalibrationResult, time_scale: float = 1.0) -> list[str]:
    """Rows whose repeats disagree by more than NOISY_SPREAD, and a busy machine: this process's
    timers late by more than LAG_BOUND_FRACTION of the shortest row (as ``run`` flags a lagging run)."""
    out = [f"{r.measurement.label}: repeats spread +-{100 * r.spread:.0f}% (more than {100 * NOISY_SPREAD:.0f}%)"
           for r in result.rows if r.spread > NOISY_SPREAD]
    shortest = min((r.measurement.seconds for r in result.rows if r.kind == "cold"), default=0.0)
    late = result.lateness.get("p99_s", 0.0) * time_scale
    if shortest and late > LAG_BOUND_FRACTION * shortest:
        out.append(f"this machine was busy: timers fired {late * 1e3:.1f} ms late (p99), more than "
                   f"{100 * LAG_BOUND_FRACTION:.0f}% of the shortest row ({shortest * 1e3:.1f} ms)")
    return out


def finish_calibration(result: CalibrationResult, plan: CalibrationPlan, out: Optional[Path],
                       checked: Optional[StepCostModel], tolerance: float, strict: bool = False,
                       force: bool = False, typical_context: Optional[int] = None, time_scale: float = 1.0) -> int:
    fit = result.fit
    ident = identify(result.rows, result.seed)
    jitter = step_jitter(result.rows, plan.chunk_tokens)
    model = dataclasses.replace(fit.model, step_jitter_sigma=jitter)
    print(fit.table())
    print(ident.table())
    print(f"step jitter (one-step rows, sd of log time): {jitter:.3f}; prompts of seed {result.seed}; "
          f"prefix cache {result.cache_reset}")
    warnings = noise_warnings(result, time_scale)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    unpinned = ident.unidentified()
    check = (check_rows(checked, result.rows, fit.request_overhead_s, tolerance, typical_context, plan.chunk_tokens)
             if checked is not None else None)
    code = 0
    if out:
        report = {"cost_model": model.to_json(), "seed": result.seed, "prefix_cache": result.cache_reset,
                  "pool_tokens": result.pool_tokens, "block_size": result.block_size,
                  "max_num_batched_tokens": plan.chunk_tokens, "repeats": plan.repeats,
                  "request_overhead_s": fit.request_overhead_s, "host": host_description(),
                  "identification": ident.to_json(), "step_jitter_sigma": jitter,
                  "lateness": result.lateness, "warnings": warnings, "remeasured": result.remeasures,
                  "rows": [{**row.to_json(), "model_s": fit_row["model_s"],
                            "relative_residual": fit_row["relative_residual"]}
                           for fit_row, row in zip(fit.rows, result.rows)]}
        if check is not None:
            report["check"] = check.to_json()
        fit_path = out.with_suffix(".fit.json")
        fit_path.write_text(json.dumps(report, indent=1) + "\n")
        if unpinned and not force:
            print(f"not writing {out}: the rows do not pin down {', '.join(unpinned)} (interval wider than the "
                  f"value; see {fit_path}); add rows that exercise it, more --repeats, a quieter machine, or "
                  "--force", file=sys.stderr)
            code = 1
        else:
            out.write_text(json.dumps(model.to_json(), indent=1) + "\n")
            print(f"pool {result.pool_tokens} tokens, block size {result.block_size}; wrote {out} "
                  f"(use it as engine.cost_model) and {fit_path}")
    if check is not None:
        print(check.table())
        if check.failures:
            print(f"{checked.name} does not describe this engine: " + "; ".join(check.failures)
                  + "; calibrate again and run the twin on the new cost.json", file=sys.stderr)
            code = 1
        elif check.inconclusive:
            print(f"{checked.name}: not checked, the measurements are too noisy to tell: "
                  + "; ".join(check.inconclusive), file=sys.stderr)
            code = 1
    if code and warnings and time_scale > 1:  # the one thing to change
        print(f"what to change: at --time-scale {time_scale:g} every real-time cost of this machine (timers, HTTP) "
              f"weighs {time_scale:g}x against the engine's steps; calibrate at --time-scale 1 (serve-sim too)",
              file=sys.stderr)
    elif code and warnings:
        print("what to change: the rows were noisy or the machine busy (warnings above): a quieter machine, or "
              "more --repeats", file=sys.stderr)
    if strict and warnings:
        print("--strict: the measurements above are too noisy to stand behind", file=sys.stderr)
        code = 1
    return code
