"""``thunderagent``: program-aware pause and resume, as Dynamo's ThunderAgent request classifier
does it (ai-dynamo/dynamo #9448, proposed as a builtin plugin in #15164; the ThunderAgent paper,
arXiv 2602.13692; the original router, ThunderAgent-org/ThunderAgent ThunderAgent/scheduler/router.py).

A program is a session. Its size is the context of its last completed request as the engine
counted it (usage: prompt + completion tokens), plus ``buffer_per_program``; while it is acting
(between turns, in its tool) it counts ``acting_token_weight`` x its tokens. A worker's usage is
the sum over the programs placed on it (the worker its last request ran on), against the
worker's KV capacity (num_gpu_blocks x block_size). Every ``scheduler_interval_seconds``:
- resume: a worker below (``pause_threshold`` - ``resume_hysteresis``) x capacity takes back its
  paused programs, those with a request waiting first, then new programs, then idle ones, each
  group smallest first, as many as fit under that level, placed largest first (best fit
  decreasing over the one worker a program keeps affinity to); a program paused longer than
  ``resume_timeout_seconds`` is released whatever the usage;
- pause: a worker above ``pause_threshold`` x capacity pauses its acting programs smallest first
  until it is at ``pause_target`` x capacity; if that is not enough, it marks reasoning programs
  (a request in flight) smallest first, to pause when their request completes.
A new program is admitted against the whole pool: when nobody waits to resume and the pool's
usage with it stays under ``pause_threshold``; otherwise it waits as a paused program with no
worker yet (placed, on resume, on the worker with the most room).

This module is the pure policy: the program table and the time go in, the decisions come out.
The actuator (loadgen/core/program_gate.py) keeps the table from the run's events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from .base import GatewayView, Policy, require_positive


@dataclass
class Program:
    program_id: object
    tokens: int  # usage of its last request (prompt + completion); its first prompt before one
    worker: Optional[int] = None  # where its last request ran (None: never ran)
    acting: bool = False  # between turns (True) or a request in flight / waiting to send (False)
    paused: bool = False
    paused_at_s: float = math.nan
    pending: bool = False  # paused with a request waiting to be sent
    marked: bool = False  # to pause when its request in flight completes
    steps: int = 0  # requests sent


@dataclass(frozen=True)
class Decisions:
    resume: tuple = ()
    pause: tuple = ()
    mark: tuple = ()


@dataclass
class ThunderAgent(Policy):
    name = "thunderagent"
    pause_threshold: float = 0.95
    pause_target: float = 0.80
    resume_hysteresis: float = 0.10
    resume_timeout_seconds: float = 1800.0
    scheduler_interval_seconds: float = 5.0
    acting_token_weight: float = 1.0
    buffer_per_program: int = 100
    needs_program_table = True  # runs behind loadgen/core/program_gate.py, not the plain gateway

    def __post_init__(self) -> None:
        for name in ("pause_threshold", "pause_target", "resume_hysteresis"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if self.pause_target > self.pause_threshold or self.resume_hysteresis > self.pause_threshold:
            raise ValueError("pause_target and resume_hysteresis must be <= pause_threshold")
        for name in ("resume_timeout_seconds", "scheduler_interval_seconds", "acting_token_weight"):
            require_positive(name, getattr(self, name))
        if self.buffer_per_program < 0:
            raise ValueError("buffer_per_program must be >= 0")

    # ------------------------------------------------------------- accounting
    def size(self, program: Program) -> float:
        weight = self.acting_token_weight if program.acting else 1.0
        return program.tokens * weight + self.buffer_per_program

    def usage(self, programs: Sequence[Program], worker: int) -> float:
        return sum(self.size(p) for p in programs if p.worker == worker and not p.paused)

    def admit_new(self, programs: Sequence[Program], capacities: Sequence[int], tokens: int) -> bool:
        """A new program may start now: nobody waits to resume and the pool has room for it."""
        if any(p.paused for p in programs):
            return False
        used = sum(self.size(p) for p in programs if not p.paused)
        return used + tokens + self.buffer_per_program <= self.pause_threshold * sum(capacities)

    # ------------------------------------------------------------- the periodic schedule
    def schedule(self, programs: Sequence[Program], capacities: Sequence[int], now_s: float) -> Decisions:
        resume = self._resume(programs, capacities, now_s)
        resumed = {id(p) for p, _ in resume}
        live = [p for p in programs if not p.paused or id(p) in resumed]
        placed = {id(p): w for p, w in resume}
        pause, mark = [], []
        for w, cap in enumerate(capacities):
            on = [p for p in live if placed.get(id(p), p.worker) == w]
            used = sum(self.size(p) for p in on)
            if used <= self.pause_threshold * cap:
                continue
            for p in sorted((p for p in on if p.acting and id(p) not in resumed), key=lambda p: p.tokens):
                if used <= self.pause_target * cap:
                    break
                pause.append(p)
                used -= self.size(p)
            for p in sorted((p for p in on if not p.acting and not p.marked and id(p) not in resumed),
                            key=lambda p: p.tokens):
                if used <= self.pause_target * cap:
                    break
                mark.append(p)
                used -= self.size(p)
        return Decisions(tuple(resume), tuple(pause), tuple(mark))

    def _resume(self, programs: Sequence[Program], capacities: Sequence[int], now_s: float) -> list:
        paused = [p for p in programs if p.paused]
        if not paused:
            return []
        out = [(p, p.worker if p.worker is not None else self._roomiest(programs, capacities))
               for p in paused if now_s - p.paused_at_s >= self.resume_timeout_seconds]
        forced = {id(p) for p, _ in out}
        room = [(self.pause_threshold - self.resume_hysteresis) * cap - self.usage(programs, w)
                for w, cap in enumerate(capacities)]

        def group(p: Program) -> int:  # a waiting request first, then new programs, then idle ones
            return 1 if p.steps == 0 else (0 if p.pending else 2)

        waiting = sorted((p for p in paused if id(p) not in forced), key=lambda p: (group(p), p.tokens))
        selected, total = [], sum(max(r, 0.0) for r in room)
        for p in waiting:  # as many as fit the headroom, in priority order
            need = p.tokens + self.buffer_per_program
            if need <= total:
                selected.append(p)
                total -= need
        for p in sorted(selected, key=lambda p: -p.tokens):  # best fit decreasing
            need = p.tokens + self.buffer_per_program
            candidates = [p.worker] if p.worker is not None else sorted(range(len(room)), key=lambda w: -room[w])
            for w in candidates:
                if need <= room[w]:
                    out.append((p, w))
                    room[w] -= need
                    break
        return out

    def _roomiest(self, programs: Sequence[Program], capacities: Sequence[int]) -> int:
        return max(range(len(capacities)), key=lambda w: (capacities[w] - self.usage(programs, w), -w))

    def limit(self, view: GatewayView) -> float:
        return self.pause_threshold * view.pool_tokens
