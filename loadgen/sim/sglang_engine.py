"""The simulated engine, SGLang flavour: SGLang 0.5.x's scheduler over its radix cache.

One iteration of SGLang's event loop (python/sglang/srt/managers/scheduler.py; the overlap loop,
SGLang's default, sees each batch's results one batch late: loadgen/sim/sglang_overlap.py) runs
either a prefill batch or a decode batch, never both:

1. ``get_new_batch_prefill``: skipped while the running batch is marked full (set when a
   request could not be admitted, cleared when the running batch shrinks) unless a chunked
   prefill is in progress. The chunked request's next chunk goes first, then the waiting queue
   in policy order (``fcfs``: arrival order, each candidate matched against the tree when it is
   considered; ``lpm``: every waiting request matched and sorted by longest match, requests
   sharing an uncached prefix with an earlier one deferred, fcfs above 128 waiting). The
   ``PrefillAdder`` (managers/schedule_policy.py) admits a request while
   ``extend + min(max_new, 4096) < available + evictable - reserved``, where ``reserved`` is
   what the batch already took plus ``new_token_ratio x`` the remaining output of every running
   request, its matched prefix locked meanwhile; it stops at the first refusal. A request
   longer than the chunk budget is truncated to it (chunked prefill) and continues next time.
2. Otherwise ``update_running_batch``: if the pool (after evicting leaves) cannot give every
   running request one slot, ``retract_decode`` retracts requests (fewest outputs first, then
   longest input), frees their uncached slots and sets ``new_token_ratio`` to
   ``(decoded + 20 x running) / max_new`` of those left; else the ratio decays by
   ``(init - min) / 600`` per step down to ``min = 0.14 x init``. Retracted requests go to the
   back of the waiting queue and are recomputed from what the tree still holds.
3. Prefilled requests insert their prompt into the tree (``cache_unfinished_req``) and lock it;
   finished requests insert prompt + output (except the last token) and unlock
   (``cache_finished_req``). ``cached_tokens`` adds up each (re)admission's match, as SGLang's
   ``meta_info`` reports it.

Why it is fast. Every running request takes part in every decode step, so the running batch is
kept as aggregates (count, sum of contexts, a heap of finish steps) and a stretch of decode
steps in which nothing can change (no admission is possible or attempted, the pool holds a
slot per request for every step, nobody finishes before its end) is committed in closed form,
its duration a quadratic in its length, as in the vLLM flavour (loadgen/sim/sglang_decode.py,
with the retraction). The radix tree is compressed (loadgen/sim/radix_cache.py).
tests/sim/reference_sglang.py does all of this literally, token by token;
tests/sim/test_differential_sglang.py checks that both agree.

Time, callbacks, ``advance_to``/``next_wakeup`` and the stretches' timing are the step machine
both flavours share (loadgen/sim/step_machine.py). A flush
(``/flush_cache``) is refused while any request is in the engine: ``flush`` applies it at the
first moment the engine is idle (a client retrying it), ``try_flush`` answers at once.
"""

from __future__ import annotations

from typing import Hashable, Optional

from .kv_pool import Stream
from .request import FINISHED, SimRequest
from .sglang_overlap import CACHE, FINISH
from .sglang_prefill import PrefillAdding
from .sglang_state import SGLangConfig, _Req

__all__ = ["SGLangConfig", "SGLangEngine", "request_error"]



def request_error(config: SGLangConfig, total_tokens: int, num_prompt_tokens: int, max_tokens: int) -> Optional[str]:
    """Why SGLang (``config``, a pool of ``total_tokens``) would reject this request up front, or None."""
    if num_prompt_tokens < 1 or max_tokens < 1:
        return f"prompt_tokens and max_tokens must be >= 1 (got {num_prompt_tokens}, {max_tokens})"
    total = num_prompt_tokens + max_tokens
    if total > config.max_model_len:
        return (f"Requested token count exceeds the model's maximum context length of "
                f"{config.max_model_len} tokens. You requested a total of {total} tokens: "
                f"{num_prompt_tokens} tokens from the input messages and {max_tokens} tokens for the completion.")
    if total >= total_tokens:
        return f"the request needs {total} tokens of KV but the pool holds {total_tokens}"
    return None


