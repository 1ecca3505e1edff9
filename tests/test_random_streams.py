"""Every random stream of a run is its own: no two keyed generators are equal or correlated.

The draws a run makes are recorded at the one constructor (``rng_for``) while a spec that uses
every kind of stream is planned and its live token contexts are built; then every pair of those
generators is compared. A generator repeated under two keys (SeedSequence zero-pads short
entropy, so (s,), (s, 0) and (s, 0, 0) used to be one generator) shows up as equal draws.
"""

from __future__ import annotations

import numpy as np
import pytest

import loadgen.core.session as session_module
import loadgen.core.workload as workload_module
from loadgen.core.session import TokenContext
from loadgen.core.spec import parse_spec
from loadgen.core.workload import TRIGGER_SESSION_ID_BASE, Stream, piecewise_poisson_arrivals, plan_sessions, rng_for
from tests.conftest import make_spec_dict
from trace_shapes.tree_presets import EDGE, SESSION, node_stream

NUM_DRAWS = 1000
# |corr| of two independent 1000-draw series has sd ~0.032; 0.2 is > 6 sd even over ~10^5 pairs
MAX_ABS_CORR = 0.2
SEED = 11


def _spec_using_every_stream(sessions: dict):
    data = make_spec_dict(duration_s=900)
    data["engine"]["pool_tokens"] = 400_000
    data["workload"]["sessions"] = sessions
    data["arms"] = [
        {"name": "base"},
        {"name": "burst", "triggers": [
            {"kind": "burst", "extra_rate_factor": 2.0, "start_s": 120, "duration_s": 300},
            {"kind": "extra_sessions", "num_sessions": 5, "start_s": 200, "duration_s": 100},
            {"kind": "burst", "extra_rate_factor": 1.0, "start_s": 300, "duration_s": 300, "seed_offset": 4}]},
        {"name": "shift", "triggers": [
            {"kind": "mix_shift", "at_s": 400, "sessions": {"kind": "synthetic", "num_turns": 3, "label": "long",
                                                             "task_tokens": 9000, "output_tokens": 50}}]},
    ]
    return parse_spec(data)


def _record_streams(monkeypatch, specs, seeds) -> dict[tuple, np.random.Generator]:
    """(kind, key) -> a fresh generator, for every stream that planning and token contexts draw."""
    keys: dict[tuple, None] = {}

    def recording_rng_for(kind, *key):
        keys[(kind, *key)] = None
        return rng_for(kind, *key)

    for module in (workload_module, session_module):
        monkeypatch.setattr(module, "rng_for", recording_rng_for)
    for spec in specs:
        for arm in spec.arms:
            for seed in seeds:
                for plan in plan_sessions(spec, arm, seed):
                    TokenContext(plan.shape, plan.token_key, plan.session_id)
    monkeypatch.undo()
    return {key: rng_for(key[0], *key[1:]) for key in keys}


def _assert_pairwise_independent(streams: dict[tuple, np.random.Generator]) -> None:
    names = list(streams)
    draws = np.stack([streams[name].random(NUM_DRAWS) for name in names])
    first = {}
    for name, row in zip(names, draws):
        assert row[:4].tobytes() not in first, f"{name} draws what {first.get(row[:4].tobytes())} draws"
        first[row[:4].tobytes()] = name
    corr = np.corrcoef(draws)
    np.fill_diagonal(corr, 0.0)
    i, j = np.unravel_index(np.argmax(np.abs(corr)), corr.shape)
    assert abs(corr[i, j]) < MAX_ABS_CORR, f"{names[i]} and {names[j]} are correlated ({corr[i, j]:.3f})"


def test_every_stream_of_a_spec_is_independent_of_every_other(monkeypatch):
    specs = [_spec_using_every_stream({"kind": "synthetic", "num_turns": 6, "task_tokens": 2000,
                                       "output_tokens": 100, "tool_tokens": 500, "think_time_mean_s": 3.0}),
             _spec_using_every_stream({"kind": "swebench"})]
    # seeds s, s + 2^32 and -s: keys are kept whole and signed, never cut to 32 bits
    streams = _record_streams(monkeypatch, specs, [SEED, SEED + 2**32, -SEED])
    kinds = {key[0] for key in streams}
    assert kinds == {Stream.BASE_ARRIVALS, Stream.BASE_SESSION, Stream.BASE_DRAW_ORDER, Stream.TRIGGER_ARRIVALS,
                     Stream.TRIGGER_SESSION, Stream.TRIGGER_DRAW_ORDER, Stream.SESSION_TOKENS,
                     Stream.SHARED_PREFIX_TOKENS}
    assert len(streams) > 500
    _assert_pairwise_independent(streams)


