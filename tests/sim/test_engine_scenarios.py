"""Hand-written scenarios with known answers, run on BOTH engines (fast SimEngine and the slow
ReferenceEngine): the numbers below are derived by hand from vLLM v1's rules, not read off
either implementation."""

from __future__ import annotations

import itertools
import weakref

import pytest

from loadgen.sim.engine import SimEngine
from loadgen.sim.request import SimRequest

from .conftest import COST, make_engine
from .reference_engine import ReferenceEngine

_ids = itertools.count()


def submit(engine, key, prompt, max_tokens, now, prefix=None, base_tokens=0):
    pre = engine.stream(prefix, 0) if prefix is not None else None
    req = SimRequest(next(_ids), engine.stream(key, base_tokens if prefix is not None else 0), prompt,
                     max_tokens, prefix=pre)
    engine.submit(req, now)
    return req


def run_until_idle(engine) -> float:
    """Advance from wakeup to wakeup until the engine is idle; returns the last wakeup time."""
    last = 0.0
    while (wake := engine.next_wakeup()) is not None:
        engine.advance_to(wake)
        last = wake
    return last


def run_alone(engine, key, prompt, max_tokens, **kw):
    """Submit one request 1 s after everything so far has finished, and run it to completion."""
    now = _last_finish.get(engine, 0.0) + 1.0
    req = submit(engine, key, prompt, max_tokens, now, **kw)
    run_until_idle(engine)
    _last_finish[engine] = req.finish_s
    return req


