"""The step machine both simulated engines share: time, delivery and closed-form decode stretches.

A flavour (vLLM's scheduler in loadgen/sim/engine.py, SGLang's in loadgen/sim/sglang_engine.py)
says how one general step is scheduled (``_step``), when the next steps are a pure-decode
stretch in which nothing can change and how long it may be (``_stretch_bounds_now``: up to the
first finish, before a shortage, before a copy in flight lands), how long its steps
last (``_stretch_coeffs``) and how such a stretch is committed (``_commit_stretch``). This
class runs them in time:

``advance_to(t)`` commits every step that *starts* at or before t (a step's schedule is fixed
when it starts; arrivals during it wait for the next one). The last committed step is "in
flight": its first tokens and finished requests are delivered when the clock reaches its end.
``next_wakeup()`` says when something observable happens next if nothing arrives: the end of
the step in flight, or of the stretch that follows it.

Step i of a stretch lasts ``alpha + 2 * beta * i``, so its first n steps take
``alpha * n + beta * n * (n - 1)``: a stretch of any length costs O(1) to commit.
"""

from __future__ import annotations

import math
from typing import Optional


class StepCosts:
    """A step-cost model's constants as plain numbers for the step loops. The model
    (loadgen/sim/cost.py's StepCostModel, a frozen dataclass) is a Python object whose every
    constant is read by name; here they are C doubles in the compiled build, read at every step."""

    def __init__(self, cost) -> None:
        self.t0_s = cost.t0_s
        self.a_s = cost.a_s_per_token
        self.b_s = cost.b_s_per_token2
        self.g_s = cost.g_s_per_token
        self.m_s = cost.mixed_decode_s_per_token
        self.dd_s = cost.decode_token_delta_s()  # a decode token's cost beyond a prefill token's
        self.h_s = cost.host_s_per_step

    def step_time(self, num_tokens: float, attention_tokens2: float, decode_context_tokens: float,
                  mixed_decode_context_tokens: float, num_decode_tokens: float = 0.0) -> float:
        """``StepCostModel.step_time``: the same terms added in the same order, so the same bits
        (the reference engines in tests/sim/ call the model's own)."""
        return (self.t0_s + self.a_s * num_tokens + self.b_s * attention_tokens2
                + self.g_s * decode_context_tokens + self.m_s * mixed_decode_context_tokens
                + self.dd_s * num_decode_tokens + self.h_s)


