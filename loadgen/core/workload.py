"""Who arrives when, with what shape: base arrivals plus triggers (docs/experiments.md: workloads, triggers, paired design).

Randomness is owned and keyed, never global: every generator comes from ``rng_for(kind, *key)``,
a stream kind (``Stream``) and a fixed-length key of that kind:
* the base arrival times: (BASE_ARRIVALS, seed);
* base session i's shape (think times...): (BASE_SESSION, seed, i);
* the j-th session-adding trigger's (burst, extra sessions) arrivals: (TRIGGER_ARRIVALS, seed, j,
  seed_offset); its sessions: (TRIGGER_SESSION, seed, j, seed_offset, i);
* replayed traces: which recorded session a stream's i-th session replays is the i-th element of
  a draw order from (BASE_DRAW_ORDER, seed) or (TRIGGER_DRAW_ORDER, seed, j, seed_offset), a
  sequence that does not depend on how many sessions arrive, so base session i's shape still
  depends only on (seed, i);
* live runs' token ids: (SESSION_TOKENS, seed, arm, session id) and (SHARED_PREFIX_TOKENS, seed,
  arm, prefix name, prefix length) (loadgen/core/session.py TokenContext).
So the arms of a pair share every base session exactly, and a burst changes nothing about them.
Rate changes act on the base stream through its cumulative intensity, so arrivals before the
change are the same whatever the new rate.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

import numpy as np

from trace_shapes.replay import TraceReplay
from trace_shapes.shape import SessionShape
from trace_shapes.synthetic import SyntheticSessions
from trace_shapes.tracelab import GeneratedReplay
from trace_shapes.tree import Tree

from .replay import ReplayRun, ReplaySession
from .seeding import KeyedSeed
from .spec import (ArmSpec, BurstTrigger, ExperimentSpec, ExtraSessionsTrigger, MixShiftTrigger,
                   RateChangeTrigger, SessionSpec, SyntheticSessionSpec, TreeSessionSpec, build_session_model)
from .spec.engines import prefix_cache_block_size

TRIGGER_SESSION_ID_BASE = 1_000_000  # trigger j's sessions get ids (j + 1) * this + i


class Stream(enum.Enum):
    """The kinds of random stream; each kind's key has a fixed number of parts (its arity)."""

    BASE_ARRIVALS = ("base-arrivals", 1)  # (seed,)
    BASE_SESSION = ("base-session", 2)  # (seed, i)
    BASE_DRAW_ORDER = ("base-draw-order", 1)  # (seed,)
    TRIGGER_ARRIVALS = ("trigger-arrivals", 3)  # (seed, j, seed_offset)
    TRIGGER_SESSION = ("trigger-session", 4)  # (seed, j, seed_offset, i)
    TRIGGER_DRAW_ORDER = ("trigger-draw-order", 3)  # (seed, j, seed_offset)
    SESSION_TOKENS = ("session-tokens", 3)  # (seed, arm, session_id)
    SHARED_PREFIX_TOKENS = ("shared-prefix-tokens", 4)  # (seed, arm, prefix_key, prefix_tokens)
    CALIBRATION_PROMPTS = ("calibration-prompts", 1)  # (seed,)
    SERVE_SIM_OUTPUT = ("serve-sim-output", 1)  # (seed,)
    ROUTER = ("router", 2)  # (seed, arm): a deployment's router (ties, random picks)
    CALIBRATION_BOOTSTRAP = ("calibration-bootstrap", 1)  # (seed,)
    STEP_JITTER = ("step-jitter", 4)  # (seed, arm, replicate, replica)
    REPLAY_BLOCK = ("replay-block", 3)  # (seed, arm, hash id): a replayed hash id's tokens
    REPLAY_TOKENS = ("replay-tokens", 3)  # (seed, arm, row): a replayed row's own tokens (-row: its answer's)

    def __init__(self, tag: str, arity: int) -> None:
        self.tag = tag
        self.arity = arity


