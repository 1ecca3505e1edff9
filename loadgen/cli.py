"""``loadgen``: a thin command line over the spec, runner, analysis and report modules."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from trace_shapes import FORMATS

from .version import __version__
from .core.spec import SpecError, load_spec, parse_seeds


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .core.runner import completed_run
    from .experiment import run_experiment
    from .live.progress import describe_duration, describe_estimate, wall_time_left_s

    console = Console(stderr=True)
    _resume_args(args)
    spec = load_spec(args.spec)
    if args.endpoint:
        from .core.spec import OpenAIEngineSpec

        previous = spec.engine.model_dump() if spec.engine.kind == "openai" else {}
        previous.pop("kind", None)
        url = _endpoint_url(args.endpoint)
        engine = OpenAIEngineSpec(**{**previous, "url": url, "model": args.model or previous.get("model")})
        spec = spec.model_copy(update={"engine": engine})
    elif args.model:
        raise SpecError("--model needs --endpoint")
    if args.api is not None:  # chat or completions for a live run (docs/chat.md)
        if spec.engine.kind != "openai":
            raise SpecError(f"--api applies to live runs only (with --endpoint URL, or a spec whose engine is kind "
                            f"openai); {args.spec} simulates in virtual time")
        spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"api": args.api})})
    if spec.engine.kind in ("vllm", "sglang", "serve_sim"):
        raise SpecError(f"{args.spec}: engine kind {spec.engine.kind!r} is launched on a Ray cluster by "
                        "`loadgen sweep` (or run against a server you started: --endpoint URL)")
    if args.time_scale is not None:
        if args.time_scale <= 0:
            raise SpecError(f"--time-scale must be > 0, got {args.time_scale}")
        if spec.engine.kind != "openai":  # a simulated run is in virtual time: there is nothing to compress
            raise SpecError(f"--time-scale applies to live runs only (with --endpoint URL, or a spec whose engine "
                            f"is kind openai); {args.spec} simulates in virtual time, which needs no scaling")
        spec = spec.model_copy(update={"time_scale": args.time_scale})
    keys = _selected_runs(spec, args)
    out = Path(args.out)
    _claim_results_dir(out, spec, args.force_new_spec, console)
    live = spec.engine.kind == "openai"
    num_to_run = len(keys)
    if args.resume is not None:
        num_to_run = sum(completed_run(out, spec, key) is None for key in keys)
        console.print(f"--resume: {len(keys) - num_to_run} of {len(keys)} runs already completed with this spec "
                      f"in {out} (skipped), {num_to_run} to run")
    if live and num_to_run:  # wall-clock runs: say up front what the whole spec will take
        console.print(f"estimate: {describe_estimate(num_to_run, spec.duration_s, spec.time_scale)}")
    failed = []
    lagging = []  # (run id, run.json "lag") of live runs that fell behind their time scale
    runs_left = [num_to_run]
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=console,
                  transient=False, disable=args.quiet) as progress:
        task = progress.add_task(spec.experiment, total=len(keys), last="")
        run_task = progress.add_task("", total=spec.duration_s, last="", visible=False) if live else None

        def started(key) -> None:
            runs_left[0] -= 1
            progress.update(task, last=f"running {key.run_id}")
            if run_task is not None:
                progress.reset(run_task, total=spec.duration_s, description=key.run_id, visible=True,
                               last="waiting for the first sample")

        def progressed(key, snapshot) -> None:
            left_s = wall_time_left_s(runs_left[0], snapshot, spec.duration_s, spec.time_scale)
            progress.update(run_task, completed=min(snapshot.t_s, spec.duration_s),
                            last=f"{snapshot.describe()}; about {describe_duration(left_s)} left for the spec")

        def skipped(key, info) -> None:
            progress.update(task, advance=1, last=f"{key.run_id}: already completed (skipped)")

        def done(key, info, wall_s) -> None:
            status = info.get("status")
            if status != "completed":
                failed.append((key.run_id, info.get("error")))
            if info.get("lagging"):
                lagging.append((key.run_id, info["lag"]))
            counts = info.get("counts", {})
            progress.update(task, advance=1, last=f"{key.run_id}: {status}, {counts.get('turns_completed', 0)} turns, "
                                                  f"{wall_s:.2f} s")

        run_experiment(spec, out, keys, spec_dir=Path(args.spec).resolve().parent,
                       on_run_start=started, on_run_done=done, wall_time=time.perf_counter,
                       resume=args.resume is not None, on_run_skipped=skipped,
                       on_progress=progressed if live else None)
    for run_id, error in failed:
        console.print(f"[red]run {run_id} failed:[/red] {error}")
    for run_id, lag in lagging:  # a flag, not a failure: the exit code stays as it is
        console.print(f"[yellow]warning: run {run_id} lagged[/yellow]: the {lag['source']}'s timers fired "
                      f"p99 {lag['p99_s']:.3g} s late (max {lag['max_s']:.3g} s) in run time, over the bound "
                      f"{lag['bound_s']:.3g} s (5% of the median turn); a lower --time-scale or a quieter "
                      "machine (docs/results-format.md#lag)", soft_wrap=True)
    unreadable = _report(out, console, figures=not args.no_figures) if not args.no_report else []
    return 1 if failed or unreadable else 0


def _resume_args(args: argparse.Namespace) -> None:
    """``loadgen run --resume DIR`` resumes DIR with the spec it recorded (DIR/spec.yaml) unless a
    SPEC is given; ``loadgen run SPEC --out DIR --resume`` resumes DIR with SPEC."""
    if args.resume:  # a directory
        if args.out and Path(args.out) != Path(args.resume):
            raise SpecError(f"--resume {args.resume} and --out {args.out} name two results directories; give one")
        args.out = args.resume
        if args.spec is None:
            recorded = Path(args.resume) / "spec.yaml"
            if not recorded.is_file():
                raise SpecError(f"--resume {args.resume}: no spec.yaml there (not a results directory of "
                                "`loadgen run`); give the SPEC too")
            args.spec = str(recorded)
    if args.spec is None:
        raise SpecError("loadgen run needs a SPEC (or --resume DIR)")
    if args.out is None:
        raise SpecError("loadgen run needs --out DIR (or --resume DIR)")


def _endpoint_url(url: str, flag: str = "--endpoint") -> str:
    from .core.spec import normalize_endpoint_url

    try:
        return normalize_endpoint_url(url)
    except ValueError as exc:
        raise SpecError(f"{flag}: {exc}") from None


def _claim_results_dir(out: Path, spec, force_new_spec: bool, console) -> None:
    """Refuse a results directory holding runs of another spec, or move them aside (--force-new-spec)."""
    from .core.same_spec import MixedSpecError, claim_results_dir

    try:
        moved = claim_results_dir(out, spec, force_new_spec)
    except MixedSpecError as exc:
        raise SpecError(str(exc)) from None
    if moved is not None:
        console.print(f"--force-new-spec: moved the runs of the previous spec to {moved}/", markup=False,
                      soft_wrap=True)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console


    if args.fleets is not None and args.fleets < 1:
        raise SpecError(f"--fleets must be a number of session-fleet actors >= 1, got {args.fleets}")
    try:  # Ray only for the commands that need a cluster
        from actors.cluster import ClusterUnreachable, ray_cluster
        from actors.sweep import SweepError, check_sweepable, run_sweep
    except ImportError as exc:
        raise SpecError(f"loadgen sweep needs Ray ({exc}): pip install 'agent-loadgen[ray]'") from None
    console = Console(stderr=True, quiet=args.quiet)
    spec = load_spec(args.spec)
    try:
        check_sweepable(spec)
    except SweepError as exc:
        raise SpecError(f"{args.spec}: {exc}") from None
    keys = _selected_runs(spec, args)
    out = Path(args.out)
    _claim_results_dir(out, spec, args.force_new_spec, console)
    finished: list = []

    def started(start) -> None:
        where = start.placement
        if where.get("node_ip"):
            console.print(f"{start.key.run_id}: on {where['node_ip']}, GPUs {where.get('gpu_ids') or 'none'}")

    def done(key, info) -> None:
        finished.append((key, info))
        counts = info.get("counts", {})
        console.print(f"{key.run_id}: {info.get('status')}, {counts.get('turns_completed', 0)} turns"
                      + (f" ({info.get('error')})" if info.get("error") else ""))

    try:
        with ray_cluster(args.address):
            results = run_sweep(spec, out, keys, spec_dir=Path(args.spec).resolve().parent, num_fleets=args.fleets,
                                on_run_start=started, on_run_done=done)
    except SweepError as exc:
        raise SpecError(f"{args.spec}: {exc}") from None
    except ClusterUnreachable as exc:
        raise SpecError(str(exc)) from None
    console.print(f"{len(keys) - len(finished)} of {len(keys)} runs already completed (skipped), {len(finished)} ran")
    failed = [info for info in results if info.get("status") != "completed"]
    for info in failed:
        console.print(f"[red]run {info['run_id']} failed:[/red] {info.get('error')}")
    unreadable = _report(out, console, figures=not args.no_figures) if not args.no_report else []
    return 1 if failed or unreadable else 0


def _cmd_map(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    import yaml

    from .core.clock import epoch_s
    from .map.bounds import spec_bounds
    from .map.grid import MapGrid, map_job, parse_controllers, parse_values
    from .map.report import summarize_map, write_map
    from .map.run import process_pool, run_map

    spec = load_spec(args.spec)
    spec_dir = Path(args.spec).resolve().parent
    try:
        grid = MapGrid(
            rates_per_s=tuple(parse_values(args.rates, "--rates", 0.0, allow_minimum=False)),
            trigger_factors=tuple(parse_values(args.trigger_factors, "--trigger-factors", 0.0)),
            seeds=tuple(parse_seeds(args.seeds)), controllers=parse_controllers(args.controllers),
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
    summary = summarize_map(job, grid, list(store.rows.values()), bounds)
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
        from .map.figures import write_map_figures

        paths = write_map_figures(summary, out)
        print(f"figures: {len(paths)} PNG files in {paths[0].parent}", file=sys.stderr)
    return 1 if summary["num_failed"] else 0


def _selected_runs(spec, args: argparse.Namespace) -> list:
    """The spec's arms x seeds, narrowed by --seeds and --arms."""
    from .core.runner import run_keys

    try:
        seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    except ValueError as exc:
        raise SpecError(f"--seeds: {exc}") from None
    arms = args.arms.split(",") if args.arms else None
    try:
        return run_keys(spec, seeds, arms)
    except (ValueError, KeyError) as exc:
        raise SpecError(f"{args.spec}: {exc}") from None


