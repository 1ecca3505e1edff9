"""The simulated engine: vLLM v1's scheduler as a step machine over the run-compressed pool.

Each step is *schedule, then update*, as in vllm/v1/core/sched/scheduler.py:

1. running requests first, in running order: a decode takes one token, a prefill
   ``min(remaining, budget)`` tokens (chunked prefill); when a request cannot get a block the
   last running request is preempted (blocks freed tail first, hashes kept, progress reset,
   put at the FRONT of the waiting queue);
2. then, only if nothing was preempted, waiting requests FCFS with head-of-line blocking: the
   head is admitted only if the blocks it needs fit (the whole prompt with
   ``reserve_full_prompt``, as vLLM 0.33; else the hit plus its first chunk, as 0.11);
3. the step takes ``StepCostModel.step_time`` seconds; its tokens are sampled at its end.

Why it is fast. In vLLM the running list is always [decoders..., at most one request still in
prefill]: a request is appended when admitted, and a partial prefill exhausts the step's budget
so nothing is admitted behind it. So every step advances *every* decoder by one token, and a
decoder's state is a line in the global step index G: it computed ``nc0 + (G - g0)`` tokens
before step G, needs a new block exactly at the steps G = g0 - nc0 (mod block size), and
finishes at a known step. The engine keeps decoders as aggregates (count, sum of contexts,
block-crossing residues, a heap of finish steps), so a step costs O(1) in the number of
decoders, and a stretch of pure-decode steps is committed in closed form (its duration is a
quadratic in its length). Per-request work happens only at admission, finish and preemption.

Time (``advance_to``, ``next_wakeup``, delivery, the stretches' timing) is the step machine both
flavours share (loadgen/sim/step_machine.py); the decoders' aggregates and stretches are
loadgen/sim/vllm_decode.py; the CPU offload tier's scheduling is loadgen/sim/vllm_offload.py;
requests and the configuration are loadgen/sim/request.py.
"""

from __future__ import annotations

from typing import Hashable, Optional

from .kv_pool import Stream
from .request import FINISHED, LOADING, RUNNING, WAITING, EngineConfig, SimRequest
from .vllm_offload import OffloadScheduling

__all__ = ["EngineConfig", "FINISHED", "LOADING", "RUNNING", "SimEngine", "WAITING"]


