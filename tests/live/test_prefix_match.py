"""serve-sim's block-hash matching (loadgen/sim/prefix_match.py): the simulated engine, fed any
token prompts through the matcher, reports the cached tokens vLLM's block pool gives them.

The reference is tests/sim/reference_engine.py with real token ids as the tokens' identities: its
hits come from chained block hashes, block by block, as vLLM's do."""

from __future__ import annotations

import math
import random

import pytest

from loadgen.sim.prefix_match import BlockHashMatcher, TokenMatcher
from loadgen.sim.engine import EngineConfig, SimEngine
from loadgen.sim.request import SimRequest
from loadgen.sim.radix_chains import ChainRadixCache
from loadgen.sim.sglang_engine import SGLangConfig, SGLangEngine

from ..sim.conftest import COST
from ..sim.reference_engine import ReferenceEngine
from ..sim.reference_sglang import ReferenceSGLang, RReq


class TokenReference(ReferenceEngine):
    """The literal vLLM engine, every token named by its id (``context``: prompt + output ids)."""

    def _token(self, req: SimRequest, pos: int) -> tuple:
        return ("id", req.context[pos])


class TokenReferenceSGLang(ReferenceSGLang):
    """The literal SGLang engine (a radix tree of token lists), every token its id."""

    def submit(self, req: SimRequest, now: float) -> None:
        self.advance_to(now)
        req.arrival_s = now
        self.prompt_tokens_total += req.num_prompt_tokens
        r = RReq(req, lambda p, ids=req.context: ids[p])
        self.all[req] = r
        self.waiting.append(r)
        if self.inflight_end is None:
            self.next_start = now
            self.advance_to(now)


def fuzzed_prompts(seed: int, num_requests: int, gap_s: float, max_context: int, burst: int = 1) -> list[tuple]:
    """(submit time, prompt ids, output ids): new prompts, sessions extending an earlier prompt and
    its output, exact repeats, branches cut anywhere (not only at block edges), and prompts that
    share one system prompt. Requests come in bursts of up to ``burst``, a few milliseconds apart,
    ``gap_s`` between bursts; a request builds only on what a client has seen: the prompts of its
    burst, the prompts and outputs of earlier bursts (which have finished by then)."""
    rng = random.Random(seed)
    system = [rng.randrange(1, 50_000) for _ in range(rng.randrange(20, 90))]
    out, t = [], 0.0
    seen, pending = [], []  # contents a client can build on; this burst's prompts, seen after it

    def fresh(n):
        return [rng.randrange(1, 50_000) for _ in range(n)]

    while len(out) < num_requests:
        t += gap_s
        burst_outputs = []
        for _ in range(rng.randrange(1, burst + 1)):
            pool = seen + pending
            op = rng.choice(("new", "extend", "extend", "repeat", "branch", "branch", "shared")) if pool else "new"
            if op == "new":
                prompt = fresh(rng.randrange(1, 200))
            elif op == "extend":
                prompt = rng.choice(pool) + fresh(rng.randrange(1, 80))
            elif op == "repeat":
                prompt = list(rng.choice(pool))
            elif op == "branch":
                base = rng.choice(pool)
                prompt = base[:rng.randrange(1, len(base) + 1)] + fresh(rng.randrange(0, 60))
            else:
                prompt = system + fresh(rng.randrange(1, 120))
            prompt = prompt[-max_context:] or fresh(5)
            output = fresh(rng.randrange(1, 12))
            out.append((t, prompt, output))
            pending.append(prompt)
            burst_outputs.append(prompt + output)
            t += rng.uniform(0, 0.004)
        seen += burst_outputs + pending
        pending = []
    return out[:num_requests]


def run(engine_cls, plan, **knobs):
    sglang = engine_cls in (SGLangEngine, TokenReferenceSGLang)
    engine = engine_cls((SGLangConfig if sglang else EngineConfig)(**knobs), COST)
    matcher = BlockHashMatcher(engine, knobs["block_size"]) if engine_cls is SimEngine else None
    tokens = TokenMatcher(knobs.get("page_size", 1)) if engine_cls is SGLangEngine else None
    if tokens is not None:
        engine.tree = ChainRadixCache(engine.config.page_size)
    requests = []
    for i, (t, prompt, output) in enumerate(plan):
        engine.advance_to(t)
        content = prompt + output
        if tokens is not None:
            chain = tokens.place(prompt)
            req = SimRequest(i, engine.stream(chain, 0), len(prompt), len(output),
                             on_done=lambda r, ch=chain, c=content: tokens.finished(ch, c[:-1]))
        elif matcher is not None:
            placement = matcher.place(prompt)
            req = SimRequest(i, placement.stream, len(prompt), len(output), prefix=placement.prefix,
                             on_done=lambda r, p=placement, c=content: matcher.finished(p, c[:-1]))
        else:
            req = SimRequest(i, engine.stream(("request", i)), len(prompt), len(output), context=content)
        engine.submit(req, t)
        requests.append(req)
    while (wake := engine.next_wakeup()) is not None:
        engine.advance_to(wake)
    assert all(r.finish_s is not None for r in requests)
    return [r.num_cached_tokens for r in requests], engine


