"""SGLang's overlap schedule: a step's results reach the scheduler one step late.

A layer of ``SGLangEngine`` (loadgen/sim/sglang_engine.py) over the state of
loadgen/sim/sglang_state.py. SGLang 0.5.x runs
``event_loop_overlap`` by default (python/sglang/srt/managers/scheduler.py; off with
``--disable-overlap-schedule``): each iteration schedules batch k+1 (``get_next_batch_to_run``)
and launches it while the GPU still computes batch k, and only then processes batch k's results
(``pop_and_process`` -> ``process_batch_result``). So:

* the CPU's share of a step (scheduling, result processing) runs while the GPU computes: a
  step lasts its cost less the cost model's ``hidden_cpu_s``, except the first step after
  idle, which has no step to hide behind;
* scheduling k+1 sees the results of k-1 but not of k: a request whose last token came out of
  step k is still in the running batch, computes one more token in k+1 if that is a decode
  step (a slot held one step longer, freed with the request: "over-allocated" in
  ``release_kv_cache``), and its tokens enter the tree after k+1 is scheduled; a prompt
  prefilled in k enters the tree (``cache_unfinished_req``) after k+1 is scheduled too;
* the scheduler counts a request's outputs without its token of step k (the reserve of the
  ``PrefillAdder``, the retraction order and ratio); a request retracted while scheduling k+1
  loses that token (``process_batch_result_*`` skips retracted requests) and computes it again;
* step k's first tokens and finished requests reach the client at its end, after k+1 was
  scheduled: a session's next turn cannot join the batch that follows its last token.

Consecutive prefill batches overlap too: ``is_disable_overlap_for_batch`` turns the overlap off
for them only with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP, whose default is false.
"""

from __future__ import annotations

from .sglang_state import SGLangState

CACHE, FINISH = "cache", "finish"


class OverlapResults(SGLangState):
    """The deferred half of SGLangEngine's results (overlap schedule on)."""

    def _init_overlap(self) -> None:
        self._ops: list = []  # (CACHE or FINISH, request, KV at its prefill) of the last step, in batch order
        self._first_ops: list = []  # requests whose first token the last step computed
        self._ops_end = 0.0  # the last step's end: when its results reach the client
        self._ops_from_prefill = False  # the last step's results are a prefill batch's
        self._last_decode = False  # the last step was a decode step (else a prefill)
        self._last_prefilled: set = set()  # requests that got a token in the last (prefill) step
        self._prev_decode_end = None  # end of the decode step before the last one

    def _has_deliveries(self) -> bool:
        return bool(self._done or self._first or self._ops or self._first_ops)

    def _lag(self, r) -> int:
        """1 if ``r`` computed a token in the last step, whose results the scheduler has not seen."""
        if not self.overlap:
            return 0
        if self._last_decode:
            return 1 if r.in_running and r.d0 < self.decode_index else 0
        return 1 if r in self._last_prefilled else 0

    def _token_before_last(self, r):
        """When ``r``'s token before its token of the last step came out (call before ``_leave``)."""
        if self._last_decode:
            return self._prev_decode_end if r.d0 <= self.decode_index - 2 else r.last_token_s
        return r.prev_token_s

    def _take_results(self) -> tuple:
        """The last step's results, held until the step being committed is scheduled."""
        held = (self._ops, self._first_ops, self._ops_end, self._ops_from_prefill)
        self._ops, self._first_ops = [], []
        return held

    def _apply_results(self, held: tuple) -> None:
        """process_batch_result of the step before the one just committed, then its outputs to the client."""
        ops, firsts, end, from_prefill = held
        for r in firsts:
            req = r.req
            req.first_token_s = end
            if req.on_first_token is not None:
                self._first.append(req)
        finished = False
        for op, r, kv_len in ops:
            if op is CACHE:
                self._cache_unfinished(r, kv_len)
            else:
                self._finish_lingering(r)
                finished = True
        if from_prefill and finished:
            self.batch_is_full = False
        self._deliver(end)

    def _finish_lingering(self, r) -> None:
        """A request whose last token came out a step ago: out of the batch, its extra slot freed."""
        r.lingering = False
        self._leave(r, stats=False)
        req = r.req
        extra = r.kv_len - (req.num_prompt_tokens + req.max_tokens - 1)  # the token computed after the last
        self.available += extra
        r.kv_len -= extra
        r.generated = req.max_tokens
        self._finish(r)
        self._shrunk = True

    def _drop_result(self, r, prev_token_s) -> None:
        """A retracted request's token of the last step: never processed, computed again later."""
        if self.gaps is not None and prev_token_s is not None:  # its gap was counted when its step was
            self.gaps.remove(r.last_token_s - prev_token_s)
        r.generated -= 1
        r.last_token_s = prev_token_s
        r.lingering = False
        self._ops = [op for op in self._ops if op[1] is not r]
        if r in self._first_ops:
            self._first_ops.remove(r)
