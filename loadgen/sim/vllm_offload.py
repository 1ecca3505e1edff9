"""vLLM's CPU offload tier in the scheduler: loads before admission, stores when blocks are freed.

A layer of ``SimEngine`` (loadgen/sim/engine.py): with ``EngineConfig.offload`` set, a waiting
request whose blocks after its GPU hit are in the host tier (loadgen/sim/offload.py) is parked
while they are copied (vLLM's WAITING_FOR_REMOTE_KVS), holding its whole prompt's GPU blocks,
and scheduled in place once the copy lands; finished and preempted requests store their full
blocks to the host tier. Copies queue on the tier's links (loadgen/sim/offload.py ``CopyLink``).
"""

from __future__ import annotations

from typing import Optional

from .request import LOADING, RUNNING, WAITING, SimRequest
from .vllm_stream_tree import StreamTree


class OffloadScheduling(StreamTree):
    """The offload-tier half of SimEngine's scheduling."""

    def _offload_plan(self, req: SimRequest, budget: int) -> Optional[tuple]:
        """What admitting the waiting ``req`` would do now, or None if it cannot be admitted:
        ("resume", blocks to allocate, tokens) for a request whose host blocks have been loaded;
        ("load", prefix hit, own hit, blocks to allocate, total blocks, host blocks) when blocks
        after its GPU hit are in the host tier (vLLM get_num_new_matched_tokens: they are loaded,
        the request takes no tokens this step); else ("admit", <_admission_plan>)."""
        if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return None
        bs = self.block_size
        if req.loaded:
            nc = req.num_computed
            n = min(req.num_tokens - nc, budget)
            need = max(0, -(-(nc + n) // bs) - req.alloc_blocks)
            return None if need > self.pool.num_free else ("resume", need, n)
        plan = self._admission_plan(req, budget)
        own, prefix = req.stream, req.prefix
        hit_prefix = min(prefix.cached, own.base, (req.num_tokens - 1) // bs) if prefix is not None else 0
        hit_own = 0
        if prefix is None or hit_prefix == own.base:
            hit_own = min(own.cached, (req.num_tokens - 1) // bs - own.base)
        h = hit_prefix + hit_own
        k = self.host.lookup(prefix, own, h, req.num_tokens // bs)
        if k == 0:
            return None if plan is None else ("admit", plan)
        if self.host.any_pinned(prefix, own, h, h + k):
            return ("skip",)  # another request is loading some of these blocks: retry next step
        total = -(-req.num_tokens // bs)  # a load reserves the whole prompt (see _preempt)
        need = total - h
        evictable = hit_own if own.ref_cnt == 0 else 0
        if prefix is not None and prefix.ref_cnt == 0:
            evictable += hit_prefix
        if need + evictable > self.pool.num_free:
            return None
        return "load", hit_prefix, hit_own, need, total, k

    def _admit_waiting_offload(self, start_s: float, num_tokens: int, attention: float, budget: int,
                               completed: list) -> tuple[int, float, int]:
        """The waiting loop with a host tier: requests whose copy is in flight are skipped (they
        keep their place), a landed one is scheduled in place, head-of-line blocking otherwise."""
        waiting = self.waiting
        i = 0
        while i < len(waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = waiting[i]
            if req.state == LOADING:
                if req.load_done_s > start_s:
                    i += 1
                    continue
                self._finish_load(req)
            plan = self._offload_plan(req, budget)
            if plan is None:
                break  # head-of-line blocking
            if plan[0] == "skip":
                # vLLM retries it next step and lets the requests behind it go on; here it holds
                # the queue, so the requests holding blocks stay at its front (see _preempt)
                break
            if plan[0] == "load":
                self._start_load(req, plan[1:], start_s)
                i += 1
                continue
            del waiting[i]
            if plan[0] == "resume":
                _, need, n = plan
                self.num_loading -= 1
                req.loaded = False
                self.pool.allocate(need)
                req.alloc_blocks += need
                hit_tokens = req.num_computed
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = hit_tokens
                self.running[req] = None
                req.state = RUNNING
                req.admit_seq = self._admit_seq
                self._admit_seq += 1
                self._computed(req, hit_tokens + n)
            else:
                self.host.touch(req.prefix, req.stream, req.num_tokens // self.block_size)
                self.external_prefix_cache_queries += req.num_tokens
                hit_tokens, n = self._admit(req, plan[1])
            attention += n * (hit_tokens + n / 2)
            num_tokens += n
            budget -= n
            if req.num_computed == req.num_tokens:
                completed.append(req)
            else:
                self.prefilling.append(req)
        return num_tokens, attention, budget

    def _start_load(self, req: SimRequest, plan: tuple, start_s: float) -> None:
        """Allocate GPU blocks for the GPU hit and the host hit and start copying the host blocks."""
        hit_prefix, hit_own, need, total, k = plan
        bs = self.block_size
        own, prefix = req.stream, req.prefix
        if own.ref_cnt:
            raise RuntimeError(f"stream {own.key!r} already has a request in the engine")
        host = self.host
        host.touch(prefix, own, req.num_tokens // bs)
        if prefix is not None:
            req.is_builder = prefix.ref_cnt == 0
            req.prefix_hit_blocks = hit_prefix
            self.pool.acquire(prefix, hit_prefix)
        self.pool.acquire(own, hit_own)
        self.pool.allocate(need)
        req.alloc_blocks = total
        h = hit_prefix + hit_own
        host.pin(prefix, own, h, h + k)
        req.load_start, req.load_blocks = h, k
        req.store_from = h + k
        req.load_done_s = host.to_gpu.submit(start_s, host.config.transfer_s(k, bs))  # FIFO behind earlier copies
        req.state = LOADING
        self.num_loading += 1
        self.prefix_cache_queries += req.num_tokens
        self.prefix_cache_hits += h * bs
        self.external_prefix_cache_queries += req.num_tokens
        self.external_prefix_cache_hits += k * bs
        self.kv_offload_bytes_cpu_to_gpu += k * bs * host.config.kv_bytes_per_token

    def _finish_load(self, req: SimRequest) -> None:
        """The copy landed: the loaded blocks are computed (and cached); the last prompt token is
        always recomputed (vLLM _update_waiting_for_remote_kv)."""
        start, k = req.load_start, req.load_blocks
        self.host.unpin(req.prefix, req.stream, start, start + k)
        req.state = WAITING
        req.loaded = True
        self._computed(req, min((start + k) * self.block_size, req.num_tokens - 1))

    def _cancel_load(self, req: SimRequest) -> None:
        """Drop a waiting request's loaded or loading blocks (flush, abort): it starts over."""
        if req.state == LOADING:
            self.host.unpin(req.prefix, req.stream, req.load_start, req.load_start + req.load_blocks)
        self.num_loading -= 1
        kv_tokens = req.num_computed if req.loaded else req.load_start * self.block_size  # what is cached
        req.loaded = False
        self._release_blocks(req, kv_tokens)
        req.num_computed = 0
        req.state = WAITING

    def _offload_store(self, req: SimRequest, kv_tokens: int) -> None:
        """The request's full blocks from its next-store index on go to the host tier when it
        finishes or is preempted (when vLLM's stores become visible)."""
        end = kv_tokens // self.block_size
        if end <= req.store_from:
            return
        stored = self.host.store(req.prefix, req.stream, req.store_from, end)
        if stored is not None:
            req.store_from = end
            if stored:
                self.host.to_host.submit(self._clock_s, self.host.config.transfer_s(stored, self.block_size))
            self.kv_offload_bytes_gpu_to_cpu += stored * self.block_size * self.host.config.kv_bytes_per_token

    def _offload_stretch_bounds(self, budget: int) -> Optional[tuple[int, Optional[float]]]:
        """Stretch bounds with the host tier: the waiting loop of the stretch's steps would skip
        every copy in flight and stop at the first other request (it cannot be admitted or its
        blocks are being loaded by another); the steps must start before the first copy lands.
        A copy in flight is one more scheduled event, not a reason to step one token at a time."""
        landing_s = None
        for req in self.waiting:
            if req.state == LOADING:
                if landing_s is None or req.load_done_s < landing_s:
                    landing_s = req.load_done_s
                continue
            if self._offload_plan(req, budget) not in (None, ("skip",)):
                return None
            break
        return self._max_stretch(), landing_s
