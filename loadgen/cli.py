"""``loadgen``: a thin command line over the spec, runner, analysis and report modules."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from . import __version__
from .spec import SpecError, load_spec, parse_seeds


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .runner import run_experiment, run_keys

    console = Console(stderr=True)
    spec = load_spec(args.spec)
    seeds = parse_seeds(args.seeds) if args.seeds else None
    arms = args.arms.split(",") if args.arms else None
    try:
        keys = run_keys(spec, seeds, arms)
    except (ValueError, KeyError) as exc:
        raise SpecError(f"{args.spec}: {exc}") from None
    out = Path(args.out)
    failed = []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=console,
                  transient=False, disable=args.quiet) as progress:
        task = progress.add_task(spec.experiment, total=len(keys), last="")

        def started(key) -> None:
            progress.update(task, last=f"running {key.run_id}")

        def done(key, info, wall_s) -> None:
            status = info.get("status")
            if status != "completed":
                failed.append((key.run_id, info.get("error")))
            counts = info.get("counts", {})
            progress.update(task, advance=1, last=f"{key.run_id}: {status}, {counts.get('turns_completed', 0)} turns, "
                                                  f"{wall_s:.2f} s")

        run_experiment(spec, out, keys, spec_dir=Path(args.spec).resolve().parent,
                       on_run_start=started, on_run_done=done, wall_time=time.perf_counter)
    for run_id, error in failed:
        console.print(f"[red]run {run_id} failed:[/red] {error}")
    if not args.no_report:
        _report(out, console, figures=not args.no_figures)
    return 1 if failed else 0


def _report(out: Path, console, figures: bool = True) -> None:
    from .analysis import format_outcome_table, write_summary
    from .runner import recover_runs

    recovered = recover_runs(out)
    if recovered:
        console.print(f"recovered rows of interrupted runs: {', '.join(recovered)}")
    summary = write_summary(out)
    print(format_outcome_table(summary), flush=True)
    console.print(f"summary: {out / 'summary.json'}")
    if figures:
        from .report import write_figures

        paths = write_figures(out, summary)
        if paths:
            console.print(f"figures: {len(paths)} PNG files in {paths[0].parent}")


def _cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    out = Path(args.dir)
    if not (out / "runs").is_dir():
        raise SpecError(f"{out}: not a results directory (no runs/ folder); run `loadgen run SPEC --out {out}` first")
    _report(out, Console(stderr=True), figures=not args.no_figures)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    print(f"{args.spec}: ok: experiment {spec.experiment!r}, {len(spec.arms)} arms x {len(spec.seeds)} seeds, "
          f"{spec.duration_s / 60:g} min per run")
    return 0


def _cmd_cost_fit(args: argparse.Namespace) -> int:
    from .sim.cost import CALIBRATION_QWEN3_8B_MI300X, fit_cost_model

    print(fit_cost_model(CALIBRATION_QWEN3_8B_MI300X, name="qwen3-8b-mi300x").table())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loadgen", description=__doc__)
    parser.add_argument("--version", action="version", version=f"agent-loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run every run of a spec (arms x seeds) and report")
    run.add_argument("spec", help="experiment spec (YAML)")
    run.add_argument("--out", required=True, help="results directory")
    run.add_argument("--seeds", help="only these seeds, e.g. 501-503 or 1,4")
    run.add_argument("--arms", help="only these arms, comma-separated")
    run.add_argument("--no-report", action="store_true", help="skip summary, table and figures")
    run.add_argument("--no-figures", action="store_true", help="summary and table only")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.set_defaults(func=_cmd_run)

    report = sub.add_parser("report", help="rebuild summary.json, print the paired table, write figures")
    report.add_argument("dir", help="results directory written by `loadgen run`")
    report.add_argument("--no-figures", action="store_true")
    report.set_defaults(func=_cmd_report)

    validate = sub.add_parser("validate", help="check a spec without running it")
    validate.add_argument("spec")
    validate.set_defaults(func=_cmd_validate)

    cost = sub.add_parser("cost-fit", help="show the step-cost fit to the calibration numbers and its residuals")
    cost.set_defaults(func=_cmd_cost_fit)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: completed runs are on disk; `loadgen report DIR` summarizes them", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
