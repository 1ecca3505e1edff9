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
  time until the last finishes is one row whose features replay the scheduler's steps;
* loaded queues (``--loaded``): a queue whose prefills take many steps while the requests
  admitted first decode beside them; with them the fit has the mixed-step decode term.

Every measurement is repeated (the median kept, every repeat reported) on prompts drawn fresh
from the calibration's seed, after the server's prefix cache is emptied, and every request is
checked against the server's own cached-token count: a row that does not measure what it says
is measured again, then refused. Pool size and block size come from the server's /metrics.
The result is a ``cost.json`` that a spec takes as ``engine.cost_model``; intervals, noise and
``--check`` are loadgen/live/calibration_stats.py's.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from ..core.engines import TurnRequest, TurnResult
from ..core.lateness import LatenessHistogram
from ..core.workload import Stream, rng_for
from .calibration_stats import fits_mixed_term
from .http_client import OpenAIEngineClient, PreflightError
from ..sim.cost import FitResult, Measurement, StepCostModel, decode_step, fit_cost_model, prefill, queue_drain

# a row whose repeats spread wider than this (half their range over their median) is noisy
NOISY_SPREAD = 0.15
# a row the server's cached-token counts contradict is measured again this many times, then refused
MAX_REMEASURES = 2


class CalibrationRefused(PreflightError):
    """The server's own counts say a row does not measure what it claims."""


def _ttft(m: Measurement) -> Measurement:
    """A time-to-first-token row: one request round trip is inside the measured time."""
    return replace(m, num_requests=1.0)


def queue_label(num_requests: int, new: int, cached: int, loaded: bool = False) -> str:
    return (f"{'loaded queue' if loaded else 'queue'} of {num_requests}: "
            f"{f'{new} new on {cached} cached' if cached else f'{new} new, cold'}")


