"""Who arrives when, with what shape: base arrivals plus triggers (docs/experiments.md: workloads, triggers, paired design).

Randomness is owned and keyed, never global:
* the base arrival times come from a generator seeded by (seed, BASE);
* base session i's shape (think times...) from (seed, BASE, i);
* the j-th session-adding trigger's (burst, extra sessions) arrivals from (seed, TRIGGER + j, seed_offset), its sessions from
  (seed, TRIGGER + j, seed_offset, i);
* replayed traces: which recorded session a stream's i-th session replays is the i-th element of
  a draw order seeded by (stream key, DRAW_ORDER), a sequence that does not depend on how many
  sessions arrive, so base session i's shape still depends only on (seed, i).
So the arms of a pair share every base session exactly, and a burst changes nothing about them.
Rate changes act on the base stream through its cumulative intensity, so arrivals before the
change are the same whatever the new rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import numpy as np

from trace_shapes import GeneratedReplay, SessionShape, SyntheticSessions, TraceReplay

from .spec import (ArmSpec, BurstTrigger, ExperimentSpec, ExtraSessionsTrigger, MixShiftTrigger,
                   RateChangeTrigger, SessionSpec, SyntheticSessionSpec, build_session_model)

BASE = 0
TRIGGER = 1000
DRAW_ORDER = 0xFFFFFFFF  # last key of a replay stream's draw order: never a session index
TRIGGER_SESSION_ID_BASE = 1_000_000  # trigger j's sessions get ids (j + 1) * this + i


def rng_for(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([k & 0xFFFFFFFF for k in key])))


@dataclass(frozen=True)
class SessionPlan:
    session_id: int
    arrival_s: float
    shape: SessionShape
    is_trigger: bool = False


ShapeModel = Union[SyntheticSessions, TraceReplay, GeneratedReplay]


def shape_model(spec: SessionSpec) -> ShapeModel:
    if not isinstance(spec, SyntheticSessionSpec):
        return build_session_model(spec)
    return SyntheticSessions(
        system_prompt_tokens=spec.system_prompt_tokens, task_tokens=spec.task_tokens,
        num_turns=spec.num_turns, output_tokens=spec.output_tokens, tool_tokens=spec.tool_tokens,
        think_time_mean_s=spec.think_time_mean_s, kind=spec.label)


class ShapeStream:
    """The shapes of one arrival stream keyed by ``key``: the i-th depends only on (key, i)."""

    def __init__(self, model: ShapeModel, key: tuple[int, ...]) -> None:
        self._model = model
        self._key = key
        self._order: Optional[Iterator[int]] = (
            model.draw_order(rng_for(*key, DRAW_ORDER)) if isinstance(model, TraceReplay) else None)
        self._drawn: list[int] = []

    def shape(self, i: int) -> SessionShape:
        rng = rng_for(*self._key, i)
        if self._order is None:
            return self._model.make(rng)
        while len(self._drawn) <= i:
            self._drawn.append(next(self._order))
        return self._model.make(self._drawn[i], rng)


def poisson_arrivals(rate_per_s: float, start_s: float, end_s: float, rng: np.random.Generator) -> list[float]:
    """Arrival times of a homogeneous Poisson process on [start_s, end_s)."""
    times = []
    if rate_per_s <= 0:
        return times
    t = start_s
    while True:
        t += rng.exponential(1.0 / rate_per_s)
        if t >= end_s:
            return times
        times.append(t)


def piecewise_poisson_arrivals(segments: list[tuple[float, float]], end_s: float,
                               rng: np.random.Generator) -> list[float]:
    """Poisson arrivals with rate ``segments[k][1]`` from ``segments[k][0]`` on.

    Unit-rate points are mapped through the inverse cumulative intensity, so changing the
    rate after time t leaves every arrival before t untouched."""
    segments = sorted(segments)
    times: list[float] = []
    lam = 0.0  # cumulative intensity of the next arrival
    seg = 0
    seg_start_lam = 0.0
    while True:
        lam += rng.exponential(1.0)
        # walk segments until the one holding cumulative intensity lam
        while True:
            t0, rate = segments[seg]
            t1 = segments[seg + 1][0] if seg + 1 < len(segments) else math.inf
            seg_lam = rate * (t1 - t0) if rate > 0 else 0.0
            if rate > 0 and lam - seg_start_lam < seg_lam:
                t = t0 + (lam - seg_start_lam) / rate
                break
            if t1 == math.inf:
                return times
            seg_start_lam += seg_lam
            seg += 1
        if t >= end_s:
            return times
        times.append(t)


def plan_sessions(spec: ExperimentSpec, arm: ArmSpec, seed: int) -> list[SessionPlan]:
    """Every session of one run, in arrival order."""
    workload = spec.workload
    duration = spec.duration_s
    segments = [(0.0, workload.arrival_rate_per_s)]
    shift_at, shift_model = math.inf, None
    for trig in arm.triggers:
        if isinstance(trig, RateChangeTrigger):
            segments.append((trig.at_s, trig.arrival_rate_per_s))
        elif isinstance(trig, MixShiftTrigger):
            shift_at, shift_model = trig.at_s, shape_model(trig.sessions)
    base_model = shape_model(workload.sessions)
    base_times = piecewise_poisson_arrivals(segments, duration, rng_for(seed, BASE))
    plans = []
    before, after = _shape_streams(base_model, shift_model, (seed, BASE))
    for i, t in enumerate(base_times):
        plans.append(SessionPlan(i, t, (after if t >= shift_at else before).shape(i)))
    stream_triggers = [t for t in arm.triggers if isinstance(t, (BurstTrigger, ExtraSessionsTrigger))]
    for j, trig in enumerate(stream_triggers):
        if isinstance(trig, BurstTrigger):
            times = poisson_arrivals(trig.extra_rate_factor * workload.arrival_rate_per_s, trig.start_s,
                                     trig.start_s + trig.duration_s, rng_for(seed, TRIGGER + j, trig.seed_offset))
        elif isinstance(trig, ExtraSessionsTrigger):
            step = trig.duration_s / trig.num_sessions
            times = [trig.start_s + (k + 0.5) * step for k in range(trig.num_sessions)]
        before, after = _shape_streams(base_model, shift_model, (seed, TRIGGER + j, trig.seed_offset))
        for i, t in enumerate(times):
            shape = (after if t >= shift_at else before).shape(i)
            plans.append(SessionPlan((j + 1) * TRIGGER_SESSION_ID_BASE + i, t, shape, is_trigger=True))
    plans.sort(key=lambda p: (p.arrival_s, p.session_id))
    return plans


def _shape_streams(model: ShapeModel, shift_model: Optional[ShapeModel],
                   key: tuple[int, ...]) -> tuple[ShapeStream, Optional[ShapeStream]]:
    """A stream's shapes before and after a mix shift (None when there is none)."""
    return ShapeStream(model, key), (ShapeStream(shift_model, key) if shift_model is not None else None)