class SGLangEngine(PrefillAdding):
    """SGLang in simulated time. See the module docstring.

    ``SGLangEngine(config, cost)``; its state and constructor are ``SGLangState``'s
    (loadgen/sim/sglang_state.py), at the bottom of its chain of classes."""

    flavor = "sglang"

    # ------------------------------------------------------------------ public surface
    def stream(self, key: Hashable, base_tokens: int = 0) -> Stream:
        """The stream for ``key``; its own tokens start after ``base_tokens`` shared tokens
        (whole pages of them: a page holding both is the stream's own)."""
        base = base_tokens - base_tokens % self.page
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = Stream(key, base)
        elif stream.base != base:
            raise ValueError(f"stream {key!r} was used after {stream.base} shared tokens, now after {base}")
        return stream

    def prefix_stream(self, key: Hashable, num_tokens: int) -> Stream:
        """The shared prefix ``key`` of ``num_tokens`` tokens (its whole pages): one prompt of one length."""
        aligned = num_tokens - num_tokens % self.page
        full_key = ("prefix", key, aligned)
        stream = self.streams.get(full_key)
        if stream is None:
            stream = self.streams[full_key] = Stream(full_key, 0, aligned)
        return stream

    def held_prompt_blocks(self, key: Hashable, prefix_key: Hashable, prefix_tokens: int, num_tokens: int) -> int:
        """Pages of a prompt (the shared prefix ``prefix_key`` of ``prefix_tokens``, then stream
        ``key``'s own tokens, ``num_tokens`` in all) that the radix tree holds from its start: what
        SGLang's KV events have told a listener. Reads the tree without touching it."""
        own = self.streams.get(key)
        aligned = prefix_tokens - prefix_tokens % self.page
        prefix = self.streams.get(("prefix", prefix_key, aligned)) if aligned else None
        if own is None and prefix is None:
            return 0
        plen = own.base if own is not None else aligned
        return self.tree.peek_prefix(prefix, plen if prefix is not None else 0, own, num_tokens) // self.page

    def validate(self, num_prompt_tokens: int, max_tokens: int) -> Optional[str]:
        """Why SGLang would reject this request up front, or None."""
        return request_error(self.config, self.total_tokens, num_prompt_tokens, max_tokens)

    def submit(self, request: SimRequest, now_s: float) -> None:
        reason = self.validate(request.num_prompt_tokens, request.max_tokens)
        if reason is not None:
            raise ValueError(reason)
        prefix = request.prefix
        own = request.stream
        if prefix is not None and prefix.num_blocks != own.base:
            raise ValueError(f"prefix {prefix.key!r} holds {prefix.num_blocks} tokens but this request's own tokens "
                             f"start after {own.base}: a prefix names one prompt of one length (prefix_stream())")
        if prefix is None and own.base:
            raise ValueError(f"stream {own.key!r} starts after {own.base} shared tokens but the request names no prefix")
        self.advance_to(now_s)
        request.arrival_s = now_s
        self.prompt_tokens_total += request.num_prompt_tokens
        r = _Req(request, prefix, own.base if prefix is not None else 0, own)
        self.state[request] = r
        self.waiting.append(r)
        self._changed()
        self._start_if_idle(now_s)

    def flush(self, now_s: float) -> None:
        """/flush_cache, retried until the engine is idle: applied at the first idle moment."""
        self.advance_to(now_s)
        if not self.try_flush(now_s):
            self._flush_pending = True

    def try_flush(self, now_s: float) -> bool:
        """/flush_cache once: False (HTTP 400) while any request is waiting or running."""
        self.advance_to(now_s)
        if self._inflight_end is not None or self.waiting or self.running or self.chunked is not None:
            return False
        self._apply_flush(now_s)
        return True

    def _at_boundary(self) -> bool:
        if not self.running and not self.waiting and self.chunked is None:
            if self._flush_pending and self._next_start is not None:
                self._apply_flush(self._next_start)
            self._next_start = None
            self._cold = True
            return True
        return False

    @property
    def num_running(self) -> int:
        return len(self.state) - len(self.waiting)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        """sglang:token_usage: evictable tokens count as free."""
        return 1.0 - (self.available + self.tree.evictable_size) / self.total_tokens

    @property
    def new_token_ratio(self) -> float:
        return self._new_token_ratio()

    def check_invariants(self) -> None:
        """Every slot is free, in the tree, or held uncached by a request in the engine."""
        held = sum((r.kv0 + self.decode_index - r.d0 if r.in_running else r.kv_len) - r.protected
                   for r in self.state.values())
        assert self.available + self.tree.total_size() + held == self.total_tokens, (
            self.available, self.tree.total_size(), held, self.total_tokens)

    # ------------------------------------------------------------------ one iteration
    def _step(self, start_s: float) -> None:
        batch = self._get_new_batch_prefill()
        if batch:
            self._run_prefill(start_s, batch)
            return
        if not self.running:
            # update_running_batch on an empty batch clears the full mark; the next iteration admits
            self._shrunk = False
            if self.batch_is_full:
                self.batch_is_full = False
                batch = self._get_new_batch_prefill()
                if batch:
                    self._run_prefill(start_s, batch)
                    return
            raise AssertionError(f"nothing runs and nothing can be admitted: {self.waiting[:3]}")
        self._update_running_batch()
        self._commit_stretch(start_s, 1)

    # ------------------------------------------------------------------ prefill (sglang_prefill.py)
    def _run_prefill(self, start_s: float, batch: list) -> None:
        total = 0
        for item in batch:
            total += item[1]
        if self.available < total:
            self.available += self.tree.evict(total)
        if self.available < total:
            raise RuntimeError(f"Prefill out of memory: {total} tokens to extend, {self.available} free "
                               f"(SGLang's alloc_token_slots fails the same way)")
        self.available -= total
        attention = 0.0
        for r, extend, _ in batch:
            r.cached_tokens += r.prefix_len - r.already_computed
            r.kv_len = r.prefix_len + extend
            r.already_computed = r.kv_len
            attention += extend * (r.prefix_len + extend / 2)
        step_s = self.step_costs.step_time(total, attention, 0.0, 0.0) - (0.0 if self._cold else self._hidden_s)
        self._cold = False
        end = start_s + (step_s if self.jitter is None else step_s * self.jitter())
        self._inflight_end = end
        self.num_steps += 1
        chunk_left = None
        finished_any = False
        if self.overlap:
            chunk_left = self._prefill_results(batch, end)
            batch = ()
        for r, extend, truncated in batch:
            if truncated:
                chunk_left = r  # cached at the next iteration's start, after this batch's results
                continue
            req = r.req
            if self._prefill_token(r, end):
                req.first_token_s = end
                if req.on_first_token is not None:
                    self._first.append(req)
            if r.generated >= req.max_tokens:
                self._finish(r)
                finished_any = True
            else:
                self._cache_unfinished(r)
                self._join(r)
        if chunk_left is not None:
            self._cache_unfinished(chunk_left)
        if finished_any:
            self.batch_is_full = False

    def _prefill_token(self, r: _Req, end: float) -> bool:
        """The token a finished prefill computes: counted, its gap taken; True if it is the first."""
        r.generated += 1
        self.generation_tokens_total += 1
        r.prev_token_s = r.last_token_s
        first = r.req.first_token_s is None
        if not first and r.last_token_s is not None:  # resumed after a retraction
            gap = end - r.last_token_s
            if not gap <= r.max_gap_s:
                r.max_gap_s = gap
            if self.gaps is not None:
                self.gaps.add(gap)
        r.last_token_s = end
        return first

    # ------------------------------------------------------------------ the tree and requests
    def _prefill_results(self, batch: list, end: float) -> Optional[_Req]:
        """The prefill batch's tokens, their results held for after the next step is scheduled
        (overlap); every request joins the running batch (SGLang merges the last batch before it
        knows who finished). Returns the chunked request."""
        held = self._take_results()
        chunk_left = None
        prefilled = []
        for r, extend, truncated in batch:
            if truncated:
                chunk_left = r
                continue
            if self._prefill_token(r, end):
                self._first_ops.append(r)
            prefilled.append(r)
            if r.generated >= r.req.max_tokens:
                r.lingering = True
                self._ops.append((FINISH, r, 0))
            else:
                self._ops.append((CACHE, r, r.kv_len))
            self._join(r)
        self._last_decode = False
        self._last_prefilled = set(prefilled)
        self._ops_end, self._ops_from_prefill = end, True
        self._apply_results(held)
        return chunk_left  # stashed at the next iteration's start, after the last batch's results

    def _cache_unfinished(self, r: _Req, kv_len: Optional[int] = None) -> None:
        """cache_unfinished_req of the request's first ``kv_len`` tokens (default: all it holds)."""
        if kv_len is None:
            kv_len = r.kv_len
        tree = self.tree
        aligned = kv_len - kv_len % self.page
        new_prefix_len, node = tree.insert_matched(r.pid, r.plen, r.own, aligned)
        if new_prefix_len > r.protected:
            self.available += new_prefix_len - r.protected  # duplicates of what another request cached
        if r.last_node is not None:
            tree.dec_lock_ref(r.last_node)
        tree.inc_lock_ref(node)
        r.protected = aligned
        r.prefix_len = kv_len  # the unaligned tail stays the request's own, still computed
        r.last_node = node

    def _finish(self, r: _Req) -> None:
        """cache_finished_req: prompt + output but the last token into the tree, the lock dropped."""
        tree = self.tree
        aligned = r.kv_len - r.kv_len % self.page
        new_prefix_len = tree.insert(r.pid, r.plen, r.own, aligned)
        if new_prefix_len > r.protected:
            self.available += new_prefix_len - r.protected
        self.available += r.kv_len - aligned
        if r.last_node is not None:
            tree.dec_lock_ref(r.last_node)
        r.prefix_len = r.protected = r.kv_len = 0
        r.last_node = None
        req = r.req
        req.generated = r.generated
        req.num_cached_tokens = r.cached_tokens
        req.last_token_s = r.last_token_s
        req.max_token_gap_s = r.max_gap_s
        req.state = FINISHED
        self.prefix_cache_queries += req.num_prompt_tokens
        self.prefix_cache_hits += r.cached_tokens
        del self.state[req]
        self._done.append(req)

    def _apply_flush(self, now_s: float) -> None:
        self._flush_pending = False
        self._changed()
        self.tree.reset()
        self.available = self.total_tokens
        self.ratio_base = self.config.init_new_token_ratio
        self.ratio_steps = 0
        self.flush_times_s.append(now_s)
