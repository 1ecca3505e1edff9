"""The real CPU vLLM behind the gateway: a short closed loop in which the budgeter parks sessions
at the proxy while the turns it lets through keep hitting the prefix cache."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from loadgen.core.runner import RunKey
from loadgen.core.spec import parse_spec
from loadgen.live.runner import run_live
from tests.live.vllm_cpu import VllmServer, tiny_model_dir

pytestmark = pytest.mark.vllm

BLOCK = 128
NUM_BLOCKS = 256  # a 32K-token pool: the budgeter (0.75 C) admits three or four of these sessions at once


def test_the_budgeter_parks_at_the_proxy_in_front_of_real_vllm_and_hits_stay_high(tmp_path):
    with VllmServer(tiny_model_dir(tmp_path / "tiny-qwen3"), num_blocks=NUM_BLOCKS, max_model_len=16384) as server:
        spec = parse_spec({
            "experiment": "vllm-cpu-gateway", "duration_s": 40, "seeds": [1],
            "engine": {"kind": "openai", "url": server.url, "gateway": {}},
            "workload": {"arrival_rate_per_s": 1.0, "sessions": {
                "kind": "synthetic", "num_turns": 5, "system_prompt_tokens": 2000, "task_tokens": 3000,
                "output_tokens": 8, "tool_tokens": 500, "think_time_mean_s": 3.0}},
            "arms": [{"name": "budgeter", "controller": {"name": "budgeter"}}],
        })
        info = run_live(spec, RunKey("budgeter", 1), tmp_path / "out")
    assert info["status"] == "completed", info.get("error")
    gw = info["gateway"]
    assert gw["controller"] == "budgeter" and gw["pool_tokens"] == NUM_BLOCKS * BLOCK
    assert gw["parks"]["waiting"] + gw["parks"]["parked"] >= 3 and gw["admissions"]["admitted"] >= 3
    t = pq.read_table(tmp_path / "out" / "runs" / "budgeter-s1" / "turns.parquet").to_pydict()
    ok = [e is None for e in t["error"]]
    assert sum(ok) > 15 and all(ok)
    warm = [(c, p) for k, p, c in zip(t["turn_index"], t["prompt_tokens"], t["cached_tokens"]) if k > 0]
    hit = sum(c for c, _ in warm) / sum(p for _, p in warm)
    assert hit > 0.8, hit
    assert np.isfinite(hit)
