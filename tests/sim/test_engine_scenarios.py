"""Hand-written scenarios with known answers, run on BOTH engines (fast SimEngine and the slow
ReferenceEngine): the numbers below are derived by hand from vLLM v1's rules, not read off
either implementation."""

from __future__ import annotations

import itertools

import pytest

from loadgen.sim.engine import SimEngine, SimRequest

from .conftest import COST, make_engine
from .reference_engine import ReferenceEngine

_ids = itertools.count()


def submit(engine, key, prompt, max_tokens, now, prefix=None, base_tokens=0):
    pre = engine.stream(prefix, 0) if prefix is not None else None
    req = SimRequest(next(_ids), engine.stream(key, base_tokens if prefix is not None else 0), prompt,
                     max_tokens, prefix=pre)
    engine.submit(req, now)
    return req


def run_until_idle(engine):
    while (wake := engine.next_wakeup()) is not None:
        engine.advance_to(wake)


def run_alone(engine, key, prompt, max_tokens, **kw):
    """Submit when the engine is idle and run it to completion."""
    now = max([0.0] + list(getattr(engine, "_last_t", [0.0])))
    req = submit(engine, key, prompt, max_tokens, now + 1.0, **kw)
    run_until_idle(engine)
    engine._last_t = [req.finish_s]
    return req


# ---------------------------------------------------------------- cache hits
@pytest.mark.parametrize("prompt", [16, 17, 64, 70, 100])
def test_repeated_prompt_hits_every_full_block_below_its_last_token(engine_cls, prompt):
    engine = make_engine(engine_cls, block_size=16)
    first = run_alone(engine, "a", prompt, 1)
    again = run_alone(engine, "a", prompt, 1)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == (prompt - 1) // 16 * 16
    assert engine.prefix_cache_hits == again.num_cached_tokens
    assert engine.prefix_cache_queries == 2 * prompt


@pytest.mark.parametrize("output", [13, 14, 15, 30])
def test_turn_two_hits_prompt_plus_output_minus_one_in_whole_blocks(engine_cls, output):
    engine = make_engine(engine_cls, block_size=16)
    turn1 = run_alone(engine, "s", 50, output)
    turn2 = run_alone(engine, "s", 50 + output + 7, 5)
    # the last sampled token never went through the model: KV holds prompt + output - 1 tokens
    assert turn2.num_cached_tokens == (50 + output - 1) // 16 * 16
    assert turn1.generated == output


def test_turn_two_hits_through_a_shared_prefix(engine_cls):
    engine = make_engine(engine_cls, block_size=16)
    other = run_alone(engine, "other", 40 + 30, 1, prefix="sys", base_tokens=40)
    turn1 = run_alone(engine, "s", 40 + 10, 14, prefix="sys", base_tokens=40)
    turn2 = run_alone(engine, "s", 40 + 10 + 14 + 3, 1, prefix="sys", base_tokens=40)
    assert other.num_cached_tokens == 0
    assert turn1.num_cached_tokens == 32  # the two full blocks of the 40-token system prompt
    assert turn2.num_cached_tokens == 48  # (50 + 14 - 1) // 16 = 3 blocks


def test_lru_eviction_trims_the_least_recently_freed_request_from_its_tail(engine_cls):
    """VLLM-CPU.md: a 400-block pool of 128-token blocks, three 20K prompts, then the first again.

    Each 20,000-token prompt (16 output tokens) holds 157 blocks, 156 of them hashed. A's blocks
    go to the free queue tail first; B takes the 242 never-used blocks' first 157; C takes the
    other 85, A's unhashed tail block and 71 of A's hashed blocks, from A's tail down. A keeps
    its first 85 blocks: 10,880 tokens. (The measurement in VLLM-CPU.md hit 11,008 = 86 blocks,
    one more, with a history that included warm-up requests.)"""
    engine = make_engine(engine_cls, num_blocks=400, block_size=128)
    for key in "ABC":
        assert run_alone(engine, key, 20_000, 16).num_cached_tokens == 0
    again = run_alone(engine, "A", 20_000, 16)
    assert again.num_cached_tokens == 85 * 128
    # A needed 157 - 85 = 72 more blocks, popped from the head of the free queue: B's unhashed
    # tail block and its positions 155..85, so B in turn keeps exactly 85 blocks
    assert run_alone(engine, "B", 20_000, 16).num_cached_tokens == 85 * 128


