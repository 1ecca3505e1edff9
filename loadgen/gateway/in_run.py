"""A live run through the gateway (``engine.gateway``, ``loadgen run --via-gateway``).

The run starts a gateway proxy in front of the spec's engine with the run's limit (a local run: on
loopback in its own event loop; a sweep: in the engine's controller actor, on the engine's node),
and sends every turn to it with a session header and Dynamo's end-of-session header on a
session's last turn. The load generator's own gate runs ``none``: what is compared is
the policy enforced by the proxy, from what the proxy sees on the wire. The engine's /metrics,
pool and cache resets are read from the engine itself (the gateway's /metrics is its own), as
for a router in front of replicas (loadgen/live/replicas.py).
"""

from __future__ import annotations

from typing import Optional, Union

from ..core.spec import ControllerSpec
from ..core.spec.engines import ViaGatewaySpec
from ..live.http_client import GATEWAY_SESSION_HEADER
from .config import GatewayConfig
from .proxy import GatewayProxy, read_pool_tokens

SESSION_HEADER = GATEWAY_SESSION_HEADER


async def start_run_gateway(via: ViaGatewaySpec, upstream: Union[str, list[str]], run_controller: ControllerSpec,
                            time_scale: float, request_timeout_s: float, pool_tokens: Optional[int] = None,
                            session_header: Optional[str] = None, host: str = "127.0.0.1",
                            pool_urls: Optional[list[str]] = None, router: str = "sticky-hash",
                            replica_header: Optional[str] = None,
                            router_options: Optional[dict] = None) -> GatewayProxy:
    """A proxy in front of ``upstream`` (one URL, or a sweep's replicas routed by ``router``, each
    response naming its replica in ``replica_header``) with the run's limit (``via.controller``, else
    the run's own), listening on ``host`` (loopback; a sweep's engine node for fleets on other nodes)
    at a free port."""
    ctl = ControllerSpec.model_validate(via.controller) if via.controller is not None else run_controller
    upstreams = [upstream] if isinstance(upstream, str) else list(upstream)
    config = GatewayConfig(upstreams=upstreams, router=router, router_options=router_options or {},
                           replica_header=replica_header,
                           controller=ctl.name, controller_options=ctl.params,
                           control_start_s=ctl.start_s, tree_policy=ctl.tree_policy, listen=f"{host}:0",
                           pool_tokens=pool_tokens or "auto",
                           session_headers=[session_header or SESSION_HEADER], max_park_s=via.max_park_s,
                           on_max_park=via.on_max_park, idle_timeout_s=via.idle_timeout_s,
                           request_timeout_s=request_timeout_s, time_scale=time_scale)
    pool = pool_tokens or await read_pool_tokens(pool_urls or upstreams)
    proxy = GatewayProxy(config, pool)
    await proxy.serve()
    return proxy


def proxy_sample(proxy: GatewayProxy) -> dict:
    """samples.parquet's gate columns from the proxy's gate: its limit, admitted, waiting and parked
    sessions (the load generator's own gate admits everyone)."""
    gate = proxy.gate
    return {"gateway_limit": gate.limit(), "sessions_admitted": gate.num_admitted,
            "sessions_gateway_waiting": len(gate.waiting_new), "sessions_parked": len(gate.parked)}


def run_gateway_info(proxy: Optional[GatewayProxy]) -> Optional[dict]:
    """run.json's ``gateway``: the proxy's limit and what it did over the run (since its reset at
    the run's start: the preflight's probes went through it before)."""
    if proxy is None:
        return None
    now, before = proxy.metrics.counts(), proxy.counts_at_reset
    if before is not None:
        now = {group: {key: n - before[group][key] for key, n in counts.items()} for group, counts in now.items()}
    return {"controller": proxy.config.controller, "controller_options": proxy.config.controller_options,
            "control_start_s": proxy.config.control_start_s, "pool_tokens": proxy.pool_tokens, **now}