def _report(out: Path, console, figures: bool = True) -> list:
    """Summary, tables and figures of ``out``; returns the runs it could not read (they are listed)."""
    from rich.markup import escape

    from .analysis import ResultsError, format_outcome_table, format_recovery_table, write_summary
    from .core.runner import recover_runs

    recovered = recover_runs(out)
    if recovered:
        console.print(f"recovered rows of interrupted runs: {', '.join(recovered)}")
    try:
        summary = write_summary(out)
    except ResultsError as exc:
        raise SpecError(str(exc)) from None
    print(format_outcome_table(summary), flush=True)
    recovery = format_recovery_table(summary)  # only when some arm has a controller or a control start
    if recovery:
        print("\n" + recovery, flush=True)
    from .analysis.latency import format_latency_table
    from .analysis.windows_table import write_missing_windows

    latency = format_latency_table(summary)
    if latency:
        print("\n" + latency, flush=True)
    written = write_missing_windows(out, summary)
    if written:
        console.print(f"windows.parquet written for {len(written)} runs that lacked it")
    console.print(f"summary: {out / 'summary.json'}")
    if figures:
        from .analysis.figures import write_figures

        from .analysis.latency_figures import write_latency_figures

        paths = write_figures(out, summary) + write_latency_figures(out, summary)
        if paths:
            console.print(f"figures: {len(paths)} PNG files in {paths[0].parent}")
    unreadable = summary.get("unreadable_runs") or []
    for entry in unreadable:
        console.print(f"[red]unreadable run {entry['run_id']}[/red] (left out of the tables): {escape(entry['error'])}",
                      soft_wrap=True)
    return unreadable


