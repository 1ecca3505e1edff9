"""Differential test: the fast SimEngine against the slow, literal ReferenceEngine.

Both engines run the same closed-loop workload (sessions whose turn k+1 is submitted only after
turn k finished plus a think time), through the same tiny event loop. Every request must get
the same cached tokens, preemptions and generated tokens, the same first-token and finish times
(to 1e-9 relative), complete in the same order, and the engines must end with the same counters.

Workloads are drawn from a seed (``random_workload``) over block sizes 4 and 16, pools small
enough to force eviction and preemption, step budgets small enough to force chunked prefill,
small ``max_num_seqs``, both admission rules, prefix caching on and off, and an optional flush.
To replay a failure: ``run_workload(SimEngine, random_workload(seed))``.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Optional

import pytest

from loadgen.sim.cost import StepCostModel
from loadgen.sim.engine import SimEngine
from loadgen.sim.request import SimRequest

from .conftest import COST, make_engine, with_gpu_terms
from .reference_engine import ReferenceEngine


@dataclass
class SessionPlan:
    key: str
    prefix_key: Optional[str]
    base_tokens: int  # shared-prefix tokens at the start of every prompt (0 without a prefix)
    arrival_s: float
    prompts: list[int]  # prompt of each turn: previous prompt + previous output + growth
    outputs: list[int]
    thinks: list[float]  # pause after turn k before turn k + 1
    # turn k's first attempt is aborted this long after it was sent (the client hung up) unless
    # it finished by then, and sent again at once with the same prompt (the client's retry)
    abort_after_s: dict = field(default_factory=dict)


@dataclass
class Workload:
    knobs: dict
    sessions: list[SessionPlan]
    cost: StepCostModel = COST
    flush_at: Optional[float] = None

    def describe(self) -> str:
        lines = [f"knobs={self.knobs} flush_at={self.flush_at} cost={self.cost}"]
        for s in self.sessions:
            lines.append(f"  {s.key}: prefix={s.prefix_key}/{s.base_tokens} at {s.arrival_s:.4f} "
                         f"prompts={s.prompts} outputs={s.outputs} thinks={[round(x, 4) for x in s.thinks]}")
        return "\n".join(lines)


@dataclass
class RunResult:
    requests: dict = field(default_factory=dict)  # (session, turn) -> SimRequest
    completion_order: list = field(default_factory=list)
    first_token_order: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    flush_times_s: list = field(default_factory=list)
    copy_jobs: dict = field(default_factory=dict)  # the reference engine's host<->GPU copies per link


def make_session(key: str, prefix_key: Optional[str], base_tokens: int, arrival_s: float, initial: int,
                 outputs: list[int], growths: list[int], thinks: list[float]) -> SessionPlan:
    prompts = [initial]
    for out, grow in zip(outputs, growths):
        prompts.append(prompts[-1] + out + grow)
    return SessionPlan(key, prefix_key, base_tokens, arrival_s, prompts[:len(outputs)], outputs, thinks)


MAX_EVENTS = 200_000  # far above any seed's step count: a guard against an engine that stalls


def run_workload(cls, wl: Workload, check_invariants: bool = True) -> RunResult:
    """Drive ``cls`` with the closed-loop workload ``wl``; a tiny discrete-event loop."""
    engine = make_engine(cls, cost=wl.cost, **wl.knobs)
    res = RunResult()
    finished: list[SimRequest] = []

    def on_done(req: SimRequest) -> None:
        finished.append(req)
        res.completion_order.append(req.context)

    def on_first_token(req: SimRequest) -> None:
        assert req.finish_s is None
        res.first_token_order.append(req.context)

    seq = itertools.count()
    pending: list = []  # (submit time, seq, session index, turn)
    for i, s in enumerate(wl.sessions):
        heapq.heappush(pending, (s.arrival_s, next(seq), i, 0))
    flush_at = wl.flush_at
    aborts: list = []  # (abort time, seq, request)

    def drain(t: float) -> None:
        """Schedule the next turn of every session whose turn was just delivered."""
        for req in finished:
            i, k = req.context
            s = wl.sessions[i]
            assert req.finish_s == t, "a request was delivered before the clock reached its end"
            if k + 1 < len(s.prompts):
                heapq.heappush(pending, (req.finish_s + s.thinks[k], next(seq), i, k + 1))
        finished.clear()

    for _ in range(MAX_EVENTS):
        wake = engine.next_wakeup()
        t = min(pending[0][0] if pending else math.inf, math.inf if wake is None else wake,
                math.inf if flush_at is None else flush_at, aborts[0][0] if aborts else math.inf)
        if t == math.inf:
            break
        engine.advance_to(t)
        drain(t)
        if flush_at is not None and flush_at <= t:
            engine.flush(t)
            flush_at = None
            drain(t)
        while aborts and aborts[0][0] <= t:
            _, _, req = heapq.heappop(aborts)
            i, k = req.context
            aborted = engine.abort(req, t)
            drain(t)
            if aborted:
                res.requests[(i, k, "aborted")] = res.requests.pop((i, k))
                heapq.heappush(pending, (t, next(seq), i, k))
        while pending and pending[0][0] <= t:
            _, _, i, k = heapq.heappop(pending)
            s = wl.sessions[i]
            prefix = engine.prefix_stream(s.prefix_key, s.base_tokens) if s.prefix_key is not None else None
            stream = engine.stream(s.key, s.base_tokens)
            req = SimRequest((i, k), stream, s.prompts[k], s.outputs[k], prefix=prefix, on_done=on_done,
                             context=(i, k))
            req.on_first_token = on_first_token
            first_attempt = (i, k, "aborted") not in res.requests
            res.requests[(i, k)] = req
            engine.submit(req, t)
            if first_attempt and k in s.abort_after_s:
                heapq.heappush(aborts, (t + s.abort_after_s[k], next(seq), req))
            drain(t)  # a zero-cost engine can finish a request inside submit
        if check_invariants and isinstance(engine, ReferenceEngine):
            engine.check_invariants()
    else:
        raise AssertionError(f"{cls.__name__} still busy after {MAX_EVENTS} events: a request stopped progressing")
    assert engine.num_running == 0 and engine.num_waiting == 0
    assert engine.kv_usage() == 0.0
    res.counters = {name: getattr(engine, name) for name in (
        "prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "num_steps",
        "prompt_tokens_total", "generation_tokens_total", "external_prefix_cache_queries",
        "external_prefix_cache_hits", "kv_offload_bytes_gpu_to_cpu", "kv_offload_bytes_cpu_to_gpu")}
    res.flush_times_s = list(engine.flush_times_s)
    res.copy_jobs = getattr(engine, "copy_jobs", {})
    return res


def random_workload(seed: int, mixed_prefix_lengths: bool = False, with_aborts: bool = False) -> Workload:
    """A random closed-loop workload and engine configuration, all drawn from ``seed``.

    Every session naming a prefix key uses that key's one length (as the shipped synthetic
    sessions do); ``mixed_prefix_lengths`` gives each key two lengths (see the xfail below)."""
    rng = random.Random(seed)
    bs = rng.choice([4, 16])
    num_prefixes = rng.choice([0, 1, 1, 2])
    prefix_bases = {f"sys{j}": [rng.randint(bs, 5 * bs)] for j in range(num_prefixes)}
    if mixed_prefix_lengths:
        for bases in prefix_bases.values():
            bases.append(bases[0] + rng.randint(bs, 3 * bs))
    long_outputs = rng.random() < 0.3  # long decode stretches
    grid = rng.random() < 0.2  # arrivals on a coarse grid: several sessions arrive at once
    sessions = []
    for i in range(rng.randint(2, 12)):
        prefix_key = rng.choice(list(prefix_bases) + [None]) if prefix_bases else None
        base = rng.choice(prefix_bases[prefix_key]) if prefix_key is not None else 0
        turns = rng.randint(1, 6)
        arrival = rng.uniform(0.0, 0.3)
        if grid:
            arrival = round(arrival, 1)
        max_out = 20 * bs if long_outputs else 3 * bs
        sessions.append(make_session(
            f"s{i}", prefix_key, base, arrival, base + rng.randint(1, 6 * bs),
            [rng.randint(1, max_out) for _ in range(turns)],
            [rng.randint(0, 3 * bs) for _ in range(turns - 1)],
            [0.0 if rng.random() < 0.1 else rng.expovariate(1 / 0.03) for _ in range(turns - 1)]))
    biggest = max(-(-(s.prompts[-1] + s.outputs[-1]) // bs) for s in sessions)
    num_blocks = biggest + 1 + rng.choice([0, 1, 2, biggest // 2, biggest, 4 * biggest])
    max_num_seqs = rng.choice([1, 2, 3, 4, 8, 256])
    budget = max(max_num_seqs, rng.choice([bs, 2 * bs + 3, 7 * bs, 64, 4096]))
    knobs = dict(num_blocks=num_blocks, block_size=bs, max_num_batched_tokens=budget,
                 max_num_seqs=max_num_seqs, enable_prefix_caching=rng.random() < 0.8,
                 reserve_full_prompt=rng.random() < 0.5)
    u = rng.random()
    if u < 0.65:
        cost = COST
    elif u < 0.95:
        cost = StepCostModel(rng.uniform(1e-4, 1e-2), rng.uniform(0, 1e-4), rng.uniform(0, 1e-7),
                             rng.uniform(0, 1e-6), name="rnd")
    else:  # zero-cost steps (load-generator benchmarks): every step of a burst at one instant
        cost = StepCostModel(0.0, 0.0, 0.0, 0.0, name="zero")
    # the mixed-step decode term, from its own generator (the rest of the workload is seed's as before)
    mixed_rng = random.Random(f"mixed-steps/{seed}")
    if cost.name != "zero" and mixed_rng.random() < 0.5:
        cost = dataclasses.replace(cost, mixed_decode_s_per_token=mixed_rng.uniform(0.1, 3.0) * max(cost.g_s_per_token,
                                                                                                   1e-8))
    cost = with_gpu_terms(cost, seed)
    flush_at = rng.uniform(0.0, 0.4) if rng.random() < 0.3 else None
    if with_aborts:  # drawn from their own generator: the rest of the workload is seed's as before
        abort_rng = random.Random(f"aborts/{seed}")
        for s in sessions:
            s.abort_after_s = {k: abort_rng.uniform(0.0, 0.06) for k in range(len(s.prompts))
                               if abort_rng.random() < 0.3}
    return Workload(knobs, sessions, cost, flush_at)


def _close(a: Optional[float], b: Optional[float]) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):  # no gap: fewer than two tokens
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def assert_same(wl: Workload, label: str = "") -> None:
    fast = run_workload(SimEngine, wl)
    ref = run_workload(ReferenceEngine, wl)
    where = f"{label}\n{wl.describe()}"
    assert fast.requests.keys() == ref.requests.keys(), where
    for key in sorted(ref.requests):
        f, r = fast.requests[key], ref.requests[key]
        got = (f.num_cached_tokens, f.num_preemptions, f.generated)
        want = (r.num_cached_tokens, r.num_preemptions, r.generated)
        assert got == want, f"request {key}: fast (cached, preemptions, generated) {got} != reference {want}{where}"
        for name in ("arrival_s", "first_token_s", "finish_s", "last_token_s", "max_token_gap_s", "mean_token_gap_s"):
            assert _close(getattr(f, name), getattr(r, name)), (
                f"request {key}: {name} fast {getattr(f, name)!r} != reference {getattr(r, name)!r}{where}")
    assert fast.completion_order == ref.completion_order, where
    assert fast.first_token_order == ref.first_token_order, where
    assert fast.counters == ref.counters, where
    assert len(fast.flush_times_s) == len(ref.flush_times_s), where
    assert all(_close(a, b) for a, b in zip(fast.flush_times_s, ref.flush_times_s)), where


SEEDS = range(400)


@pytest.mark.parametrize("seed", SEEDS)
def test_fast_engine_matches_reference(seed):
    assert_same(random_workload(seed), f"seed={seed}")


def test_random_workloads_exercise_the_hard_paths():
    """The seeds above do reach preemption, chunked prefill, hits, evictions, flushes and both
    settings of every switch, each in at least a tenth of the workloads."""
    seen = dict.fromkeys(("preemption", "chunked", "hit", "flush", "eviction_miss", "caching_off",
                          "caching_on", "reserve", "no_reserve", "mixed_steps_cost_more"), 0)
    for seed in SEEDS:
        wl = random_workload(seed)
        res = run_workload(ReferenceEngine, wl, check_invariants=False)
        if wl.cost.mixed_decode_s_per_token:  # the term moved some request's times: decodes beside a chunk
            without = run_workload(SimEngine, dataclasses.replace(
                wl, cost=dataclasses.replace(wl.cost, mixed_decode_s_per_token=0.0)))
            seen["mixed_steps_cost_more"] += any(not _close(r.finish_s, without.requests[k].finish_s)
                                                 for k, r in res.requests.items())
        bs = wl.knobs["block_size"]
        seen["preemption"] += res.counters["num_preemptions"] > 0
        seen["hit"] += res.counters["prefix_cache_hits"] > 0
        seen["flush"] += bool(res.flush_times_s)
        seen["chunked"] += max(p for s in wl.sessions for p in s.prompts) > wl.knobs["max_num_batched_tokens"]
        seen["caching_off" if not wl.knobs["enable_prefix_caching"] else "caching_on"] += 1
        seen["reserve" if wl.knobs["reserve_full_prompt"] else "no_reserve"] += 1
        # a later turn that hit less than its whole previous context: evicted (or flushed) blocks
        seen["eviction_miss"] += wl.knobs["enable_prefix_caching"] and any(
            r.num_cached_tokens < (wl.sessions[i].prompts[k - 1] + wl.sessions[i].outputs[k - 1] - 1) // bs * bs
            for (i, k), r in res.requests.items() if k > 0)
    assert all(v >= len(SEEDS) // 10 for v in seen.values()), seen


# A client that hangs up: vLLM aborts its request at the next step boundary (blocks freed tail
# first, hashes kept) and the client's retry of the same prompt hits what the aborted one computed.
ABORT_SEEDS = range(150)


@pytest.mark.parametrize("seed", ABORT_SEEDS)
def test_fast_engine_matches_reference_with_aborted_requests(seed):
    assert_same(random_workload(seed, with_aborts=True), f"aborts seed={seed}")


def test_abort_workloads_abort_running_and_waiting_requests_and_retries_hit():
    """The abort seeds reach aborts of requests in decode, in prefill and still waiting, and
    retries that hit blocks their aborted attempt computed."""
    seen = dict.fromkeys(("decoding", "prefilling_or_waiting", "retry_hit"), 0)
    for seed in ABORT_SEEDS:
        res = run_workload(ReferenceEngine, random_workload(seed, with_aborts=True), check_invariants=False)
        for key, req in res.requests.items():
            if len(key) == 3:
                seen["decoding" if req.generated > 0 else "prefilling_or_waiting"] += 1
                retry = res.requests[key[:2]]
                seen["retry_hit"] += retry.num_cached_tokens > max(req.num_cached_tokens, 0)
    assert all(v >= 20 for v in seen.values()), seen


# A prefix is one prompt of one length (SimEngine.prefix_stream): a key used with two lengths
# names two prompts, in both engines, and they must still agree.
@pytest.mark.parametrize("seed", [13, 22, 24, 31, 40])
def test_mixed_prefix_lengths_per_key_are_distinct_prompts(seed):
    assert_same(random_workload(seed, mixed_prefix_lengths=True), f"mixed seed={seed}")


# ---------------------------------------------------------------- whole prompts cached
# A turn sent again with the same prompt (a client re-sending a turn it already got) finds every
# block of its prompt cached when the prompt ends on a block boundary; vLLM still computes the
# last prompt token, so the hit stops one block short: (prompt - 1) // block_size blocks, the
# rest recomputed. A zero-growth turn (the previous prompt and its output, nothing added) never
# finds its whole prompt cached: the previous turn's last output token was sampled but never went
# through the model, so its cache ends one token short of the new prompt.
def with_repeated_prompts(wl: Workload, seed: int) -> Workload:
    """``wl`` with zero-growth turns, prompts grown to block boundaries, and some sessions ending
    with their last prompt sent once more (with as many or more output tokens).

    A repeat only ever ends its session: the blocks above the cap that it recomputes are
    duplicates, which vLLM keeps hashed in the free queue where SimEngine drops their hashes (the
    gap of the xfail below), and a later turn of the same session can see that. Drawn from its
    own generator, so ``random_workload(seed)`` is the same workload as before."""
    rng = random.Random(f"repeated-prompts/{seed}")
    bs = wl.knobs["block_size"]
    sessions = []
    for s in wl.sessions:
        prompts = [s.prompts[0]]
        for k in range(1, len(s.prompts)):
            growth = s.prompts[k] - s.prompts[k - 1] - s.outputs[k - 1]
            prompt = prompts[-1] + s.outputs[k - 1]
            if rng.random() >= 0.25:  # else a zero-growth turn
                prompt += growth
                if rng.random() < 0.5:
                    prompt += -prompt % bs
            prompts.append(prompt)
        outputs, thinks = list(s.outputs), list(s.thinks)
        if rng.random() < 0.6:
            if rng.random() < 0.7:  # a block-aligned last prompt: the repeat finds all of it cached
                prompts[-1] += -prompts[-1] % bs
            prompts.append(prompts[-1])
            outputs.append(outputs[-1] + rng.randint(0, 2 * bs))
            thinks.append(0.0 if rng.random() < 0.2 else rng.expovariate(1 / 0.03))
        sessions.append(SessionPlan(s.key, s.prefix_key, s.base_tokens, s.arrival_s, prompts, outputs, thinks))
    biggest = max(-(-(p + o) // bs) for s in sessions for p, o in zip(s.prompts, s.outputs))
    knobs = dict(wl.knobs, num_blocks=max(wl.knobs["num_blocks"], biggest + 1))
    return Workload(knobs, sessions, wl.cost, wl.flush_at)


REPEAT_SEEDS = range(200)


@pytest.mark.parametrize("seed", REPEAT_SEEDS)
def test_fast_engine_matches_reference_with_repeated_prompts(seed):
    assert_same(with_repeated_prompts(random_workload(seed), seed), f"repeated prompts seed={seed}")


def test_repeated_prompt_workloads_cache_whole_prompts():
    """The seeds above do send prompts whose every block is cached (the last-token cap decides
    their hit) and zero-growth turns, each in at least a tenth of the workloads."""
    seen = dict.fromkeys(("whole_prompt_cached", "zero_growth_hit"), 0)
    for seed in REPEAT_SEEDS:
        wl = with_repeated_prompts(random_workload(seed), seed)
        if not wl.knobs["enable_prefix_caching"]:
            continue
        res = run_workload(ReferenceEngine, wl, check_invariants=False)
        bs = wl.knobs["block_size"]
        whole = zero_growth = False
        for (i, k), req in res.requests.items():
            s = wl.sessions[i]
            if k == 0:
                continue
            prompt = s.prompts[k]
            # a repeat of an aligned prompt that hit all the cap allows: every block was cached
            whole |= (prompt == s.prompts[k - 1] and prompt % bs == 0 and req.num_cached_tokens == prompt - bs)
            zero_growth |= (prompt == s.prompts[k - 1] + s.outputs[k - 1]
                            and req.num_cached_tokens == (prompt - 1) // bs * bs > 0)
        seen["whole_prompt_cached"] += whole
        seen["zero_growth_hit"] += zero_growth
    assert all(v >= len(REPEAT_SEEDS) // 10 for v in seen.values()), seen


# ---------------------------------------------------------------- known fast-engine gap
@pytest.mark.xfail(strict=True, reason=(
    "a prompt equal to a block-aligned shared prefix: the last-token cap cuts the hit inside the "
    "prefix and the request recomputes the last prefix block. vLLM hashes the recomputed copy as a "
    "duplicate, keeps the old copy hashed in the free queue, and later lookups take the OLD copy "
    "(first inserted); SimEngine unhashes the old copy in place, so free-queue order and free "
    "counts drift (here s0's third turn hits 16 tokens in SimEngine, 12 in vLLM)"))
def test_prompt_equal_to_a_block_aligned_shared_prefix():
    cost = StepCostModel(0.0018029673698740111, 7.241963430249277e-06, 8.580610195033e-08,
                         8.827321299324609e-07, name="rnd")
    wl = Workload(
        dict(num_blocks=23, block_size=4, max_num_batched_tokens=8, max_num_seqs=8,
             enable_prefix_caching=True, reserve_full_prompt=False),
        [make_session("s0", "sys0", 8, 0.1852, 9, [10, 1, 1], [0, 0], [0.029, 0.022]),
         make_session("s2", "sys0", 8, 0.1236, 8, [11, 1, 4, 10], [0, 0, 0], [0.0214, 0.0413, 0.0169]),
         make_session("s4", None, 0, 0.2475, 21, [1], [], []),
         make_session("s5", "sys0", 8, 0.2229, 8, [10, 4], [0], [0.0053])],
        cost)
    assert_same(wl)
