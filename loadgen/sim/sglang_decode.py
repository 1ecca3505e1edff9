"""SGLang's decode batch: the running batch as aggregates, closed-form stretches, retraction.

A layer of ``SGLangEngine`` (loadgen/sim/sglang_engine.py) over the state of
loadgen/sim/sglang_state.py. Follows python/sglang/srt/managers/scheduler.py
(``update_running_batch``) and managers/schedule_batch.py (``check_decode_mem``,
``retract_decode``, ``release_req``), SGLang 0.5.x: the module docstring of sglang_engine.py says
what they do and why the batch is kept as aggregates.
"""

from __future__ import annotations

import bisect
from heapq import heappop, heappush  # compiled, a global read per call, not a module attribute
import operator
from typing import Optional

from .request import WAITING
from .sglang_overlap import FINISH, OverlapResults


class DecodeBatch(OverlapResults):
    """The decode half of SGLangEngine's scheduling."""

    # ------------------------------------------------------------------ decode aggregates
    def _stretch_coeffs(self) -> tuple[float, float]:
        """Decode step i from D lasts alpha + 2 * beta * i (its requests' KV includes the step's token)."""
        c = self.step_costs
        n = len(self.running)
        ctx = self._ctx_const + n * (self.decode_index + 1)
        return c.t0_s - self._hidden_s + c.a_s * n + c.g_s * ctx + c.dd_s * n + c.h_s, c.g_s * n / 2.0

    def _join(self, r: _Req) -> None:
        r.in_running = True
        r.order = self._order
        self._order += 1
        r.d0, r.kv0, r.gen0 = self.decode_index, r.kv_len, r.generated
        self._ctx_const += r.kv0 - r.d0
        self.running[r] = None
        self._joined.append(r)
        if not r.lingering:  # a lingering request has computed its last token already
            heappush(self._finish_heap, (r.d0 + r.req.max_tokens - r.gen0 - 1, r.order, r))

    def _leave(self, r: _Req, stats: bool = True) -> None:
        """Out of the running batch, its KV and outputs brought up to date (``stats``: its token
        times too; a lingering request's stop at its last token)."""
        steps = self.decode_index - r.d0
        r.kv_len = r.kv0 + steps
        r.generated = r.gen0 + steps
        self._ctx_const -= r.kv0 - r.d0
        del self.running[r]
        r.in_running = False
        if steps and stats:
            self._decode_token_times(r)

    def _decode_token_times(self, r: _Req) -> None:
        """``r``'s last token at the last decode step's end, its longest gap since it joined."""
        r.last_token_s = self._last_decode_end
        i = bisect.bisect_left(self._gap_steps, r.d0 + 1)
        if i < len(self._gap_steps) and not self._gap_max_s[i] <= r.max_gap_s:
            r.max_gap_s = self._gap_max_s[i]

    # ------------------------------------------------------------------ decode stretches
    def _stretch_bounds_now(self) -> Optional[tuple[int, Optional[float]]]:
        if self.jitter is not None:  # every step draws its own jitter
            return None
        if (self.running and self.chunked is None and not self._shrunk and (not self.waiting or self.batch_is_full)
                and not self._ops and not self._first_ops):
            return self._max_stretch(), None
        return None

    def _max_stretch(self) -> int:
        heap = self._finish_heap
        while heap and not _valid(heap[0]):
            heappop(heap)
        return min(heap[0][0] - self.decode_index + 1, self.available // len(self.running))

    def _commit_stretch(self, start_s: float, num_steps: int, coeffs: Optional[tuple[float, float]] = None) -> None:
        """``num_steps`` decode steps of the whole running batch (its slots are free)."""
        held = self._take_results() if self.overlap else None
        n = len(self.running)
        self.available -= n * num_steps
        alpha, beta = coeffs or self._stretch_coeffs()
        if self.jitter is not None:  # one step at a time then (no stretches)
            f = self.jitter()
            alpha, beta = alpha * f, beta * f
        end = start_s + alpha * num_steps + beta * num_steps * (num_steps - 1)
        first_end = start_s + alpha
        d = self.decode_index
        gaps = self.gaps
        num_joined = 0
        for r in self._joined:
            if r.in_running and r.last_token_s is not None and not r.lingering:
                gap = first_end - r.last_token_s
                if not gap <= r.max_gap_s:
                    r.max_gap_s = gap
                if gaps is not None:
                    gaps.add(gap)
                    num_joined += 1
        self._joined.clear()
        if gaps is not None:  # a lingering request's token was its last: no gap follows it
            num_tokens = sum([1 for r in self.running if not r.lingering])
            if self._last_decode_end is not None:  # the others' last tokens: the previous decode step's end
                gaps.add(first_end - self._last_decode_end, num_tokens - num_joined)
            gaps.add_linear(alpha + 2 * beta, 2 * beta, num_steps - 1, num_tokens)
        if self._last_decode_end is not None:
            self._push_gap(d, first_end - self._last_decode_end)
        if num_steps > 1:
            self._push_gap(d + num_steps - 1, alpha + 2 * beta * (num_steps - 1))
        self._prev_decode_end = (self._last_decode_end if num_steps == 1
                                 else end - (alpha + 2 * beta * (num_steps - 1)))
        self._last_decode_end = end
        self.decode_index = d + num_steps
        self.ratio_steps += num_steps
        self.num_steps += num_steps
        self.generation_tokens_total += n * num_steps
        self._inflight_end = end
        last = d + num_steps - 1
        heap = self._finish_heap
        finishing = []
        while heap:
            entry = heap[0]
            if not _valid(entry):
                heappop(heap)
                continue
            if entry[0] != last:
                if entry[0] < last:
                    raise AssertionError(f"{entry[2]!r} should have finished at decode step {entry[0]} < {last}")
                break
            heappop(heap)
            finishing.append(entry[2])
        if len(finishing) > 1:
            finishing.sort(key=_batch_order)  # the batch's order
        if held is not None:
            self._last_decode = True
            self._ops_end, self._ops_from_prefill = end, False
            for r in finishing:
                # its last token is out; the scheduler learns it once the next step is scheduled
                self._decode_token_times(r)
                r.lingering = True
                self._ops.append((FINISH, r, 0))
            self._apply_results(held)
        elif finishing:
            for r in finishing:
                self._leave(r)
                self._finish(r)
            self._shrunk = True

    # ------------------------------------------------------------------ memory and retraction
    def _update_running_batch(self) -> None:
        """Filter finished requests (done when they finished), check memory, retract or decay."""
        shrunk, self._shrunk = self._shrunk, False
        if not self._check_decode_mem(len(self.running)):
            self._retract_decode()
            shrunk = True
        if shrunk:
            self.batch_is_full = False

    def _check_decode_mem(self, num_tokens: int) -> bool:
        if self.available < num_tokens:
            self.available += self.tree.evict(num_tokens)
        return self.available >= num_tokens

    def _retract_decode(self) -> None:
        """Retract until one slot per remaining request is free (SGLang's retract_decode)."""
        cfg = self.config
        batch = list(self.running)
        # overlap: the scheduler has not seen the last step's tokens (sglang_overlap.py)
        lag = {r: self._lag(r) for r in batch}
        before = {r: self._token_before_last(r) for r in batch if lag[r]}
        for r in batch:
            self._leave(r)  # bring every request's counts up to date; those kept rejoin below
        seen = {r: r.generated - lag[r] for r in batch}
        order = sorted(batch, key=lambda r: (seen[r], -r.req.num_prompt_tokens), reverse=True)
        retracted = []
        first = True
        while first or not self._check_decode_mem(len(order)):
            if len(order) == 1:
                if self.available <= 0:
                    raise RuntimeError("No space left for only one request")
                break
            first = False
            r = order.pop()
            retracted.append(r)
            if lag[r]:
                self._drop_result(r, before[r])
            self._release(r, len(order) * cfg.retract_decode_steps)
        for r in order:  # the batch keeps the sorted order (filter_batch(keep_indices))
            self._join(r)
        decoded = sum(seen[r] for r in order)
        max_new = sum(r.req.max_tokens for r in order)
        self.ratio_base = min(1.0, (decoded + cfg.retract_decode_steps * len(order)) / max_new)
        self.ratio_steps = -1  # _commit_stretch counts every step; this one sets the ratio instead of decaying it
        for r in retracted:
            r.req.state = WAITING
            r.req.num_preemptions += 1
            self.num_preemptions += 1
            self.waiting.append(r)

    def _release(self, r: _Req, evict_tokens: int) -> None:
        """release_req: free the request's uncached slots, unlock its prefix, reset it for retraction."""
        self.available += r.kv_len - r.protected
        if r.last_node is not None:
            self.tree.dec_lock_ref(r.last_node)
        if self.available < evict_tokens:
            self.available += self.tree.evict(evict_tokens)
        r.prefix_len = r.protected = 0
        r.last_node = None
        r.kv_len = 0
        r.already_computed = 0


_batch_order = operator.attrgetter("order")  # a sort key (no lambda: a closure cannot be compiled in _commit_stretch)


def _valid(entry: tuple) -> bool:
    """A finish-heap entry is stale once its request left the running batch (it rejoins with a new order)."""
    _, order, r = entry
    return r.in_running and r.order == order
