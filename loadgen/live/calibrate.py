"""``loadgen calibrate``: fit the simulated engine's step-cost model to a real engine.

A short measured run against the endpoint, each measurement written as one row of the
cost model's least-squares problem (loadgen/sim/cost.py):

* cold prefills at several context lengths: a fresh random prompt, one output token; the time to
  first token is the prefill (chunked by the server's step budget) plus the request's own
  round trip, a constant fitted alongside (a one-block prompt pins it down) and kept out of the
  step model;
* incremental prefills on cached prefixes: a prompt is sent once to be cached, then sent again
  with new tokens appended; the second request's time to first token prefills only the new
  tokens on top of what the server reports as cached;
* decode at several batch sizes and contexts: a batch of warm prompts generating together; how
  much longer m tokens take than one, divided by m - 1, is one decode step of the batch;
* queues drained: many requests sharing a cached prefix sent at once, each with new tokens to
  prefill and a few to generate; the server works through them in steps that mix prefill chunks
  with decodes over a long waiting queue, the batch compositions of a collapsed engine, and the
  time until the last finishes is one row whose features replay the scheduler's steps.

Every measurement is repeated and the median kept. Pool size and block size come from the
server's /metrics. The result is a ``cost.json`` that a spec takes as ``engine.cost_model``.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from ..core.engines import TurnRequest, TurnResult
from ..core.workload import Stream, rng_for
from .http_client import OpenAIEngineClient, PreflightError
from ..sim.cost import FitResult, Measurement, StepCostModel, decode_step, fit_cost_model, prefill, queue_drain


def _ttft(m: Measurement) -> Measurement:
    """A time-to-first-token row: one request round trip is inside the measured time."""
    return replace(m, num_requests=1.0)


@dataclass(frozen=True)
class CalibrationPlan:
    cold_contexts: tuple[int, ...] = (16, 1000, 2000, 4000, 8000, 12000, 16000)
    incremental: tuple[tuple[int, int], ...] = ((2000, 1000), (6000, 500), (12000, 1000), (16000, 250))
    decode: tuple[tuple[int, int], ...] = ((1, 1000), (1, 8000), (4, 2000), (8, 4000), (16, 1000))
    decode_tokens: int = 64
    # (requests, new tokens each, cached shared prefix): queues a collapsed engine works through
    queues: tuple[tuple[int, int, int], ...] = ((16, 2000, 2000), (12, 6000, 2000))
    queue_output_tokens: int = 8
    repeats: int = 3
    chunk_tokens: int = 8192  # the server's max_num_batched_tokens

    def largest_context(self) -> int:
        return max([*self.cold_contexts, *(c + n for c, n in self.incremental),
                    *(c + self.decode_tokens for _, c in self.decode),
                    *(c + n + self.queue_output_tokens for _, n, c in self.queues)])


@dataclass
class CalibrationResult:
    fit: FitResult
    pool_tokens: Optional[int]
    block_size: Optional[int]
    measurements: list[Measurement] = field(default_factory=list)


class Calibrator:
    def __init__(self, client: OpenAIEngineClient, plan: CalibrationPlan, time_scale: float = 1.0,
                 seed: int = 0, log: Callable[[str], None] = lambda msg: None) -> None:
        self.client = client
        self.plan = plan
        self.time_scale = time_scale  # a scaled serve-sim runs time_scale x faster than the wall clock
        self.rng = rng_for(Stream.CALIBRATION_PROMPTS, seed)  # never a run's token ids
        self.log = log
        self._ids = 0

    def _prompt(self, num_tokens: int) -> list[int]:
        # random ids: no measurement shares a prefix with another by accident
        return self.rng.integers(1, 29000, size=num_tokens).tolist()

    async def _send(self, ids: list[int], max_tokens: int) -> TurnResult:
        self._ids += 1
        result = await self.client.generate(TurnRequest(-1, self._ids, len(ids), max_tokens, token_ids=ids))
        if result.error:
            raise PreflightError(f"calibration request failed: {result.error}")
        return result

    def _s(self, seconds: float) -> float:
        return seconds * self.time_scale

    async def cold(self, context: int) -> Measurement:
        times = []
        for _ in range(self.plan.repeats):
            r = await self._send(self._prompt(context), 1)
            times.append(self._s(r.first_token_s - r.submitted_s))
        return _ttft(prefill(f"cold prefill {context}", statistics.median(times), context,
                             chunk_tokens=self.plan.chunk_tokens, source="measured"))

    async def incremental(self, cached: int, new: int) -> Measurement:
        times, hits = [], []
        for _ in range(self.plan.repeats):
            base = self._prompt(cached)
            await self._send(base, 1)
            r = await self._send(base + self._prompt(new), 1)
            times.append(self._s(r.first_token_s - r.submitted_s))
            hits.append(r.cached_tokens)
        hit = int(statistics.median(hits))
        return _ttft(prefill(f"{new} new on {cached} cached (hit {hit})", statistics.median(times),
                             cached + new - hit, hit, chunk_tokens=self.plan.chunk_tokens, source="measured"))

    async def decode(self, batch: int, context: int) -> Measurement:
        """One decode step of the batch: how much longer the batch takes to generate m tokens than
        one. Both runs are warm (only the last prompt block is recomputed) and time whole requests:
        a server may merge several tokens into one streamed chunk when its front end lags behind
        the engine (vLLM does), so chunk arrival times do not time single steps."""
        m = self.plan.decode_tokens
        steps = []
        for _ in range(self.plan.repeats):
            prompts = [self._prompt(context) for _ in range(batch)]
            await asyncio.gather(*(self._send(p, 1) for p in prompts))  # warm the prompts
            one = await asyncio.gather(*(self._send(p, 1) for p in prompts))
            many = await asyncio.gather(*(self._send(p, m) for p in prompts))
            total = lambda results: max(r.finish_s for r in results) - min(r.submitted_s for r in results)
            steps.append(self._s(total(many) - total(one)) / (m - 1))
        step_s = statistics.median(steps)
        if step_s <= 0:
            raise PreflightError(f"decode at batch {batch}, context {context}: generating {m} tokens took no "
                                 "longer than 1; raise decode_tokens")
        return decode_step(f"decode batch {batch} at {context}", step_s, batch, context + m // 2,
                           source="measured")

    async def queue(self, num_requests: int, new: int, cached: int) -> Measurement:
        out = self.plan.queue_output_tokens
        times, hits = [], []
        for _ in range(self.plan.repeats):
            prefix = self._prompt(cached)
            await self._send(prefix, 1)  # the shared prefix, cached
            results = await asyncio.gather(*(self._send(prefix + self._prompt(new), out)
                                             for _ in range(num_requests)))
            times.append(self._s(max(r.finish_s for r in results) - min(r.submitted_s for r in results)))
            hits.append(statistics.median(r.cached_tokens for r in results))
        hit = int(statistics.median(hits))
        return queue_drain(f"queue of {num_requests}: {new} new on {cached} cached (hit {hit}), {out} out",
                           statistics.median(times), num_requests, cached + new - hit, hit, out,
                           chunk_tokens=self.plan.chunk_tokens, source="measured")

    async def run(self) -> list[Measurement]:
        rows = []
        for context in self.plan.cold_contexts:
            rows.append(await self.cold(context))
            self.log(f"  {rows[-1].label}: {rows[-1].seconds * 1e3:.1f} ms")
        for cached, new in self.plan.incremental:
            rows.append(await self.incremental(cached, new))
            self.log(f"  {rows[-1].label}: {rows[-1].seconds * 1e3:.1f} ms")
        for batch, context in self.plan.decode:
            rows.append(await self.decode(batch, context))
            self.log(f"  {rows[-1].label}: {rows[-1].seconds * 1e3:.2f} ms/step")
        for num_requests, new, cached in self.plan.queues:
            rows.append(await self.queue(num_requests, new, cached))
            self.log(f"  {rows[-1].label}: {rows[-1].seconds:.2f} s")
        return rows


async def calibrate(client: OpenAIEngineClient, plan: CalibrationPlan, name: str, time_scale: float = 1.0,
                    log: Callable[[str], None] = lambda msg: None) -> CalibrationResult:
    info = await client.preflight(plan.largest_context())
    log(f"calibrating {client.base} ({info['model']}, pool {info['pool_tokens']} tokens)")
    rows = await Calibrator(client, plan, time_scale, log=log).run()
    scraped = client.last_metrics
    return CalibrationResult(fit_cost_model(rows, name=name, fit_request_overhead=True), info["pool_tokens"],
                             scraped.block_size if scraped else None, rows)


@dataclass
class CostCheck:
    """A cost model's predictions of measured rows: is the twin built on it still true?"""

    model_name: str
    rows: list[dict]
    median_ratio: float  # measured / predicted: 2.0 means the engine takes twice what the model says

    def table(self) -> str:
        lines = [f"checking {self.model_name}:", f"{'measurement':62s} {'measured s':>10s} {'predicted s':>11s} "
                                                 f"{'ratio':>6s}"]
        for r in self.rows:
            lines.append(f"{r['label'][:62]:62s} {r['measured_s']:10.4f} {r['predicted_s']:11.4f} {r['ratio']:6.2f}")
        lines.append(f"median ratio {self.median_ratio:.2f} (measured / predicted)")
        return "\n".join(lines)


def check_cost_model(model: StepCostModel, measurements: list[Measurement], request_overhead_s: float) -> CostCheck:
    """Predict each measurement with ``model``; the request round trips inside a row are charged
    what this calibration measured them at, so only the engine's steps are judged."""
    rows = []
    for m in measurements:
        predicted = model.predict(m) + request_overhead_s * m.num_requests
        rows.append({"label": m.label, "measured_s": m.seconds, "predicted_s": predicted,
                     "ratio": m.seconds / predicted})
    return CostCheck(model.name, rows, statistics.median(r["ratio"] for r in rows))


def host_description() -> dict:
    """The machine the calibration ran from (the engine's own, for a local endpoint): a CPU
    engine's step costs belong to its host, and virtual machines of one name differ."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "num_cpus": os.cpu_count(), "platform": platform.platform()}