def test_caching_off_never_hits(engine_cls):
    engine = make_engine(engine_cls, block_size=16, enable_prefix_caching=False)
    run_alone(engine, "a", 100, 1)
    repeat = run_alone(engine, "a", 100, 1)
    turn2 = run_alone(engine, "b", 150, 5, prefix="sys", base_tokens=40)
    assert repeat.num_cached_tokens == 0 and turn2.num_cached_tokens == 0
    assert engine.prefix_cache_hits == 0
    assert engine.prefix_cache_queries == 350


# ---------------------------------------------------------------- preemption
def test_preempted_request_goes_to_the_front_of_waiting_and_keeps_its_reported_hit(engine_cls):
    """bs 4, 10 usable blocks. R1 and R2 (8-token prompts, 20 output tokens each: 7 blocks at the
    end) run together; R3 arrives when too few blocks are left and waits. At the step where R1
    computes its 21st token (nc = 20) no block is free: R2, last in the running list, is preempted
    and goes in FRONT of R3. R1 takes R2's tail block, then one more later; R2 comes back after
    R1 finishes, hitting the 3 of its blocks that survived (12 tokens), but still reports 0, its
    hit at first scheduling."""
    engine = make_engine(engine_cls, num_blocks=11, block_size=4)
    r1 = submit(engine, "r1", 8, 20, 0.0)
    r2 = submit(engine, "r2", 8, 20, 0.0)
    # steps: a 5.8 ms prefill, then ~5.1 ms decodes; a block each at nc = 8, 12, 16, 20: between
    # about 26 ms and 47 ms only 2 blocks are free
    engine.advance_to(0.035)
    assert engine.kv_usage() == pytest.approx(0.8)
    r3 = submit(engine, "r3", 12, 1, 0.035)
    waiting_after_preemption = None
    while (wake := engine.next_wakeup()) is not None:
        engine.advance_to(wake)
        if r2.num_preemptions == 1 and waiting_after_preemption is None:
            waiting_after_preemption = list(engine.waiting)
    assert waiting_after_preemption == [r2, r3]
    assert (r1.num_preemptions, r2.num_preemptions, r3.num_preemptions) == (0, 1, 0)
    assert engine.num_preemptions == 1
    assert r2.num_cached_tokens == 0
    assert engine.prefix_cache_hits == 12  # R2's re-admission
    assert r2.generated == 20 and r1.generated == 20
    assert r2.finish_s > r1.finish_s and r3.first_token_s > r1.finish_s


# ---------------------------------------------------------------- step time
def test_single_cold_prefill_takes_the_cost_formula(engine_cls):
    engine = make_engine(engine_cls, block_size=16)
    L = 1000
    req = submit(engine, "a", L, 1, 2.0)
    run_until_idle(engine)
    want = COST.t0_s + COST.a_s_per_token * L + COST.b_s_per_token2 * L * L / 2
    assert req.first_token_s - 2.0 == pytest.approx(want, rel=1e-12)
    assert req.finish_s == req.first_token_s
    assert engine.num_steps == 1


def test_chunked_prefill_then_decode_steps_take_the_cost_formula(engine_cls):
    engine = make_engine(engine_cls, block_size=16, max_num_batched_tokens=256)
    L = 1000
    req = submit(engine, "a", L, 3, 0.0)
    run_until_idle(engine)
    c = COST
    prefill = 4 * c.t0_s + c.a_s_per_token * L + c.b_s_per_token2 * L * L / 2  # chunks 256,256,256,232
    decodes = 2 * (c.t0_s + c.a_s_per_token) + c.g_s_per_token * ((L + 1) + (L + 2))
    assert req.first_token_s == pytest.approx(prefill, rel=1e-12)
    assert req.finish_s == pytest.approx(prefill + decodes, rel=1e-12)
    assert engine.num_steps == 6


# ---------------------------------------------------------------- known fast-engine gap
_MIXED_BASES_GAP = (
    "SimEngine caches shared-prefix blocks only for the request that found the prefix stream "
    "unreferenced (its 'builder'); a request with a LONGER shared prefix, admitted while a "
    "shorter-prefix request holds the stream, computes the extra prefix blocks without caching "
    "them, whereas vLLM hashes them at schedule time.")