_last_finish: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> last finish time


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
    """The real CPU vLLM (docs/cpu-vllm.md): a 400-block pool of 128-token blocks, three 20K prompts, then the first again.

    Each 20,000-token prompt (16 output tokens) holds 157 blocks, 156 of them hashed. A's blocks
    go to the free queue tail first; B takes the 242 never-used blocks' first 157; C takes the
    other 85, A's unhashed tail block and 71 of A's hashed blocks, from A's tail down. A keeps
    its first 85 blocks: 10,880 tokens. (The measurement on the real engine hit 11,008 = 86 blocks,
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


def test_a_prompt_sent_again_whole_in_cache_recomputes_its_last_block(engine_cls):
    """bs 16. Turn 1: prompt 40, 24 output tokens; the KV holds 40 + 24 - 1 = 63 tokens, 3 full
    blocks. Turn 2 grows by nothing (prompt 64 = 40 + 24): its last token was never computed, so 3
    blocks (48 tokens) hit and one 16-token chunk at context 48 is computed; with 1 output token its
    KV is 64 tokens, 4 full blocks. Turn 3 sends prompt 64 again: all 4 blocks are cached, yet the
    last prompt token must go through the model to sample, so the hit stops at (64 - 1) // 16 = 3
    blocks and the fourth is recomputed: the same 16-token step at context 48 as turn 2."""
    engine = make_engine(engine_cls, block_size=16)
    turn1 = run_alone(engine, "s", 40, 24)
    turn2 = run_alone(engine, "s", 64, 1)
    turn3 = run_alone(engine, "s", 64, 1)
    assert [turn1.num_cached_tokens, turn2.num_cached_tokens, turn3.num_cached_tokens] == [0, 48, 48]
    one_block_at_48 = COST.t0_s + COST.a_s_per_token * 16 + COST.b_s_per_token2 * 16 * (48 + 16 / 2)
    for turn in (turn2, turn3):
        assert turn.first_token_s - turn.arrival_s == pytest.approx(one_block_at_48, rel=1e-12)
    assert engine.prefix_cache_hits == 96 and engine.prefix_cache_queries == 40 + 64 + 64


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


def test_flush_waits_for_the_step_boundary_then_preempts_and_drops_the_cache(engine_cls):
    engine = make_engine(engine_cls, block_size=16)
    cached = run_alone(engine, "old", 100, 1)  # leaves 6 cached blocks behind
    t = cached.finish_s + 1.0
    r1 = submit(engine, "r1", 40, 30, t)
    r2 = submit(engine, "r2", 40, 30, t + 0.001)  # joins at the second step
    engine.advance_to(t + 0.02)
    engine.flush(t + 0.02)
    assert engine.flush_times_s == []  # a step is in flight: the reset waits for its end
    hits_before = engine.prefix_cache_hits
    run_until_idle(engine)
    # decode steps here last 5.05-5.1 ms: the reset happened at the end of the step in flight
    assert t + 0.02 < engine.flush_times_s[0] < t + 0.02 + 0.0052
    assert (r1.num_preemptions, r2.num_preemptions) == (1, 1)
    assert engine.prefix_cache_hits == hits_before  # nothing survived the reset, not even r1's blocks
    assert (r1.num_cached_tokens, r2.num_cached_tokens) == (0, 0)
    assert (r1.generated, r2.generated) == (30, 30)
    again = run_alone(engine, "old", 100, 1)
    assert again.num_cached_tokens == 0
    assert engine.next_wakeup() is None
    engine.flush(again.finish_s + 5.0)  # an idle engine resets at once
    assert engine.flush_times_s[1:] == [again.finish_s + 5.0]


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


# ---------------------------------------------------------------- prefixes of several lengths
def test_two_lengths_of_one_prefix_name_are_two_prompts(engine_cls):
    """bs 4. L (16-token system prompt) runs; S (8-token prompt of the same name) shares nothing
    with it, as loadgen's sessions draw a system prompt's tokens from its name and length; L's
    second turn still hits its whole prefix and its own block."""
    engine = make_engine(engine_cls, block_size=4)

    def run(key, prompt, prefix_tokens):
        req = SimRequest(next(_ids), engine.stream(key, prefix_tokens), prompt, 1,
                         prefix=engine.prefix_stream("sys", prefix_tokens))
        engine.submit(req, _last_finish.get(engine, 0.0) + 1.0)
        run_until_idle(engine)
        _last_finish[engine] = req.finish_s
        return req

    run("L", 20, 16)
    assert run("S", 12, 8).num_cached_tokens == 0
    assert run("L", 24, 16).num_cached_tokens == 20
    assert run("S2", 12, 8).num_cached_tokens == 8


def test_a_prefix_stream_used_with_another_length_is_refused():
    engine = make_engine(SimEngine, block_size=4)
    submit(engine, "a", 20, 1, 0.0, prefix="sys", base_tokens=16)
    with pytest.raises(ValueError, match="one prompt of one length"):
        submit(engine, "b", 12, 1, 0.0, prefix="sys", base_tokens=8)


# ---------------------------------------------------------------- aborts (a client that hung up)
def test_an_aborted_decoder_frees_its_blocks_and_a_retry_hits_its_computed_prompt(engine_cls):
    engine = make_engine(engine_cls, block_size=16)
    first = submit(engine, "s", 100, 200, now=1.0)
    engine.advance_to(1.5)  # prefilled long ago, decoding: 100 prompt + some output tokens in KV
    assert first.first_token_s is not None and first.finish_s is None
    engine.abort(first, 1.5)
    run_until_idle(engine)
    assert first.finish_s is None and engine.num_running == 0 and engine.kv_usage() == 0.0
    retry = run_alone(engine, "s", 100, 1)
    # the aborted request's full prompt blocks kept their hashes: (100 - 1) // 16 blocks hit
    assert retry.num_cached_tokens == 96


def test_an_abort_waits_for_the_step_in_flight(engine_cls):
    engine = make_engine(engine_cls, block_size=16)
    req = submit(engine, "s", 40, 1, now=1.0)  # one prefill step samples its only token
    engine.abort(req, 1.0)  # the step is in flight: it finishes the request, which is delivered
    run_until_idle(engine)
    assert req.finish_s is not None and req.generated == 1


def test_an_aborted_waiting_request_never_runs(engine_cls):
    engine = make_engine(engine_cls, block_size=16, max_num_seqs=1)
    busy = submit(engine, "a", 40, 50, now=1.0)
    queued = submit(engine, "b", 40, 5, now=1.0)
    engine.abort(queued, 1.001)
    run_until_idle(engine)
    assert busy.finish_s is not None and queued.finish_s is None and queued.num_cached_tokens == -1
    assert engine.prefix_cache_queries == 40  # only the busy request was ever looked up
    assert run_alone(engine, "b", 40, 1).num_cached_tokens == 0  # nothing of b was computed
