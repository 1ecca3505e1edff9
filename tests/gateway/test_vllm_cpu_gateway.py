"""The real CPU vLLM behind the gateway: a short closed loop in which the budgeter parks sessions
at the proxy while the turns it lets through keep hitting the prefix cache, once with the run's own
proxy (engine.gateway) and once through a `loadgen gateway` started on its own (only its URL given)."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from loadgen.core.runner import RunKey
from loadgen.core.spec import parse_spec
from loadgen.live.runner import run_live
from tests.live.vllm_cpu import VllmServer, tiny_model_dir
from tests.servers import free_port, start_server

pytestmark = pytest.mark.vllm

BLOCK = 128
NUM_BLOCKS = 256  # a 32K-token pool: the budgeter (0.75 C) admits three or four of these sessions at once
SPEC = {
    "experiment": "vllm-cpu-gateway", "duration_s": 40, "seeds": [1],
    "workload": {"arrival_rate_per_s": 1.0, "sessions": {
        "kind": "synthetic", "num_turns": 5, "system_prompt_tokens": 2000, "task_tokens": 3000,
        "output_tokens": 8, "tool_tokens": 500, "think_time_mean_s": 3.0}},
}


def check_turns(run_dir) -> None:
    t = pq.read_table(run_dir / "turns.parquet").to_pydict()
    ok = [e is None for e in t["error"]]
    assert sum(ok) > 15 and all(ok)
    warm = [(c, p) for k, p, c in zip(t["turn_index"], t["prompt_tokens"], t["cached_tokens"]) if k > 0]
    hit = sum(c for c, _ in warm) / sum(p for _, p in warm)
    assert np.isfinite(hit) and hit > 0.8, hit
    # the proxy's parks are the turns' gateway waits (its response header)
    assert sum(w > 0 for w in t["gateway_wait_s"]) >= 3


def test_the_budgeter_parks_at_the_proxy_in_front_of_real_vllm_and_hits_stay_high(tmp_path):
    with VllmServer(tiny_model_dir(tmp_path / "tiny-qwen3"), num_blocks=NUM_BLOCKS, max_model_len=16384) as server:
        spec = parse_spec({**SPEC, "engine": {"kind": "openai", "url": server.url, "gateway": {}},
                           "arms": [{"name": "budgeter", "controller": {"name": "budgeter"}}]})
        info = run_live(spec, RunKey("budgeter", 1), tmp_path / "out")
        assert info["status"] == "completed", info.get("error")
        gw = info["gateway"]
        assert gw["controller"] == "budgeter" and gw["pool_tokens"] == NUM_BLOCKS * BLOCK
        assert gw["parks"]["waiting"] + gw["parks"]["parked"] >= 3 and gw["admissions"]["admitted"] >= 3
        check_turns(tmp_path / "out" / "runs" / "budgeter-s1")

        # a gateway of the user's own, in front of the same engine: the run is given its URL only
        port = free_port()
        (tmp_path / "gateway.yaml").write_text(yaml.safe_dump({
            "upstreams": [server.url], "controller": "budgeter", "listen": f"127.0.0.1:{port}"}))
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
            **SPEC, "engine": {"kind": "sim", "pool_tokens": NUM_BLOCKS * BLOCK}, "arms": [{"name": "through"}]}))
        url = f"http://127.0.0.1:{port}"
        gateway = start_server([sys.executable, "-m", "loadgen.cli", "gateway", "--config",
                                str(tmp_path / "gateway.yaml")], url,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(tmp_path / "spec.yaml"),
                                   "--endpoint", url, "--out", str(tmp_path / "external"), "--no-figures",
                                   "--quiet"], capture_output=True, text=True, timeout=600)
        finally:
            gateway.kill()
            gateway.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "external" / "runs" / "through-s1"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["endpoint_gateway_started"] is True and info["pool_tokens"] == NUM_BLOCKS * BLOCK
    check_turns(run_dir)
