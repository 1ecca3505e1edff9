"""Time the batch compositions of a collapsed engine on a real server, beside a step-cost model.

A collapsed engine serves turns that miss most of their context, with a few requests running and
hundreds waiting. Which of these makes a turn cost more than the step model says? Each
experiment sends the same kind of turn (a shared 2,000-token system prompt, cached, then NEW
fresh tokens, 8 output tokens) in one arrangement, and reports seconds per turn in steady state
(the middle 60% of completions) beside the model's prediction, with the server's own timing
from vLLM's /metrics (per-request prefill, queue and decode time, tokens per step):

    sequential        one turn at a time: isolated prefills, as `loadgen calibrate` times them
    concurrency-N     N turns in flight: steps mix one request's prefill chunk with others' decodes
    queue-N           N turns sent at once: N-1 waiting, N open streams to the API server
    busy              sequential, with a CPU-bound process beside the server (front-end contention)
    cold-L            one turn at a time, L fresh tokens and no shared prefix

    python benchmarks/bench_compositions.py --endpoint http://127.0.0.1:8000 --cost-model cost.json \\
        --max-num-batched-tokens 2048 sequential concurrency-4 queue-100 busy cold-8000

A model fitted minutes before on the same server (`loadgen calibrate`) predicts every
arrangement; docs/cpu-vllm.md#the-twin-after-a-collapse has the figures for the CPU vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient
from loadgen.sim.cost import StepCostModel, prefill, preset_or_file, queue_drain

SYSTEM_TOKENS = 2000
OUTPUT_TOKENS = 8
VLLM_TIMINGS = ["vllm:request_prefill_time_seconds", "vllm:request_queue_time_seconds",
                "vllm:request_decode_time_seconds", "vllm:iteration_tokens_total"]


def scrape(url: str) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    out = {}
    for name in VLLM_TIMINGS:
        for suffix in ("_sum", "_count"):
            m = re.search(rf"^{re.escape(name + suffix)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)", text, re.M)
            if m:
                out[name + suffix] = float(m.group(1))
    return out


def server_means(before: dict, after: dict) -> dict[str, float]:
    means = {}
    for name in VLLM_TIMINGS:
        count = after.get(name + "_count", 0) - before.get(name + "_count", 0)
        if count:
            means[name.split(":")[1]] = round((after[name + "_sum"] - before.get(name + "_sum", 0)) / count, 4)
    return means


class Bench:
    def __init__(self, url: str, model: StepCostModel, chunk_tokens: int, new_tokens: int) -> None:
        self.url = url
        self.model = model
        self.chunk_tokens = chunk_tokens
        self.new_tokens = new_tokens
        self.rng = np.random.default_rng(7)
        self.system = self.rng.integers(1, 29000, size=SYSTEM_TOKENS).tolist()
        self.client = OpenAIEngineClient(WallClock(), EndpointOptions(url=url))
        self._ids = 0

    async def turn(self, new: int, shared: bool = True):
        ids = (self.system if shared else []) + self.rng.integers(1, 29000, size=new).tolist()
        self._ids += 1
        r = await self.client.generate(TurnRequest(-1, self._ids, len(ids), OUTPUT_TOKENS, token_ids=ids))
        if r.error:
            raise SystemExit(f"request failed: {r.error}")
        return r

    async def run(self, name: str, num_turns: int, concurrency: int, new: int, shared: bool = True) -> dict:
        await self.turn(16)  # the system prompt, cached
        before = scrape(self.url)
        gate = asyncio.Semaphore(concurrency)

        async def one():
            async with gate:
                return await self.turn(new, shared)

        results = await asyncio.gather(*(one() for _ in range(num_turns)))
        after = scrape(self.url)
        finish = sorted(r.finish_s for r in results)
        lo, hi = num_turns // 5, num_turns - num_turns // 5
        per_turn_s = (finish[hi - 1] - finish[lo - 1]) / (hi - lo)
        hit = int(statistics.median(r.cached_tokens for r in results))
        context = (SYSTEM_TOKENS if shared else 0) + new
        if concurrency == 1:
            row = prefill("", 0, context - hit, hit, chunk_tokens=self.chunk_tokens)
            predicted = self.model.predict(row) + sum(
                self.model.step_time(1, 0, context + k) for k in range(1, OUTPUT_TOKENS))
        else:  # a drained queue, per turn
            row = queue_drain("", 0, num_turns, context - hit, hit, OUTPUT_TOKENS, chunk_tokens=self.chunk_tokens)
            predicted = self.model.predict(row) / num_turns
        return {"experiment": name, "turns": num_turns, "new_tokens": new, "hit_tokens": hit,
                "measured_s_per_turn": round(per_turn_s, 4), "model_s_per_turn": round(predicted, 4),
                "ratio": round(per_turn_s / predicted, 2), "server": server_means(before, after)}

    async def experiment(self, name: str) -> dict:
        new = self.new_tokens
        if name == "sequential":
            return await self.run(name, 12, 1, new)
        if name.startswith("concurrency-"):
            n = int(name.split("-")[1])
            return await self.run(name, 6 * n, n, new)
        if name.startswith("queue-"):
            n = int(name.split("-")[1])
            return await self.run(name, n, n, new)
        if name.startswith("cold-"):
            return await self.run(name, 8, 1, int(name.split("-")[1]), shared=False)
        if name == "busy":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                return await self.run(name, 12, 1, new)
            finally:
                hog.kill()
        raise SystemExit(f"unknown experiment {name!r}: sequential, concurrency-N, queue-N, busy, cold-L")


async def main(args) -> None:
    model = preset_or_file(args.cost_model)
    bench = Bench(args.endpoint.rstrip("/"), model, args.max_num_batched_tokens, args.new_tokens)
    try:
        await bench.client.preflight(SYSTEM_TOKENS + args.new_tokens + OUTPUT_TOKENS)
        for _ in range(3):  # the first requests after a start are slow
            await bench.turn(2000)
        for name in args.experiments:
            t0 = time.perf_counter()
            print(json.dumps({**await bench.experiment(name), "wall_s": round(time.perf_counter() - t0, 1)}),
                  flush=True)
    finally:
        await bench.client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--cost-model", required=True, help="a preset or the cost.json of `loadgen calibrate`")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=6000, help="fresh tokens per turn after the system prompt")
    parser.add_argument("experiments", nargs="+")
    asyncio.run(main(parser.parse_args()))