@pytest.mark.parametrize("engine_cls", [
    pytest.param(SimEngine, marks=pytest.mark.xfail(strict=True, reason=_MIXED_BASES_GAP)),
    ReferenceEngine,
], ids=["SimEngine", "ReferenceEngine"])
def test_a_longer_system_prompt_computed_next_to_a_shorter_one_is_cached(engine_cls):
    """Two session kinds share the prefix key with different lengths (8 and 16 tokens, bs 4),
    as a mix-shift between synthetic session specs with different system_prompt_tokens does.
    A (short prefix) is decoding; B (long prefix) hits A's 2 prefix blocks and computes prefix
    blocks 2 and 3 itself, which vLLM hashes; C (long prefix), after B finished, hits all 4."""
    engine = make_engine(engine_cls, block_size=4)
    a = submit(engine, "a", 12, 50, 0.0, prefix="sys", base_tokens=8)
    b = submit(engine, "b", 20, 1, 0.001, prefix="sys", base_tokens=16)
    engine.advance_to(0.05)
    assert b.finish_s is not None and a.finish_s is None
    c = submit(engine, "c", 20, 1, 0.05, prefix="sys", base_tokens=16)
    run_until_idle(engine)
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 8)
    assert c.num_cached_tokens == 16


@pytest.mark.parametrize("engine_cls", [
    pytest.param(SimEngine, marks=pytest.mark.xfail(strict=True, reason=(
        "SimEngine's acquire() drops the hashes of an idle stream's cached blocks above the hit; "
        "a request with a SHORTER shared prefix therefore wipes the cached tail of a longer one "
        "(and, through the broken chain, every own block after it), whereas vLLM leaves idle "
        "cached blocks alone until they are popped for reuse."))),
    ReferenceEngine,
], ids=["SimEngine", "ReferenceEngine"])
def test_a_shorter_system_prompt_does_not_evict_the_tail_of_a_longer_one(engine_cls):
    """bs 4, a 64-block pool (nothing is ever evicted). L (16-token system prompt) runs turn 1 and
    goes idle with 5 cached blocks; S (8-token system prompt, same key) hits the first 2; L's
    turn 2 must still hit its 4 prefix blocks plus its own block: 20 tokens."""
    engine = make_engine(engine_cls, block_size=4)
    run_alone(engine, "L", 20, 1, prefix="sys", base_tokens=16)
    short = run_alone(engine, "S", 12, 1, prefix="sys", base_tokens=8)
    assert short.num_cached_tokens == 8
    turn2 = run_alone(engine, "L", 24, 1, prefix="sys", base_tokens=16)
    assert turn2.num_cached_tokens == 20


@pytest.mark.parametrize("engine_cls", [
    pytest.param(SimEngine, marks=pytest.mark.xfail(strict=True, reason=(
        "SimEngine keeps prefix blocks that only a finished longer-prefix request held out of the "
        "free queue until the last request holding the prefix stream releases it, so free-block "
        "counts (kv_usage, admission, preemption) are off while a shorter-prefix request runs."))),
    ReferenceEngine,
], ids=["SimEngine", "ReferenceEngine"])
def test_prefix_blocks_held_only_by_a_finished_request_are_free(engine_cls):
    """bs 4, 23 usable blocks. B (16-token system prompt, 20-token prompt, 3 output tokens) starts
    alone and builds the prefix; A (8-token system prompt, 12-token prompt, 50 output tokens)
    arrives during B's first step and hits B's first 2 prefix blocks. When B finishes (end of
    step 3), its prefix blocks 2 and 3 drop to ref_cnt 0 and join the free queue with its own
    blocks; A holds 4 blocks. D (76 tokens, no prefix: 19 blocks) arrives at 20 ms, when A
    needs no new block for a while: 19 blocks are free, so D runs at once, long before A ends."""
    engine = make_engine(engine_cls, num_blocks=24, block_size=4)
    b = submit(engine, "b", 20, 3, 0.0, prefix="sys", base_tokens=16)
    a = submit(engine, "a", 12, 50, 0.001, prefix="sys", base_tokens=8)
    engine.advance_to(0.02)
    assert b.finish_s is not None and b.finish_s < 0.02 and a.num_cached_tokens == 8
    d = submit(engine, "d", 76, 1, 0.02)
    run_until_idle(engine)
    assert d.first_token_s < 0.05 < a.finish_s
    assert a.num_preemptions == d.num_preemptions == 0
