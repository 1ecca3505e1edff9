"""The host time of a real engine's steps, from one of its runs: what its decode-only seconds took
beyond the kernels a profile fit predicts (``loadgen calibrate --from-profile DIR --host-from-run RUN``).

A run in LLMServingSim's layout (``vllm/requests.jsonl``: per request ``input_toks``,
``output_toks``, ``queued_ts``, ``first_token_ts``, ``last_token_ts`` on the engine's monotonic
clock; ``vllm/timeseries.csv``: per one-second tick ``t``, ``prompt_throughput``,
``gen_throughput`` tokens/s, ``running``, ``waiting``). A tick with no prompt tokens and no one
waiting is decode-only: every step decodes each running request once, so a step took
``mean running / gen_throughput`` seconds. The running requests and their contexts over the tick
come from requests.jsonl (a request decodes from its first token to its last, its context the
prompt plus the tokens generated so far, evenly in time); the kernels' share is the fitted model
at that batch and context; the host time is the median of the rest over ticks of at least
``MIN_RUNNING`` requests (a nearly empty batch's tick is mostly idle tails).

The tick clock starts at the first request's ``queued_ts`` (the run's start); tick t covers
[t - 1, t).
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from .cost import StepCostModel
from .kernel_profile import ProfileError

MIN_RUNNING = 8
SAMPLES_PER_TICK = 20


@dataclass(frozen=True)
class HostTick:
    t_s: float
    mean_running: float
    mean_context_tokens: float  # summed over the running requests
    step_s: float  # measured
    kernel_s: float  # the model's kernels at that batch

    @property
    def host_s(self) -> float:
        return self.step_s - self.kernel_s


def read_requests(path: Path) -> list[dict]:
    """A run's vllm/requests.jsonl (LLMServingSim's layout): per request its lengths and engine
    timestamps, as floats; ProfileError naming the line that lacks one."""
    need = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append({k: float(row[k]) for k in need})
        except (ValueError, KeyError, TypeError):
            raise ProfileError(f"{path}: line {number}: expected a JSON object with {list(need)}") from None
    if not out:
        raise ProfileError(f"{path}: no requests")
    return out


def _ticks(path: Path) -> list[dict]:
    need = ("t", "prompt_throughput", "gen_throughput", "running", "waiting")
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in need if c not in (reader.fieldnames or [])]
            if missing:
                raise ProfileError(f"{path}: missing column(s) {missing}; expected {list(need)}")
            return [{k: float(row[k]) for k in need} for row in reader]
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError:
        raise ProfileError(f"{path}: expected numbers in {list(need)}") from None


def decode_only_ticks(model: StepCostModel, run_dir: str | Path) -> list[HostTick]:
    run_dir = Path(run_dir)
    base = run_dir / "vllm" if (run_dir / "vllm").is_dir() else run_dir
    requests = read_requests(base / "requests.jsonl")
    start = min(r["queued_ts"] for r in requests)
    out = []
    for tick in _ticks(base / "timeseries.csv"):
        if tick["prompt_throughput"] or tick["waiting"] or tick["gen_throughput"] <= 0:
            continue
        running, context = 0.0, 0.0
        for i in range(SAMPLES_PER_TICK):  # time averages over the tick
            tau = start + tick["t"] - 1 + (i + 0.5) / SAMPLES_PER_TICK
            for r in requests:
                first, last = r["first_token_ts"], r["last_token_ts"]
                if first <= tau < last:
                    done = (tau - first) / (last - first) * (r["output_toks"] - 1)
                    running += 1
                    context += r["input_toks"] + done
        running /= SAMPLES_PER_TICK
        context /= SAMPLES_PER_TICK
        if running < MIN_RUNNING:
            continue
        step_s = running / tick["gen_throughput"]
        kernel_s = model.step_time(round(running), 0.0, context, 0.0, round(running)) - model.host_s_per_step
        out.append(HostTick(tick["t"], running, context, step_s, kernel_s))
    return out


def host_time_from_run(model: StepCostModel, run_dir: str | Path) -> tuple[float, list[HostTick]]:
    """(the median host time a step, the ticks it rests on); ProfileError when the run has no
    decode-only tick of at least MIN_RUNNING requests."""
    ticks = decode_only_ticks(model, run_dir)
    if not ticks:
        raise ProfileError(f"{run_dir}: no decode-only second (no prompt tokens, none waiting) with at least "
                           f"{MIN_RUNNING} requests running: the host time cannot be read from this run")
    return max(0.0, statistics.median(t.host_s for t in ticks)), ticks
