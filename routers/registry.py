"""Names to routers, and the checked construction of a router from a spec's knobs."""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import Router
from .cache_aware import CacheAware
from .dynamo_kv import DynamoKv
from .hashing import BoundedHash, ConsistentHash
from .llm_d import LlmD
from .simple import LeastOutstanding, PowerOfTwo, RandomRouter, RoundRobin

# docs/deployments.md, in its order
ROUTERS: dict[str, type[Router]] = {
    router.name: router
    for router in (RoundRobin, RandomRouter, LeastOutstanding, PowerOfTwo, ConsistentHash, BoundedHash,
                   CacheAware, LlmD, DynamoKv)
}


def router_params(name: str) -> dict[str, Any]:
    """The knobs a router takes, with their shipped defaults."""
    return {f.name: f.default for f in dataclasses.fields(_router_class(name)) if f.init}


def make_router(name: str, **knobs: Any) -> Router:
    """A fresh router (routers keep state: one per run); a bad name or knob is a ValueError."""
    valid = router_params(name)
    unknown = sorted(set(knobs) - set(valid))
    if unknown:
        raise ValueError(f"router {name!r}: unknown knob(s) {unknown}; valid knobs: "
                         f"{sorted(valid) if valid else 'none'}")
    try:
        return _router_class(name)(**knobs)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"router {name!r}: {exc}") from None


def _router_class(name: str) -> type[Router]:
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; valid routers: {list(ROUTERS)}") from None
