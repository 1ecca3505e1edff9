"""The other commands: the map, serve-sim, calibrate, cost-fit, compare and shapes."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from trace_shapes import TREE_PRESETS

from ..core.spec import SpecError, load_spec, parse_seeds
from .runs import _cost_model_arg, _endpoint_url


def _cmd_map(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    import yaml

    from ..core.clock import epoch_s
    from ..map.bounds import spec_bounds
    from ..map.grid import MapGrid, map_job, parse_controllers, parse_values, with_routers
    from ..map.report import summarize_map, write_map
    from ..map.run import process_pool, run_map

    spec = load_spec(args.spec)
    spec_dir = Path(args.spec).resolve().parent
    try:
        controllers = parse_controllers(args.controllers)
        if args.budgets is not None:  # the budgets replace the spec's one budgeter
            from ..map.budgets import BUDGETER, parse_budgets

            spec_params = spec.controller.params if spec.controller.name == BUDGETER else {}
            controllers = tuple(c for c in controllers if c != BUDGETER) + parse_budgets(args.budgets, spec_params)
        grid = MapGrid(
            rates_per_s=tuple(parse_values(args.rates, "--rates", 0.0, allow_minimum=False)),
            trigger_factors=tuple(parse_values(args.trigger_factors, "--trigger-factors", 0.0)),
            seeds=tuple(parse_seeds(args.seeds)),
            controllers=with_routers(controllers,
                                     parse_controllers(args.routers, "--routers", "consistent_hash,cache_aware")
                                     if args.routers else (), spec),
            horizon_s=args.horizon_h * 3600, bisect_steps=args.bisect_steps, max_escape_rates=args.max_escape_rates)
        job = map_job(spec, spec_dir, grid.trigger_factors)
        bounds = spec_bounds(spec, spec.engine.load_cost_model(spec_dir))
    except ValueError as exc:  # GridError, a bad --seeds, an unreadable cost model
        raise SpecError(f"{args.spec}: {exc}") from None
    if args.workers is not None and args.workers < 1:
        raise SpecError(f"--workers must be >= 1, got {args.workers}")
    if args.address or args.ray:
        try:  # Ray only for the commands that need a cluster
            from actors.cluster import ray_cluster
            from actors.map import ray_executor
        except ImportError as exc:
            raise SpecError(f"loadgen map --address needs Ray ({exc}): pip install 'agent-loadgen[ray]'") from None
        where, execute = ray_cluster(args.address), ray_executor()
    else:
        where, execute = nullcontext(), process_pool(args.workers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_unset=True), sort_keys=False))
    shown: dict = {}

    def progress(phase: str, done: int, total: int) -> None:
        # a line per tenth of a phase: enough to see it move, few enough for a log file
        step = max(1, total // 10)
        if not args.quiet and done and (done == total or done % step == 0) and shown.get(phase) != done:
            shown[phase] = done
            print(f"{phase}: {done}/{total} runs", file=sys.stderr, flush=True)

    start_s = epoch_s()
    try:
        with where:
            store, ran = run_map(job, grid, out, execute, progress)
    except ValueError as exc:  # an unreadable outcome table
        raise SpecError(str(exc)) from None
    wall_s = epoch_s() - start_s
    summary = summarize_map(job, grid, store.map_rows(), bounds)
    write_map(out, summary)
    print(summary["report"], flush=True)
    num_ran = sum(ran.values())
    if num_ran:
        print(f"ran {num_ran} runs ({', '.join(f'{k} {v}' for k, v in ran.items())}) in {wall_s:.1f} s: "
              f"{num_ran / max(wall_s, 1e-9):.2f} runs/s", file=sys.stderr)
    else:
        print("the map is complete: nothing to run, redrawn from outcomes.parquet", file=sys.stderr)
    print(f"map: {out / 'map.json'}, outcomes: {out / 'outcomes.parquet'}", file=sys.stderr)
    if not args.no_figures:
        from ..map.figures import write_map_figures

        paths = write_map_figures(summary, out)
        print(f"figures: {len(paths)} PNG files in {paths[0].parent}", file=sys.stderr)
    return 1 if summary["num_failed"] else 0

def _cmd_cost_fit(args: argparse.Namespace) -> int:
    from ..sim.cost import CALIBRATION_QWEN3_8B_MI300X, fit_cost_model

    print(fit_cost_model(CALIBRATION_QWEN3_8B_MI300X, name="qwen3-8b-mi300x").table())
    return 0

def _cmd_serve_sim(args: argparse.Namespace) -> int:
    import asyncio

    from ..live.serve_sim import SimServer, check_options, serve
    from ..sim import EngineConfig, StepCostModel
    from ..core.spec import SimEngineSpec, error_message

    try:
        check_options(args.port, args.pool_tokens, args.block_size, args.max_num_batched_tokens, args.max_model_len,
                      flavor=args.flavor, page_size=args.page_size)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if args.time_scale <= 0:
        raise SpecError(f"--time-scale must be > 0, got {args.time_scale}")
    try:
        cost_model = {} if args.cost_model is None else {"cost_model": args.cost_model}  # default: the flavour's
        cost = (StepCostModel(0.0, 0.0, 0.0, 0.0, name="zero") if args.zero_cost
                else SimEngineSpec(flavor=args.flavor, **cost_model).load_cost_model(Path.cwd()))
    except ValueError as exc:
        raise SpecError(f"--cost-model: {error_message(exc)}") from None
    config = EngineConfig(num_blocks=args.pool_tokens // args.block_size, block_size=args.block_size,
                          max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                          enable_prefix_caching=not args.no_prefix_caching)
    if args.offload_cpu_tokens is not None:  # the CPU tier with its documented copy-cost defaults
        try:
            offload = SimEngineSpec(pool_tokens=config.pool_tokens, block_size=args.block_size,
                                    enable_prefix_caching=not args.no_prefix_caching,
                                    offload={"cpu_tokens": args.offload_cpu_tokens}).offload_config()
        except ValueError as exc:
            raise SpecError(f"--offload-cpu-tokens: {error_message(exc)}") from None
        config = dataclasses.replace(config, offload=offload)
    if args.flavor == "sglang":
        from ..core.runner import engine_config

        if args.offload_cpu_tokens is not None:
            raise SpecError("--offload-cpu-tokens models vLLM's offloading: it needs --flavor vllm")
        try:  # the same engine a spec's {kind: sim, flavor: sglang} builds, so both runs agree
            config = engine_config(SimEngineSpec(
                flavor="sglang", pool_tokens=args.pool_tokens, max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=args.max_model_len, enable_prefix_caching=not args.no_prefix_caching,
                sglang={"page_size": args.page_size, "schedule_policy": args.schedule_policy,
                        "overlap_schedule": not args.disable_overlap_schedule}))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise SpecError(f"serve-sim --flavor sglang: {error_message(exc)}") from None
    elif args.disable_overlap_schedule:
        raise SpecError("--disable-overlap-schedule is SGLang's flag: it needs --flavor sglang")
    tokenizer = None
    if args.tokenizer:
        from ..live.tokenizer import LocalTokenizer, TokenizerError

        try:
            tokenizer = LocalTokenizer(args.tokenizer)
        except TokenizerError as exc:
            raise SpecError(f"--tokenizer: {exc}") from None
    if args.replicas < 1:
        raise SpecError(f"--replicas {args.replicas}: must be >= 1")
    if args.router is not None and args.replicas == 1:
        raise SpecError("--router needs --replicas N > 1 (one engine has nothing to route between)")
    servers = [SimServer(config, cost, time_scale=args.time_scale, model=args.model, tokenizer=tokenizer,
                         chat_only=args.chat_only, seed=i) for i in range(args.replicas)]
    server = servers[0]
    listen = serve
    if args.replicas > 1:
        from routers import make_router

        from ..live.serve_deployment import DeploymentServer, serve_deployment
        try:
            router = make_router(args.router or "round_robin")
            if router.reads_kv_events:  # serve-sim's replicas publish no KV events to its router
                router = make_router(args.router, use_kv_events=False)
                print(f"serve-sim: {args.router} runs without KV events (use_kv_events false: what it routed)",
                      file=sys.stderr)
        except ValueError as exc:
            raise SpecError(f"--router: {exc}") from None
        server, listen = DeploymentServer(servers, router, session_header=args.session_header), serve_deployment
    import logging

    # serve-sim's own lines (a client hang-up) on stderr as they are, nothing of other loggers
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("loadgen.serve_sim")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    async def main() -> None:
        await listen(server, args.host, args.port)
        replicas = (f", {args.replicas} replicas behind {args.router or 'round_robin'} "
                    f"(each at /replica/<i>)" if args.replicas > 1 else "")
        print(f"serve-sim: http://{args.host}:{args.port} ({args.flavor}, model {args.model!r}, "
              f"pool {config.pool_tokens} tokens, cost {cost.name}, time x{args.time_scale:g}{replicas})", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(main())
    except OSError as exc:
        raise SpecError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    return 0

SHAPE_NAMES = ("swebench", "tracelab-synthetic")

def _column(text: str) -> tuple[str, str]:
    field, sep, column = text.partition("=")
    if not sep or not field or not column:
        raise SpecError(f"--column expects FIELD=COLUMN (the format's field name = the dataset's column), got {text!r}")
    return field, column

def _cmd_shapes(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from trace_shapes import (TREE_FORMATS, LoaderOptions, TraceLabLikeSessions, describe_sessions, format_description,
                              load_hf, load_swebench, load_trace, select_models)

    for flag, values in (("--truncate-at", [args.truncate_at]), ("--over", args.over or []),
                         ("--num-sessions", [args.num_sessions]), ("--block-tokens", [args.block_tokens]),
                         ("--default-output-tokens", [args.default_output_tokens] if args.default_output_tokens else [])):
        for value in values:
            if value <= 0:
                raise SpecError(f"{flag} must be a positive number of {'sessions' if flag == '--num-sessions' else 'tokens'}, "
                                f"got {value}")
    if args.source in TREE_PRESETS or args.format in TREE_FORMATS:
        return _describe_trees(args)
    try:
        if args.source == "swebench":
            trace = load_swebench()
            sessions, notes = trace.sessions, trace.notes
        elif args.source == "tracelab-synthetic":
            generator, rng = TraceLabLikeSessions(), np.random.default_rng(args.seed)
            sessions = [generator.record(rng, f"tracelab-like-{i}") for i in range(args.num_sessions)]
            notes = (f"{args.num_sessions} sessions generated from TraceLab's published statistics, seed {args.seed}",)
        else:
            options = LoaderOptions(args.tokenizer, args.default_output_tokens, args.block_tokens)
            columns = dict(_column(c) for c in args.column or [])
            if args.source.startswith("hf:") or Path(args.source).is_dir() or columns:
                # a Hugging Face dataset: its format defaults to the generic one-call-a-row format
                trace = load_hf(args.source.removeprefix("hf:"), args.format or "calls", args.split,
                                args.config, columns, options)
            else:
                trace = load_trace(args.source, args.format or "shapes", options)
            sessions, notes = trace.sessions, trace.notes
        sessions = select_models(sessions, args.model)
    except ValueError as exc:
        hint = "" if Path(args.source).exists() else f" (names: {', '.join(SHAPE_NAMES)})"
        if args.format is None and Path(args.source).is_file():  # read as shapes: say what it looks like
            from trace_shapes.guess import guess_format

            guessed = guess_format(args.source)
            if guessed not in (None, "shapes"):
                hint = f"; its rows look like {guessed} rows: try --format {guessed}"
        raise SpecError(f"{exc}{hint}") from None
    description = describe_sessions(sessions, args.truncate_at, args.over or [38_000], name=args.source)
    print(json.dumps(description, indent=1) if args.json else format_description(description, notes))
    return 0


def _describe_trees(args: argparse.Namespace) -> int:
    """``shapes describe`` of session trees: a tree format's file, or a synthetic tree preset."""
    import json

    import numpy as np

    from trace_shapes import LoaderOptions, load_trees, tree_preset
    from trace_shapes.describe_trees import describe_trees, format_tree_description

    try:
        if args.source in TREE_PRESETS:
            if args.format is not None:
                raise SpecError(f"--format reads a file; {args.source} is a synthetic tree preset")
            # tree i draws from its own stream: the same seed gives the same trees, whatever their number
            model, streams = tree_preset(args.source), np.random.SeedSequence(args.seed).spawn(args.num_sessions)
            trees = [model.make(np.random.default_rng(stream)).as_recorded(f"{args.source}-{i}")
                     for i, stream in enumerate(streams)]
            notes = [f"{args.num_sessions} trees drawn from the {args.source} preset, seed {args.seed}"]
        else:
            options = LoaderOptions(args.tokenizer, args.default_output_tokens, args.block_tokens)
            loaded = load_trees(args.source, args.format, options)
            trees, notes = list(loaded.trees), list(loaded.notes)
        if args.model:
            trees = [t for t in trees if t.node.model in args.model]
            if not trees:
                raise ValueError(f"no trees whose root is of model(s) {args.model}")
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    description = describe_trees(trees, args.truncate_at, args.over or [38_000], name=args.source)
    print(json.dumps(description, indent=1) if args.json else format_tree_description(description, notes))
    return 0