KeyPart = Union[int, str]
_WORD = 0xFFFFFFFF
_INT_LIMIT = 2**64  # key integers are kept whole up to 64 bits (seeds, offsets, ids), never cut


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _key_words(part: KeyPart) -> list[int]:
    """Three 32-bit words per key part: a type-and-sign word, then 64 bits of magnitude or hash.

    Negative integers keep their sign in the first word, so -s and s are different streams."""
    if isinstance(part, str):
        kind, value = 2, _hash64(part)
    elif isinstance(part, (int, np.integer)) and not isinstance(part, bool):
        part = int(part)
        if not -_INT_LIMIT < part < _INT_LIMIT:
            raise ValueError(f"random stream key {part} does not fit in 64 bits (seeds must be |seed| < 2^64)")
        kind, value = (1 if part < 0 else 0), abs(part)
    else:
        raise TypeError(f"random stream key parts are ints or strings, got {part!r}")
    return [kind, value & _WORD, value >> 32]


def rng_for(kind: Stream, *key: KeyPart) -> np.random.Generator:
    """The generator of stream ``kind`` at ``key``: independent of every other (kind, key).

    SeedSequence zero-pads short entropy, so variable-length keys alias ((s,), (s, 0) and (s, 0, 0)
    were one generator); here the entropy is always the kind's 64-bit tag, then a fixed number of
    words per part for the kind's fixed number of parts, so two different keys never share words."""
    if len(key) != kind.arity:
        raise ValueError(f"stream {kind.tag} takes {kind.arity} key parts, got {len(key)}: {key!r}")
    tag = _stream_tag(kind)
    words = [tag & _WORD, tag >> 32, kind.arity]
    for part in key:
        words.extend(_key_words(part))
    # the same state as PCG64(SeedSequence(words)), hashed without NumPy's per-call overhead
    return np.random.Generator(np.random.PCG64(KeyedSeed(words)))


@functools.lru_cache(maxsize=None)
def _stream_tag(kind: Stream) -> int:
    return _hash64(f"agent-loadgen/{kind.tag}")


@dataclass(frozen=True)
class SessionPlan:
    session_id: int
    arrival_s: float
    shape: SessionShape
    is_trigger: bool = False
    # The run (seed, arm) whose token ids a live session draws, so that no run resends another
    # run's ids to a server that still caches them. Not compared: the arms of a pair share a
    # base session (arrival and shape) while their token contents differ.
    token_key: Optional[tuple[int, str]] = field(default=None, compare=False)
    # a session tree's session (loadgen/core/tree_runtime.py): its subtree, whose node is ``shape``
    tree: Optional[Tree] = None
    # a replayed trace's session (loadgen/core/replay.py): its turns' send times and prompts
    replay: Optional[ReplaySession] = field(default=None, compare=False)


def _plan(session_id: int, arrival_s: float, drawn: Union[SessionShape, Tree], **kw) -> SessionPlan:
    if isinstance(drawn, Tree):
        return SessionPlan(session_id, arrival_s, drawn.node, tree=drawn, **kw)
    return SessionPlan(session_id, arrival_s, drawn, **kw)


ShapeModel = Union[SyntheticSessions, TraceReplay, GeneratedReplay]


def shape_model(spec: SessionSpec) -> ShapeModel:
    if isinstance(spec, TreeSessionSpec):
        return spec.model()  # make(rng) draws a Tree
    if not isinstance(spec, SyntheticSessionSpec):
        return build_session_model(spec)
    return SyntheticSessions(
        system_prompt_tokens=spec.system_prompt_tokens, task_tokens=spec.task_tokens,
        num_turns=spec.num_turns, output_tokens=spec.output_tokens, tool_tokens=spec.tool_tokens,
        think_time_mean_s=spec.think_time_mean_s, kind=spec.label)


@dataclass(frozen=True)
class StreamKeys:
    """The stream kinds and key of one arrival stream's sessions (base, or trigger j)."""

    session: Stream
    draw_order: Stream
    key: tuple[int, ...]


BASE_STREAM = (Stream.BASE_SESSION, Stream.BASE_DRAW_ORDER)
TRIGGER_STREAM = (Stream.TRIGGER_SESSION, Stream.TRIGGER_DRAW_ORDER)


