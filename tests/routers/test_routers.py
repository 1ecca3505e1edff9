"""Each router against decisions worked out by hand at its published thresholds (docs/deployments.md)."""

from __future__ import annotations

import math

import pytest

from routers import ROUTERS, ReplicaView, RouteRequest, make_router, router_params
from routers.hashing import HashRing


def views(*outstanding, waiting=None, kv=None):
    n = len(outstanding)
    waiting = waiting or [-1] * n
    kv = kv or [math.nan] * n
    return [ReplicaView(i, outstanding[i], 0, waiting[i], kv[i], 1000) for i in range(n)]


def req(session="s1", prompt=6000, shared=2000, key="system"):
    return RouteRequest(session, prompt, key, shared)


def started(name, n=4, seed=7, **knobs):
    router = make_router(name, **knobs)
    router.start(n, seed)
    return router


def send(router, index, request, now_s=0.0):
    router.routed(index, request, now_s)


def test_round_robin_cycles():
    r = started("round_robin", 3)
    assert [r.route(req(), views(0, 0, 0), 0) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_random_is_seeded_and_covers_all():
    picks = [started("random", 4, seed=3).route(req(), views(0, 0, 0, 0), 0) for _ in range(3)]
    assert len(set(picks)) == 1  # same seed, same first pick
    r = started("random", 4, seed=3)
    assert {r.route(req(), views(0, 0, 0, 0), 0) for _ in range(200)} == {0, 1, 2, 3}


def test_least_outstanding_takes_the_lightest():
    r = started("least_outstanding", 4)
    assert r.route(req(), views(5, 2, 7, 3), 0) == 1


def test_power_of_two_takes_the_lighter_of_its_two_draws():
    r = started("power_of_two", 4, seed=11)
    loads = views(9, 1, 5, 3)
    for _ in range(50):
        state = r.rng.getstate()
        a, b = r.rng.sample(range(4), 2)
        r.rng.setstate(state)
        assert r.route(req(), loads, 0) == (b if loads[b].outstanding < loads[a].outstanding else a)
    # the heaviest replica is never chosen: it loses to whichever it is drawn with
    assert 0 not in {r.route(req(), loads, 0) for _ in range(100)}


def test_consistent_hash_pins_a_session_whatever_the_load():
    r = started("consistent_hash", 4)
    first = r.route(req("abc"), views(0, 0, 0, 0), 0)
    heavy = [0, 0, 0, 0]
    heavy[first] = 500
    assert r.route(req("abc", prompt=9000), views(*heavy), 1.0) == first
    assert first == next(HashRing(4, 160).walk("abc"))


def test_bounded_hash_moves_on_at_its_load_bound():
    r = started("bounded_hash", 4)
    ring = list(HashRing(4, 160).walk("abc"))
    # 8 outstanding over 4 replicas: the bound is ceil(1.25 x 9 / 4) = 3
    loads = [1, 1, 1, 1]
    loads[ring[0]] = 2
    loads[ring[1]] = 3
    loads[ring[2]] = 1
    loads[ring[3]] = 2
    assert sum(loads) == 8 and r.capacity(views(*loads)) == 3
    assert r.route(req("abc"), views(*loads), 0) == ring[0]  # 2 < 3: its home takes it
    loads[ring[0]], loads[ring[2]] = 3, 0  # home full; the next clockwise is full too; the third is not
    assert r.capacity(views(*loads)) == 3
    assert r.route(req("abc"), views(*loads), 0) == ring[2]


def test_cache_aware_follows_its_match_above_threshold_else_the_smallest_tree():
    r = started("cache_aware", 3)
    a = req("a", prompt=6000, shared=2000)
    assert r.route(a, views(0, 0, 0), 0) == 0  # empty trees: smallest tree, lowest index
    send(r, 0, a)
    send(r, 1, req("b", prompt=1000, shared=0))
    # session a's next turn: 6000 of its 7000 tokens are on replica 0: 0.857 > 0.3
    assert r.route(req("a", prompt=7000), views(0, 0, 0), 1) == 0
    # a new session over the same 2000-token system prompt: 2000/6000 = 0.333 > 0.3 -> replica 0 too
    # (where the prefix was routed; every new session follows it: smg #32983's "all misses to one worker")
    assert r.route(req("c", prompt=6000, shared=2000), views(0, 0, 0), 1) == 0
    # 2000/7000 = 0.286 <= 0.3: the smallest tree instead (replica 2 holds nothing)
    assert r.route(req("d", prompt=7000, shared=2000), views(0, 0, 0), 1) == 2


def test_cache_aware_imbalance_needs_both_thresholds():
    r = started("cache_aware", 2)
    a = req("a")
    send(r, 0, a)
    # max - min = 65 > 64 but 100 > 1.5 x 35 is true too: imbalanced -> shortest queue (replica 1)
    assert r.route(req("a", prompt=7000), views(100, 35), 0) == 1
    # max - min = 64: not > 64: balanced -> the cached replica 0
    assert r.route(req("a", prompt=7000), views(100, 36), 0) == 0
    # 200 - 140 = 60 <= 64 and 200 <= 1.5 x 140: balanced
    assert r.route(req("a", prompt=7000), views(200, 140), 0) == 0
    # 300 - 200 = 100 > 64 but 300 <= 1.5 x 200 = 300: balanced (both conditions are needed)
    assert r.route(req("a", prompt=7000), views(300, 200), 0) == 0


def test_cache_aware_kv_triggers_are_off_by_default_and_fire_when_set():
    off = started("cache_aware", 2)
    assert not off.reads_engine
    send(off, 0, req("a"))
    assert off.route(req("a", prompt=7000), views(0, 0, kv=[0.99, 0.1]), 0) == 0
    on = started("cache_aware", 2, overload_token_usage_threshold=0.9)
    assert on.reads_engine
    send(on, 0, req("a"))
    assert on.route(req("a", prompt=7000), views(1, 0, kv=[0.95, 0.1]), 0) == 1  # 0.95 > 0.9: shed
    assert on.route(req("a", prompt=7000), views(1, 0, kv=[0.85, 0.1]), 0) == 0
    spread = started("cache_aware", 2, balance_token_usage_threshold=0.5)
    send(spread, 0, req("a"))
    assert spread.route(req("a", prompt=7000), views(1, 0, kv=[0.7, 0.1]), 0) == 1  # 0.6 > 0.5
    assert spread.route(req("a", prompt=7000), views(1, 0, kv=[0.5, 0.1]), 0) == 0


def test_cache_aware_evicts_its_tree_by_lru_each_interval():
    r = started("cache_aware", 1, max_tree_size=5000, eviction_interval_secs=120)
    r.route(req("old"), views(0), 0)
    send(r, 0, req("old", prompt=4000, shared=0), 0)
    send(r, 0, req("new", prompt=3000, shared=0), 10)
    assert r.tree.sizes[0] == 7000
    r.route(req("x"), views(0), 119)
    assert r.tree.sizes[0] == 7000  # not yet an interval
    r.route(req("x"), views(0), 120)
    assert r.tree.sizes[0] == 3000 and "old" not in r.tree.sessions[0]


def test_llm_d_default_weights_trade_prefix_against_queue_and_kv():
    r = started("llm_d", 2)
    a = req("a", prompt=6400, shared=0)
    send(r, 0, a)
    nxt = req("a", prompt=8000, shared=0)  # replica 0 holds 6400/16 = 400 blocks; 256 are matched of 256
    # equal queues and KV: prefix 3 x 1.0 + queue 2 + kv 2 x 0.5 on 0 vs 0 + 2 + 1 on 1
    assert r.scores(nxt, views(0, 0, waiting=[3, 3], kv=[0.5, 0.5])) == [6.0, 3.0]
    # replica 0 queues 10, replica 1 none; KV 0.9 vs 0.1: 3 + 0 + 0.2 = 3.2 vs 0 + 2 + 1.8 = 3.8
    s = r.scores(nxt, views(0, 0, waiting=[10, 0], kv=[0.9, 0.1]))
    assert s == pytest.approx([3.2, 3.8])
    assert r.route(nxt, views(0, 0, waiting=[10, 0], kv=[0.9, 0.1]), 0) == 1


def cached(*tokens):
    """Views as a deployment gives them to a router reading KV events: the prompt tokens each holds."""
    return [ReplicaView(i, 0, cached_tokens=t) for i, t in enumerate(tokens)]


def test_dynamo_kv_cost_is_prefill_in_flight_and_uncached_plus_active_blocks():
    r = started("dynamo_kv", 2, use_kv_events=False)  # the approximate index: what it routed
    a = req("a", prompt=1600, shared=0)  # 100 blocks
    r.route(a, views(0, 0), 0)
    send(r, 0, a, 0.0)  # active on 0 (100 blocks, 1600 prefill tokens) and in its index there
    nxt = req("a", prompt=3200, shared=0)  # 200 blocks, the first 100 of them a's
    # replica 0: prefill (1600 in flight + 1600 new) / 16 = 200, decode 100 active + 100 new = 200
    # replica 1: prefill 3200 / 16 = 200, decode 200 -> a tie, which the smaller index (1's, empty) wins
    assert r.costs(nxt, views(0, 0), 1.0) == [400, 400]
    assert r.route(nxt, views(0, 0), 1.0) == 1
    r.first_token(0, a, 1.5)  # a's prefill is done: 100 + 200 on replica 0
    assert r.costs(nxt, views(0, 0), 1.5) == [300, 400]
    r.finished(0, a, 2.0)  # a is no longer active: its blocks are new again, but cached
    assert r.costs(nxt, views(0, 0), 3.0) == [300, 400]
    assert r.route(nxt, views(0, 0), 3.0) == 0
    # the approximate index forgets after ttl_secs (120 s): no overlap left anywhere
    assert r.costs(nxt, views(0, 0), 130.0) == [400, 400]
    # the overlap weight scales the prefill term only: 2 x 100 + 200 vs 2 x 200 + 200
    heavy = started("dynamo_kv", 2, overlap_score_weight=2.0, use_kv_events=False)
    send(heavy, 0, a, 0.0)
    heavy.finished(0, a, 1.0)
    assert heavy.costs(nxt, views(0, 0), 2.0) == [400, 600]


def test_dynamo_kv_counts_a_shared_prefix_once_among_the_active_blocks():
    r = started("dynamo_kv", 2)
    b = req("b", prompt=6000, shared=2000)  # 375 blocks: the system prompt's 125, then b's own 250
    r.route(b, cached(0, 0), 0.0)
    send(r, 0, b, 0.0)
    r.first_token(0, b, 0.5)
    c = req("c", prompt=6000, shared=2000)
    # replica 0 holds the system prompt (its KV events): prefill (6000 - 2000) / 16 = 250; decode 375
    # active + 250 new (the system prompt is active already) = 625; replica 1: 375 + 375
    assert r.costs(c, cached(2000, 0), 1.0) == [875, 750]
    r.finished(0, b, 2.0)
    assert r.costs(c, cached(2000, 0), 2.0) == [250 + 375, 750]


def test_dynamo_kv_with_kv_events_no_longer_prefers_a_replica_that_evicted_the_prefix():
    a = req("a", prompt=1600, shared=0)
    z = req("z", prompt=160, shared=0)  # 10 blocks of another session, active on replica 0
    nxt = req("a", prompt=3200, shared=0)
    costs = {}
    for events in (True, False):
        r = started("dynamo_kv", 2, use_kv_events=events)
        r.route(a, cached(0, 0), 0.0)
        send(r, 0, a, 0.0)
        r.finished(0, a, 1.0)
        r.route(z, cached(0, 0), 2.0)
        send(r, 0, z, 2.0)
        r.first_token(0, z, 2.5)
        # replica 0 has since evicted a's blocks: its KV events say it holds none of nxt
        costs[events] = r.costs(nxt, cached(0, 0), 3.0)
        assert r.route(nxt, cached(0, 0), 3.0) == (1 if events else 0)
    # events: 0 pays prefill 200 + decode 10 + 200, 1 pays 200 + 200; approximate: 0 believes a's
    # 100 blocks are still there (routed 3 s ago, within the TTL): 100 + 210
    assert costs == {True: [410, 400], False: [310, 400]}


def test_dynamo_kv_refuses_a_view_without_kv_events():
    with pytest.raises(ValueError, match="needs the engines' KV events"):
        started("dynamo_kv", 2).route(req(), views(0, 0), 0.0)
    with pytest.raises(ValueError, match="use_kv_events must be true or false"):
        make_router("dynamo_kv", use_kv_events="yes")


def test_unknown_router_and_knob_name_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown router 'nope'; valid routers: \['round_robin'"):
        make_router("nope")
    with pytest.raises(ValueError, match=r"router 'consistent_hash': unknown knob\(s\) \['cache_threshold'\]"):
        make_router("consistent_hash", cache_threshold=0.5)
    with pytest.raises(ValueError, match="cache_threshold must be in"):
        make_router("cache_aware", cache_threshold=2)


def test_every_router_is_listed_with_its_knobs():
    assert list(ROUTERS) == ["round_robin", "random", "least_outstanding", "power_of_two", "consistent_hash",
                             "bounded_hash", "cache_aware", "llm_d", "dynamo_kv"]
    assert router_params("cache_aware") == {
        "cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5,
        "balance_token_usage_threshold": 1.0, "overload_token_usage_threshold": 1.0,
        "eviction_interval_secs": 120.0, "max_tree_size": 2 ** 26}