def _check_calibrate_flags(args: argparse.Namespace) -> None:
    """Every number calibrate measures with, checked before the first request."""
    import math

    if args.repeats < 1:
        raise SpecError(f"--repeats must be >= 1 (measurements per point; the median is kept), got {args.repeats}")
    if args.max_num_batched_tokens < 1:
        raise SpecError(f"--max-num-batched-tokens must be >= 1 (the server's step token budget), "
                        f"got {args.max_num_batched_tokens}")
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise SpecError(f"--time-scale must be a number > 0 (how many times faster than real time the server "
                        f"runs), got {args.time_scale:g}")
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise SpecError(f"--tolerance must be a number >= 0, got {args.tolerance:g}")


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import asyncio
    import secrets

    from ..live.calibrate import CalibrationPlan, calibrate
    from ..live.calibration_report import finish_calibration
    from ..core.clock import WallClock
    from ..live.http_client import EndpointOptions, OpenAIEngineClient, PreflightError

    if args.from_profile is not None:
        if args.endpoint is not None:
            raise SpecError("calibrate: give --endpoint (measure an engine) or --from-profile (fit a kernel "
                            "profile), not both")
        return _calibrate_from_profile(args)
    if args.endpoint is None:
        raise SpecError("calibrate: give --endpoint URL (the engine to measure) or --from-profile DIR (a kernel "
                        "profile to fit)")
    if (args.tp is not None or args.layers is not None or args.host_s_per_step is not None
            or args.host_from_run is not None):
        raise SpecError("calibrate: --tp, --layers, --host-s-per-step and --host-from-run go with --from-profile")
    url = _endpoint_url(args.endpoint)
    if not args.out and not args.check:
        raise SpecError("calibrate: give --out (the cost.json to write), --check COST_MODEL, or both")
    _check_calibrate_flags(args)
    checked = _cost_model_arg(args.check, "--check") if args.check else None
    plan = CalibrationPlan(repeats=args.repeats, chunk_tokens=args.max_num_batched_tokens)
    if args.loaded:
        plan = dataclasses.replace(plan, loaded_queues=(plan.loaded_queue(plan.chunk_tokens),))
    out = Path(args.out) if args.out else None
    # fresh prompts every calibration: a second one against a warm server must not find its rows cached
    seed = args.seed if args.seed is not None else secrets.randbits(32)

    async def main():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=url, model=args.model))
        try:
            return await calibrate(client, plan, name=args.name or (out.stem if out else "measured"),
                                   time_scale=args.time_scale, seed=seed,
                                   log=lambda msg: print(msg, file=sys.stderr, flush=True))
        finally:
            await client.close()

    try:
        result = asyncio.run(main())
    except PreflightError as exc:
        raise SpecError(str(exc)) from None
    return finish_calibration(result, plan, out, checked, tolerance=args.tolerance, strict=args.strict,
                              force=args.force, typical_context=args.context, time_scale=args.time_scale)