def test_the_issue_example_hits_what_vllm_hits():
    """base, base + new, base + new2, base, base[:1000] + other at block size 16, one at a time."""
    rng = random.Random(1)
    ids = lambda n: [rng.randrange(1, 50_000) for _ in range(n)]
    base = ids(2000)
    prompts = [base, base + ids(300), base + ids(300), base, base[:1000] + ids(500)]
    plan = [(10.0 * i, p, ids(4)) for i, p in enumerate(prompts)]
    knobs = dict(num_blocks=4096, block_size=16, max_num_batched_tokens=2048, max_model_len=4000)
    fast, _ = run(SimEngine, plan, **knobs)
    ref, _ = run(TokenReference, plan, **knobs)
    assert fast == ref == [0, 2000, 2000, 1984, 992]


@pytest.mark.parametrize("seed", range(12))
def test_one_request_at_a_time_hits_exactly_what_vllm_hits_even_under_eviction(seed):
    """Requests far apart (each finished before the next): every hit equals the reference's, in
    pools from roomy to a few prompts' worth (eviction in LRU order, trimmed from the tail)."""
    rng = random.Random(seed)
    block_size = rng.choice((4, 16))
    num_blocks = rng.choice((64, 160, 2000))
    max_context = min(400, (num_blocks - 2) * block_size - 20)
    plan = fuzzed_prompts(seed, 60, gap_s=50.0, max_context=max_context)
    knobs = dict(num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=rng.choice((64, 256)),
                 max_model_len=max_context + 20)
    fast, engine = run(SimEngine, plan, **knobs)
    ref, reference = run(TokenReference, plan, **knobs)
    assert fast == ref
    assert engine.pool.num_free == len(reference.free_queue)
    assert sum(fast) > 0


@pytest.mark.parametrize("seed", range(8))
def test_overlapping_requests_hit_what_vllm_hits(seed):
    """Bursts of requests at once (sub-agents forked from one context, a retry while the first
    try runs): a prompt that runs into content other requests hold or are still computing hits
    what vLLM's pool has cached by its admission, in roomy and in tight pools."""
    plan = fuzzed_prompts(100 + seed, 80, gap_s=30.0, max_context=400, burst=6)
    knobs = dict(num_blocks=(4000, 200)[seed % 2], block_size=16, max_num_batched_tokens=256, max_model_len=420)
    fast, _ = run(SimEngine, plan, **knobs)
    ref, _ = run(TokenReference, plan, **knobs)
    assert fast == ref


@pytest.mark.parametrize("flavor,hits", [("vllm", [0, 2000, 2000, 1984, 992]),
                                         ("sglang", [0, 2000, 2000, 1999, 1000])])
def test_serve_sim_reports_the_hits_the_engine_reports_for_retried_edited_and_forked_prompts(
        serve_sim_factory, flavor, hits):
    """The issue's example over HTTP, one token-id prompt at a time: vLLM hits whole 16-token blocks
    (a repeated prompt recomputes its last block), SGLang every token (but the last)."""
    from loadgen.core.clock import WallClock
    from loadgen.core.engines import TurnRequest
    from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient

    server = serve_sim_factory(30.0, "--flavor", flavor)
    rng = random.Random(2)
    ids = lambda n: [rng.randrange(1, 29_000) for _ in range(n)]
    base = ids(2000)
    prompts = [base, base + ids(300), base + ids(300), base, base[:1000] + ids(500)]

    async def go():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=server.url, model="sim"))
        try:
            return [await client.generate(TurnRequest(1, i, len(p), 2, token_ids=p)) for i, p in enumerate(prompts)]
        finally:
            await client.close()

    import asyncio

    results = asyncio.run(go())
    assert [r.error for r in results] == [None] * 5
    assert [r.cached_tokens for r in results] == hits


@pytest.mark.parametrize("seed", range(10))
def test_sglang_flavour_hits_what_sglangs_radix_cache_hits(seed):
    """Token-granular matching against the literal SGLang radix tree of token lists: one request at
    a time and in bursts, roomy pools and pools that evict, page sizes 1 and 4."""
    rng = random.Random(seed)
    burst = rng.choice((1, 6))
    plan = fuzzed_prompts(200 + seed, 60, gap_s=30.0, max_context=400, burst=burst)
    knobs = dict(pool_tokens=rng.choice((3000, 60_000)), page_size=rng.choice((1, 4)), chunked_prefill_size=256,
                 max_model_len=420)
    fast, _ = run(SGLangEngine, plan, **knobs)
    ref, _ = run(TokenReferenceSGLang, plan, **knobs)
    assert fast == ref
    assert sum(fast) > 0