def _cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .analysis import ResultsError, check_results_dir

    try:
        out = check_results_dir(args.dir)
    except ResultsError as exc:
        raise SpecError(str(exc)) from None
    arms = _compare_arms_arg(args.compare_arms) if args.compare_arms is not None else None
    unreadable = _report(out, Console(stderr=True), figures=not args.no_figures)
    if arms is not None:
        import json

        from .analysis.uncertainty import compare_arms, format_arm_comparison

        try:
            comparison = compare_arms(json.loads((out / "summary.json").read_text()), *arms)
        except ValueError as exc:
            raise SpecError(f"--compare-arms: {exc}") from None
        print("\n" + format_arm_comparison(comparison), flush=True)
    return 1 if unreadable else 0


def _compare_arms_arg(value: str) -> tuple[str, str]:
    arms = [a.strip() for a in value.split(",")]
    if len(arms) != 2 or not all(arms) or arms[0] == arms[1]:
        raise SpecError(f"--compare-arms: expected two different arm names as A,B, got {value!r}")
    return arms[0], arms[1]


def _cmd_validate(args: argparse.Namespace) -> int:
    from .core.spec import check_spec_files

    spec = load_spec(args.spec)
    check_spec_files(spec, Path(args.spec).resolve().parent, args.spec)
    print(f"{args.spec}: ok: experiment {spec.experiment!r}, {len(spec.arms)} arms x {len(spec.seeds)} seeds, "
          f"{spec.duration_s / 60:g} min per run")
    return 0