class StepMachine:
    """The delivery loop over a flavour's scheduling; see the module docstring."""

    def _init_step_machine(self) -> None:
        self._inflight_end: Optional[float] = None  # end of the step (or stretch) in flight
        self._next_start: Optional[float] = None  # when the next step starts (None: idle)
        self._done: list = []  # finishing at the end of the in-flight step
        self._first: list = []  # first token at the end of the in-flight step (with on_first_token)
        # The longest step from a step index on, kept O(1) per committed chunk (one general
        # step or one stretch): a stack of (first step index, longest step in it) with strictly
        # decreasing durations, so the longest step from index g on is the first entry at or
        # after g. A request in a decode batch spans whole chunks, so its longest gap between
        # tokens is one lookup when it leaves.
        self._gap_steps: list[int] = []
        self._gap_max_s: list[float] = []
        # the stretch bounds of the current state, computed once per state (next_wakeup asks,
        # then advance_to asks again when the clock gets there): every change of the
        # scheduling state moves ``_version`` (``_changed``)
        self._version = 0
        self._bounds_version = -1
        self._bounds: Optional[tuple[int, Optional[float]]] = None
        self._coeffs_version = -1
        self._coeffs: tuple[float, float] = (0.0, 0.0)
        # every inter-token gap, when a run asks for them (a GapHistogram, loadgen/core/gap_histogram.py:
        # a replay's ITL percentiles); None costs one test per committed chunk
        self.gaps = None

    # ------------------------------------------------------------------ what a flavour provides
    def _at_boundary(self) -> bool:
        """Work due between steps (aborts, a flush); True, with ``_next_start`` cleared, when
        the engine is idle."""
        raise NotImplementedError

    def _stretch_bounds_now(self) -> Optional[tuple[int, Optional[float]]]:
        """None if the next steps are not a pure-decode stretch, else (the most steps it may
        have: up to the first finish, before a shortage; a time its steps must start before,
        or None)."""
        raise NotImplementedError

    def _stretch_coeffs(self) -> tuple[float, float]:
        raise NotImplementedError

    def _commit_stretch(self, start_s: float, num_steps: int, coeffs: Optional[tuple[float, float]] = None) -> None:
        """Commit ``num_steps`` stretch steps from ``start_s`` (``coeffs``: the state's
        ``_stretch_coeffs()``, when the caller has them)."""
        raise NotImplementedError

    def _step(self, start_s: float) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ time
    def _start_if_idle(self, now_s: float) -> None:
        """Something arrived: an idle engine starts its next step now."""
        if self._inflight_end is None:
            self._next_start = now_s
            self.advance_to(now_s)

    def advance_to(self, t_s: float) -> None:
        """Commit every step starting at or before ``t_s``; deliver requests finished by then."""
        while True:
            end = self._inflight_end
            if end is not None:
                if end > t_s:
                    return
                self._inflight_end = None
                self._next_start = end
                self._deliver(end)
            if self._at_boundary():
                return
            start = self._next_start
            bounds = self._stretch_bounds()
            if bounds is not None:
                num_steps = self._stretch_len(start, t_s, bounds)
                if num_steps:
                    self._commit_stretch(start, num_steps, self._state_coeffs())
                    self._version += 1
                    continue
            self._step(start)
            self._version += 1

    def _deliver(self, end_s: float) -> None:
        """First tokens and finished requests of the step that ended at ``end_s``, to their callbacks."""
        if self._first:
            first, self._first = self._first, []
            for req in first:
                req.on_first_token(req)
        if self._done:
            done, self._done = self._done, []
            for req in done:
                req.finish_s = end_s
                if req.on_done is not None:
                    req.on_done(req)

    def _has_deliveries(self) -> bool:
        """Something is delivered when the step in flight ends."""
        return bool(self._done or self._first)

    def next_wakeup(self) -> Optional[float]:
        """When the engine next needs the clock, if nothing new arrives (None when idle)."""
        end = self._inflight_end
        if end is None:
            return None
        if self._has_deliveries():
            return end
        bounds = self._stretch_bounds()
        if bounds is None:
            return end
        num_steps = self._stretch_len(end, None, bounds)
        if num_steps == 0:
            return end
        alpha, beta = self._state_coeffs()
        return end + alpha * num_steps + beta * num_steps * (num_steps - 1)

    def _changed(self) -> None:
        """The scheduling state changed outside a step (an arrival, an abort, a flush)."""
        self._version += 1

    def _stretch_bounds(self) -> Optional[tuple[int, Optional[float]]]:
        if self._bounds_version != self._version:
            self._bounds = self._stretch_bounds_now()
            self._bounds_version = self._version
        return self._bounds

    def _state_coeffs(self) -> tuple[float, float]:
        """``_stretch_coeffs()`` of the current state, computed once per state."""
        if self._coeffs_version != self._version:
            self._coeffs = self._stretch_coeffs()
            self._coeffs_version = self._version
        return self._coeffs

    def _stretch_len(self, start_s: float, limit_s: Optional[float], bounds: tuple[int, Optional[float]]) -> int:
        """Stretch steps to commit from ``start_s``: at most ``bounds[0]``, only those starting
        before ``bounds[1]`` (a copy landing) and, with ``limit_s``, at or before it."""
        num_steps, deadline_s = bounds
        if num_steps <= 0:
            return 0
        if deadline_s is not None:
            num_steps = self._steps_starting_by(start_s, deadline_s, num_steps, strict=True)
        if limit_s is not None and num_steps > 1:
            num_steps = self._steps_starting_by(start_s, limit_s, num_steps, strict=False)
        return num_steps

    def _steps_starting_by(self, start_s: float, limit_s: float, num_steps: int, strict: bool) -> int:
        """Of ``num_steps`` stretch steps from ``start_s``, how many start at or before
        ``limit_s`` (before it, ``strict``)."""
        alpha, beta = self._state_coeffs()
        budget = limit_s - start_s  # steps i with T(i) = alpha*i + beta*i*(i-1) <= budget start in time
        if strict and not budget > 0:
            return 0
        if alpha > 0:  # zero-cost engines (load-generator benchmarks) run every step at once
            if beta > 0:
                b1 = alpha - beta
                root = (-b1 + math.sqrt(b1 * b1 + 4 * beta * max(budget, 0.0))) / (2 * beta)
            else:
                root = max(budget, 0.0) / alpha
            # far past num_steps the answer is num_steps from any start there; compiled, a
            # root past a C long's range would not convert
            i = int(root) if not root >= 1e15 else num_steps + 2
            if strict:
                while i > 0 and alpha * i + beta * i * (i - 1) >= budget:
                    i -= 1
                while i + 1 < num_steps and alpha * (i + 1) + beta * (i + 1) * i < budget:
                    i += 1
            else:
                while i > 0 and alpha * i + beta * i * (i - 1) > budget:
                    i -= 1
                while i + 1 < num_steps and alpha * (i + 1) + beta * (i + 1) * i <= budget:
                    i += 1
            num_steps = min(num_steps, i + 1)
        return num_steps

    # ------------------------------------------------------------------ per-token gaps
    def _push_gap(self, first_step: int, longest_s: float) -> None:
        steps, gaps = self._gap_steps, self._gap_max_s
        while gaps:
            last_s = gaps[-1]  # compiled, a C double: no float object per comparison
            if not last_s <= longest_s:
                break
            # one or two entries at a time: compiled, a pop is a pointer move, a slice deletion
            # builds a slice object and a length
            gaps.pop()
            steps.pop()
        steps.append(first_step)
        gaps.append(longest_s)
