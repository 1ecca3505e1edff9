"""Engine server command lines and environments (no cluster needed)."""

from __future__ import annotations

import pytest

from actors.launch import server_command, server_env, visible_devices
from loadgen.cli import build_parser
from loadgen.core.spec import LaunchedEngineSpec


def test_vllm_gets_the_flags_loadgen_needs_then_the_specs_own():
    spec = LaunchedEngineSpec(kind="vllm", model="/models/Qwen3-8B", served_model_name="qwen3-8b",
                              flags=["--max-model-len", "40960"], python="/opt/vllm/bin/python")
    command = server_command(spec, "10.1.2.3", 8123, time_scale=1.0)
    assert command[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details"):
        assert flag in command
    assert command[command.index("--model") + 1] == "/models/Qwen3-8B"
    assert command[command.index("--served-model-name") + 1] == "qwen3-8b"
    assert command[command.index("--host") + 1] == "10.1.2.3" and command[command.index("--port") + 1] == "8123"
    assert command[-2:] == ["--max-model-len", "40960"]


def test_sglang_reports_cached_tokens_and_metrics():
    spec = LaunchedEngineSpec(kind="sglang", model="Qwen/Qwen3-8B", flags=["--mem-fraction-static", "0.85"])
    command = server_command(spec, "h", 1, time_scale=1.0)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    assert command[command.index("--model-path") + 1] == "Qwen/Qwen3-8B"
    assert command[command.index("--served-model-name") + 1] == "Qwen/Qwen3-8B"
    assert {"--enable-cache-report", "--enable-metrics"} <= set(command)
    assert command[-2:] == ["--mem-fraction-static", "0.85"]


def test_serve_sim_command_is_one_loadgen_accepts_with_the_specs_engine():
    spec = LaunchedEngineSpec(kind="serve_sim", model="sim-8b", num_gpus=0,
                              simulator={"pool_tokens": 160_000, "block_size": 32, "enable_prefix_caching": False})
    command = server_command(spec, "127.0.0.1", 9000, time_scale=60.0)
    assert command[1:4] == ["-m", "loadgen.cli", "serve-sim"]
    args = build_parser().parse_args(command[3:])
    assert (args.pool_tokens, args.block_size, args.no_prefix_caching) == (160_000, 32, True)
    assert (args.time_scale, args.port, args.model, args.cost_model) == (60.0, 9000, "sim-8b", "qwen3-8b-mi300x")


def test_server_inherits_rays_device_variables_and_vllm_runs_in_dev_mode():
    inherited = {"PATH": "/usr/bin", "HIP_VISIBLE_DEVICES": "3"}
    env = server_env(LaunchedEngineSpec(kind="vllm", model="m"), inherited)
    assert env["HIP_VISIBLE_DEVICES"] == "3" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert visible_devices(env) == {"HIP_VISIBLE_DEVICES": "3"}
    overridden = server_env(LaunchedEngineSpec(kind="vllm", model="m", env={"VLLM_SERVER_DEV_MODE": "0"}), inherited)
    assert overridden["VLLM_SERVER_DEV_MODE"] == "0"
    assert "VLLM_SERVER_DEV_MODE" not in server_env(LaunchedEngineSpec(kind="sglang", model="m"), inherited)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_launched_engine_reserves_one_gpu_unless_told(kind):
    assert LaunchedEngineSpec(kind=kind, model="m").num_gpus == 1