def _cmd_cost_fit(args: argparse.Namespace) -> int:
    from .sim.cost import CALIBRATION_QWEN3_8B_MI300X, fit_cost_model

    print(fit_cost_model(CALIBRATION_QWEN3_8B_MI300X, name="qwen3-8b-mi300x").table())
    return 0


def _cmd_serve_sim(args: argparse.Namespace) -> int:
    import asyncio

    from .live.serve_sim import SimServer, check_options, serve
    from .sim import EngineConfig, StepCostModel
    from .core.spec import SimEngineSpec

    try:
        check_options(args.port, args.pool_tokens, args.block_size, args.max_num_batched_tokens, args.max_model_len,
                      flavor=args.flavor, page_size=args.page_size)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if args.time_scale <= 0:
        raise SpecError(f"--time-scale must be > 0, got {args.time_scale}")
    try:
        cost = (StepCostModel(0.0, 0.0, 0.0, 0.0, name="zero") if args.zero_cost
                else SimEngineSpec(cost_model=args.cost_model).load_cost_model(Path.cwd()))
    except ValueError as exc:
        raise SpecError(f"--cost-model: {exc}") from None
    config = EngineConfig(num_blocks=args.pool_tokens // args.block_size, block_size=args.block_size,
                          max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                          enable_prefix_caching=not args.no_prefix_caching)
    if args.offload_cpu_tokens is not None:  # the CPU tier with its documented copy-cost defaults
        try:
            offload = SimEngineSpec(pool_tokens=config.pool_tokens, block_size=args.block_size,
                                    enable_prefix_caching=not args.no_prefix_caching,
                                    offload={"cpu_tokens": args.offload_cpu_tokens}).offload_config()
        except ValueError as exc:
            raise SpecError(f"--offload-cpu-tokens: {str(exc).splitlines()[-1].strip()}") from None
        config = dataclasses.replace(config, offload=offload)
    if args.flavor == "sglang":
        from .core.runner import engine_config

        if args.offload_cpu_tokens is not None:
            raise SpecError("--offload-cpu-tokens models vLLM's offloading: it needs --flavor vllm")
        try:  # the same engine a spec's {kind: sim, flavor: sglang} builds, so both runs agree
            config = engine_config(SimEngineSpec(
                flavor="sglang", pool_tokens=args.pool_tokens, max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=args.max_model_len, enable_prefix_caching=not args.no_prefix_caching,
                sglang={"page_size": args.page_size, "schedule_policy": args.schedule_policy}))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise SpecError(f"serve-sim --flavor sglang: {str(exc).splitlines()[-1].strip()}") from None
    tokenizer = None
    if args.tokenizer:
        from .live.tokenizer import LocalTokenizer, TokenizerError

        try:
            tokenizer = LocalTokenizer(args.tokenizer)
        except TokenizerError as exc:
            raise SpecError(f"--tokenizer: {exc}") from None
    server = SimServer(config, cost, time_scale=args.time_scale, model=args.model, tokenizer=tokenizer,
                       chat_only=args.chat_only)

    async def main() -> None:
        await serve(server, args.host, args.port)
        print(f"serve-sim: http://{args.host}:{args.port} ({args.flavor}, model {args.model!r}, "
              f"pool {config.pool_tokens} tokens, cost {cost.name}, time x{args.time_scale:g})", flush=True)
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

    from trace_shapes import (LoaderOptions, TraceLabLikeSessions, describe_sessions, format_description, load_hf,
                              load_swebench, load_trace, select_models)

    for flag, values in (("--truncate-at", [args.truncate_at]), ("--over", args.over or []),
                         ("--num-sessions", [args.num_sessions]), ("--block-tokens", [args.block_tokens]),
                         ("--default-output-tokens", [args.default_output_tokens] if args.default_output_tokens else [])):
        for value in values:
            if value <= 0:
                raise SpecError(f"{flag} must be a positive number of {'sessions' if flag == '--num-sessions' else 'tokens'}, "
                                f"got {value}")
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
        raise SpecError(f"{exc}{hint}") from None
    description = describe_sessions(sessions, args.truncate_at, args.over or [38_000], name=args.source)
    print(json.dumps(description, indent=1) if args.json else format_description(description, notes))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from .live.calibrate import CalibrationPlan, calibrate
    from .core.clock import WallClock
    from .live.http_client import EndpointOptions, OpenAIEngineClient, PreflightError

    url = _endpoint_url(args.endpoint)
    plan = CalibrationPlan(repeats=args.repeats, chunk_tokens=args.max_num_batched_tokens)
    out = Path(args.out)

    async def main():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=url, model=args.model))
        try:
            return await calibrate(client, plan, name=args.name or out.stem, time_scale=args.time_scale,
                                   log=lambda msg: print(msg, file=sys.stderr, flush=True))
        finally:
            await client.close()

    try:
        result = asyncio.run(main())
    except PreflightError as exc:
        raise SpecError(str(exc)) from None
    out.write_text(json.dumps(result.fit.model.to_json(), indent=1) + "\n")
    report = {"cost_model": result.fit.model.to_json(), "pool_tokens": result.pool_tokens,
              "block_size": result.block_size, "max_num_batched_tokens": plan.chunk_tokens,
              "request_overhead_s": result.fit.request_overhead_s, "rows": result.fit.rows}
    out.with_suffix(".fit.json").write_text(json.dumps(report, indent=1) + "\n")
    print(result.fit.table())
    print(f"pool {result.pool_tokens} tokens, block size {result.block_size}; wrote {out} "
          f"(use it as engine.cost_model) and {out.with_suffix('.fit.json')}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from .analysis.compare import compare_runs, format_comparison, write_comparison

    for d in (args.real_dir, args.sim_dir):
        if not (Path(d) / "runs").is_dir():
            raise SpecError(f"{d}: not a results directory (no runs/ folder)")
    try:
        result = compare_runs(Path(args.real_dir), Path(args.sim_dir), width_s=args.window_min * 60)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    print(format_comparison(result), flush=True)
    out = Path(args.out) if args.out else Path(args.real_dir) / "compare"
    paths = write_comparison(result, out)
    print(f"wrote {out / 'compare.json'} and {len(paths)} figures", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loadgen", description=__doc__)
    parser.add_argument("--version", action="version", version=f"agent-loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run every run of a spec (arms x seeds) and report")
    run.add_argument("spec", nargs="?", help="experiment spec (YAML); with --resume DIR, default DIR/spec.yaml")
    run.add_argument("--out", help="results directory (required unless --resume DIR)")
    run.add_argument("--resume", nargs="?", const="", metavar="DIR",
                     help="skip the runs already completed with the same spec (in DIR, else --out)")
    run.add_argument("--seeds", help="only these seeds, e.g. 501-503 or 1,4")
    run.add_argument("--arms", help="only these arms, comma-separated")
    run.add_argument("--no-report", action="store_true", help="skip summary, table and figures")
    run.add_argument("--no-figures", action="store_true", help="summary and table only")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument("--endpoint", help="run against this OpenAI-compatible server instead of the spec's engine")
    run.add_argument("--model", help="served model name (with --endpoint; default: the first one served)")
    run.add_argument("--time-scale", type=float, help="compress every workload time X-fold (live runs only)")
    run.add_argument("--api", choices=("completions", "chat"),
                     help="the endpoint's API for a live run (default: the spec's engine.api, else completions)")
    run.add_argument("--force-new-spec", action="store_true",
                     help="DIR holds runs of another spec: move them to DIR/previous-N/ instead of refusing")
    run.set_defaults(func=_cmd_run)

    sweep = sub.add_parser("sweep", help="run arms x seeds on a Ray cluster (engines on their own GPUs); resumes")
    sweep.add_argument("spec", help="experiment spec (YAML)")
    sweep.add_argument("--out", required=True, help="results directory on this node; a re-run skips completed runs")
    sweep.add_argument("--address", help="Ray cluster to join (default: $RAY_ADDRESS, else a new local cluster)")
    sweep.add_argument("--seeds", help="only these seeds, e.g. 501-503 or 1,4")
    sweep.add_argument("--arms", help="only these arms, comma-separated")
    sweep.add_argument("--fleets", type=int, help="session-fleet actors (default: one per node, at least 2)")
    sweep.add_argument("--force-new-spec", action="store_true",
                       help="DIR holds runs of another spec: move them to DIR/previous-N/ instead of refusing")
    sweep.add_argument("--no-report", action="store_true", help="skip summary, table and figures")
    sweep.add_argument("--no-figures", action="store_true", help="summary and table only")
    sweep.add_argument("--quiet", action="store_true", help="no per-run lines")
    sweep.set_defaults(func=_cmd_sweep)

    from .map.grid import (DEFAULT_BISECT_STEPS, DEFAULT_CONTROLLERS, DEFAULT_HORIZON_H, DEFAULT_MAX_ESCAPE_RATES,
                           DEFAULT_RATES, DEFAULT_SEEDS, DEFAULT_TRIGGER_FACTORS)

    map_ = sub.add_parser("map", help="the metastability map: P(degradation) over rate x trigger x controller")
    map_.add_argument("spec", help="experiment spec (YAML) with the simulated engine and a burst trigger")
    map_.add_argument("--out", required=True, help="map directory; a rerun skips finished runs, a complete map redraws")
    map_.add_argument("--rates", default=DEFAULT_RATES, help=f"base arrival rates, start:stop:step or a list "
                                                             f"(default {DEFAULT_RATES})")
    map_.add_argument("--trigger-factors", default=DEFAULT_TRIGGER_FACTORS,
                      help=f"burst extra_rate_factor values, 0 = no trigger (default {DEFAULT_TRIGGER_FACTORS})")
    map_.add_argument("--seeds", default=DEFAULT_SEEDS, help=f"seeds at every point (default {DEFAULT_SEEDS})")
    map_.add_argument("--controllers", default=DEFAULT_CONTROLLERS,
                      help=f"controllers, each from the start of the run (default {DEFAULT_CONTROLLERS})")
    map_.add_argument("--horizon-h", type=float, default=DEFAULT_HORIZON_H,
                      help=f"escape-time runs: hours per run, 0 to skip (default {DEFAULT_HORIZON_H:g})")
    map_.add_argument("--max-escape-rates", type=int, default=DEFAULT_MAX_ESCAPE_RATES,
                      help=f"escape-time runs at most at this many rates of the band (default {DEFAULT_MAX_ESCAPE_RATES})")
    map_.add_argument("--bisect-steps", type=int, default=DEFAULT_BISECT_STEPS,
                      help=f"halvings of each seed's tipping bracket, 0 to skip (default {DEFAULT_BISECT_STEPS})")
    map_.add_argument("--workers", type=int, help="local processes (default: one per CPU)")
    map_.add_argument("--address", help="run on this Ray cluster instead of local processes")
    map_.add_argument("--ray", action="store_true", help="run on Ray ($RAY_ADDRESS, else a local cluster)")
    map_.add_argument("--no-figures", action="store_true")
    map_.add_argument("--quiet", action="store_true", help="no progress lines")
    map_.set_defaults(func=_cmd_map)

    serve = sub.add_parser("serve-sim", help="serve the simulated engine behind vLLM's HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--time-scale", type=float, default=1.0, help="run the engine X times faster than real time")
    serve.add_argument("--pool-tokens", type=int, default=400_000, help="KV pool C in tokens")
    serve.add_argument("--block-size", type=int, default=16)
    serve.add_argument("--max-num-batched-tokens", type=int, default=8192)
    serve.add_argument("--max-model-len", type=int, default=40960)
    serve.add_argument("--cost-model", default="qwen3-8b-mi300x", help="preset name or cost.json path")
    serve.add_argument("--zero-cost", action="store_true", help="every step takes no time (load-generator benchmarks)")
    serve.add_argument("--no-prefix-caching", action="store_true")
    serve.add_argument("--offload-cpu-tokens", type=int, default=None, metavar="N",
                       help="a CPU KV offload tier of N tokens (vLLM's native offloading)")
    serve.add_argument("--model", default="sim", help="the served model name")
    serve.add_argument("--flavor", choices=("vllm", "sglang"), default="vllm",
                       help="which engine and API surface: vLLM's (default) or SGLang's (radix cache, /flush_cache, "
                            "sglang:* metrics); --max-num-batched-tokens is SGLang's --chunked-prefill-size")
    serve.add_argument("--page-size", type=int, default=1, help="SGLang's --page-size (flavor sglang)")
    serve.add_argument("--tokenizer", metavar="PATH",
                       help="tokenizer.json or a model directory: tokenizes chat messages and text prompts "
                            "(default: one token per whitespace-separated word)")
    serve.add_argument("--chat-only", action="store_true",
                       help="serve no /v1/completions (an endpoint that speaks only the chat API)")
    serve.add_argument("--schedule-policy", choices=("fcfs", "lpm"), default="fcfs",
                       help="SGLang's --schedule-policy (flavor sglang)")
    serve.set_defaults(func=_cmd_serve_sim)

    report = sub.add_parser("report", help="rebuild summary.json, print the paired table, write figures")
    report.add_argument("dir", help="results directory written by `loadgen run`")
    report.add_argument("--no-figures", action="store_true")
    report.add_argument("--compare-arms", metavar="A,B",
                        help="paired by seed, B - A for each metric: median, bootstrap 95%% interval, sign test")
    report.set_defaults(func=_cmd_report)

    cal = sub.add_parser("calibrate", help="fit the simulator's step-cost model to a real engine")
    cal.add_argument("--endpoint", required=True, help="the engine's base URL")
    cal.add_argument("--model", help="served model name (default: the first one served)")
    cal.add_argument("--out", required=True, help="cost.json to write (a .fit.json with the rows goes beside it)")
    cal.add_argument("--name", help="the cost model's name (default: the file name)")
    cal.add_argument("--repeats", type=int, default=3, help="repeats per measurement (median kept)")
    cal.add_argument("--max-num-batched-tokens", type=int, default=8192, help="the server's step token budget")
    cal.add_argument("--time-scale", type=float, default=1.0, help="the server runs X times faster than real time "
                                                                 "(a scaled serve-sim)")
    cal.set_defaults(func=_cmd_calibrate)

    compare = sub.add_parser("compare", help="a real engine's results beside the simulator's, run by run")
    compare.add_argument("real_dir")
    compare.add_argument("sim_dir")
    compare.add_argument("--window-min", type=float, default=5.0, help="window width in minutes")
    compare.add_argument("--out", help="where compare.json and figures go (default REAL_DIR/compare)")
    compare.set_defaults(func=_cmd_compare)

    validate = sub.add_parser("validate", help="check a spec without running it")
    validate.add_argument("spec")
    validate.set_defaults(func=_cmd_validate)

    cost = sub.add_parser("cost-fit", help="show the step-cost fit to the calibration numbers and its residuals")
    cost.set_defaults(func=_cmd_cost_fit)

    shapes = sub.add_parser("shapes", help="session shapes: what replayed traces look like")
    shapes_sub = shapes.add_subparsers(dest="shapes_command", required=True)
    describe = shapes_sub.add_parser(
        "describe", help="calls per session, context and gap percentiles, growth per turn, share of long sessions")
    describe.add_argument("source", help=f"a trace file (JSONL, .gz, Parquet), a Hugging Face dataset (hf:ORG/NAME "
                                         f"from the local cache, or a local dataset directory) or a name: "
                                         f"{', '.join(SHAPE_NAMES)}")
    describe.add_argument("--format", default=None, choices=sorted(FORMATS),
                          help="the rows' format (default: shapes, the shipped format, for a file; calls for a dataset)")
    describe.add_argument("--split", default="train", help="Hugging Face dataset: the split (default train)")
    describe.add_argument("--config", default=None, help="Hugging Face dataset: the configuration name")
    describe.add_argument("--column", action="append", metavar="FIELD=COLUMN",
                          help="Hugging Face dataset: the format's field name for a dataset column (repeatable)")
    describe.add_argument("--tokenizer", default=None, help="aiperf: a local tokenizer.json to count text turns")
    describe.add_argument("--default-output-tokens", type=int, default=None,
                          help="aiperf: output tokens of a turn without output_length")
    describe.add_argument("--block-tokens", type=int, default=512, help="mooncake: tokens per hash_ids block")
    describe.add_argument("--model", action="append", help="only sessions of this model (repeatable)")
    describe.add_argument("--truncate-at", type=int, default=38_000,
                          help="engine limit for the replay section (default 38000)")
    describe.add_argument("--over", type=int, action="append",
                          help="report the share of sessions whose context exceeds this (repeatable; default 38000)")
    describe.add_argument("--num-sessions", type=int, default=2000, help="tracelab-synthetic: sessions to generate")
    describe.add_argument("--seed", type=int, default=0, help="tracelab-synthetic: generator seed")
    describe.add_argument("--json", action="store_true", help="print the numbers as JSON")
    describe.set_defaults(func=_cmd_shapes)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: runs that ended are on disk, the ones that had not are marked interrupted in their "
              "run.json; the same command again runs those (a sweep skips completed runs); `loadgen report DIR` "
              "summarizes what is there", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
