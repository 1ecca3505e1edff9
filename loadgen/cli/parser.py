"""The command line: every subcommand, its flags and the function that runs it.

Each command's flags are added only when that command is parsed (``build_parser(command)``), and
each command's module is imported only when it runs: ``loadgen --help`` or a mistyped flag imports
none of the spec models, numpy or pyarrow that the commands themselves need."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..version import __version__

from .help import apply_help


@dataclass(frozen=True)
class Command:
    """``loadgen.cli.<module>.<name>``, imported when the command runs, with ``preload``: the
    modules it imports as it starts (loaded beside it, main() keeps the garbage collector out)."""

    module: str
    name: str
    preload: tuple[str, ...] = ()

    def load(self) -> Callable[[argparse.Namespace], int]:
        for module in self.preload:
            importlib.import_module(module)
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.name)

    def __call__(self, args: argparse.Namespace) -> int:
        return self.load()(args)


def _add_run(run: argparse.ArgumentParser) -> None:
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
    run.add_argument("--pool-tokens", type=int, metavar="N",
                     help="live runs: the endpoint's KV pool in tokens, where its /metrics does not say it (a "
                          "gateway, a server without vllm:cache_config_info); it overrides what the endpoint says")
    run.add_argument("--api", choices=("completions", "chat"),
                     help="the endpoint's API for a live run (default: the spec's engine.api, else completions)")
    run.add_argument("--via-gateway", action="store_true",
                     help="live runs: every turn through a loadgen gateway in front of the engine, which enforces "
                          "the run's limit (docs/gateway.md#in-experiments)")
    run.add_argument("--cost-model", metavar="PRESET_OR_JSON",
                     help="simulate with these step costs (a preset, or the cost.json `loadgen calibrate` wrote), "
                          "written into the run's spec")
    run.add_argument("--force-new-spec", action="store_true",
                     help="DIR holds runs of another spec: move them to DIR/previous-N/ instead of refusing")
    run.add_argument("--workers", type=int,
                     help="simulated runs and figures at once, one process each (default: one per CPU); "
                          "the results are the same bytes whatever the number")
    run.add_argument("--replicates", type=int, metavar="R",
                     help="simulated runs: each run again under R draws of the cost model's step jitter; "
                          "P(persistently degraded) per seed in RESULTS/replicates.json")
    run.set_defaults(func=Command("runs", "_cmd_run", preload=(
        "rich.progress", "loadgen.experiment", "loadgen.core.runner", "loadgen.live.progress")))


def _add_sweep(sweep: argparse.ArgumentParser) -> None:
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
    sweep.add_argument("--workers", type=int, help="figures drawn at once after the runs, one process each "
                                                   "(default: one per CPU)")
    sweep.set_defaults(func=Command("runs", "_cmd_sweep"))


def _add_map(map_: argparse.ArgumentParser) -> None:
    from ..map.grid import (DEFAULT_BISECT_STEPS, DEFAULT_CONTROLLERS, DEFAULT_HORIZON_H, DEFAULT_MAX_ESCAPE_RATES,
                           DEFAULT_RATES, DEFAULT_SEEDS, DEFAULT_TRIGGER_FACTORS)
    map_.add_argument("spec", help="experiment spec (YAML) with the simulated engine and a burst trigger")
    map_.add_argument("--out", required=True, help="map directory; a rerun skips finished runs, a complete map redraws")
    map_.add_argument("--rates", default=DEFAULT_RATES, help=f"base arrival rates, start:stop:step or a list "
                                                             f"(default {DEFAULT_RATES})")
    map_.add_argument("--trigger-factors", default=DEFAULT_TRIGGER_FACTORS,
                      help=f"burst extra_rate_factor values, 0 = no trigger (default {DEFAULT_TRIGGER_FACTORS})")
    map_.add_argument("--seeds", default=DEFAULT_SEEDS, help=f"seeds at every point (default {DEFAULT_SEEDS})")
    map_.add_argument("--controllers", default=DEFAULT_CONTROLLERS,
                      help=f"controllers, each from the start of the run (default {DEFAULT_CONTROLLERS})")
    map_.add_argument("--routers", help="routers of a deployment spec (engine.replicas > 1), e.g. "
                                        "consistent_hash,cache_aware: each controller with each router")
    map_.add_argument("--budgets", metavar="A[/P],...",
                      help="search the budgeter's budget: admit fractions (park fraction: the spec's) or ADMIT/PARK "
                           "pairs, e.g. 0.6,0.75,0.9/0.98; each budget runs the grid as its own controller in place "
                           "of budgeter, and the recommendation picks among them (default: the spec's budget only)")
    map_.add_argument("--horizon-h", type=float, default=DEFAULT_HORIZON_H,
                      help=f"escape-time runs: hours per run, 0 to skip (default {DEFAULT_HORIZON_H:g})")
    map_.add_argument("--max-escape-rates", type=int, default=DEFAULT_MAX_ESCAPE_RATES,
                      help=f"escape-time runs at most at this many rates of the band (default {DEFAULT_MAX_ESCAPE_RATES})")
    map_.add_argument("--bisect-steps", type=int, default=DEFAULT_BISECT_STEPS,
                      help=f"halvings of each seed's tipping bracket, 0 to skip (default {DEFAULT_BISECT_STEPS})")
    map_.add_argument("--workers", type=int, help="local processes (default: one per CPU)")
    map_.add_argument("--address", help="run on this Ray cluster instead of local processes")
    map_.add_argument("--ray", action="store_true", help="run on Ray ($RAY_ADDRESS, else a local cluster)")
    map_.add_argument("--no-figures", action="store_true", help="map.json and the report only, no PNG figures")
    map_.add_argument("--quiet", action="store_true", help="no progress lines")
    map_.set_defaults(func=Command("tools", "_cmd_map"))


def _add_serve_sim(serve: argparse.ArgumentParser) -> None:
    from routers import ROUTERS

    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on; 0.0.0.0 serves other machines too (default 127.0.0.1: this one)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000)")
    serve.add_argument("--time-scale", type=float, default=1.0, help="run the engine X times faster than real time")
    serve.add_argument("--pool-tokens", type=int, default=400_000, help="KV pool C in tokens")
    serve.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (vLLM's --block-size)")
    serve.add_argument("--max-num-batched-tokens", type=int, default=8192,
                       help="tokens one engine step schedules at most (vLLM's flag of the same name)")
    serve.add_argument("--max-model-len", type=int, default=40960,
                       help="longest prompt + output a request may have, in tokens")
    serve.add_argument("--cost-model", default=None,
                       help="preset name or cost.json path (default qwen3-8b-mi300x; sglang-qwen3-8b-mi300x "
                            "with --flavor sglang)")
    serve.add_argument("--zero-cost", action="store_true", help="every step takes no time (load-generator benchmarks)")
    serve.add_argument("--no-prefix-caching", action="store_true", help="serve with prefix caching off")
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
    serve.add_argument("--disable-overlap-schedule", action="store_true",
                       help="SGLang's flag: schedule each batch after the last one's results (flavor sglang)")
    # added with deployments (docs/deployments.md#serve-sim-deployments)
    serve.add_argument("--replicas", type=int, default=1,
                       help="serve N engines behind a router at one URL (each also at /replica/<i>)")
    serve.add_argument("--router", help="the router of --replicas N (default round_robin): " + ", ".join(ROUTERS))
    serve.add_argument("--session-header", default="X-Session-ID", help="the header the router reads a session from")
    serve.set_defaults(func=Command("tools", "_cmd_serve_sim"))


def _add_report(report: argparse.ArgumentParser) -> None:
    report.add_argument("dir", help="results directory written by `loadgen run` (with --html, also `loadgen map`)")
    report.add_argument("--no-figures", action="store_true", help="summary and tables only, no PNG figures")
    report.add_argument("--compare-arms", metavar="A,B",
                        help="paired by seed, B - A for each metric: median, bootstrap 95%% interval, sign test")
    report.add_argument("--html", action="store_true",
                        help="also write DIR/report.html: one self-contained page (warnings, tables, figures inline, "
                             "the spec) to open or attach to a ticket; DIR may be a map directory")
    report.set_defaults(func=Command("runs", "_cmd_report"))


def _add_calibrate(cal: argparse.ArgumentParser) -> None:
    cal.add_argument("--endpoint", help="the engine's base URL (or --from-profile)")
    cal.add_argument("--from-profile", metavar="DIR",
                     help="fit to a kernel profile instead of an endpoint: a folder in LLMServingSim's layout "
                          "(meta.yaml, tp<N>/attention.csv, dense.csv, per_sequence.csv): every profiled step "
                          "composed from its per-layer times")
    cal.add_argument("--tp", type=int, help="with --from-profile: the tensor-parallel degree (default: the smallest "
                                            "profiled)")
    cal.add_argument("--layers", type=int, help="with --from-profile: the model's layer count (default: from "
                                                "configs/model/<model>.json above the folder)")
    cal.add_argument("--host-s-per-step", type=float, metavar="SECONDS",
                     help="with --from-profile: the host time every step adds beside its kernels (scheduling, "
                          "input preparation, output processing), which a kernel profile cannot see; written as its "
                          "own term (host_s_per_step), never folded into t0 (default 0: kernel time only)")
    cal.add_argument("--host-from-run", metavar="RUN_DIR",
                     help="with --from-profile: read the host time from a real run of the engine (LLMServingSim's "
                          "layout: vllm/requests.jsonl and vllm/timeseries.csv): the median of what its decode-only "
                          "seconds took beyond the fitted kernels")
    cal.add_argument("--model", help="served model name (default: the first one served)")
    cal.add_argument("--out", help="cost.json to write (a .fit.json with the rows goes beside it); "
                                  "required unless --check")
    cal.add_argument("--check", metavar="COST_MODEL",
                     help="also predict every measurement with this preset or cost.json and exit 1 when the engine "
                          "runs more than --tolerance faster or slower than it says: is a twin still true?")
    cal.add_argument("--tolerance", type=float, default=0.10,
                     help="with --check: the bound on |measured / predicted - 1| every row of every class must be "
                          "within; a row outside it but within 3x its repeats' spread is noisy, and the check then "
                          "says it cannot tell (exit 1)")
    cal.add_argument("--name", help="the cost model's name (default: the file name)")
    cal.add_argument("--repeats", type=int, default=3, help="repeats per measurement (median kept)")
    cal.add_argument("--max-num-batched-tokens", type=int, default=8192, help="the server's step token budget")
    cal.add_argument("--time-scale", type=float, default=1.0, help="the server runs X times faster than real time "
                                                                 "(a scaled serve-sim)")
    cal.add_argument("--seed", type=int, help="the prompts' seed (default: a fresh one, recorded in the .fit.json)")
    cal.add_argument("--strict", action="store_true",
                     help="exit 1 when repeats disagree by more than 15%% or this machine was busy")
    cal.add_argument("--force", action="store_true",
                     help="write the cost.json even when a coefficient's interval is wider than its value (with "
                          "--from-profile: even when a step kind's p90 |residual| is above 30%%)")
    cal.add_argument("--context", type=int, metavar="TOKENS",
                     help="with --check: the workload's typical context, where the cold-turn cost is compared "
                          "(default: the median cold row)")
    cal.add_argument("--loaded", action="store_true",
                     help="also drain a loaded queue (many decodes beside prefill chunks) and fit the mixed-step "
                          "decode term, what a decode costs beyond g in a step that also prefills")
    cal.set_defaults(func=Command("tools", "_cmd_calibrate"))


def _add_compare(compare: argparse.ArgumentParser) -> None:
    compare.add_argument("real_dir", help="results directory of the runs on the real engine")
    compare.add_argument("sim_dir", help="results directory of the same spec and seeds simulated")
    compare.add_argument("--window-min", type=float, default=5.0, help="window width in minutes")
    compare.add_argument("--out", help="where compare.json and figures go (default REAL_DIR/compare-vs-NAME, NAME the last part of SIM_DIR)")
    compare.set_defaults(func=Command("tools", "_cmd_compare"))


def _add_export(export: argparse.ArgumentParser) -> None:
    from ..analysis.export import FORMATS as EXPORT_FORMATS
    export.add_argument("dir", help="results directory written by `loadgen run`")
    export.add_argument("--format", required=True, choices=EXPORT_FORMATS,
                        help="csv or jsonl: turns and per-run summary tables; llm-d: a benchmark report (v0.2.1) per "
                             "run; aiperf: a profile_export.jsonl per run (docs/results-format.md#exports)")
    export.add_argument("--out", help="directory to write (default DIR/export/FORMAT)")
    export.set_defaults(func=Command("runs", "_cmd_export"))


def _add_validate(validate: argparse.ArgumentParser) -> None:
    validate.add_argument("spec", help="experiment spec (YAML)")
    validate.set_defaults(func=Command("runs", "_cmd_validate"))


def _add_cost_fit(cost: argparse.ArgumentParser) -> None:
    cost.set_defaults(func=Command("tools", "_cmd_cost_fit"))


def _add_shapes(shapes: argparse.ArgumentParser) -> None:
    from trace_shapes import FORMATS, TREE_FORMATS, TREE_PRESETS

    from .tools import SHAPE_NAMES

    shapes_sub = shapes.add_subparsers(dest="shapes_command", required=True)
    describe = shapes_sub.add_parser(
        "describe", help="calls per session, context and gap percentiles, growth per turn, share of long sessions")
    describe.add_argument("source", help=f"a trace file (JSONL, .gz, Parquet), a Hugging Face dataset (hf:ORG/NAME "
                                         f"from the local cache, or a local dataset directory) or a name: "
                                         f"{', '.join(SHAPE_NAMES)}; or a session-tree preset: "
                                         f"{', '.join(TREE_PRESETS)}")
    describe.add_argument("--format", default=None, choices=sorted(FORMATS) + sorted(TREE_FORMATS),
                          help="the rows' format (default: shapes, the shipped format, for a file; calls for a dataset); "
                               f"{', '.join(sorted(TREE_FORMATS))} read session trees")
    describe.add_argument("--split", default="train", help="Hugging Face dataset: the split (default train)")
    describe.add_argument("--config", default=None, help="Hugging Face dataset: the configuration name")
    describe.add_argument("--column", action="append", metavar="FIELD=COLUMN",
                          help="Hugging Face dataset: the format's field name for a dataset column (repeatable)")
    describe.add_argument("--tokenizer", default=None, help="aiperf, dag_jsonl: a local tokenizer.json to count text turns (default: one token per word, as serve-sim counts)")
    describe.add_argument("--default-output-tokens", type=int, default=None,
                          help="aiperf: output tokens of a turn without output_length")
    describe.add_argument("--block-tokens", type=int, default=512, help="mooncake: tokens per hash_ids block")
    describe.add_argument("--model", action="append", help="only sessions of this model (repeatable)")
    describe.add_argument("--truncate-at", type=int, default=38_000,
                          help="engine limit for the replay section (default 38000)")
    describe.add_argument("--over", type=int, action="append",
                          help="report the share of sessions whose context exceeds this (repeatable; default 38000)")
    describe.add_argument("--num-sessions", type=int, default=2000,
                          help="tracelab-synthetic: sessions to generate; a tree preset: trees to draw")
    describe.add_argument("--seed", type=int, default=0, help="tracelab-synthetic, tree presets: generator seed")
    describe.add_argument("--json", action="store_true", help="print the numbers as JSON")
    describe.set_defaults(func=Command("tools", "_cmd_shapes"))


def _add_gateway(gw: argparse.ArgumentParser) -> None:
    from .gateway import add_gateway_arguments

    add_gateway_arguments(gw)
    gw.set_defaults(func=Command("gateway", "_cmd_gateway"))


# every command: its one-line help and what adds its flags
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "run": ("run every run of a spec (arms x seeds) and report",
           _add_run),
    "sweep": ("run arms x seeds on a Ray cluster (engines on their own GPUs); resumes",
             _add_sweep),
    "map": ("the metastability map: P(degradation) over rate x trigger x controller",
           _add_map),
    "serve-sim": ("serve the simulated engine behind vLLM's HTTP API",
                 _add_serve_sim),
    "report": ("rebuild summary.json, print the paired table, write figures",
              _add_report),
    "calibrate": ("fit the simulator's step-cost model to a real engine",
                 _add_calibrate),
    "compare": ("a real engine's results beside the simulator's, run by run",
               _add_compare),
    "export": ("a results directory for other tools: CSV / JSONL tables, llm-d-benchmark reports, AIPerf-style profile_export.jsonl",
              _add_export),
    "validate": ("check a spec without running it",
                _add_validate),
    "cost-fit": ("show the step-cost fit to the calibration numbers and its residuals",
                _add_cost_fit),
    "shapes": ("session shapes: what replayed traces look like",
              _add_shapes),
    "gateway": ("the gateway controllers as an OpenAI-compatible proxy in front of engines (docs/gateway.md)",
                _add_gateway),
}


def command_in(argv: Sequence[str]) -> Optional[str]:
    """The command ``argv`` names: its first word that is not a flag, when that is a command."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(command: Optional[str] = "*") -> argparse.ArgumentParser:
    """The whole command line ("*"), or every command's name and one-line help with only
    ``command``'s flags (None: no command's flags, all that ``loadgen --help`` shows)."""
    parser = argparse.ArgumentParser(prog="loadgen", description=__doc__)
    parser.add_argument("--version", action="version", version=f"agent-loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (line, add_arguments) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=line)
        if command in ("*", name):
            add_arguments(command_parser)
    return apply_help(parser)
