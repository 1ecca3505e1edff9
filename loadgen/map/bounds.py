"""The two analytic bounds drawn on the map (docs/experiments.md#bounds-of-the-map).

* Healthy side: with every turn warm, Little's law puts N = lambda T (Z + R0) sessions in the
  system; their contexts fit the pool while N x mean context <= C. R0, the warm turn's response
  time, grows with load as in processor sharing: R0 = R_alone / (1 - lambda T W), with W the engine
  work of one warm turn beyond the per-step overhead and R_alone its time on an otherwise idle
  engine. Solving lambda T (Z + R0(lambda)) L = C for lambda gives a quadratic (smaller root).
* Drain: in the degraded regime every turn recomputes its context except the shared system
  prompt, so a session costs S = sum_k c(L_k) engine-seconds; a degraded server can drain only if
  lambda < 1/S.

Both come from the spec's session shape and the engine's step-cost model (loadgen/sim/cost.py);
the per-step overhead t0 is shared by a batch, so it is charged to no single turn's work.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from trace_shapes import SessionShape, TraceReplay

from ..core.spec import ExperimentSpec, SimEngineSpec, SyntheticSessionSpec
from ..core.workload import shape_model
from ..sim.cost import StepCostModel

# Sessions drawn to average over a random session shape (traces, TraceLab-like); synthetic shapes
# are deterministic in their tokens, so one is enough for them.
NUM_SAMPLED_SHAPES = 1000
BOUNDS_SEED = 0x5EED


@dataclass(frozen=True)
class TurnCosts:
    prompt_tokens: int
    output_tokens: int
    warm_work_s: float  # engine work of the turn when its previous turn's prefix is cached
    cold_work_s: float  # ... when only the shared system prompt is cached
    alone_s: float      # its response time on an otherwise idle engine (warm)


def turn_costs(shape: SessionShape, cost: StepCostModel) -> list[TurnCosts]:
    """Per turn of ``shape``: the step-cost model's work for it warm and cold (block rounding ignored)."""
    a, b, g, t0 = cost.a_s_per_token, cost.b_s_per_token2, cost.g_s_per_token, cost.t0_s + cost.host_s_per_step
    dd = cost.decode_token_delta_s()  # output tokens are decodes (0.0 unless the model prices them apart)
    shared = shape.shared_prefix_tokens
    out = []
    prompt = shape.initial_tokens
    for k in range(shape.num_turns):
        o = shape.output_tokens[k]
        # warm: the first turn finds the shared prompt, a later one its previous prompt and output
        new = prompt - shared if k == 0 else shape.growth_tokens[k - 1]
        decode = g * (o * prompt + o * o / 2)
        warm = a * (new + o) + b * new * (prompt - new + new / 2) + decode + dd * o
        cold_new = prompt - shared
        cold = a * (cold_new + o) + b * cold_new * (shared + cold_new / 2) + decode + dd * o
        # alone, every output token is one step (the prefill step samples the first)
        out.append(TurnCosts(prompt, o, warm, cold, o * t0 + warm))
        if k < shape.num_turns - 1:
            prompt += o + shape.growth_tokens[k]
    return out


@dataclass(frozen=True)
class MapBounds:
    pool_tokens: int
    turns_per_session: float          # T
    think_time_s: float               # Z
    mean_context_tokens: float        # L: mean prompt over turns
    mean_output_tokens: float         # o: mean output over turns
    warm_turn_work_s: float           # W
    warm_turn_alone_s: float          # R_alone
    session_cold_cost_s: float        # S
    healthy_rate_per_s: float         # lambda with lambda T (Z + R0) L = C
    warm_response_at_healthy_s: float  # R0 there
    sessions_at_healthy: float        # N there (= C / L)
    saturation_rate_per_s: float      # 1 / (T W): even warm turns outrun the engine
    drain_rate_per_s: float           # 1 / S
    # a deployment's (engine.replicas): the rates and pool above are the replicas' together,
    # each replica taking 1/replicas of the load (a router that balances perfectly)
    replicas: int = 1

    def warm_response_s(self, rate_per_s: float) -> float:
        load = rate_per_s / self.replicas * self.turns_per_session * self.warm_turn_work_s
        return math.inf if load >= 1 else self.warm_turn_alone_s / (1 - load)

    def to_json(self) -> dict:
        data = asdict(self)
        if self.replicas == 1:
            del data["replicas"]  # one engine's map.json as before deployments
        return data


