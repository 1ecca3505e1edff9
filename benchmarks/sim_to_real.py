"""Sim-to-real: every public real GPU run of a data folder replayed on the simulated vLLM engine, and
our error beside the measurement (docs/sim-to-real.md).

    python benchmarks/sim_to_real.py --data DIR [--run NAME ...] [--json OUT]

DIR is laid out as the vendored real-run data (llmservingsim/, blis/, blis-training/,
blis-sim-to-real/, llm-d/); real_runs.py maps each run (workload, engine settings, cost model) or
says why it cannot. The step costs of a run with a kernel profile come from that profile (loadgen
calibrate --from-profile's fit) plus the host time per step measured on the ``fit`` LLMServingSim
run; a run without one gets the roofline model (roofline.py) whose five constants are fitted on the
``fit`` runs' measured stages only. A request measured by an HTTP client gets its first token (and so
every token) a number of engine steps later than the simulated engine emits it: the median TTFT gap
of the ``fit`` runs in units of each run's step time. The HTTP client gives up on a request after
300 s (``replay.client_timeout_s``) and the simulated engine aborts it, as vLLM does on the
disconnect; it counts as failed, as the real client counted it. Errors are signed fractions, (simulated - measured) / measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import pyarrow.parquet as pq  # noqa: E402

from loadgen.core.runner import RunKey, run_simulated  # noqa: E402
from loadgen.core.spec import parse_spec  # noqa: E402
from loadgen.core.workload import Stream, rng_for  # noqa: E402
from loadgen.sim.cost import StepCostModel  # noqa: E402
from real_runs import (BLOCK_TOKENS, CLIENT_TIMEOUT_S, HOST_RUN, METRICS, RealRun, discover,  # noqa: E402
                       inference_perf_trace, stats_ms)
from roofline import CONSTANTS, Stage, fit_constants, saturated_features  # noqa: E402

SEED = 1


def fit_stages(runs: list[RealRun]) -> list[Stage]:
    """The measured stages of the ``fit`` runs that have a roofline (one row each for the fit)."""
    stages = []
    for run in runs:
        m = run.mapping
        if run.split != "fit" or m is None or m.roofline is None:
            continue
        sp = m.shared_prefix
        prompt, uncached = _prompt_tokens(sp)
        for (rate, _), (ttft_s, e2e_s) in zip(sp.stages, run.stage_means_s, strict=True):
            decode_s = e2e_s - ttft_s
            stages.append(Stage(m.roofline, rate, prompt, uncached, sp.output_tokens,
                                decode_s / (sp.output_tokens - 1), decode_s))
    return stages


def _prompt_tokens(sp) -> tuple[int, int]:
    """A shared-prefix prompt's tokens, and what it prefills once it recurs (its last, partial block)."""
    prompt = sp.system_prompt_tokens + sp.question_tokens
    return prompt, prompt - BLOCK_TOKENS * ((prompt - 1) // BLOCK_TOKENS)


def profile_cost(run: RealRun, host_s: float) -> StepCostModel:
    from loadgen.sim.kernel_profile import load_profile
    from loadgen.sim.profile_fit import fit_profile

    m = run.mapping
    profile = load_profile(m.profile_dir, m.tp, m.num_layers)
    model = fit_profile(profile, rng_for(Stream.CALIBRATION_BOOTSTRAP, 0), num_resamples=2).model(run.name, host_s)
    step_s, token_s = m.allreduce
    if not (step_s or token_s):
        return model
    decode = None if model.decode_s_per_token is None else model.decode_s_per_token + token_s
    return dataclasses.replace(model, t0_s=model.t0_s + step_s, a_s_per_token=model.a_s_per_token + token_s,
                               decode_s_per_token=decode)


def host_time_s(runs: list[RealRun]) -> float:
    """The host time per step read from the HOST_RUN's decode-only seconds; 0.0, said, without them."""
    from loadgen.sim.host_time import host_time_from_run
    from loadgen.sim.kernel_profile import ProfileError

    host = next((r for r in runs if r.name == HOST_RUN and r.mapping is not None), None)
    if host is None:
        return 0.0
    try:
        return host_time_from_run(profile_cost(host, 0.0), host.mapping.trace_path.parents[1] / "bench" / "examples"
                                  / HOST_RUN / "vllm")[0]
    except ProfileError as exc:
        print(f"host time per step: none ({exc}); the profiled runs step at their kernels' time", file=sys.stderr)
        return 0.0


def simulate(run: RealRun, cost: StepCostModel, work: Path) -> dict:
    """The replay of ``run`` on the simulated engine: per request (ttft_s, e2e_s, output_tokens) and the
    run's duration."""
    m = run.mapping
    if m.trace_path is not None:
        replay = {"path": str(m.trace_path), "format": "llmservingsim"}
    else:
        trace = work / f"{run.name.replace('/', '_')}.jsonl"
        trace.write_text("".join(json.dumps(r) + "\n" for r in inference_perf_trace(m.shared_prefix, SEED)))
        replay = {"path": str(trace), "format": "mooncake", "block_tokens": BLOCK_TOKENS}
    if m.over_http:  # the client gives up and vLLM aborts the request
        replay["client_timeout_s"] = CLIENT_TIMEOUT_S
    cost_path = work / "cost.json"
    cost_path.write_text(json.dumps(cost.to_json()))
    engine = {"kind": "sim", "block_size": BLOCK_TOKENS, "enable_prefix_caching": True, "max_model_len": 131072,
              "cost_model": str(cost_path), **m.engine}
    spec = parse_spec({"experiment": "sim-to-real", "seeds": [SEED], "engine": engine,
                       "workload": {"replay": replay}, "arms": [{"name": "replay"}]})
    out = work / "out"
    run_simulated(spec, RunKey("replay", SEED), out)
    t = pq.read_table(out / "runs" / f"replay-s{SEED}" / "turns.parquet",
                      columns=["ready_s", "first_token_s", "finish_s", "output_tokens", "error"]).to_pydict()
    ready, first, finish = (np.array(t[k], dtype=float) for k in ("ready_s", "first_token_s", "finish_s"))
    return {"ttft_s": first - ready, "e2e_s": finish - ready, "output": np.array(t["output_tokens"], dtype=float),
            "ready_s": ready, "finish_s": finish, "failed": np.array([e is not None for e in t["error"]])}


def predicted(sim: dict, delay_s: float) -> tuple[dict, int]:
    """The measured metrics of a simulated replay, as the run's client reports them: every token
    ``delay_s`` after the engine emits it; a failed request (its client's timeout) not a success."""
    ttft, e2e = sim["ttft_s"] + delay_s, sim["e2e_s"] + delay_s
    ok = ~sim["failed"]
    out = sim["output"][ok]

    metrics = {**stats_ms(ttft[ok], "ttft"), **stats_ms(e2e[ok], "e2e"),
               "tpot_mean": float(np.mean((e2e[ok] - ttft[ok]) / np.maximum(1, out - 1))) * 1e3,
               "request_throughput": float(ok.sum() / (sim["finish_s"][ok].max() - sim["ready_s"].min()))}
    return metrics, int((~ok).sum())


def _step_s(sim: dict) -> float:
    """The run's mean step time as its requests see it: the mean time per output token."""
    ok = ~sim["failed"]
    tokens = np.maximum(1, sim["output"][ok] - 1)
    return float(np.mean((sim["e2e_s"][ok] - sim["ttft_s"][ok]) / tokens))


def given_step_time(run: RealRun, constants: dict, delay_steps: float, work: Path) -> dict:
    """A collapsed run replayed with its roofline scaled so that the step of its saturated state
    (max_num_seqs running, a prompt let in as each finishes) takes the measured time per output
    token: whether the engine's queue, the client's timeout and the abort reproduce the collapse once
    the step time is right. A run whose pool cannot hold max_num_seqs requests at full length
    preempts, so its time per token is not one step's; it is skipped, said."""
    m, sp = run.mapping, run.mapping.shared_prefix
    prompt, uncached = _prompt_tokens(sp)
    running = m.engine["max_num_seqs"]
    holds = m.engine["pool_tokens"] // (prompt + sp.output_tokens)
    if holds < running:
        return {"run": run.name, "skipped": f"its pool holds {holds} requests at full length, fewer than "
                                            f"max_num_seqs {running}: it preempts"}
    ttft_s, e2e_s = run.stage_means_s[0]
    measured_step_s = (e2e_s - ttft_s) / (sp.output_tokens - 1)
    roofline_step_s = float(saturated_features(m.roofline, running, prompt, uncached, sp.output_tokens)
                            @ np.array([constants[k] for k in CONSTANTS]))
    scale = measured_step_s / roofline_step_s
    cost = m.roofline.cost_model(constants, run.name)
    cost = dataclasses.replace(cost, t0_s=cost.t0_s * scale, a_s_per_token=cost.a_s_per_token * scale,
                               b_s_per_token2=cost.b_s_per_token2 * scale, g_s_per_token=cost.g_s_per_token * scale)
    sim = simulate(run, cost, work)
    pred, failed = predicted(sim, delay_steps * _step_s(sim))
    return {"run": run.name, "roofline_step_ms": roofline_step_s * 1e3, "measured_step_ms": measured_step_s * 1e3,
            "scale": scale, "measured_failed": run.failed, "simulated_failed": failed,
            **{f"{k}_error": (pred[k] - run.measured[k]) / run.measured[k] for k in ("ttft_mean", "e2e_mean")}}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder laid out as the vendored real-run data")
    parser.add_argument("--run", action="append", default=[], help="only this run (by name; repeatable)")
    parser.add_argument("--json", help="write the per-run errors here")
    args = parser.parse_args(argv)
    data = Path(args.data)
    if not data.is_dir():
        print(f"--data {data}: not a folder", file=sys.stderr)
        return 2
    runs = discover(data)
    by_name: dict[str, RealRun] = {}
    for r in runs:  # a run two sources list (one marked as the other's twin) is the mapped one
        if r.mapping is not None or r.name not in by_name:
            by_name[r.name] = r
    for name in args.run:
        if name not in by_name:
            print(f"--run {name!r}: no such run in {data} (runs: {', '.join(sorted(by_name))})", file=sys.stderr)
            return 2
        if by_name[name].mapping is None:
            print(f"--run {name!r} cannot be mapped: {by_name[name].unmapped}", file=sys.stderr)
            return 2
    started = time.monotonic()
    constants, residuals = fit_constants(fit_stages(runs)) if any(
        r.split == "fit" and r.mapping is not None and r.mapping.roofline is not None for r in runs) else ({}, [])
    if constants:
        print("roofline constants (fit runs' stages, %d rows, |residual| median %.1f%%): %s" % (
            len(residuals), 100 * median(abs(v) for v in residuals),
            ", ".join(f"{k} {v:.4g}" for k, v in constants.items())))
    host_s = host_time_s(runs)
    if host_s:
        print(f"host time per step (decode-only seconds of {HOST_RUN}): {host_s * 1e3:.2f} ms")
    chosen = [by_name[n] for n in args.run] if args.run else [r for r in runs if r.mapping is not None]
    # the HTTP fit runs are simulated whichever runs are asked for: their TTFT gap gives every HTTP
    # run's first-token delay
    simulated = chosen + [r for r in runs if r.split == "fit" and r.mapping is not None and r.mapping.over_http
                          and r not in chosen]
    sims: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, run in enumerate(simulated):
            m = run.mapping
            if m.roofline is not None and not constants:
                print(f"{run.name}: no fit run for the roofline constants; skipped", file=sys.stderr)
                continue
            cost = profile_cost(run, host_s) if m.profile_dir else m.roofline.cost_model(constants, run.name)
            work = Path(tmp) / str(i)
            work.mkdir()
            t0 = time.monotonic()
            sims[run.name] = simulate(run, cost, work)
            print(f"[{i + 1}/{len(simulated)}] {run.name}: simulated in {time.monotonic() - t0:.1f} s", flush=True)
    # the first token reaches an HTTP client later than the simulated engine emits it, by a number of
    # engine steps (the gap divided by the run's step time is steady across models; a constant is not)
    gaps = [(run.measured["ttft_mean"] / 1e3 - float(np.mean(sims[run.name]["ttft_s"]))) / _step_s(sims[run.name])
            for run in simulated if run.split == "fit" and run.mapping.over_http and run.name in sims]
    delay_steps = max(0.0, median(gaps)) if gaps else 0.0
    print(f"first-token delay of an HTTP client (median TTFT gap of {len(gaps)} fit runs, in engine steps): "
          f"{delay_steps:.2f} steps")
    rows = []
    for run in chosen:
        if run.name not in sims:
            continue
        http = run.mapping.over_http
        pred, failed = predicted(sims[run.name], delay_steps * _step_s(sims[run.name]) if http else 0.0)
        row = {"run": run.name, "source": run.source, "split": run.split, "gpu": run.gpu, "model": run.model,
               "measured_failed": run.failed, "simulated_failed": failed, "notes": run.notes}
        for key in METRICS:
            real = run.measured.get(key)
            row[f"{key}_measured"] = real
            row[f"{key}_simulated"] = pred[key]
            row[f"{key}_error"] = (pred[key] - real) / real if real else None
        row["itl_mean_error"] = row["tpot_mean_error"]  # the per-token time: TPOT (docs/sim-to-real.md)
        rows.append(row)
    collapsed = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, run in enumerate(r for r in chosen if r.collapsed and r.name in sims and r.mapping.roofline is not None):
            work = Path(tmp) / str(i)
            work.mkdir()
            collapsed.append(given_step_time(run, constants, delay_steps, work))
    unmapped = [{"run": r.name, "source": r.source, "reason": r.unmapped} for r in runs if r.mapping is None]
    print(table(rows))
    for split in ("fit", "validation"):
        part = [r for r in rows if r["split"] == split]
        if part:
            print(f"{split}: {len(part)} runs, median |error| of mean TTFT "
                  f"{100 * median(abs(r['ttft_mean_error']) for r in part):.1f}%, mean E2E "
                  f"{100 * median(abs(r['e2e_mean_error']) for r in part):.1f}%, TPOT "
                  f"{100 * median(abs(r['tpot_mean_error']) for r in part):.1f}%")
    if collapsed:
        print("collapsed runs with the step time they measured at max_num_seqs running (roofline scaled):")
        for c in collapsed:
            if "skipped" in c:
                print(f"  {c['run'][:46]:46} skipped: {c['skipped']}")
                continue
            print(f"  {c['run'][:46]:46} step {c['roofline_step_ms']:.1f} -> {c['measured_step_ms']:.1f} ms "
                  f"(x{c['scale']:.2f}): TTFT {100 * c['ttft_mean_error']:+.1f}%, E2E {100 * c['e2e_mean_error']:+.1f}%, "
                  f"failed {c['measured_failed'] or 0} real / {c['simulated_failed']} simulated")
    print("not mapped:")
    for u in unmapped:
        print(f"  {u['source']} {u['run']}: {u['reason']}")
    print(f"wall time {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"constants": constants, "host_s_per_step": host_s, "first_token_delay_steps": delay_steps,
             "runs": rows, "collapsed_given_step_time": collapsed, "unmapped": unmapped}, indent=1) + "\n")
    return 0


def table(rows: list[dict]) -> str:
    pct = lambda v: "" if v is None else f"{100 * v:+.1f}"
    lines = [f"{'run':46} {'split':10} {'TTFT ms':>9} {'err%':>6} {'p90%':>6} {'p99%':>6} {'E2E ms':>9} {'err%':>6} "
             f"{'p90%':>6} {'p99%':>6} {'TPOT ms':>8} {'err%':>6} {'tput%':>6} {'fail r/s':>9}"]
    for r in rows:
        lines.append(f"{r['run'][:46]:46} {r['split']:10} {r['ttft_mean_measured']:9.1f} {pct(r['ttft_mean_error']):>6} "
                     f"{pct(r['ttft_p90_error']):>6} {pct(r['ttft_p99_error']):>6} {r['e2e_mean_measured']:9.1f} "
                     f"{pct(r['e2e_mean_error']):>6} {pct(r['e2e_p90_error']):>6} {pct(r['e2e_p99_error']):>6} "
                     f"{r['tpot_mean_measured']:8.2f} {pct(r['tpot_mean_error']):>6} "
                     f"{pct(r['request_throughput_error']):>6} {r['measured_failed'] or 0:>4}/{r['simulated_failed']:<4}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
