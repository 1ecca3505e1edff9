"""The experiment commands: run, sweep, report and validate."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..core.spec import SpecError, load_spec, parse_seeds


PIPED_WIDTH = 200


def stderr_console(**kwargs):
    """Rich's console on stderr. Piped (no terminal, no COLUMNS), rich would lay every line out
    in 80 columns and cut the progress lines there: a log keeps them whole instead."""
    import os
    import sys

    from rich.console import Console

    piped = not sys.stderr.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=True, width=PIPED_WIDTH if piped else None, **kwargs)


def _cmd_run(args: argparse.Namespace) -> int:
    from ..core.runner import completed_run
    from ..experiment import run_experiment
    from ..live.progress import describe_duration, describe_estimate, wall_time_left_s

    console = stderr_console()
    _resume_args(args)
    spec = load_spec(args.spec)
    if args.endpoint:
        from ..core.spec import OpenAIEngineSpec

        previous = spec.engine.model_dump() if spec.engine.kind == "openai" else {}
        previous.pop("kind", None)
        if spec.engine.kind == "sim" and "pool_tokens" in spec.engine.model_fields_set and args.pool_tokens is None:
            # the pool the spec's load and limits were sized for: checked against the endpoint's, never dropped
            previous["simulated_pool_tokens"] = spec.engine.pool_tokens
        url = _endpoint_url(args.endpoint)
        engine = OpenAIEngineSpec(**{**previous, "url": url, "model": args.model or previous.get("model")})
        spec = spec.model_copy(update={"engine": engine})
    elif args.model:
        raise SpecError("--model needs --endpoint")
    if args.pool_tokens is not None:
        if spec.engine.kind != "openai":
            raise SpecError(f"--pool-tokens applies to live runs only (with --endpoint URL, or a spec whose engine is "
                            f"kind openai); {args.spec} simulates, and its pool is engine.pool_tokens in the spec")
        if args.pool_tokens <= 0:
            raise SpecError(f"--pool-tokens must be a number of tokens > 0, got {args.pool_tokens}")
        spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"pool_tokens": args.pool_tokens})})
    if args.api is not None:  # chat or completions for a live run (docs/chat.md)
        if spec.engine.kind != "openai":
            raise SpecError(f"--api applies to live runs only (with --endpoint URL, or a spec whose engine is kind "
                            f"openai); {args.spec} simulates in virtual time")
        spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"api": args.api})})
    if args.via_gateway:
        if spec.engine.kind != "openai":
            raise SpecError(f"--via-gateway applies to live runs only (with --endpoint URL, or a spec whose engine is "
                            f"kind openai); {args.spec} simulates in virtual time")
        from ..core.spec.engines import ViaGatewaySpec

        engine = spec.engine.model_copy(update={"gateway": spec.engine.gateway or ViaGatewaySpec()})
        spec = spec.model_copy(update={"engine": engine})
    if args.cost_model is not None:
        if spec.engine.kind != "sim":
            raise SpecError(f"--cost-model applies to simulated runs; {args.spec if not args.endpoint else '--endpoint'}"
                            f" runs engine kind {spec.engine.kind!r}")
        # the model itself goes into the spec, so the results directory says what was simulated
        model = _cost_model_arg(args.cost_model, "--cost-model").to_json()
        spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"cost_model": model})})
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
    if args.workers is not None and args.workers < 1:
        raise SpecError(f"--workers must be >= 1, got {args.workers}")
    from ..core.run_pool import default_workers

    num_workers = args.workers or default_workers()
    keys = _selected_runs(spec, args)
    out = Path(args.out)
    _claim_results_dir(out, spec, args.force_new_spec, console)
    if args.replicates is not None:  # after the claim: --force-new-spec moves an earlier replicates.json aside
        from ..replicates import check_replicates

        check_replicates(spec, args.replicates, Path(args.spec).resolve().parent, out)
    live = spec.engine.kind == "openai"
    num_to_run = len(keys)
    if args.resume is not None:
        num_to_run = sum(completed_run(out, spec, key) is None for key in keys)
        console.print(f"--resume: {len(keys) - num_to_run} of {len(keys)} runs already completed with this spec "
                      f"in {out} (skipped), {num_to_run} to run")
    if spec.workload.replay is not None:
        for line in spec.workload.replay.describe(spec.duration_s):
            console.print(line, markup=False, highlight=False)
    if live and num_to_run:  # wall-clock runs: say up front what the whole spec will take
        console.print(f"estimate: {describe_estimate(num_to_run, spec.duration_s, spec.time_scale)}"
                      + (" (more: it goes on until every request is answered)"
                         if spec.workload.replay is not None and spec.workload.replay.until_done else ""))
    failed = []
    lagging = []  # (run id, run.json "lag") of live runs that fell behind their time scale
    warned: set[str] = set()  # preflight warnings already printed
    runs_left = [num_to_run]
    with _progress(console, args.quiet) as progress:
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
            for warning in (info.get("preflight") or {}).get("warnings") or []:
                if warning not in warned:  # the same endpoint says the same for every run: once
                    warned.add(warning)
                    progress.console.print(f"warning: {warning} (run.json preflight.warnings)", markup=False,
                                           highlight=False, soft_wrap=True, style="yellow")
            counts = info.get("counts", {})
            progress.update(task, advance=1, last=f"{key.run_id}: {status}, {counts.get('turns_completed', 0)} turns, "
                                                  f"{wall_s:.2f} s")

        run_experiment(spec, out, keys, spec_dir=Path(args.spec).resolve().parent,
                       on_run_start=started, on_run_done=done, wall_time=time.perf_counter,
                       resume=args.resume is not None, on_run_skipped=skipped,
                       on_progress=progressed if live else None, num_workers=num_workers)
    for run_id, error in failed:
        console.print(f"[red]run {run_id} failed:[/red] {error}")
    for run_id, lag in lagging:  # a flag, not a failure: the exit code stays as it is
        console.print(f"[yellow]warning: run {run_id} lagged[/yellow]: the {lag['source']}'s timers fired "
                      f"p99 {lag['p99_s']:.3g} s late (max {lag['max_s']:.3g} s) in run time, over the bound "
                      f"{lag['bound_s']:.3g} s (5% of the median turn); a lower --time-scale or a quieter "
                      "machine (docs/results-format.md#lag)", soft_wrap=True)
    unreadable = (_report(out, console, figures=not args.no_figures, num_workers=num_workers)
                  if not args.no_report else [])
    if args.replicates is not None and not failed:
        from ..replicates import format_replicates, run_replicates

        failed_replicates = []
        with _progress(console, args.quiet) as progress:  # one line for all replicates, not one each
            task = progress.add_task("replicates", total=None, last="")

            def replicate_done(key, r, info) -> None:
                if info.get("status") != "completed":
                    failed_replicates.append((f"{key.run_id} replicate {r}", info.get("error")))
                progress.update(task, advance=1, last=f"{key.run_id} replicate {r}: {info.get('status')}")

            summary = run_replicates(spec, out, keys, args.replicates, Path(args.spec).resolve().parent,
                                     on_start=lambda num_jobs: progress.update(task, total=num_jobs),
                                     on_done=replicate_done, num_workers=num_workers,
                                     resume=args.resume is not None)
        for what, error in failed_replicates:
            console.print(f"[red]{what} failed:[/red] {error}")
        print(format_replicates(summary), flush=True)
    return 1 if failed or unreadable else 0


def _progress(console, quiet: bool):
    """The bar a sweep of runs shows: done of all, elapsed, and what the last one did."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[last]}"), console=console, transient=False, disable=quiet)


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
    from ..core.spec import normalize_endpoint_url

    try:
        return normalize_endpoint_url(url)
    except ValueError as exc:
        raise SpecError(f"{flag}: {exc}") from None

