"""The ``loadgen gateway`` process: read the pool, listen, show progress, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import sys
from typing import Optional

from ..core.spec import SpecError
from .config import GatewayConfig
from .proxy import GatewayProxy, read_pool_tokens


def keys_from_env(config: GatewayConfig) -> tuple[Optional[list[str]], Optional[str]]:
    """(client keys, upstream key) from the environment variables the config names."""
    client_keys = upstream_key = None
    if config.client_keys_env:
        value = os.environ.get(config.client_keys_env, "")
        client_keys = [k.strip() for k in value.split(",") if k.strip()]
        if not client_keys:
            raise SpecError(f"client_keys_env: ${config.client_keys_env} is not set or holds no key")
    if config.upstream_key_env:
        upstream_key = os.environ.get(config.upstream_key_env)
        if not upstream_key:
            raise SpecError(f"upstream_key_env: ${config.upstream_key_env} is not set")
    return client_keys, upstream_key


def progress_line(proxy: GatewayProxy) -> str:
    gate = proxy.gate
    limit = gate.limit()
    return (f"t={gate.clock.now():8.1f} s  active {gate.num_admitted:5d}  parked {len(gate.parked):5d}  "
            f"waiting {len(gate.waiting_new):5d}  in flight {proxy.num_in_flight:5d}  "
            f"D/C {gate.demand_tokens / max(gate.pool_tokens, 1):5.2f}  limit {'-' if math.isnan(limit) else f'{limit:g}'}")


async def serve(config: GatewayConfig, quiet: bool = False) -> int:
    client_keys, upstream_key = keys_from_env(config)
    upstream_pools = None
    if config.pool_tokens == "auto":
        try:
            if config.scope == "replica":  # each upstream's own pool, for its own limit
                upstream_pools = [await read_pool_tokens([url]) for url in config.upstreams]
                pool_tokens = sum(upstream_pools)
            else:
                pool_tokens = await read_pool_tokens(config.upstreams)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
    else:
        pool_tokens = config.pool_tokens
    proxy = GatewayProxy(config, pool_tokens, client_keys=client_keys, upstream_key=upstream_key,
                         upstream_pools=upstream_pools)
    try:
        await proxy.serve()
    except OSError as exc:
        raise SpecError(f"listen: cannot listen on {config.listen} ({exc.strerror})") from None
    print(f"loadgen gateway on http://{config.listen} -> {', '.join(config.upstreams)}; controller "
          f"{config.controller}, pool {pool_tokens} tokens"
          + (f" (a limit per upstream: {', '.join(map(str, proxy.upstream_pools))})" if proxy.per_upstream else ""),
          file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    show = not quiet and sys.stderr.isatty()

    async def progress() -> None:
        while True:
            await asyncio.sleep(1.0)
            sys.stderr.write("\r" + progress_line(proxy))
            sys.stderr.flush()

    shown = loop.create_task(progress()) if show else None
    await stop.wait()
    if shown is not None:
        shown.cancel()
        sys.stderr.write("\n")
    print(f"draining: {proxy.num_open} request(s) open, up to {config.drain_timeout_s:g} s",
          file=sys.stderr, flush=True)
    clean = await proxy.drain()
    counts = proxy.drain_counts
    print(("drained" if clean else f"drain deadline reached: {counts['cut_streaming']} request(s) cut mid-response, "
           f"{counts['refused_unanswered']} answered 503 before their answer began")
          + f"; {counts['refused_held']} parked or waiting request(s) answered 503 at once", file=sys.stderr, flush=True)
    return 0


def run(config: GatewayConfig, quiet: bool = False, log_level: str = "info") -> int:
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(config, quiet))
    return uvloop.run(serve(config, quiet))
