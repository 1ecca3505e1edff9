"""serve-sim with a CPU offload tier: a prompt the GPU pool lost is served from the host tier,
and /metrics reports it under vLLM's names (external prefix cache, offload bytes)."""

import asyncio
import re
import urllib.request

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient
from loadgen.sim.offload import DEFAULT_KV_BYTES_PER_TOKEN

A = [(i * 7919) % 29989 + 1 for i in range(4000)]
B = [(i * 104729) % 29989 + 1 for i in range(7000)]


def _metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_:]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def test_a_turn_evicted_from_the_gpu_pool_is_loaded_from_the_host_tier(serve_sim_factory):
    server = serve_sim_factory(1.0, "--zero-cost", "--pool-tokens", "8192", "--max-model-len", "8192",
                               "--offload-cpu-tokens", "100000")

    async def go():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=server.url, model="sim"))
        try:
            first = await client.generate(TurnRequest(1, 0, len(A), 1, token_ids=A))
            other = await client.generate(TurnRequest(2, 0, len(B), 1, token_ids=B))  # evicts most of A on the GPU
            again = A + list(first.output_token_ids) + [5] * 100
            second = await client.generate(TurnRequest(1, 1, len(again), 1, token_ids=again))
        finally:
            await client.close()
        return first, other, second, len(again)

    first, other, second, num_again = asyncio.run(go())
    assert first.error is None and other.error is None and second.error is None
    m = _metrics(server.url)
    name = 'model_name="sim"'
    gpu_hits = m[f"vllm:prefix_cache_hits_total{{{name}}}"]
    host_hits = m[f"vllm:external_prefix_cache_hits_total{{{name}}}"]
    # A's KV (4000 prompt + 1 output - 1 = 250 blocks) comes back whole: part from what the GPU
    # pool kept, the rest copied from the host tier
    assert second.cached_tokens == 4000
    assert host_hits > 0 and gpu_hits + host_hits == 4000
    assert m[f"vllm:external_prefix_cache_queries_total{{{name}}}"] == len(A) + len(B) + num_again
    to_gpu = m[f'vllm:kv_offload_total_bytes_total{{{name},transfer_type="CPU_to_GPU"}}']
    to_cpu = m[f'vllm:kv_offload_total_bytes_total{{{name},transfer_type="GPU_to_CPU"}}']
    assert to_gpu == host_hits * DEFAULT_KV_BYTES_PER_TOKEN
    # stored: A's 250 blocks, B's 437 full blocks, and the second turn's blocks past what it loaded
    assert to_cpu == (250 + 437 + (num_again // 16 - 250)) * 16 * DEFAULT_KV_BYTES_PER_TOKEN


def test_serve_sim_without_a_tier_reports_no_offload_metrics(serve_sim_factory):
    server = serve_sim_factory(1.0, "--zero-cost")
    m = _metrics(server.url)
    assert not any(k.startswith(("vllm:external_prefix_cache", "vllm:kv_offload")) for k in m)
    assert 'vllm:prefix_cache_hits_total{model_name="sim"}' in m
