"""SGLang's overlap schedule in both SGLang engines (loadgen/sim/sglang_overlap.py): a step lasts
its cost less the hidden CPU share, and its results reach the scheduler and the client only after
the next step is scheduled."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadgen.sim.cost import SGLANG_QWEN3_8B_MI300X, StepCostModel
from loadgen.sim.request import SimRequest
from loadgen.sim.sglang_engine import SGLangConfig, SGLangEngine

from .conftest import COST
from .reference_sglang import ReferenceSGLang

HIDDEN = 0.002  # of COST's 5 ms per step
ENGINES = (SGLangEngine, ReferenceSGLang)


def engine(cls, overlap: bool, pool_tokens: int = 10_000, hidden_s: float = HIDDEN):
    return cls(SGLangConfig(pool_tokens=pool_tokens, overlap_schedule=overlap), replace(COST, hidden_cpu_s=hidden_s))


def request(eng, rid, prompt, max_tokens, prefix=None, done=None):
    stream = eng.stream(rid, eng.prefix_stream(*prefix).num_blocks if prefix else 0)
    return SimRequest(rid, stream, prompt, max_tokens, prefix=eng.prefix_stream(*prefix) if prefix else None,
                      on_done=(lambda r: done.append(r)) if done is not None else None)


def finish(eng, req, until_s=100.0):
    eng.submit(req, 0.0)
    eng.advance_to(until_s)
    assert req.finish_s is not None
    return req


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_every_step_but_the_first_after_idle_lasts_its_cost_less_the_hidden_share(cls):
    off = finish(engine(cls, False), request(engine(cls, False), "a", 1000, 50))
    eng = engine(cls, True)
    on = finish(eng, request(eng, "a", 1000, 50))
    assert on.first_token_s == pytest.approx(off.first_token_s, abs=1e-12)  # the prefill from idle hides nothing
    # 49 decode steps, each HIDDEN shorter; the last token reaches the client at its step's end
    assert off.finish_s - on.finish_s == pytest.approx(49 * HIDDEN, rel=1e-9)
    assert on.last_token_s == on.finish_s
    # the preset of the sglang flavour hides a share of the per-step constant only
    assert 0 < SGLANG_QWEN3_8B_MI300X.hidden_cpu_s < SGLANG_QWEN3_8B_MI300X.t0_s


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_a_finished_request_computes_one_more_token_and_holds_its_memory_one_batch_longer(cls):
    """B (1150 + 50 tokens) fits only once A (1000 + 50) frees its slots: with the overlap the
    batch after A's last token is scheduled with A still in it, so B waits one batch more."""
    runs = {}
    for overlap in (False, True):
        eng = engine(cls, overlap, pool_tokens=2200)
        a, b = request(eng, "a", 1000, 50), request(eng, "b", 1150, 50)
        eng.submit(a, 0.0)
        eng.submit(b, 0.0)
        eng.advance_to(100.0)
        assert b.first_token_s > a.finish_s
        runs[overlap] = (b.first_token_s - a.finish_s, eng.generation_tokens_total, eng.num_steps)
    extra_step = COST.t0_s - HIDDEN + COST.a_s_per_token + 1050 * COST.g_s_per_token
    assert runs[True][0] - runs[False][0] == pytest.approx(extra_step - HIDDEN, rel=1e-6)
    # A's token after its last, and B's after its last: two more tokens, two more steps
    assert runs[True][1:] == (runs[False][1] + 2, runs[False][2] + 2)


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_a_prefilled_prompt_enters_the_tree_one_batch_late(cls):
    """B arrives while A's prompt is prefilled: with the overlap the next batch is scheduled before
    A's prompt is in the tree, so B finds nothing of the prefix they share."""
    cached = {}
    for overlap in (False, True):
        eng = engine(cls, overlap)
        a = request(eng, "a", 1000, 20, prefix=("sys", 800))
        b = request(eng, "b", 1000, 20, prefix=("sys", 800))
        eng.submit(a, 0.0)
        eng.submit(b, 1e-4)  # during A's prefill
        eng.advance_to(100.0)
        cached[overlap] = (a.num_cached_tokens, b.num_cached_tokens)
    assert cached == {False: (0, 800), True: (0, 0)}


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_a_turn_sent_when_the_last_one_finished_misses_the_batch_after_it(cls):
    """The client hears of a finish after the next batch was scheduled: the session's next turn
    waits one batch more (here: the finished request's own extra decode step)."""
    gaps = {}
    for overlap in (False, True):
        eng = engine(cls, overlap)
        done = []
        eng.submit(request(eng, "a", 1000, 10, done=done), 0.0)
        while not done:
            eng.advance_to(eng.next_wakeup())
        t = done[0].finish_s
        nxt = request(eng, "a", 1100, 10)
        eng.submit(nxt, t)
        eng.advance_to(t + 100.0)
        gaps[overlap] = nxt.first_token_s - t
    # without the overlap the prefill starts at once, from idle; with it, after the finished
    # request's extra decode step (1010 tokens of context), and then hides its own CPU share
    extra_step = COST.t0_s - HIDDEN + COST.a_s_per_token + 1010 * COST.g_s_per_token
    assert gaps[True] - gaps[False] == pytest.approx(extra_step - HIDDEN, rel=1e-6)


def test_the_hidden_share_is_a_cost_model_input_between_zero_and_t0():
    data = {**COST.to_json(), "hidden_cpu_s": COST.t0_s * 2}
    with pytest.raises(ValueError, match="hidden_cpu_s"):
        StepCostModel.from_json(data)
    model = StepCostModel.from_json({**COST.to_json(), "hidden_cpu_s": 0.001, "flavor": "sglang"})
    assert StepCostModel.from_json(model.to_json()) == model
    assert "hidden_cpu_s" not in COST.to_json() and "flavor" not in COST.to_json()  # vLLM's files read as before


def test_the_sglang_preset_is_vllms_constants_plus_the_overlaps_share_and_the_flavours_default():
    from loadgen.core.spec import SimEngineSpec
    from loadgen.sim.cost import QWEN3_8B_MI300X

    p = SGLANG_QWEN3_8B_MI300X
    assert (p.t0_s, p.a_s_per_token, p.b_s_per_token2, p.g_s_per_token) == (
        QWEN3_8B_MI300X.t0_s, QWEN3_8B_MI300X.a_s_per_token, QWEN3_8B_MI300X.b_s_per_token2,
        QWEN3_8B_MI300X.g_s_per_token)
    # SGLang v0.4's 1.1x on the batch-1 decode step at 6K context: 5.18 ms x (1 - 1/1.1)
    assert p.hidden_cpu_s == pytest.approx(5.1775e-3 / 11, rel=1e-3) and p.flavor == "sglang"
    assert SimEngineSpec(flavor="sglang").load_cost_model() == p
    assert SimEngineSpec(flavor="vllm").load_cost_model() == QWEN3_8B_MI300X
