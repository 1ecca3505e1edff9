"""The CPU offload tier's copy links, on both engines (fast SimEngine and ReferenceEngine): the
copies of one direction run one after the other (vllm/v1/kv_offload/worker/cpu_gpu.py chains each
job's stream to the previous job's end event), and with ``shared_link`` a store takes the link a
load needs. Times are derived by hand: 16-token blocks of 1 byte per token at 160 bytes/s, so a
block copies in 0.1 s, and no per-job latency."""

from __future__ import annotations

import pytest

from loadgen.sim.offload import OffloadConfig, copy_piece_bytes, effective_bandwidth_bytes_per_s

from .conftest import make_engine
from .test_engine_scenarios import run_alone, run_until_idle, submit

BLOCK_S = 0.1


def offload_engine(engine_cls, shared_link: bool):
    offload = OffloadConfig(cpu_blocks=1000, bandwidth_bytes_per_s=160.0, latency_s=0.0, kv_bytes_per_token=1,
                            shared_link=shared_link)
    return make_engine(engine_cls, block_size=16, offload=offload)


def stored_then_flushed(engine, keys) -> float:
    """Each key's 64-token turn runs alone (its 4 full blocks go to the host tier when it finishes),
    then the GPU cache is flushed: the next turn of each hits the host tier only. Returns the
    flush time."""
    last = max(run_alone(engine, key, 64, 1).finish_s for key in keys)
    engine.flush(last + 1.0)
    return last + 1.0


@pytest.mark.parametrize("shared_link", [False, True])
def test_two_loads_started_together_finish_one_after_the_other(engine_cls, shared_link):
    engine = offload_engine(engine_cls, shared_link)
    t = stored_then_flushed(engine, ["a", "b"]) + 1.0
    submit(engine, "x", 16, 200, t)  # decodes for about a second: its steps run on
    a = submit(engine, "a", 80, 1, t + 0.001)  # a and b arrive during x's first step: both
    b = submit(engine, "b", 80, 1, t + 0.001)  # look up the host tier at the second step's start
    run_until_idle(engine)
    assert a.num_cached_tokens == b.num_cached_tokens == 64  # both loaded their 4 host blocks
    # a's copy takes the link for 4 blocks, b's waits for it, then takes 4 blocks more
    assert t + 4 * BLOCK_S < a.first_token_s < t + 4 * BLOCK_S + 0.05
    assert b.first_token_s - a.first_token_s > 4 * BLOCK_S - 0.05


@pytest.mark.parametrize("shared_link", [False, True])
def test_a_store_delays_a_load_queued_behind_it_on_a_shared_link(engine_cls, shared_link):
    engine = offload_engine(engine_cls, shared_link)
    stored_then_flushed(engine, ["a"])
    c = run_alone(engine, "c", 64, 1)  # finishes at c.finish_s: its 4 blocks are stored then
    t = c.finish_s
    a = submit(engine, "a", 80, 1, t)  # its load is submitted right behind c's store
    run_until_idle(engine)
    assert a.num_cached_tokens == 64
    if shared_link:  # 4 blocks of store, then 4 of load
        assert a.first_token_s > t + 8 * BLOCK_S
    else:  # stores have their own link (the other direction)
        assert t + 4 * BLOCK_S < a.first_token_s < t + 8 * BLOCK_S


def test_bandwidth_follows_the_copy_piece_of_the_vllm_version():
    """Qwen3-8B (144 KiB/token, 36 layers), 16-token blocks: before 0.12 a block is copied as 72
    per-layer K and V pieces of 32 KiB, from 0.12 as one 2.25 MiB piece; small pieces pay the
    per-copy cost on every 32 KiB."""
    old = copy_piece_bytes("0.11.2", 16, 147_456, 36)
    new = copy_piece_bytes("0.12", 16, 147_456, 36)
    assert (old, new) == (32_768, 2_359_296)
    assert copy_piece_bytes("0.32.0", 16, 147_456, 36) == new
    slow, fast = effective_bandwidth_bytes_per_s(old), effective_bandwidth_bytes_per_s(new)
    assert 8e9 < slow < 10e9 and 45e9 < fast < 50e9
    with pytest.raises(ValueError, match="vLLM version"):
        copy_piece_bytes("latest", 16, 147_456, 36)


def test_a_load_waiting_for_the_link_holds_its_gpu_blocks(engine_cls):
    """b's load waits behind a's: meanwhile b holds its whole prompt's 5 GPU blocks (the twin run
    without b differs by exactly those: b takes no tokens while it waits)."""
    held = {}
    for with_b in (False, True):
        engine = offload_engine(engine_cls, shared_link=False)
        t = stored_then_flushed(engine, ["a", "b"]) + 1.0
        submit(engine, "x", 16, 200, t)
        submit(engine, "a", 80, 1, t + 0.001)
        if with_b:
            b = submit(engine, "b", 80, 1, t + 0.001)
        engine.advance_to(t + 6 * BLOCK_S)  # a's copy has landed, b's has not
        if with_b:
            assert b.first_token_s is None
        held[with_b] = round(engine.kv_usage() * 63)  # 64 blocks, one of them vLLM's null block
    assert held[True] - held[False] == 5


def test_pinned_blocks_are_counted_once_and_never_evicted_until_every_load_unpins():
    from loadgen.sim.kv_pool import Stream
    from loadgen.sim.offload import HostTier

    host = HostTier(OffloadConfig(cpu_blocks=10))
    prefix, own = Stream(("prefix", "system", 2), 0, 2), Stream("s", 2)
    assert host.store(prefix, own, 0, 8) == 8
    host.pin(prefix, own, 1, 5)  # one load: a prefix block and own blocks 2-4
    host.pin(prefix, own, 3, 7)  # another over 3-6: 3 and 4 pinned twice
    assert host.num_pinned == 6 and host.any_pinned(prefix, own, 6, 8) and not host.any_pinned(prefix, own, 7, 8)
    # 8 resident, 6 of them pinned: room for 4 more needs 2 evictions, 5 more would need 3
    other = Stream("t", 0)
    assert host.store(None, other, 0, 5) is None
    assert host.store(None, other, 0, 4) == 4
    assert host.lookup(prefix, own, 1, 7) == 6  # the pinned blocks stayed
    host.unpin(prefix, own, 1, 5)
    assert host.num_pinned == 4 and not host.any_pinned(prefix, own, 0, 3)  # 3-6 still pinned by the other
    host.unpin(prefix, own, 3, 7)
    assert host.num_pinned == 0 and not host.any_pinned(prefix, own, 0, 8)
