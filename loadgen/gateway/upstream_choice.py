"""Which upstream a session's requests go to: the seam a router policy plugs into.

A chooser is pure: a session key and the number of upstreams in, an upstream index out. Until the
deployment routers (top-level ``routers/``) land, the one chooser is ``sticky-hash``: every request
of a session goes to one upstream, so its prefix stays in one engine's cache.
"""

from __future__ import annotations

import hashlib
from typing import Callable


def sticky_hash(session_key: str, num_upstreams: int) -> int:
    """Rendezvous (highest random weight) hashing: a session keeps its upstream, and removing one
    upstream moves only the sessions that were on it."""
    if num_upstreams == 1:
        return 0
    key = session_key.encode()
    return max(range(num_upstreams),
               key=lambda i: hashlib.blake2b(key, digest_size=8, salt=i.to_bytes(8, "little")).digest())


CHOOSERS: dict[str, Callable[[str, int], int]] = {"sticky-hash": sticky_hash}
