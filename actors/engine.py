"""The engine actor: one inference server per run, on the GPU(s) Ray reserved for it.

Created with ``num_gpus`` from the spec (1 for vLLM/SGLang), so Ray sets the device variables
(CUDA_VISIBLE_DEVICES on NVIDIA, HIP_VISIBLE_DEVICES on AMD) and the server, which inherits
them, sees only its own GPU. ``start`` launches the server, waits for /health, reads the KV
pool C from /metrics and returns where it serves; ``wait_exit`` returns when the server
process ends, which is how the sweep notices a server that died mid-run (a killed actor makes
the same call fail). The server dies with the actor (parent-death signal) and with ``stop``.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import ray

from loadgen.core.clock import WallClock
from loadgen.live.server_metrics import parse_metrics
from loadgen.core.spec import LaunchedEngineSpec

from .launch import free_port, log_tail, serve_sim_cost_model_arg, server_command, server_env, visible_devices

HEALTH_POLL_S = 0.25
STOP_GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1


class EngineStartError(RuntimeError):
    """The server exited or never became healthy; the message carries its log's tail."""


def _die_with_parent() -> None:
    # runs in the child before exec: the kernel sends SIGKILL when the actor's process dies,
    # so a killed actor never leaves a server holding its GPU
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@ray.remote(num_cpus=0)
class EngineActor:
    def __init__(self, spec: LaunchedEngineSpec, time_scale: float, run_id: str) -> None:
        self.spec = spec
        self.time_scale = time_scale
        self.run_id = run_id
        self.proc: Optional[subprocess.Popen] = None
        self.scratch = Path(tempfile.mkdtemp(prefix=f"loadgen-engine-{run_id}-"))
        self.log_path = self.scratch / "server.log"

    async def start(self) -> dict:
        """Launch the server and wait until it serves; returns url, pool size and placement."""
        host = ray.util.get_node_ip_address()
        port = free_port(host)
        cost_arg = serve_sim_cost_model_arg(self.spec.simulator, self.scratch) if self.spec.kind == "serve_sim" else None
        command = server_command(self.spec, host, port, self.time_scale, cost_arg)
        env = server_env(self.spec, os.environ)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        url = f"http://{host}:{port}"
        await self._wait_healthy(url)
        pool_tokens = self.spec.pool_tokens or await self._read_pool_tokens(url)
        return {"url": url, "model": self.spec.name, "pool_tokens": pool_tokens, "pid": self.proc.pid,
                "node_id": ray.get_runtime_context().get_node_id(), "node_ip": host,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "visible_devices": visible_devices(env),
                "command": command, "log_path": str(self.log_path)}

    async def _wait_healthy(self, url: str) -> None:
        import aiohttp

        clock = WallClock()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while clock.now() < self.spec.startup_timeout_s:
                if self.proc.poll() is not None:
                    raise EngineStartError(f"{self.spec.kind} server exited with code {self.proc.returncode} "
                                           f"while starting; log tail:\n{log_tail(self.log_path)}")
                try:
                    async with http.get(url + "/health") as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await clock.sleep(HEALTH_POLL_S)
        self._terminate()
        raise EngineStartError(f"{self.spec.kind} server not healthy after {self.spec.startup_timeout_s:g} s; "
                               f"log tail:\n{log_tail(self.log_path)}")

    async def _read_pool_tokens(self, url: str) -> int:
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(url + "/metrics") as resp:
                scraped = parse_metrics(await resp.text())
        if not scraped.pool_tokens:
            raise EngineStartError(f"{url}/metrics reports no KV pool size (vllm:cache_config_info or "
                                   "sglang:max_total_num_tokens): give engine.pool_tokens in the spec")
        return scraped.pool_tokens

    async def wait_exit(self) -> int:
        """Returns the server's exit code when it exits (it should not before ``stop``)."""
        clock = WallClock()
        while self.proc.poll() is None:
            await clock.sleep(HEALTH_POLL_S)
        return self.proc.returncode

    def server_log_tail(self) -> str:
        return log_tail(self.log_path)

    def stop(self) -> None:
        """Stop the server and drop its scratch files (a failure's log tail is in its error)."""
        self._terminate()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _terminate(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