PROFILE_MAX_P90 = 0.30  # calibrate --from-profile writes no model whose p90 |residual| of a step kind is above


def _calibrate_from_profile(args: argparse.Namespace) -> int:
    """loadgen calibrate --from-profile: the step model fitted to a kernel profile's composed steps."""
    from ..core.recording import write_json_atomic
    from ..core.workload import Stream, rng_for
    from ..sim.kernel_profile import ProfileError, load_profile
    from ..sim.profile_fit import fit_profile

    if not args.out:
        raise SpecError("calibrate --from-profile: give --out (the cost.json to write)")
    if args.check:
        raise SpecError("calibrate --from-profile: --check judges an engine's measurements; fit the profile, "
                        "then compare the two cost.json files")
    if args.tp is not None and args.tp < 1:
        raise SpecError(f"--tp must be >= 1 (a tensor-parallel degree), got {args.tp}")
    host_s = 0.0 if args.host_s_per_step is None else args.host_s_per_step
    if not (host_s >= 0 and host_s < float("inf")):
        raise SpecError(f"--host-s-per-step must be a number of seconds >= 0, got {args.host_s_per_step}")
    if args.host_from_run is not None and args.host_s_per_step is not None:
        raise SpecError("calibrate: give --host-s-per-step (by hand) or --host-from-run (measured), not both")
    try:
        profile = load_profile(args.from_profile, args.tp, args.layers)
        fit = fit_profile(profile, rng_for(Stream.CALIBRATION_BOOTSTRAP, args.seed or 0))
    except (ProfileError, ValueError) as exc:
        raise SpecError(f"--from-profile: {exc}") from None
    out = Path(args.out)
    host_lines = []
    if args.host_from_run is not None:
        from ..sim.host_time import host_time_from_run

        try:
            host_s, ticks = host_time_from_run(fit.model("kernels"), args.host_from_run)
        except ProfileError as exc:
            raise SpecError(f"--host-from-run: {exc}") from None
        host_lines = [f"host time from {args.host_from_run}: median {host_s * 1e3:.2f} ms a step over {len(ticks)} "
                      f"decode-only seconds (step measured - kernels, ms: "
                      + ", ".join(f"{t.host_s * 1e3:.1f}" for t in ticks) + ")"]
    model = fit.model(args.name or out.stem, host_s)
    worst = {kind: p90 for kind, p90 in fit.p90_by_kind().items() if p90 > PROFILE_MAX_P90}
    write_json_atomic(out.with_suffix(".fit.json"), fit.to_json())  # before printing: a closed stdout loses nothing
    if worst and not args.force:
        print("\n".join([fit.table(), *host_lines]))
        print(f"not written: the step model does not describe this profile (p90 |residual| "
              + ", ".join(f"{100 * v:.0f}% {k}" for k, v in worst.items())
              + f", above {100 * PROFILE_MAX_P90:.0f}%)"
              + ("; an MoE step's expert time saturates with the experts its tokens activate, which no term of the "
                 "model follows" if profile.moe is not None else "")
              + f". --force writes {out} anyway "
              f"(the fit and its residuals: {out.with_suffix('.fit.json')})", file=sys.stderr)
        return 1
    write_json_atomic(out, model.to_json())
    print("\n".join([fit.table(), *host_lines]))
    host = (f"kernels and {host_s * 1e3:g} ms of host time a step" if host_s
            else "kernel time only: pass --host-s-per-step for the host's share")
    print(f"cost model: {out} ({host}; the fit and its residuals: {out.with_suffix('.fit.json')})")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from ..analysis.compare import check_out_dir, compare_runs, default_out_dir, format_comparison, write_comparison

    for d in (args.real_dir, args.sim_dir):
        if not (Path(d) / "runs").is_dir():
            raise SpecError(f"{d}: not a results directory (no runs/ folder)")
    try:
        result = compare_runs(Path(args.real_dir), Path(args.sim_dir), width_s=args.window_min * 60)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    out = Path(args.out) if args.out else default_out_dir(Path(args.real_dir), Path(args.sim_dir))
    try:
        check_out_dir(out, Path(args.real_dir), Path(args.sim_dir))
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    print(format_comparison(result), flush=True)
    paths = write_comparison(result, out)
    print(f"wrote {out / 'compare.json'} and {len(paths)} figures", file=sys.stderr)
    return 0