class SimEngine(OffloadScheduling):
    """A vLLM v1 engine in simulated time. See the module docstring.

    ``SimEngine(config, cost)``; its state and constructor are ``VllmState``'s
    (loadgen/sim/vllm_state.py), at the bottom of its chain of classes."""

    # ------------------------------------------------------------------ public surface
    def stream(self, key: Hashable, base_tokens: int = 0) -> Stream:
        """The stream for ``key``; its own blocks start after ``base_tokens`` shared tokens."""
        stream = self.streams.get(key)
        base = base_tokens // self.block_size
        if stream is None:
            stream = self.streams[key] = Stream(key, base)
        elif stream.base != base:
            raise ValueError(f"stream {key!r} was used after {stream.base} shared blocks, now after {base}")
        return stream

    def prefix_stream(self, key: Hashable, num_tokens: int) -> Stream:
        """The shared prefix (system prompt) ``key`` of ``num_tokens`` tokens: its full blocks.

        A prefix is one prompt of one length: the same name with another length is another
        prompt (loadgen's sessions draw its tokens from the name and the length), so every
        request holding a prefix stream holds all of it and one reference count is exact."""
        num_blocks = num_tokens // self.block_size
        full_key = ("prefix", key, num_blocks)
        stream = self.streams.get(full_key)
        if stream is None:
            stream = self.streams[full_key] = Stream(full_key, 0, num_blocks)
        return stream

    def held_prompt_blocks(self, key: Hashable, prefix_key: Hashable, prefix_tokens: int, num_tokens: int) -> int:
        """Blocks of a prompt (the shared prefix ``prefix_key`` of ``prefix_tokens``, then stream
        ``key``'s own tokens, ``num_tokens`` in all) that the pool holds from its start: what
        vLLM's KV events (BlockStored, BlockRemoved when a block loses its hash) have told a
        listener. Reads the pool without touching it; GPU blocks only."""
        if not self.caching:
            return 0
        bs = self.block_size
        cap = num_tokens // bs  # a KV event names full blocks only
        own = self.streams.get(key)
        base = prefix_tokens // bs
        if base:
            prefix = self.streams.get(("prefix", prefix_key, base))
            held = min(prefix.cached, base, cap) if prefix is not None else 0
            if held < base:
                return held
        else:
            held = 0
        if own is not None and own.base == base and own.parent is None:
            held += max(0, min(own.cached, cap - base))
        return held

    def validate(self, num_prompt_tokens: int, max_tokens: int) -> Optional[str]:
        """Why vLLM would reject this request up front (400), or None."""
        if num_prompt_tokens < 1 or max_tokens < 1:
            return f"prompt_tokens and max_tokens must be >= 1 (got {num_prompt_tokens}, {max_tokens})"
        total = num_prompt_tokens + max_tokens
        if total > self.config.max_model_len:
            return (f"This model's maximum context length is {self.config.max_model_len} tokens; "
                    f"the request asks for {total} ({num_prompt_tokens} prompt + {max_tokens} output)")
        if -(-total // self.block_size) > self.pool.num_usable:
            return f"the request needs {total} tokens of KV but the pool holds {self.pool.num_usable * self.block_size}"
        return None

    def submit(self, request: SimRequest, now_s: float) -> None:
        """A request arrives at ``now_s``; it is considered at the next step start."""
        reason = self.validate(request.num_prompt_tokens, request.max_tokens)
        if reason is not None:
            raise ValueError(reason)
        prefix = request.prefix
        if prefix is not None and prefix.parent is not None:
            request.segments = self._segments(request)
        elif prefix is not None:
            if prefix.base != 0:
                raise ValueError("a prefix stream must start at block 0")
            if prefix.num_blocks is None:
                prefix.num_blocks = request.stream.base
            elif prefix.num_blocks != request.stream.base:
                raise ValueError(
                    f"prefix {prefix.key!r} holds {prefix.num_blocks} blocks but this request's own tokens start "
                    f"after {request.stream.base}: a prefix names one prompt of one length (prefix_stream())")
        self.advance_to(now_s)
        request.arrival_s = now_s
        self.prompt_tokens_total += request.num_prompt_tokens
        self.waiting.append(request)
        self._changed()
        self._start_if_idle(now_s)

    def flush(self, now_s: float) -> None:
        """Reset the prefix cache, preempting running requests (vLLM reset_running_requests)."""
        self.advance_to(now_s)
        self._flush_requested = True
        self._changed()
        if self._inflight_end is None:
            self._apply_flush(now_s)

    def abort(self, request: SimRequest, now_s: float) -> bool:
        """The client went away: drop ``request`` as vLLM aborts it (its output is never delivered).

        vLLM's engine core takes aborts between steps, so it leaves at the next step boundary:
        a request the step in flight finishes is delivered as usual; otherwise it leaves the
        waiting queue or the running set, its blocks are freed tail first and the full blocks it
        computed keep their hashes, so a retry of the same prompt hits them. Returns False when
        the request finishes anyway (it is delivered, ``on_done`` included), True when aborted."""
        self.advance_to(now_s)
        if request.state == FINISHED:
            return False
        self._aborts.append(request)
        self._changed()
        if self._inflight_end is None:
            self._clock_s = now_s
            self._apply_aborts()
        return True

    def _at_boundary(self) -> bool:
        if self._next_start is not None:
            self._clock_s = self._next_start
        if self._aborts:
            self._apply_aborts()
        if self._flush_requested:
            self._apply_flush(self._next_start)
        if not self.running and not self.waiting:
            self._next_start = None
            return True
        return False

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        return self.pool.usage()

    # ------------------------------------------------------------------ stretches
    def _stretch_bounds_now(self) -> Optional[tuple[int, Optional[float]]]:
        if self.jitter is not None:  # every step draws its own jitter
            return None
        if self.prefilling or not self.num_decoders or self._flush_requested or self._aborts:
            return None
        budget = self.config.max_num_batched_tokens - self.num_decoders
        if self.host is not None:
            return self._offload_stretch_bounds(budget)
        if self.waiting and self._admission_plan(self.waiting[0], budget) is not None:
            return None
        return self._max_stretch(), None

    # ------------------------------------------------------------------ one general step
    def _step(self, start_s: float) -> None:
        cfg = self.config
        bs = self.block_size
        g = self.step_index
        budget = cfg.max_num_batched_tokens
        preempted = False
        self._clock_s = start_s
        if self.num_decoders:
            need = self._residues[g % bs]
            if need <= self.pool.num_free:
                self.pool.allocate(need)
            else:
                preempted = self._decode_with_shortage(g)
        r = self.num_decoders
        num_tokens = r
        budget -= r
        decode_ctx = self._decoder_ctx_const + r * g
        attention = 0.0
        completed: list[SimRequest] = []
        for req in list(self.prefilling):
            if budget <= 0:
                break
            if req.state != RUNNING:
                continue
            nc = req.num_computed
            n = min(req.num_tokens - nc, budget)
            if not cfg.reserve_full_prompt:
                need = -(-(nc + n) // bs) - req.alloc_blocks
                while need > self.pool.num_free:
                    victim = next(reversed(self.running))
                    self._preempt(victim, g)
                    preempted = True
                    if victim is req:
                        break
                if req.state != RUNNING:
                    break
                if need > 0:
                    self.pool.allocate(need)
                    req.alloc_blocks += need
            attention += n * (nc + n / 2)
            num_tokens += n
            budget -= n
            self._computed(req, nc + n)
            if req.num_computed == req.num_tokens:
                completed.append(req)
        if not preempted and self.host is not None:
            num_tokens, attention, budget = self._admit_waiting_offload(start_s, num_tokens, attention, budget,
                                                                        completed)
            landing = [w.load_done_s for w in self.waiting if w.state == LOADING] if num_tokens == 0 else None
            if landing:
                # nothing to compute, copies in flight: vLLM's empty steps poll until one lands
                self._inflight_end = max(start_s, min(landing))
                return
        elif not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = waiting[0]
                plan = self._admission_plan(req, budget)
                if plan is None:
                    break  # head-of-line blocking
                waiting.popleft()
                hit_tokens, n = self._admit(req, plan)
                attention += n * (hit_tokens + n / 2)
                num_tokens += n
                budget -= n
                if req.num_computed == req.num_tokens:
                    completed.append(req)
                else:
                    self.prefilling.append(req)
        # a prefill chunk beside the decodes makes the step a mixed one (cost.py's mixed term)
        step_s = self.step_costs.step_time(num_tokens, attention, decode_ctx, decode_ctx if num_tokens > r else 0.0, r)
        end = start_s + (step_s if self.jitter is None else step_s * self.jitter())
        self._inflight_end = end
        self._last_end_s = self._clock_s = end
        self._push_gap(g, end - start_s)
        if r and self.gaps is not None:  # each decoder's token follows its last, sampled at the step's start
            self.gaps.add(end - start_s, r)
        self.step_index = g + 1
        self.num_steps += 1
        self.generation_tokens_total += r + len(completed)
        self._collect_finished(g)
        for req in completed:
            if req in self.prefilling:
                self.prefilling.remove(req)
            req.generated += 1
            if req.last_token_s is not None:  # resumed after a preemption
                gap_s = end - req.last_token_s
                if not gap_s <= req.max_token_gap_s:
                    req.max_token_gap_s = gap_s
                if self.gaps is not None:
                    self.gaps.add(gap_s)
            req.last_token_s = end
            if req.first_token_s is None:
                req.first_token_s = end
                if req.on_first_token is not None:
                    self._first.append(req)
            if req.generated >= req.max_tokens:
                req.num_tokens = req.num_prompt_tokens + req.generated
                self._finish(req, req.num_computed)
            else:
                self._add_decoder(req, g + 1)

    # ------------------------------------------------------------------ leaving the running set
    def _finish(self, req: SimRequest, kv_tokens: int) -> None:
        del self.running[req]
        self._release_blocks(req, kv_tokens)
        req.state = FINISHED
        self._done.append(req)

    def _preempt(self, req: SimRequest, g: int) -> None:
        if req.is_decoder:
            self._remove_decoder(req, g)
        else:
            self.prefilling.remove(req)
        del self.running[req]
        self._release_blocks(req, req.num_computed)
        req.num_computed = 0
        req.state = WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        if self.num_loading:
            # Behind the waiting requests that hold blocks (loading or loaded), not at the very front
            # as vLLM puts it: there it could wait, with nothing running, for blocks they hold while
            # they wait behind it, forever. They hold their whole prompt, so they always fit.
            i = 0
            while i < len(self.waiting) and (self.waiting[i].state == LOADING or self.waiting[i].loaded):
                i += 1
            self.waiting.insert(i, req)
        else:
            self.waiting.appendleft(req)

    def _release_blocks(self, req: SimRequest, kv_tokens: int) -> None:
        """Free in reverse block order (tail first): own partial blocks, own cached blocks, the
        prefix blocks this request computed without caching them, then the shared prefix."""
        bs = self.block_size
        pool = self.pool
        if self.host is not None:
            self._offload_store(req, kv_tokens)
        own = req.stream
        # a decoder holds exactly the blocks its KV needs; a prefill holds its reservation
        alloc = max(req.alloc_blocks, -(-kv_tokens // bs))
        base = own.base
        own_alloc = max(0, alloc - base)
        own_cached = max(0, kv_tokens // bs - base) if self.caching else 0
        pool.free_unhashed(own_alloc - own_cached)
        own.cached = own_cached
        pool.release(own)
        prefix = req.prefix
        if req.segments is not None:
            for seg, h, builds in reversed(list(zip(req.segments, req.segment_hits, req.segment_builders))):
                held = max(0, min(alloc, seg.base + seg.num_blocks) - seg.base)
                pool.free_unhashed(held - (seg.cached if builds else h))
                pool.release(seg)
        elif prefix is not None:
            held = min(alloc, base)
            if req.is_builder:
                pool.free_unhashed(held - prefix.cached)
            else:
                pool.free_unhashed(held - req.prefix_hit_blocks)
            pool.release(prefix)
        req.is_builder = False
        req.alloc_blocks = 0

    def _apply_aborts(self) -> None:
        aborts, self._aborts = self._aborts, []
        self._changed()
        g = self.step_index
        for req in aborts:
            if req.state == LOADING or req.loaded:
                self.waiting.remove(req)
                self._cancel_load(req)
            elif req.state == WAITING:
                self.waiting.remove(req)  # waiting requests hold no blocks (a preempted one freed them)
            elif req.state == RUNNING:
                if req.is_decoder:
                    self._remove_decoder(req, g)
                else:
                    self.prefilling.remove(req)
                del self.running[req]
                self._release_blocks(req, req.num_computed)
            else:
                continue
            req.state = FINISHED

    def _apply_flush(self, now_s: float) -> None:
        self._flush_requested = False
        self._clock_s = now_s
        self._changed()
        g = self.step_index
        if self.num_loading:
            for req in self.waiting:
                if req.state == LOADING or req.loaded:
                    self._cancel_load(req)
        for req in reversed(list(self.running)):
            self._preempt(req, g)
        self.pool.reset(self.streams.values())
        self.flush_times_s.append(now_s)