def test_base_think_times_are_not_the_arrival_gaps_and_a_burst_is_not_its_first_session():
    spec = _spec_using_every_stream({"kind": "synthetic", "num_turns": 12, "think_time_mean_s": 5.0})
    plans = plan_sessions(spec, spec.arm("burst"), SEED)
    base = [p for p in plans if not p.is_trigger]
    gaps = np.diff([0.0] + [p.arrival_s for p in base])[:11]
    think = np.array(base[0].shape.think_s[:len(gaps)])
    ratios = think / gaps
    assert ratios.max() > 1.5 * ratios.min()  # not the same exponential draws, rescaled
    burst = [p for p in plans if p.session_id // TRIGGER_SESSION_ID_BASE == 1]  # the first trigger's
    burst_gaps = np.diff([120.0] + [p.arrival_s for p in burst])[:11]
    burst_think = np.array(burst[0].shape.think_s[:len(burst_gaps)])
    ratios = burst_think / burst_gaps
    assert ratios.max() > 1.5 * ratios.min()


def test_keys_are_whole_signed_and_of_a_fixed_length():
    def first(kind, *key):
        return tuple(rng_for(kind, *key).random(4))

    seeds = [5, 5 + 2**32, -5, 2**63 + 5]
    assert len({first(Stream.BASE_ARRIVALS, s) for s in seeds}) == len(seeds)
    # one seed, different kinds and arities: different streams
    assert len({first(Stream.BASE_ARRIVALS, 5), first(Stream.BASE_SESSION, 5, 0),
                first(Stream.BASE_DRAW_ORDER, 5), first(Stream.TRIGGER_ARRIVALS, 5, 0, 0),
                first(Stream.TRIGGER_SESSION, 5, 0, 0, 0)}) == 5
    assert first(Stream.BASE_ARRIVALS, 5) == first(Stream.BASE_ARRIVALS, 5)  # deterministic
    with pytest.raises(ValueError, match="takes 2 key parts"):
        rng_for(Stream.BASE_SESSION, 5)
    with pytest.raises(ValueError, match="64 bits"):
        rng_for(Stream.BASE_ARRIVALS, 2**64)


@pytest.mark.parametrize("kind,key", [
    (Stream.BASE_ARRIVALS, (0,)), (Stream.BASE_ARRIVALS, (2**64 - 1,)), (Stream.BASE_ARRIVALS, (-(2**64) + 1,)),
    (Stream.BASE_SESSION, (501, 0)), (Stream.BASE_SESSION, (7, 2**32 - 1)),
    (Stream.TRIGGER_SESSION, (501, 3, 99, 1_000_123)), (Stream.SESSION_TOKENS, (501, "burst", 12)),
    (Stream.SHARED_PREFIX_TOKENS, (3, "é arm", "system", 2048)), (Stream.STEP_JITTER, (1, "a", 0, 3)),
])
def test_a_stream_is_numpys_pcg64_seeded_by_its_key_words(kind, key):
    # rng_for hashes the key's words itself (loadgen/core/seeding.py): the numbers a spec has always
    # drawn must not move, so each stream is still PCG64(SeedSequence(words))
    from loadgen.core.workload import _WORD, _hash64, _key_words
    tag = _hash64(f"agent-loadgen/{kind.tag}")
    words = [tag & _WORD, tag >> 32, kind.arity] + [w for part in key for w in _key_words(part)]
    reference = np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
    drawn = rng_for(kind, *key)
    assert drawn.integers(0, 2**63, 8).tolist() == reference.integers(0, 2**63, 8).tolist()
    assert drawn.random(3).tolist() == reference.random(3).tolist()
    # a session tree derives its nodes' streams from its root's seed sequence: the same ones
    for path, purpose in [((), EDGE), ((0,), SESSION), ((2, 1), EDGE), ((1, 0, 3), SESSION)]:
        ours = node_stream(rng_for(kind, *key), path, purpose)
        numpys = node_stream(np.random.Generator(np.random.PCG64(np.random.SeedSequence(words))), path, purpose)
        assert ours.integers(0, 2**63, 4).tolist() == numpys.integers(0, 2**63, 4).tolist()


def test_the_seed_hash_matches_numpys_for_any_words():
    from loadgen.core.seeding import KeyedSeed, seed_state
    rng = np.random.default_rng(11)
    for n in range(0, 20):
        words = [int(w) for w in rng.integers(0, 2**32, n)] + [0, 2**32 - 1][: n % 3]
        reference = np.random.SeedSequence(words)
        assert seed_state(words, 9) == reference.generate_state(9).tolist()
        assert KeyedSeed(words).generate_state(3, np.uint64).tolist() == reference.generate_state(3, np.uint64).tolist()
    with pytest.raises(ValueError, match="seed words"):
        KeyedSeed([2**32])


def test_arms_still_share_every_base_draw():
    spec = _spec_using_every_stream({"kind": "swebench"})
    base = plan_sessions(spec, spec.arm("base"), SEED)
    burst = [p for p in plan_sessions(spec, spec.arm("burst"), SEED) if not p.is_trigger]
    assert base == burst and len(base) > 10
    # the base arrival stream is the one the planner drew from
    rate = spec.workload.arrival_rate_per_s
    assert [p.arrival_s for p in base] == piecewise_poisson_arrivals(
        [(0.0, rate)], spec.duration_s, rng_for(Stream.BASE_ARRIVALS, SEED))
