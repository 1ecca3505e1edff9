"""A sweep's deployment: ``engine.replicas`` engines per run behind a loadgen gateway.

Each replica is an engine actor on a bundle of its own (``num_gpus`` GPUs each); the run's
controller actor hosts the gateway proxy in front of them (``actors/controller.py``), which
routes every session to one replica and names the replica of each response in
``X-Loadgen-Replica``, the header serve-sim deployments set, so the fleets record ``replica``
per turn as a live run with ``engine.replica_header`` does. The controller scrapes each replica's
/metrics (replica_samples.parquet) and sums their pools into C.
"""

from __future__ import annotations

import asyncio
from typing import Optional

from loadgen.core.spec import LaunchedEngineSpec
from loadgen.gateway.upstream_choice import ROUTER_NAMES
from loadgen.live.serve_deployment import REPLICA_HEADER

FALLBACK_CHOOSER = "sticky-hash"

__all__ = ["REPLICA_HEADER", "first_exit", "router_info", "router_note"]


def router_info(engine: LaunchedEngineSpec) -> dict:
    """run.json's fields of a deployment: ``router``, the gateway router that routed (as a
    simulated deployment's ``router`` names its policy), the ``router_spec`` asked for (its knobs
    go to the gateway's router_options), and a ``router_note`` when they differ. The gateway routes
    by every policy of routers/ (loadgen/gateway/upstream_choice.py); a spec without a router is
    routed by sticky-hash (every request of a session to one replica)."""
    spec = engine.router
    exact = spec is not None and spec.policy in ROUTER_NAMES
    info = {"router": spec.policy if exact else FALLBACK_CHOOSER,
            "router_spec": {"policy": spec.policy, **spec.knobs} if spec is not None else None, "router_note": None}
    if spec is not None and not exact:
        info["router_note"] = (f"the gateway cannot route by {spec.policy!r} yet: sessions were routed by "
                               f"{FALLBACK_CHOOSER} (each session's requests to one replica, by a hash of its "
                               "session id)")
    return info


def router_note(engine) -> Optional[str]:
    """What a sweep says before it starts when its replicas will not be routed by the spec's policy."""
    if getattr(engine, "replicas", 1) > 1 and isinstance(engine, LaunchedEngineSpec):
        return router_info(engine)["router_note"]
    return None


async def first_exit(waits: list) -> tuple[int, Optional[int]]:
    """(replica index, exit code) of the first engine whose ``wait_exit`` returns; a dead actor's
    error is raised."""
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
        first = min(futures.index(f) for f in done)
        return first, futures[first].result()
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
            elif not f.cancelled():
                f.exception()
