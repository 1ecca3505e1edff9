"""`loadgen calibrate`'s queue rows: the features that replay vLLM's scheduler over a drained
queue must be the steps the simulated engines take, or the fit would learn the wrong costs."""

from dataclasses import replace

import pytest

from loadgen.sim.cost import queue_drain
from loadgen.sim.request import SimRequest

from .conftest import COST, make_engine


def drain_time_s(engine, num_requests: int, new_tokens: int, cached_tokens: int, output_tokens: int) -> float:
    prefix = engine.prefix_stream("system", cached_tokens)
    warm = SimRequest("warm", engine.stream("warm", cached_tokens), cached_tokens + 16, 1, prefix=prefix)
    engine.submit(warm, 0.0)
    engine.advance_to(100.0)
    assert warm.finish_s is not None
    requests = [SimRequest(i, engine.stream(i, cached_tokens), cached_tokens + new_tokens, output_tokens,
                           prefix=prefix) for i in range(num_requests)]
    for req in requests:
        engine.submit(req, 100.0)
    engine.advance_to(1e6)
    assert all(r.num_cached_tokens == cached_tokens for r in requests)
    return max(r.finish_s for r in requests) - 100.0


@pytest.mark.parametrize("num_requests,new_tokens,output_tokens,budget", [
    (6, 700, 5, 512),    # chunks split across steps, decodes riding with later prefills
    (3, 100, 9, 512),    # several whole prefills in one step, then a decode tail
    (8, 1000, 1, 2048),  # one output token: prefill only
])
def test_queue_features_are_the_steps_the_engine_takes(engine_cls, num_requests, new_tokens, output_tokens, budget):
    # with the mixed-step decode term on: the row must also say which decodes ran beside a chunk
    cost = replace(COST, mixed_decode_s_per_token=3 * COST.g_s_per_token)
    engine = make_engine(engine_cls, cost=cost, num_blocks=4096, max_num_batched_tokens=budget)
    measured = drain_time_s(engine, num_requests, new_tokens, 512, output_tokens)
    row = queue_drain("queue", measured, num_requests, new_tokens, 512, output_tokens, chunk_tokens=budget)
    assert cost.predict(row) == pytest.approx(measured, rel=1e-9)
