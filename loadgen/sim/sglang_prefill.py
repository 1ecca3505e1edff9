"""SGLang's prefill admission: ``get_new_batch_prefill`` and its ``PrefillAdder``.

A layer of ``SGLangEngine`` (loadgen/sim/sglang_engine.py) over the state of
loadgen/sim/sglang_state.py. Follows python/sglang/srt/managers/scheduler.py
(``get_new_batch_prefill``) and managers/schedule_policy.py (``PrefillAdder``,
``SchedulePolicy.calc_priority``), SGLang 0.5.x: the module docstring of sglang_engine.py says
what they do.
"""

from __future__ import annotations

import math
from typing import Optional

from .request import RUNNING
from .sglang_decode import DecodeBatch

IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32  # schedule_policy.py
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
LPM_FALLBACK_QUEUE_LEN = 128  # lpm turns into fcfs above this many waiting requests
NO_TOKEN, OTHER, CONTINUE = "no_token", "other", "continue"


class PrefillAdding(DecodeBatch):
    """The prefill half of SGLangEngine's scheduling."""

    def _get_new_batch_prefill(self) -> list:
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return []
        running_bs = len(self.running)
        if self.max_running_requests - running_bs <= 0 and self.chunked is None:
            self.batch_is_full = True
            return []
        prefix_computed = False
        if self.lpm and len(self.waiting) <= LPM_FALLBACK_QUEUE_LEN:
            self._sort_by_longest_prefix()
            prefix_computed = True
        ratio = self._new_token_ratio()
        clip = self.clip_max_new_tokens
        tree = self.tree
        # the outputs the scheduler has seen (overlap: without the last step's, sglang_overlap.py);
        # summed in the running batch's order from 0, as sum() would
        rem_total = 0
        for r in self.running:
            rem_total += min(r.req.max_tokens - (r.gen0 + self.decode_index - r.d0 - self._lag(r)), clip) * ratio
        self._rem_total_offset = rem_total
        self._cur_offset = 0
        self._rem_input = self.max_prefill_tokens
        self._rem_chunk = self.chunked_prefill_size
        batch = []  # (request, tokens to extend, truncated)
        chunked = self.chunked
        if chunked is not None:
            extend = chunked.fill_len() - chunked.prefix_len
            truncated = extend > self._rem_chunk
            extend = min(extend, self._rem_chunk)
            self._charge(extend, min(chunked.req.max_tokens, clip) if not truncated else 0)
            batch.append((chunked, extend, truncated))
            self.chunked = chunked if truncated else None
        new_chunked = None
        admitted = []
        for r in self.waiting:
            if len(admitted) + (chunked is not None) >= self.max_running_requests - running_bs:
                self.batch_is_full = True
                break
            if not prefix_computed:
                r.match_len, r.match_node = tree.match_prefix(r.pid, r.plen, r.own, r.fill_len() - 1)
            res, item = self._add_one_req(r, len(batch))
            if item is not None:
                batch.append(item)
                admitted.append(r)
                if item[2]:
                    new_chunked = r
            if res != CONTINUE:
                if res == NO_TOKEN:
                    self.batch_is_full = True
                break
        if admitted:
            taken = set(admitted)
            self.waiting = [r for r in self.waiting if r not in taken]
        if new_chunked is not None:
            self.chunked = new_chunked
        return batch

    def _charge(self, extend: int, max_new: int) -> None:
        extend = -(-extend // self.page) * self.page
        self._rem_total_offset += extend + max_new
        self._cur_offset += extend
        self._rem_input -= extend
        self._rem_chunk -= extend

    def _rem_total(self) -> float:
        return self.available + self.tree.evictable_size - self._rem_total_offset

    def _budget_state(self) -> str:
        free = self.available + self.tree.evictable_size
        if free - self._rem_total_offset <= 0 or free - self._cur_offset <= 0:
            return NO_TOKEN
        if self._rem_input <= 0 or self._rem_chunk <= 0:
            return OTHER
        return CONTINUE

    def _add_one_req(self, r, batch_len: int) -> tuple[str, Optional[tuple]]:
        """PrefillAdder.add_one_req: (verdict, (request, extend, truncated) or None)."""
        tree = self.tree
        clip = self.clip_max_new_tokens
        max_new = min(r.req.max_tokens - r.generated, clip)
        extend = r.fill_len() - r.match_len
        total_tokens = extend + max_new
        input_tokens = -(-extend // self.page) * self.page
        node = r.match_node
        tree.inc_lock_ref(node)  # _lock_node: the matched prefix is not evictable meanwhile
        try:
            if total_tokens >= self._rem_total():
                return NO_TOKEN, None
            if input_tokens >= self._rem_input and batch_len:
                return OTHER, None
            if input_tokens <= self._rem_chunk:
                item = (r, extend, False)
                self._charge(extend, max_new)
            else:
                trunc = self._rem_chunk - self._rem_chunk % self.page
                if trunc <= 0:
                    return OTHER, None
                item = (r, trunc, True)
                self._charge(trunc, 0)
            tree.inc_lock_ref(node)
            r.prefix_len = r.protected = r.match_len
            r.last_node = node
        finally:
            tree.dec_lock_ref(node)
        r.req.state = RUNNING
        return self._budget_state(), item

    def _sort_by_longest_prefix(self) -> None:
        """SchedulePolicy.calc_priority for lpm: match every waiting request, defer in-batch sharers."""
        tree = self.tree
        inserted: set = set()
        deferred: set = set()
        for r in self.waiting:
            r.match_len, r.match_node = tree.match_prefix(r.pid, r.plen, r.own, r.fill_len() - 1)
            if r.match_len <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                # the in-batch tree holds earlier waiting requests' tokens: another request shares
                # exactly this one's prefix (sessions share nothing else)
                if r.pid is not None and r.pid in inserted and r.plen >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    deferred.add(r)
                elif r.pid is not None:
                    inserted.add(r.pid)
        self.waiting.sort(key=lambda r: math.inf if r in deferred else -r.match_len)