def _claim_results_dir(out: Path, spec, force_new_spec: bool, console) -> None:
    """Refuse a results directory holding runs of another spec, or move them aside (--force-new-spec)."""
    from ..core.same_spec import MixedSpecError, claim_results_dir

    try:
        moved = claim_results_dir(out, spec, force_new_spec)
    except MixedSpecError as exc:
        raise SpecError(str(exc)) from None
    if moved is not None:
        console.print(f"--force-new-spec: moved the runs of the previous spec to {moved}/", markup=False,
                      soft_wrap=True)

def _cmd_sweep(args: argparse.Namespace) -> int:
    if args.fleets is not None and args.fleets < 1:
        raise SpecError(f"--fleets must be a number of session-fleet actors >= 1, got {args.fleets}")
    try:  # Ray only for the commands that need a cluster
        from actors.cluster import ClusterUnreachable, ray_cluster
        from actors.sweep import SweepError, check_sweepable, run_sweep
    except ImportError as exc:
        raise SpecError(f"loadgen sweep needs Ray ({exc}): pip install 'agent-loadgen[ray]'") from None
    console = stderr_console(quiet=args.quiet)
    spec = load_spec(args.spec)
    try:
        check_sweepable(spec)
    except SweepError as exc:
        raise SpecError(f"{args.spec}: {exc}") from None
    from actors.deployment import router_note

    if (note := router_note(spec.engine)) is not None:  # said even with --quiet: the runs are not the policy's
        stderr_console().print(f"[yellow]engine.router: {note}[/yellow]")
    if args.workers is not None and args.workers < 1:
        raise SpecError(f"--workers must be >= 1, got {args.workers}")
    from ..core.run_pool import default_workers

    num_workers = args.workers or default_workers()
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
    unreadable = (_report(out, console, figures=not args.no_figures, num_workers=num_workers)
                  if not args.no_report else [])
    return 1 if failed or unreadable else 0

