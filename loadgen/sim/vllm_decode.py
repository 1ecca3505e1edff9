"""vLLM's decoders as aggregates: the closed-form stretches of pure-decode steps, the block
shortage loop, and the decoders that finish at a step.

A layer of ``SimEngine`` (loadgen/sim/engine.py) over the state of loadgen/sim/vllm_state.py; the
module docstring of engine.py says why every decoder is a line in the global step index and what
that buys. Follows vllm/v1/core/sched/scheduler.py (``schedule``'s running loop, where a request
that cannot get a block preempts the last running one) as engine.py does.
"""

from __future__ import annotations

import bisect
from heapq import heappop, heappush  # compiled, a global read per call, not a module attribute
from typing import Optional

from .request import RUNNING, SimRequest
from .vllm_admission import Admission


class DecodeAggregates(Admission):
    """The decode half of SimEngine's scheduling."""

    # ------------------------------------------------------------------ decoders as aggregates
    def _add_decoder(self, req: SimRequest, g0: int) -> None:
        req.is_decoder = True
        req.g0 = g0
        req.nc0 = req.num_computed
        req.gen0 = req.generated
        req.residue = (g0 - req.nc0) % self.block_size
        self._residues[req.residue] += 1
        self.num_decoders += 1
        self._decoder_ctx_const += req.nc0 - g0 + 1
        heappush(self._finish_heap, (g0 + req.max_tokens - req.gen0 - 1, req.admit_seq, req))

    def _remove_decoder(self, req: SimRequest, g: int) -> None:
        """Take ``req`` out of the aggregates with its state as of the start of step ``g``."""
        req.is_decoder = False
        self._residues[req.residue] -= 1
        self.num_decoders -= 1
        self._decoder_ctx_const -= req.nc0 - req.g0 + 1
        steps = g - req.g0
        req.num_computed = req.nc0 + steps
        req.generated = req.gen0 + steps
        req.num_tokens = req.num_prompt_tokens + req.generated
        if steps > 0:
            # its tokens were sampled at the ends of steps g0 .. g-1, the last one just committed
            gap_s = self._gap_max_s[bisect.bisect_left(self._gap_steps, req.g0)]
            if not gap_s <= req.max_token_gap_s:
                req.max_token_gap_s = gap_s
            req.last_token_s = self._last_end_s

    def _stretch_coeffs(self) -> tuple[float, float]:
        """Step i of a pure-decode stretch from G lasts alpha + 2 * beta * i."""
        c = self.step_costs
        r = self.num_decoders
        alpha = c.t0_s + c.a_s * r + c.g_s * (self._decoder_ctx_const + r * self.step_index) + c.dd_s * r + c.h_s
        return alpha, c.g_s * r / 2.0

    # ------------------------------------------------------------------ stretches
    def _max_stretch(self) -> int:
        """Pure-decode steps: up to the first finish, before a block shortage."""
        heap = self._finish_heap
        while heap and not _valid(heap[0]):
            heappop(heap)
        g = self.step_index
        num_steps = heap[0][0] - g + 1
        # blocks: r per full cycle of block_size steps, then the residues step by step
        r = self.num_decoders
        free = self.pool.num_free
        bs = self.block_size
        cycles = free // r
        if cycles * bs < num_steps:
            left = free - cycles * r
            i = 0
            res = self._residues
            base = g + cycles * bs
            while i < bs and res[(base + i) % bs] <= left:
                left -= res[(base + i) % bs]
                i += 1
            num_steps = min(num_steps, cycles * bs + i)
        return num_steps

    def _commit_stretch(self, start_s: float, num_steps: int, coeffs: Optional[tuple[float, float]] = None) -> None:
        g = self.step_index
        bs = self.block_size
        r = self.num_decoders
        cycles, rest = divmod(num_steps, bs)
        blocks = cycles * r
        if rest:
            res = self._residues
            first = (g + cycles * bs) % bs
            blocks += sum(res[first:first + rest]) + (sum(res[:first + rest - bs]) if first + rest > bs else 0)
        self.pool.allocate(blocks)
        alpha, beta = coeffs or self._stretch_coeffs()
        self._inflight_end = start_s + alpha * num_steps + beta * num_steps * (num_steps - 1)
        self._last_end_s = self._clock_s = self._inflight_end
        self._push_gap(g, alpha + 2 * beta * (num_steps - 1))  # its steps grow longer: the last is longest
        if self.gaps is not None:
            self.gaps.add_linear(alpha, 2 * beta, num_steps, r)
        self.step_index = g + num_steps
        self.num_steps += num_steps
        self.generation_tokens_total += r * num_steps
        self._collect_finished(g + num_steps - 1)

    def _decode_with_shortage(self, g: int) -> bool:
        """Too few free blocks for this step's decoders: allocate one by one in running order,
        preempting the last running request when one cannot get its block (vLLM's loop)."""
        bs = self.block_size
        preempted = False
        for req in list(self.running):
            if req.state != RUNNING or not req.is_decoder:
                continue
            if (g - req.residue) % bs:
                continue
            while self.pool.num_free < 1:
                victim = next(reversed(self.running))
                self._preempt(victim, g)
                preempted = True
                if victim is req:
                    break
            if req.state == RUNNING:
                self.pool.allocate(1)
        return preempted

    # ------------------------------------------------------------------ decoders that finish
    def _collect_finished(self, g: int) -> None:
        """Decoders whose last token is produced by step ``g`` finish at its end, in running order."""
        heap = self._finish_heap
        while heap:
            entry = heap[0]
            req = entry[2]
            if not (req.state == RUNNING and req.is_decoder and req.admit_seq == entry[1]):  # stale: see _valid
                heappop(heap)
                continue
            if entry[0] != g:
                if entry[0] < g:
                    raise AssertionError(f"decoder {entry[2]!r} should have finished at step {entry[0]} < {g}")
                return
            heappop(heap)
            self._remove_decoder(req, g + 1)
            self._finish(req, req.num_computed)


def _valid(entry: tuple) -> bool:
    _, seq, req = entry
    return req.state == RUNNING and req.is_decoder and req.admit_seq == seq
