"""Differential test, SGLang flavour: the fast SGLangEngine against the literal ReferenceSGLang.

Both run the same closed-loop workload (tests/sim/test_differential.py's sessions: turn k + 1 is
sent when turn k finished plus a think time) through the same tiny event loop. Every request
must report the same cached tokens, retractions and outputs, the same first-token, finish and
token-gap times, complete in the same order, and both engines must end with the same counters.
Workloads cover page sizes 1 and 4, pools small enough to force eviction and retraction, chunk
budgets small enough to chunk prompts, small ``max_running_requests``, fcfs and lpm, and an
optional flush. To replay one: ``run(SGLangEngine, random_workload(seed))``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import replace

import pytest

from loadgen.sim.cost import StepCostModel
from loadgen.sim.request import SimRequest
from loadgen.sim.sglang_engine import SGLangConfig, SGLangEngine

from .conftest import COST, with_gpu_terms
from .reference_sglang import ReferenceSGLang
from .test_differential import Workload, _close, make_session


def random_workload(seed: int) -> Workload:
    rng = random.Random(f"sglang/{seed}")
    page = rng.choice([1, 1, 4])
    unit = 16
    prefixes = {f"sys{j}": rng.randint(unit, 5 * unit) for j in range(rng.choice([0, 1, 1, 2]))}
    long_outputs = rng.random() < 0.3
    sessions = []
    for i in range(rng.randint(2, 12)):
        key = rng.choice(list(prefixes) + [None]) if prefixes else None
        base = prefixes[key] if key is not None else 0
        turns = rng.randint(1, 6)
        arrival = rng.uniform(0.0, 0.3)
        if rng.random() < 0.2:
            arrival = round(arrival, 1)
        max_out = 20 * unit if long_outputs else 3 * unit
        sessions.append(make_session(
            f"s{i}", key, base, arrival, base + rng.randint(1, 6 * unit),
            [rng.randint(1, max_out) for _ in range(turns)],
            [rng.randint(0, 3 * unit) for _ in range(turns - 1)],
            [0.0 if rng.random() < 0.1 else rng.expovariate(1 / 0.03) for _ in range(turns - 1)]))
    biggest = max(s.prompts[-1] + s.outputs[-1] for s in sessions)
    pool = biggest + 1 + rng.choice([0, 8, biggest // 2, biggest, 4 * biggest])
    knobs = dict(pool_tokens=pool, page_size=page,
                 chunked_prefill_size=rng.choice([16, 37, 64, 8192]),
                 max_prefill_tokens=rng.choice([64, 16384]),
                 max_running_requests=rng.choice([1, 2, 3, 8, 1024]),
                 schedule_policy=rng.choice(["fcfs", "fcfs", "lpm"]),
                 new_token_ratio_decay_steps=rng.choice([10, 600]))
    u = rng.random()
    cost = COST if u < 0.7 else StepCostModel(rng.uniform(1e-4, 1e-2), rng.uniform(0, 1e-4),
                                               rng.uniform(0, 1e-7), rng.uniform(0, 1e-6), name="rnd")
    cost = with_gpu_terms(cost, seed)
    flush_at = rng.uniform(0.0, 0.4) if rng.random() < 0.3 else None
    return Workload(knobs, sessions, cost, flush_at)


def run(cls, wl: Workload, check: bool = True) -> dict:
    engine = cls(SGLangConfig(**wl.knobs), wl.cost)
    requests, order, firsts, finished = {}, [], [], []
    seq = itertools.count()
    pending = [(s.arrival_s, next(seq), i, 0) for i, s in enumerate(wl.sessions)]
    heapq.heapify(pending)
    flush_at = wl.flush_at

    def on_done(req):
        finished.append(req)
        order.append(req.context)

    def drain():
        for req in finished:
            i, k = req.context
            s = wl.sessions[i]
            if k + 1 < len(s.prompts):
                heapq.heappush(pending, (req.finish_s + s.thinks[k], next(seq), i, k + 1))
        finished.clear()

    for _ in range(200_000):
        wake = engine.next_wakeup()
        t = min(pending[0][0] if pending else math.inf, math.inf if wake is None else wake,
                math.inf if flush_at is None else flush_at)
        if t == math.inf:
            break
        engine.advance_to(t)
        drain()
        if flush_at is not None and flush_at <= t:
            engine.flush(t)
            flush_at = None
            drain()
        while pending and pending[0][0] <= t:
            _, _, i, k = heapq.heappop(pending)
            s = wl.sessions[i]
            prefix = engine.prefix_stream(s.prefix_key, s.base_tokens) if s.prefix_key is not None else None
            stream = engine.stream(s.key, s.base_tokens if prefix is not None else 0)
            req = SimRequest((i, k), stream, s.prompts[k], s.outputs[k], prefix=prefix, on_done=on_done,
                             context=(i, k))
            req.on_first_token = lambda r: firsts.append(r.context)
            requests[(i, k)] = req
            engine.submit(req, t)
            drain()
        if check:
            engine.check_invariants()
    else:
        raise AssertionError(f"{cls.__name__} still busy after 200000 events")
    assert engine.num_running == 0 and engine.num_waiting == 0
    counters = {n: getattr(engine, n) for n in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions",
                                                "num_steps", "prompt_tokens_total", "generation_tokens_total")}
    return dict(requests=requests, order=order, firsts=firsts, counters=counters,
                flush_times_s=list(engine.flush_times_s))


def assert_same(wl: Workload, label: str = "") -> None:
    fast, ref = run(SGLangEngine, wl), run(ReferenceSGLang, wl)
    where = f"{label}\n{wl.describe()}"
    assert fast["requests"].keys() == ref["requests"].keys(), where
    for key in sorted(ref["requests"]):
        f, r = fast["requests"][key], ref["requests"][key]
        got, want = (f.num_cached_tokens, f.num_preemptions, f.generated), (r.num_cached_tokens, r.num_preemptions,
                                                                             r.generated)
        assert got == want, f"request {key}: fast (cached, retractions, generated) {got} != reference {want}{where}"
        for name in ("arrival_s", "first_token_s", "finish_s", "last_token_s", "max_token_gap_s", "mean_token_gap_s"):
            assert _close(getattr(f, name), getattr(r, name)), (
                f"request {key}: {name} fast {getattr(f, name)!r} != reference {getattr(r, name)!r}{where}")
    assert fast["order"] == ref["order"], where
    assert fast["firsts"] == ref["firsts"], where
    assert fast["counters"] == ref["counters"], where
    assert len(fast["flush_times_s"]) == len(ref["flush_times_s"]), where
    assert all(_close(a, b) for a, b in zip(fast["flush_times_s"], ref["flush_times_s"])), where


SEEDS = range(300)


@pytest.mark.parametrize("seed", SEEDS)
def test_fast_sglang_matches_reference(seed):
    assert_same(random_workload(seed), f"seed={seed}")


def overlap_workload(seed: int) -> Workload:
    """The seed's workload under SGLang's overlap schedule, hiding none, half or all of t0."""
    wl = random_workload(seed)
    hidden = random.Random(f"sglang-overlap/{seed}").choice([0.0, 0.5, 1.0]) * wl.cost.t0_s
    return replace(wl, knobs={**wl.knobs, "overlap_schedule": True}, cost=replace(wl.cost, hidden_cpu_s=hidden))


@pytest.mark.parametrize("seed", SEEDS)
def test_fast_sglang_matches_reference_with_the_overlap(seed):
    assert_same(overlap_workload(seed), f"overlap seed={seed}")


def test_random_workloads_exercise_the_hard_paths():
    """The seeds reach retraction, chunked prefill, hits, eviction misses, flushes, lpm and paging."""
    seen = dict.fromkeys(("retraction", "chunked", "hit", "flush", "eviction_miss", "lpm", "paged"), 0)
    for seed in SEEDS:
        wl = random_workload(seed)
        res = run(ReferenceSGLang, wl, check=False)
        seen["retraction"] += res["counters"]["num_preemptions"] > 0
        seen["hit"] += res["counters"]["prefix_cache_hits"] > 0
        seen["flush"] += bool(res["flush_times_s"])
        seen["chunked"] += max(p for s in wl.sessions for p in s.prompts) > wl.knobs["chunked_prefill_size"]
        seen["lpm"] += wl.knobs["schedule_policy"] == "lpm"
        seen["paged"] += wl.knobs["page_size"] > 1
        page = wl.knobs["page_size"]
        seen["eviction_miss"] += any(
            r.num_cached_tokens < (wl.sessions[i].prompts[k - 1] + wl.sessions[i].outputs[k - 1] - 1) // page * page
            and r.num_preemptions == 0 for (i, k), r in res["requests"].items() if k > 0)
    assert all(v >= len(SEEDS) // 10 for v in seen.values()), seen


def test_a_flush_waits_until_the_engine_is_idle():
    """/flush_cache is refused while a request runs: the flush happens when the last one finishes."""
    wl = random_workload(0)
    wl = replace(wl, sessions=wl.sessions[:1], flush_at=wl.sessions[0].arrival_s + 1e-6)
    res = run(SGLangEngine, wl)
    first = res["requests"][(0, 0)]
    assert res["flush_times_s"] and res["flush_times_s"][0] >= first.finish_s