def _selected_runs(spec, args: argparse.Namespace) -> list:
    """The spec's arms x seeds, narrowed by --seeds and --arms."""
    from ..core.runner import run_keys

    try:
        seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    except ValueError as exc:
        raise SpecError(f"--seeds: {exc}") from None
    arms = args.arms.split(",") if args.arms else None
    try:
        return run_keys(spec, seeds, arms)
    except ValueError as exc:
        raise SpecError(f"--arms: {exc}") from None

def _report(out: Path, console, figures: bool = True, num_workers: int = 1, check_summary=None) -> list:
    """Summary, tables and figures of ``out``; returns the runs it could not read (they are listed).
    ``check_summary(summary)`` runs before anything is printed or drawn, so that a bad flag is
    refused at once."""
    from functools import lru_cache

    from rich.markup import escape

    from ..analysis import ResultsError, format_outcome_table, format_recovery_table, write_summary
    from ..analysis.runs import load_run
    from ..core.runner import recover_runs

    recovered = recover_runs(out)
    if recovered:
        console.print(f"recovered rows of interrupted runs: {', '.join(recovered)}")
    load = lru_cache(maxsize=None)(load_run)  # the summary, missing windows and figures read each run once
    try:
        summary = write_summary(out, load)
    except ResultsError as exc:
        raise SpecError(str(exc)) from None
    if check_summary is not None:
        check_summary(summary)
    from ..analysis.latency import format_latency_table
    from ..analysis.serving import format_serving_table
    from ..analysis.windows_table import write_missing_windows

    serving = format_serving_table(summary)  # a replayed trace: an open-loop benchmark's table
    if serving:
        # the paired table's verdicts (degraded, hit ratio over the last 10 minutes) judge long
        # closed-loop runs; on a replay they would say nothing true
        from ..analysis.ideal import ideal_hit_lines
        from ..analysis.tables import table_arms

        print("\n".join([serving, *ideal_hit_lines(summary, table_arms(summary))]), flush=True)
    else:
        print(format_outcome_table(summary), flush=True)
        recovery = format_recovery_table(summary)  # only when some arm has a controller or a control start
        if recovery:
            print("\n" + recovery, flush=True)
        latency = format_latency_table(summary)
        if latency:
            print("\n" + latency, flush=True)
    from ..analysis.trees import format_trees_table

    trees = format_trees_table(summary)  # only for runs of session trees
    if trees:
        print("\n" + trees, flush=True)
    written = write_missing_windows(out, summary, load)
    if written:
        console.print(f"windows.parquet written for {len(written)} runs that lacked it")
    console.print(f"summary: {out / 'summary.json'}")
    if figures:
        from ..analysis.figures import figure_jobs
        from ..analysis.latency_figures import latency_figure_jobs
        from ..core.run_pool import run_jobs

        # every figure on its own, over the workers; the latency figures (the longest to draw)
        # first, so that no worker is left drawing one of them alone at the end
        jobs = latency_figure_jobs(out, summary, load) + figure_jobs(out, summary, load)
        run_jobs([draw for _, draw in jobs], num_workers)
        paths = [path for path, _ in jobs]
        if paths:
            console.print(f"figures: {len(paths)} PNG files in {paths[0].parent}")
    unreadable = summary.get("unreadable_runs") or []
    for entry in unreadable:
        console.print(f"[red]unreadable run {entry['run_id']}[/red] (left out of the tables): {escape(entry['error'])}",
                      soft_wrap=True)
    return unreadable

