"""Routers: pure policies that pick the replica of a deployment each request goes to.

A router gets the request (its session key and prefix shape) and a view of the replicas (the
requests it has outstanding on each, and, for routers that read them, the engines' own
queue and KV-usage gauges) with the time, and returns a replica index. It keeps what the real
router keeps between requests (a hash ring, an approximate prefix tree of what it routed), and
nothing it could not see. No I/O, no clock reads: the same policy runs in the simulator and,
later, in the HTTP gateway. ``make_router`` maps names to routers (docs/deployments.md); an
unknown name or knob is an error that lists the valid ones.
"""

from .base import ReplicaView, RouteRequest, Router
from .registry import ROUTERS, make_router, router_params

__all__ = ["ROUTERS", "ReplicaView", "RouteRequest", "Router", "make_router", "router_params"]
