"""vLLM's admission of a waiting request: what its prefix-cache hit is and whether its blocks fit.

A layer of ``SimEngine`` (loadgen/sim/engine.py) over the state of loadgen/sim/vllm_state.py; the
rules are vLLM v1's (vllm/v1/core/sched/scheduler.py, ``KVCacheManager.allocate_slots``), as the
module docstring of engine.py describes.
"""

from __future__ import annotations

from typing import Optional

from .request import RUNNING, SimRequest
from .vllm_state import VllmState


class Admission(VllmState):
    """The admission half of SimEngine's scheduling."""

    def _admission_plan(self, req: SimRequest, budget: int) -> Optional[tuple]:
        """(prefix hit, own hit, blocks to allocate, total blocks, tokens to schedule) if ``req``
        can be admitted now, else None."""
        if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return None
        bs = self.block_size
        num_tokens = req.num_tokens
        cap = (num_tokens - 1) // bs  # the last token is always computed
        own = req.stream
        prefix = req.prefix
        hit_prefix = hit_own = 0
        if self.caching:
            if req.segments is not None:
                hits, whole = _segment_hits(req.segments, cap)
                req.segment_hits = hits
                hit_prefix = sum(hits)
                if whole:
                    hit_own = min(own.cached, cap - own.base)
            elif prefix is not None:
                hit_prefix = min(prefix.cached, own.base, cap)
                if hit_prefix == own.base:
                    hit_own = min(own.cached, cap - own.base)
            else:
                hit_own = min(own.cached, cap)
        elif req.segments is not None:
            req.segment_hits = [0] * len(req.segments)
        hit_tokens = (hit_prefix + hit_own) * bs
        n = min(num_tokens - hit_tokens, budget)
        if self.config.reserve_full_prompt:
            total = -(-num_tokens // bs)
        else:
            total = -(-(hit_tokens + n) // bs)
        need = total - hit_prefix - hit_own
        evictable = hit_own if own.ref_cnt == 0 else 0
        if req.segments is not None:
            for seg, h in zip(req.segments, req.segment_hits):
                if seg.ref_cnt == 0:
                    evictable += h
        elif prefix is not None and prefix.ref_cnt == 0:
            evictable += hit_prefix
        if need + evictable > self.pool.num_free:
            return None
        return hit_prefix, hit_own, need, total, n

    def _admit(self, req: SimRequest, plan: tuple) -> tuple[int, int]:
        """Move the waiting head into the running list; returns (hit tokens, scheduled tokens)."""
        hit_prefix, hit_own, need, total, n = plan
        own = req.stream
        if own.ref_cnt:
            raise RuntimeError(f"stream {own.key!r} already has a request in the engine")
        prefix = req.prefix
        if req.segments is not None:
            req.segment_builders = [self.caching and seg.ref_cnt == 0 for seg in req.segments]
            req.is_builder = any(req.segment_builders)
            for seg, h in zip(req.segments, req.segment_hits):
                self.pool.acquire(seg, h)
        elif prefix is not None:
            req.is_builder = self.caching and prefix.ref_cnt == 0
            req.prefix_hit_blocks = hit_prefix
            self.pool.acquire(prefix, hit_prefix)
        self.pool.acquire(own, hit_own)
        self.pool.allocate(need)
        req.alloc_blocks = total
        hit_tokens = (hit_prefix + hit_own) * self.block_size
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = hit_tokens
        self.prefix_cache_queries += req.num_tokens
        self.prefix_cache_hits += hit_tokens
        self.running[req] = None
        req.state = RUNNING
        req.admit_seq = self._admit_seq
        self._admit_seq += 1
        self._computed(req, hit_tokens + n)
        return hit_tokens, n

    def _computed(self, req: SimRequest, num_computed: int) -> None:
        """Blocks are cached as soon as their tokens are scheduled (vLLM cache_blocks)."""
        req.num_computed = num_computed
        if req.is_builder and req.segments is not None:
            done = num_computed // self.block_size
            for seg, builds in zip(req.segments, req.segment_builders):
                full = min(done, seg.base + seg.num_blocks) - seg.base
                if builds and full > seg.cached:
                    seg.cached = full
        elif req.is_builder:
            prefix = req.prefix
            full = min(num_computed // self.block_size, req.stream.base)
            if full > prefix.cached:
                prefix.cached = full


def _segment_hits(segments: tuple, cap: int) -> tuple[list, bool]:
    """Blocks hit in each stream of a prefix chain (the lookup stops at the first miss, at most
    ``cap`` blocks), and whether the whole chain hit."""
    hits = []
    whole = True
    for seg in segments:
        h = max(0, min(seg.cached, seg.num_blocks, cap - seg.base)) if whole else 0
        hits.append(h)
        whole = h == seg.num_blocks
    return hits, whole