def _cmd_report(args: argparse.Namespace) -> int:
    from ..analysis import ResultsError, check_results_dir

    if args.html and (Path(args.dir) / "map.json").is_file() and not (Path(args.dir) / "runs").is_dir():
        from ..analysis.html_report import write_map_html

        print(f"report: {write_map_html(Path(args.dir))}", flush=True)
        return 0
    try:
        out = check_results_dir(args.dir)
    except ResultsError as exc:
        raise SpecError(str(exc)) from None
    arms = _compare_arms_arg(args.compare_arms) if args.compare_arms is not None else None
    comparison = []

    def compare(summary: dict) -> None:  # before the figures: a mistyped arm is refused at once
        from ..analysis.uncertainty import compare_arms

        try:
            comparison.append(compare_arms(summary, *arms))
        except ValueError as exc:
            raise SpecError(f"--compare-arms: {exc}") from None

    from ..core.run_pool import default_workers

    unreadable = _report(out, stderr_console(), figures=not args.no_figures, num_workers=default_workers(),
                         check_summary=compare if arms is not None else None)
    if comparison:
        from ..analysis.uncertainty import format_arm_comparison

        print("\n" + format_arm_comparison(comparison[0]), flush=True)
    if args.html:
        import json

        from ..analysis.html_report import write_results_html

        summary = json.loads((out / "summary.json").read_text())
        path = write_results_html(out, summary, sorted((out / "figures").glob("*.png")))
        print(f"report: {path}", flush=True)
    return 1 if unreadable else 0

def _cmd_export(args: argparse.Namespace) -> int:
    from ..analysis import ResultsError, check_results_dir, write_summary
    from ..analysis.export import export_results

    try:
        out = check_results_dir(args.dir)
        summary = write_summary(out)
    except ResultsError as exc:
        raise SpecError(str(exc)) from None
    target = Path(args.out) if args.out else out / "export" / args.format
    try:
        paths = export_results(out, summary, args.format, target)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    print(f"export: {len(paths)} files in {target}", flush=True)
    for entry in summary.get("unreadable_runs") or []:
        print(f"unreadable run {entry['run_id']} (not exported): {entry['error']}", file=sys.stderr)
    return 1 if summary.get("unreadable_runs") else 0

def _compare_arms_arg(value: str) -> tuple[str, str]:
    arms = [a.strip() for a in value.split(",")]
    if len(arms) != 2 or not all(arms) or arms[0] == arms[1]:
        raise SpecError(f"--compare-arms: expected two different arm names as A,B, got {value!r}")
    return arms[0], arms[1]

def _cmd_validate(args: argparse.Namespace) -> int:
    from ..core.spec import check_spec_files

    spec = load_spec(args.spec)
    check_spec_files(spec, Path(args.spec).resolve().parent, args.spec)
    replay = spec.workload.replay
    per_run = ("until the last request is answered" if replay is not None and replay.until_done
               else f"{spec.duration_s / 60:g} min")
    print(f"{args.spec}: ok: experiment {spec.experiment!r}, {len(spec.arms)} arms x {len(spec.seeds)} seeds, "
          f"{per_run} per run")
    if replay is not None:
        print("\n".join(replay.describe(spec.duration_s)))
    return 0


def _cost_model_arg(value: str, flag: str):
    from ..sim.cost import PRESETS, preset_or_file

    try:
        return preset_or_file(value)
    except ValueError as exc:
        raise SpecError(f"{flag}: {exc} (or a preset: {', '.join(sorted(PRESETS))})") from None