def session_bounds(shapes: list[SessionShape], think_time_s: float, pool_tokens: int,
                   cost: StepCostModel) -> MapBounds:
    """The bounds for sessions like ``shapes`` (averaged over them, turn-weighted where per turn)."""
    turns = [turn_costs(s, cost) for s in shapes]
    num_turns = sum(len(t) for t in turns)
    T = num_turns / len(shapes)
    L = sum(c.prompt_tokens for t in turns for c in t) / num_turns
    o = sum(c.output_tokens for t in turns for c in t) / num_turns
    W = sum(c.warm_work_s for t in turns for c in t) / num_turns
    R_alone = sum(c.alone_s for t in turns for c in t) / num_turns
    S = sum(c.cold_work_s for t in turns for c in t) / len(shapes)
    Z = think_time_s
    M = pool_tokens / L  # the sessions the pool holds
    # x = lambda T solves x (Z + R_alone / (1 - x W)) = M, i.e. Z W x^2 - (Z + R_alone + M W) x + M = 0;
    # the smaller root is the one below saturation (x W < 1)
    B = Z + R_alone + M * W
    if Z * W > 0:
        x = (B - math.sqrt(B * B - 4 * Z * W * M)) / (2 * Z * W)
    else:
        x = M / B
    healthy = x / T
    R0 = R_alone / (1 - x * W)
    return MapBounds(
        pool_tokens=pool_tokens, turns_per_session=T, think_time_s=Z, mean_context_tokens=L, mean_output_tokens=o,
        warm_turn_work_s=W, warm_turn_alone_s=R_alone, session_cold_cost_s=S,
        healthy_rate_per_s=healthy, warm_response_at_healthy_s=R0, sessions_at_healthy=healthy * T * (Z + R0),
        saturation_rate_per_s=1 / (T * W), drain_rate_per_s=1 / S)


def spec_bounds(spec: ExperimentSpec, cost: StepCostModel) -> MapBounds:
    """The bounds of the spec's base sessions on its simulated engine."""
    if not isinstance(spec.engine, SimEngineSpec):
        raise ValueError(f"bounds need the simulated engine's pool and step costs, not engine kind {spec.engine.kind!r}")
    sessions = spec.workload.sessions
    model = shape_model(sessions)
    if isinstance(sessions, SyntheticSessionSpec):
        shapes = [model.make(np.random.default_rng(BOUNDS_SEED))]
        think_s = sessions.think_time_mean_s
    else:
        shapes = _sampled_shapes(model)
        gaps = [t for s in shapes for t in s.think_s]
        think_s = sum(gaps) / len(gaps) if gaps else 0.0
    one = session_bounds(shapes, think_s, spec.engine.pool_tokens, cost)
    n = spec.engine.replicas
    if spec.engine.replica_specs is not None:
        raise ValueError("engine.replicas: the map's bounds take identical replicas; a list of replicas that "
                         "differ is not mapped")
    if n == 1:
        return one
    return replace(one, pool_tokens=one.pool_tokens * n, healthy_rate_per_s=one.healthy_rate_per_s * n,
                               sessions_at_healthy=one.sessions_at_healthy * n,
                               saturation_rate_per_s=one.saturation_rate_per_s * n,
                               drain_rate_per_s=one.drain_rate_per_s * n, replicas=n)


def _sampled_shapes(model) -> list[SessionShape]:
    """NUM_SAMPLED_SHAPES sessions as a base stream draws them, from the bounds' own generator."""
    rng = np.random.default_rng(BOUNDS_SEED)
    if isinstance(model, TraceReplay):
        order = model.draw_order(rng)
        return [model.make(next(order), rng) for _ in range(NUM_SAMPLED_SHAPES)]
    return [model.make(rng) for _ in range(NUM_SAMPLED_SHAPES)]