class ShapeStream:
    """The shapes of one arrival stream: the i-th depends only on (stream key, i)."""

    def __init__(self, model: ShapeModel, keys: StreamKeys) -> None:
        self._model = model
        self._keys = keys
        self._order: Optional[Iterator[int]] = (
            model.draw_order(rng_for(keys.draw_order, *keys.key)) if isinstance(model, TraceReplay) else None)
        self._drawn: list[int] = []

    def shape(self, i: int) -> SessionShape:
        rng = rng_for(self._keys.session, *self._keys.key, i)
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
    if workload.replay is not None:
        return replay_plans(spec, arm, seed)
    duration = spec.duration_s
    segments = [(0.0, workload.arrival_rate_per_s)]
    shift_at, shift_model = math.inf, None
    for trig in arm.triggers:
        if isinstance(trig, RateChangeTrigger):
            segments.append((trig.at_s, trig.arrival_rate_per_s))
        elif isinstance(trig, MixShiftTrigger):
            shift_at, shift_model = trig.at_s, shape_model(trig.sessions)
    base_model = shape_model(workload.sessions)
    base_times = piecewise_poisson_arrivals(segments, duration, rng_for(Stream.BASE_ARRIVALS, seed))
    token_key = (seed, arm.name)
    plans = []
    before, after = _shape_streams(base_model, shift_model, StreamKeys(*BASE_STREAM, (seed,)))
    for i, t in enumerate(base_times):
        plans.append(_plan(i, t, (after if t >= shift_at else before).shape(i), token_key=token_key))
    stream_triggers = [t for t in arm.triggers if isinstance(t, (BurstTrigger, ExtraSessionsTrigger))]
    for j, trig in enumerate(stream_triggers):
        if isinstance(trig, BurstTrigger):
            times = poisson_arrivals(trig.extra_rate_factor * workload.arrival_rate_per_s, trig.start_s,
                                     trig.start_s + trig.duration_s,
                                     rng_for(Stream.TRIGGER_ARRIVALS, seed, j, trig.seed_offset))
        elif isinstance(trig, ExtraSessionsTrigger):
            step = trig.duration_s / trig.num_sessions
            times = [trig.start_s + (k + 0.5) * step for k in range(trig.num_sessions)]
        before, after = _shape_streams(base_model, shift_model,
                                       StreamKeys(*TRIGGER_STREAM, (seed, j, trig.seed_offset)))
        for i, t in enumerate(times):
            shape = (after if t >= shift_at else before).shape(i)
            plans.append(_plan((j + 1) * TRIGGER_SESSION_ID_BASE + i, t, shape, is_trigger=True,
                               token_key=token_key))
    plans.sort(key=lambda p: (p.arrival_s, p.session_id))
    return plans


def _shape_streams(model: ShapeModel, shift_model: Optional[ShapeModel],
                   keys: StreamKeys) -> tuple[ShapeStream, Optional[ShapeStream]]:
    """A stream's shapes before and after a mix shift (None when there is none). Both use the
    same keys: session i arrives either before or after the shift, so it draws from one only."""
    return ShapeStream(model, keys), (ShapeStream(shift_model, keys) if shift_model is not None else None)


def replay_plans(spec: ExperimentSpec, arm: ArmSpec, seed: int) -> list[SessionPlan]:
    """A replayed trace's sessions (loadgen/core/replay.py): one per recorded session, at its first
    request's time / speed; the seed draws only the ids the trace does not record."""
    replay = spec.workload.replay

    def draw(kind: str, key: int) -> np.random.Generator:
        return rng_for(Stream.REPLAY_BLOCK if kind == "block" else Stream.REPLAY_TOKENS, seed, arm.name, key)

    run = ReplayRun(replay.trace(), replay.speed, prefix_cache_block_size(spec.engine_for(arm)) or 16, draw)
    plans = []
    for i, requests in enumerate(run.trace.sessions()):
        session = ReplaySession(run, requests)
        plans.append(SessionPlan(i, session.send_at_s[0], session.shape(), token_key=(seed, arm.name),
                                 replay=session))
    plans.sort(key=lambda p: (p.arrival_s, p.session_id))
    return plans
