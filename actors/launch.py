"""What an engine actor runs: the server command line, its environment, health and pool size.

Plain functions with no Ray in them, so they are tested without a cluster. The flags loadgen
relies on are always given: prefix caching and cached-token reports (the preflight refuses a
server without them), the served name, host and port; the spec's own ``flags`` come last so
that they can add anything else (``--max-model-len``, ``--gpu-memory-utilization`` ...).
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Optional

from loadgen.core.spec import LaunchedEngineSpec, SimEngineSpec
from loadgen.sim.cost import PRESETS

# The device variables Ray sets for an actor with num_gpus (NVIDIA, AMD): the server inherits
# them and so sees only the GPUs Ray reserved for this run.
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(spec: LaunchedEngineSpec, host: str, port: int, time_scale: float,
                   cost_model_arg: Optional[str] = None) -> list[str]:
    """The server's argv. ``cost_model_arg``: serve_sim's --cost-model (a preset or a file)."""
    python = spec.python or sys.executable
    if spec.kind == "vllm":
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model,
                "--served-model-name", spec.name, "--host", host, "--port", str(port),
                "--enable-prefix-caching", "--enable-prompt-tokens-details", *spec.flags]
    if spec.kind == "sglang":
        return [python, "-m", "sglang.launch_server", "--model-path", spec.model,
                "--served-model-name", spec.name, "--host", host, "--port", str(port),
                "--enable-cache-report", "--enable-metrics", *spec.flags]
    sim = spec.simulator
    command = [python, "-m", "loadgen.cli", "serve-sim", "--model", spec.name, "--host", host, "--port", str(port),
               "--time-scale", repr(time_scale), "--pool-tokens", str(sim.pool_tokens),
               "--block-size", str(sim.block_size), "--max-num-batched-tokens", str(sim.max_num_batched_tokens),
               "--max-model-len", str(sim.max_model_len), "--cost-model", cost_model_arg or str(sim.cost_model)]
    if not sim.enable_prefix_caching:
        command.append("--no-prefix-caching")
    if spec.tokenizer:  # the server counts prompts as the sessions that build them do
        command += ["--tokenizer", spec.tokenizer]
    return command + list(spec.flags)


def serve_sim_cost_model_arg(sim: SimEngineSpec, scratch_dir: Path) -> str:
    """serve-sim takes a preset name or a cost.json path; inline constants go to a scratch file."""
    if isinstance(sim.cost_model, dict):
        path = Path(tempfile.mkstemp(prefix="cost-", suffix=".json", dir=scratch_dir)[1])
        path.write_text(json.dumps(sim.cost_model))
        return str(path)
    return sim.cost_model if sim.cost_model in PRESETS else str(Path(sim.cost_model).resolve())


def server_env(spec: LaunchedEngineSpec, inherited: Mapping[str, str]) -> dict[str, str]:
    """The inherited environment (with Ray's device variables) plus the spec's ``env``.
    vLLM serves /reset_prefix_cache, which every run starts with, only in dev mode."""
    env = dict(inherited)
    if spec.kind == "vllm":
        env.setdefault("VLLM_SERVER_DEV_MODE", "1")
    env.update(spec.env)
    return env


def visible_devices(env: Mapping[str, str]) -> dict[str, str]:
    return {name: env[name] for name in DEVICE_VARIABLES if name in env}


def log_tail(path: Path, num_chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-num_chars:]
    except OSError:
        return ""