@dataclass(frozen=True)
class CalibrationPlan:
    cold_contexts: tuple[int, ...] = (16, 1000, 2000, 4000, 8000, 12000, 16000)
    # (cached, new): small additions on long cached contexts pin the attention term b (b * new *
    # cached outweighs a * new once cached > a / b, ~17K tokens on the 8B preset)
    incremental: tuple[tuple[int, int], ...] = ((2000, 1000), (6000, 500), (12000, 1000), (16000, 250))
    # (batch, context): the last two put ~72K tokens of context in one step, so that the decode
    # attention term g carries more of a row than the step's overhead t0 even where g is small
    # (the tiny CPU model's ~0.1 us per token); two, so that a resample of the class keeps one
    decode: tuple[tuple[int, int], ...] = ((1, 1000), (1, 8000), (4, 2000), (8, 4000), (16, 1000), (12, 6000),
                                           (6, 12000))
    decode_tokens: int = 64
    # (requests, new tokens each, cached shared prefix): queues a collapsed engine works through;
    # then short cold prompts filling whole steps, mostly per-token cost a: where a long
    # prefill's attention outweighs a (past a / b tokens, ~200 on the tiny CPU model) no other
    # row separates a from b. No more than 16 requests: the server's front end admits them one
    # by one (~3 ms each on the CPU vLLM), and 64 at once read twice the modelled time
    queues: tuple[tuple[int, int, int], ...] = ((16, 2000, 2000), (12, 6000, 2000), (8, 1024, 0), (16, 512, 0),
                                                (16, 256, 0))
    queue_output_tokens: int = 8
    # (requests, new tokens each, cached shared prefix): queues whose prefills take many steps
    # while the first admitted decode beside them over a long context, the steps of a loaded
    # engine; they pin the mixed-step decode term (cost.py), which only such steps pay. None by
    # default (`loadgen calibrate --loaded` adds ``loaded_queue(chunk_tokens)``)
    loaded_queues: tuple[tuple[int, int, int], ...] = ()
    loaded_output_tokens: int = 32
    repeats: int = 3
    chunk_tokens: int = 8192  # the server's max_num_batched_tokens

    @staticmethod
    def loaded_queue(chunk_tokens: int) -> tuple[int, int, int]:
        """Prefills of 512 tokens on a cached 12,000-token prefix, 16 steps' worth: the decodes
        admitted first ride beside the rest, ~10% of the row's time when the term is g (the 8B
        preset at 8192 tokens a step, the CPU preset at 2048)."""
        return (16 * chunk_tokens // 512, 512, 12_000)

    # Each row's features as the fit sees them, from what was measured (``seconds``) and the
    # cached tokens the server reported (``hit``).
    def cold_row(self, context: int, seconds: float) -> Measurement:
        return _ttft(prefill(f"cold prefill {context}", seconds, context, chunk_tokens=self.chunk_tokens,
                             source="measured"))

    def incremental_row(self, cached: int, new: int, hit: int, seconds: float) -> Measurement:
        return _ttft(prefill(f"{new} new on {cached} cached (hit {hit})", seconds, cached + new - hit, hit,
                             chunk_tokens=self.chunk_tokens, source="measured"))

    def decode_row(self, batch: int, context: int, step_s: float) -> Measurement:
        return decode_step(f"decode batch {batch} at {context}", step_s, batch, context + self.decode_tokens // 2,
                           source="measured")

    def queue_row(self, num_requests: int, new: int, cached: int, hit: int, seconds: float,
              loaded: bool = False) -> Measurement:
        out = self.loaded_output_tokens if loaded else self.queue_output_tokens
        return queue_drain(f"{queue_label(num_requests, new, cached, loaded)} (hit {hit}), {out} out", seconds,
                           num_requests, cached + new - hit, hit, out, chunk_tokens=self.chunk_tokens,
                           source="measured")

    def expected_rows(self, block_size: int) -> list[tuple[str, Measurement]]:
        """(kind, features) of every row, before any is measured: the hits a server of
        ``block_size``-token blocks reports (whole blocks) and 0 seconds. Which rows carry which
        coefficient, and so whether the plan can pin each down, shows here."""
        hit = lambda cached: cached - cached % block_size
        return [*(("cold", self.cold_row(c, 0.0)) for c in self.cold_contexts),
                *(("incremental", self.incremental_row(c, n, hit(c), 0.0)) for c, n in self.incremental),
                *(("decode", self.decode_row(b, c, 0.0)) for b, c in self.decode),
                *(("queue", self.queue_row(q, n, c, hit(c), 0.0)) for q, n, c in self.queues),
                *(("loaded", self.queue_row(q, n, c, hit(c), 0.0, loaded=True)) for q, n, c in self.loaded_queues)]

    def largest_context(self) -> int:
        return max([*self.cold_contexts, *(c + n for c, n in self.incremental),
                    *(c + self.decode_tokens for _, c in self.decode),
                    *(c + n + self.queue_output_tokens for _, n, c in self.queues),
                    *(c + n + self.loaded_output_tokens for _, n, c in self.loaded_queues)])


@dataclass
class CalibrationRow:
    """One measured row: its median as the fit's ``Measurement``, every repeat, and its class
    (cold, incremental, decode, queue), which ``--check`` judges apart."""

    measurement: Measurement
    kind: str
    samples: list[float]
    remeasured: int = 0  # attempts the server's counts rejected before this one

    def to_json(self) -> dict:
        m = self.measurement
        return {"label": m.label, "kind": self.kind, "seconds": m.seconds, "samples": self.samples,
                "spread": self.spread, "features": {"num_steps": m.num_steps, "num_tokens": m.num_tokens,
                                                    "attention_tokens2": m.attention_tokens2,
                                                    "decode_context_tokens": m.decode_context_tokens,
                                                    "mixed_decode_context_tokens": m.mixed_decode_context_tokens,
                                                    "num_requests": m.num_requests}}

    @classmethod
    def from_json(cls, data: dict) -> "CalibrationRow":
        """A row of a .fit.json: ``--check`` and the intervals can be redone from the file."""
        return cls(Measurement(data["label"], data["seconds"], source="measured", **data["features"]),
                   data["kind"], list(data["samples"]))

    @property
    def spread(self) -> float:
        """Half the repeats' range over their median: how far one repeat may sit from the row."""
        return _spread(self.samples)


def _spread(samples: list[float]) -> float:
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / (2 * med) if med > 0 and len(samples) > 1 else 0.0


@dataclass
class CalibrationResult:
    fit: FitResult
    pool_tokens: Optional[int]
    block_size: Optional[int]
    measurements: list[Measurement] = field(default_factory=list)
    rows: list[CalibrationRow] = field(default_factory=list)
    seed: int = 0
    cache_reset: str = ""  # how the prefix cache was emptied first, or why it could not be
    remeasures: list[str] = field(default_factory=list)  # the rows measured again, and why
    lateness: dict = field(default_factory=dict)  # this process's own timer lateness during the calibration


class Calibrator:
    def __init__(self, client: OpenAIEngineClient, plan: CalibrationPlan, time_scale: float = 1.0,
                 seed: int = 0, block_size: Optional[int] = None,
                 log: Callable[[str], None] = lambda msg: None) -> None:
        self.client = client
        self.plan = plan
        self.time_scale = time_scale  # a scaled serve-sim runs time_scale x faster than the wall clock
        self.rng = rng_for(Stream.CALIBRATION_PROMPTS, seed)  # never a run's token ids
        # how far below a cached prefix the server's count may fall: it hits whole blocks only
        self.block_size = block_size or 1
        self.log = log
        self._ids = 0
        self.remeasures: list[str] = []

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

    def _hit_problem(self, what: str, results: list[TurnResult], expected: int) -> Optional[str]:
        """Why the server's cached-token counts contradict the row (None: they agree): a cold
        prompt must hit nothing, a cached prefix of ``expected`` tokens all its whole blocks."""
        low = max(0, expected - self.block_size) if expected else 0
        bad = [r.cached_tokens for r in results if not low <= r.cached_tokens <= expected]
        if not bad:
            return None
        return (f"{what}: the server reports {bad[0]} cached tokens where {expected} were expected "
                f"({'a cold prompt hits nothing' if not expected else 'the prefix sent just before'})")

    async def _repeat(self, label: str, attempt) -> list[tuple]:
        """``attempt()`` -> (seconds, hits, problem or None), ``plan.repeats`` times, and up to as
        many again while the repeats spread wider than NOISY_SPREAD (a median needs more of them
        then); an attempt the server's counts contradict is made again with fresh prompts, then
        the row is refused."""
        out = []
        while len(out) < self.plan.repeats or (len(out) < 2 * self.plan.repeats
                                                and _spread([x[0] for x in out]) > NOISY_SPREAD):
            for tries in range(MAX_REMEASURES + 1):
                seconds, hit, problem = await attempt()
                if problem is None:
                    out.append((seconds, hit, tries))
                    break
                self.remeasures.append(problem)
                self.log(f"  {problem}: measured again with fresh prompts")
            else:
                raise CalibrationRefused(f"{label}: {problem}, {MAX_REMEASURES + 1} times; this row does not "
                                         "measure what it says (a server caching across requests it should not, "
                                         "or not reporting its cached tokens)")
        return out

    @staticmethod
    def _row(m: Measurement, kind: str, measured: list[tuple], scale: float = 1.0) -> CalibrationRow:
        return CalibrationRow(m, kind, [x[0] * scale for x in measured], sum(x[2] for x in measured))

    async def cold(self, context: int) -> CalibrationRow:
        async def attempt():
            r = await self._send(self._prompt(context), 1)
            return self._s(r.first_token_s - r.submitted_s), 0, self._hit_problem(f"cold prefill {context}", [r], 0)

        measured = await self._repeat(f"cold prefill {context}", attempt)
        return self._row(self.plan.cold_row(context, statistics.median(x[0] for x in measured)), "cold", measured)

    async def incremental(self, cached: int, new: int) -> CalibrationRow:
        async def attempt():
            base = self._prompt(cached)
            first = await self._send(base, 1)
            r = await self._send(base + self._prompt(new), 1)
            problem = (self._hit_problem(f"the base of {new} new on {cached}", [first], 0)
                       or self._hit_problem(f"{new} new on {cached} cached", [r], cached))
            return self._s(r.first_token_s - r.submitted_s), r.cached_tokens, problem

        measured = await self._repeat(f"{new} new on {cached} cached", attempt)
        hit = int(statistics.median(x[1] for x in measured))
        m = self.plan.incremental_row(cached, new, hit, statistics.median(x[0] for x in measured))
        return self._row(m, "incremental", measured)

    async def decode(self, batch: int, context: int) -> CalibrationRow:
        """One decode step of the batch: how much longer the batch takes to generate m tokens than
        one. Both runs are warm (only the last prompt block is recomputed) and time whole requests:
        a server may merge several tokens into one streamed chunk when its front end lags behind
        the engine (vLLM does), so chunk arrival times do not time single steps."""
        m = self.plan.decode_tokens
        label = f"decode batch {batch} at {context}"

        async def attempt():
            prompts = [self._prompt(context) for _ in range(batch)]
            await asyncio.gather(*(self._send(p, 1) for p in prompts))  # warm the prompts
            one = await asyncio.gather(*(self._send(p, 1) for p in prompts))
            many = await asyncio.gather(*(self._send(p, m) for p in prompts))
            total = lambda results: max(r.finish_s for r in results) - min(r.submitted_s for r in results)
            # each prompt was just cached: all of it but the block of its last token hits
            problem = self._hit_problem(label, [*one, *many], context - 1)
            return self._s(total(many) - total(one)) / (m - 1), 0, problem

        measured = await self._repeat(label, attempt)
        step_s = statistics.median(x[0] for x in measured)
        if step_s <= 0:
            raise PreflightError(f"decode at batch {batch}, context {context}: generating {m} tokens took no "
                                 "longer than 1; raise decode_tokens")
        return self._row(self.plan.decode_row(batch, context, step_s), "decode", measured)

    async def queue(self, num_requests: int, new: int, cached: int, loaded: bool = False) -> CalibrationRow:
        """A queue drained at once; ``loaded``: one of the plan's loaded queues (kind "loaded")."""
        out = self.plan.loaded_output_tokens if loaded else self.plan.queue_output_tokens
        label = queue_label(num_requests, new, cached, loaded)

        async def attempt():
            prefix = self._prompt(cached)
            if cached:
                await self._send(prefix, 1)  # the shared prefix, cached
            results = await asyncio.gather(*(self._send(prefix + self._prompt(new), out)
                                             for _ in range(num_requests)))
            seconds = self._s(max(r.finish_s for r in results) - min(r.submitted_s for r in results))
            return seconds, statistics.median(r.cached_tokens for r in results), self._hit_problem(label, results, cached)

        measured = await self._repeat(label, attempt)
        hit = int(statistics.median(x[1] for x in measured))
        m = self.plan.queue_row(num_requests, new, cached, hit, statistics.median(x[0] for x in measured), loaded)
        return self._row(m, "loaded" if loaded else "queue", measured)

    async def run(self) -> list[CalibrationRow]:
        rows = []

        def logged(row: CalibrationRow, unit: str, scale: float, digits: int) -> None:
            rows.append(row)
            self.log(f"  {row.measurement.label}: {row.measurement.seconds * scale:.{digits}f} {unit} "
                     f"(repeats within {100 * row.spread:.0f}%)")

        for context in self.plan.cold_contexts:
            logged(await self.cold(context), "ms", 1e3, 1)
        for cached, new in self.plan.incremental:
            logged(await self.incremental(cached, new), "ms", 1e3, 1)
        for batch, context in self.plan.decode:
            logged(await self.decode(batch, context), "ms/step", 1e3, 2)
        for num_requests, new, cached in self.plan.queues:
            logged(await self.queue(num_requests, new, cached), "s", 1, 2)
        for num_requests, new, cached in self.plan.loaded_queues:
            logged(await self.queue(num_requests, new, cached, loaded=True), "s", 1, 2)
        return rows


async def _watch_lateness(clock, stop: asyncio.Event, lateness: LatenessHistogram, period_s: float = 0.01) -> None:
    """Sleep in short steps while the calibration runs, recording how late each wake-up came: a
    busy machine delays this process's timers as it delays the server's steps (``run`` flags a
    run the same way)."""
    while not stop.is_set():
        start = clock.now()
        await clock.sleep(period_s)
        lateness.record(clock.now() - start - period_s)


async def reset_prefix_cache(client: OpenAIEngineClient) -> str:
    """Empty the server's prefix cache first (vLLM's /reset_prefix_cache, SGLang's /flush_cache):
    what was done, or why it could not be (fresh prompts then keep the cold rows cold)."""
    try:
        await client.flush_async()
        return "reset" if client.server != "sglang" else "flushed"
    except PreflightError as exc:
        return f"not reset: {exc}"


async def calibrate(client: OpenAIEngineClient, plan: CalibrationPlan, name: str, time_scale: float = 1.0,
                    log: Callable[[str], None] = lambda msg: None, seed: int = 0,
                    reset_cache: bool = True) -> CalibrationResult:
    # its clock is unscaled (measured seconds are scaled here): the server's scale is checked against time_scale
    info = await client.preflight(plan.largest_context(), time_scale=time_scale)
    log(f"calibrating {client.base} ({info['model']}, pool {info['pool_tokens']} tokens, prompts of seed {seed})")
    cache_reset = await reset_prefix_cache(client) if reset_cache else "not asked"
    if cache_reset.startswith("not reset"):
        log(f"  the prefix cache was {cache_reset}")
    calibrator = Calibrator(client, plan, time_scale, seed=seed, block_size=info.get("block_size"), log=log)
    stop, lateness = asyncio.Event(), LatenessHistogram()
    watcher = asyncio.ensure_future(_watch_lateness(client.clock, stop, lateness))
    try:
        rows = await calibrator.run()
    finally:
        stop.set()
        await watcher
    scraped = client.last_metrics
    measurements = [r.measurement for r in rows]
    fit = fit_cost_model(measurements, name=name, fit_request_overhead=True, fit_mixed=fits_mixed_term(rows))
    if client.server in ("vllm", "sglang"):  # the engine the constants belong to, in the cost.json
        fit.model = replace(fit.model, flavor=client.server)
    if client.server == "sglang":
        log("  an SGLang server: its measured steps already leave out what its overlap schedule hides "
            "(hidden_cpu_s 0 in this model; calibrate with --disable-overlap-schedule to see the difference)")
    return CalibrationResult(fit, info["pool_tokens"],
                             scraped.block_size if scraped else info.get("block_size"), measurements, rows, seed,
                             cache_reset, calibrator.remeasures, lateness.summary())


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
