"""A router's approximate prefix index: per replica, what the router itself sent there.

This is what the SGLang model gateway's cache-aware policy keeps without KV events (a radix
tree per worker of the request texts it routed), what llm-d's prefix-cache scorer keeps (an
LRU of block hashes per server) and what Dynamo's KV router keeps with --no-kv-events (an
approximate indexer whose entries expire). Agent prompts are append-only streams: a session's
prompt is its shared prefix (the system prompt) then its own history, and each turn extends the
last one, so the tree of what a replica was sent is one growing path per session over shared
prefixes. The index stores exactly that: per replica, per session, the longest prompt routed
there, and the shared prefixes routed there, each with the time it was last touched; a match
is the longest of them that begins the request. Sizes are in tokens (the gateway's gRPC token
tree; its HTTP string tree counts characters).
"""

from __future__ import annotations

from typing import Optional

from .base import RouteRequest


class StreamPrefixIndex:
    def __init__(self, num_replicas: int) -> None:
        # replica -> session key -> [tokens routed, last touched s, its shared prefix's tokens]
        self.sessions: list[dict[str, list]] = [{} for _ in range(num_replicas)]
        # replica -> (prefix key, prefix tokens) -> last touched s
        self.prefixes: list[dict[tuple[str, int], float]] = [{} for _ in range(num_replicas)]
        self.sizes = [0] * num_replicas  # tokens each replica's tree holds (a tenant's size)

    def match(self, index: int, request: RouteRequest) -> int:
        """Tokens of ``request``'s prompt the tree of replica ``index`` holds."""
        held = 0
        entry = self.sessions[index].get(request.session_key)
        if entry is not None:
            held = min(entry[0], request.prompt_tokens)
        shared = request.shared_prefix_tokens
        if shared and held < shared and (request.prefix_key, shared) in self.prefixes[index]:
            held = min(shared, request.prompt_tokens)
        return held

    def insert(self, index: int, request: RouteRequest, now_s: float) -> None:
        """Replica ``index`` was sent ``request``: its prompt is in that tree from now on."""
        shared = request.shared_prefix_tokens
        if shared:
            key = (request.prefix_key, shared)
            if key not in self.prefixes[index]:
                self.sizes[index] += shared
            self.prefixes[index][key] = now_s
        own = max(request.prompt_tokens - shared, 0)  # the session's tokens after the shared prefix
        entry = self.sessions[index].get(request.session_key)
        if entry is None:
            self.sessions[index][request.session_key] = [request.prompt_tokens, now_s, min(shared, request.prompt_tokens)]
            self.sizes[index] += own
        else:
            if request.prompt_tokens > entry[0]:
                self.sizes[index] += request.prompt_tokens - entry[0]
                entry[0] = request.prompt_tokens
            entry[1] = now_s

    def evict_to_size(self, index: int, max_tokens: int) -> None:
        """Drop replica ``index``'s least recently touched entries until it holds at most
        ``max_tokens`` (the gateway's evict_tenant_by_size; an LRU's capacity)."""
        if self.sizes[index] <= max_tokens:
            return
        entries = [(e[1], 0, key) for key, e in self.sessions[index].items()]
        entries += [(t, 1, key) for key, t in self.prefixes[index].items()]
        entries.sort(key=lambda e: (e[0], e[1], str(e[2])))
        for _, kind, key in entries:
            if self.sizes[index] <= max_tokens:
                break
            self._drop(index, kind, key)

    def expire(self, before_s: float) -> None:
        """Drop every entry last touched before ``before_s`` (an approximate indexer's TTL)."""
        for index in range(len(self.sizes)):
            for key in [k for k, e in self.sessions[index].items() if e[1] < before_s]:
                self._drop(index, 0, key)
            for key in [k for k, t in self.prefixes[index].items() if t < before_s]:
                self._drop(index, 1, key)

    def _drop(self, index: int, kind: int, key) -> None:
        if kind == 0:
            tokens, _, shared = self.sessions[index].pop(key)
            self.sizes[index] -= tokens - shared
        else:
            self.prefixes[index].pop(key)
            self.sizes[index] -= key[1]



def best_match(index_: StreamPrefixIndex, request: RouteRequest, candidates) -> tuple[Optional[int], int]:
    """(replica with the longest match, its matched tokens) over ``candidates``; (None, 0) if none."""
    best, best_tokens = None, 0
    for i in candidates:
        m = index_.match(i, request)
        if m > best_tokens:
            best, best_tokens = i, m
    return best, best_tokens
