"""One simulated run (one arm x one seed) in virtual time, and the run.json header every runner writes."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

import pyarrow as pa

from controllers import make_policy
from routers import make_router

from ..sim import EngineConfig
from ..sim.cost import StepCostModel
from ..sim.jitter import StepJitter
from ..sim.sglang_engine import SGLangConfig
from ..version import __version__
from .clock import VirtualClock
from .deployment import DeploymentClient
from .engines import SimEngineClient
from .gateway import Gateway
from .recording import RunRecorder, merge_parts, write_json_atomic
from .gap_histogram import GapHistogram
from .replay import attach_replay_placers
from .program_gate import ProgramGate, UsageTap
from .replica_gates import ReplicaGates
from .session import RunEnv, run_session
from .tree_engines import has_trees, start_trees
from .spec import ExperimentSpec, FlushTrigger, SimEngineSpec
from .spec.engines import prefix_cache_block_size
from .workload import Stream, plan_sessions, rng_for


@dataclass(frozen=True)
class RunKey:
    arm: str
    seed: int

    @property
    def run_id(self) -> str:
        return f"{self.arm}-s{self.seed}"


def run_keys(spec: ExperimentSpec, seeds: Optional[Iterable[int]] = None,
             arms: Optional[Iterable[str]] = None) -> list[RunKey]:
    """Seeds x arms, seed-major so that both arms of a pair finish close together. The spec's seeds
    are the default: seeds asked for run as asked, each run recording its own seed."""
    seeds = list(spec.seeds if seeds is None else seeds)
    spec_arms = [a.name for a in spec.arms]
    arm_names = spec_arms if arms is None else list(arms)
    unknown = [name for name in arm_names if name not in spec_arms]
    if unknown:
        raise ValueError(f"no arm {', '.join(map(repr, unknown))}; the spec's arms: {', '.join(spec_arms)}")
    return [RunKey(a, s) for s in seeds for a in arm_names]


def engine_config(engine: SimEngineSpec) -> Union[EngineConfig, SGLangConfig]:
    """The simulated engine's configuration: vLLM's EngineConfig, or SGLangConfig for flavor sglang."""
    if engine.flavor == "sglang":
        opts = engine.sglang
        return SGLangConfig(
            pool_tokens=engine.pool_tokens, page_size=opts.page_size, chunked_prefill_size=engine.max_num_batched_tokens,
            max_prefill_tokens=opts.max_prefill_tokens, max_running_requests=engine.max_num_seqs,
            max_model_len=engine.max_model_len, schedule_policy=opts.schedule_policy,
            init_new_token_ratio=opts.init_new_token_ratio, min_new_token_ratio_factor=opts.min_new_token_ratio_factor,
            new_token_ratio_decay_steps=opts.new_token_ratio_decay_steps,
            retract_decode_steps=opts.retract_decode_steps, enable_prefix_caching=engine.enable_prefix_caching,
            overlap_schedule=opts.overlap_schedule)
    return EngineConfig(
        num_blocks=engine.pool_tokens // engine.block_size, block_size=engine.block_size,
        max_num_batched_tokens=engine.max_num_batched_tokens, max_num_seqs=engine.max_num_seqs,
        max_model_len=engine.max_model_len, enable_prefix_caching=engine.enable_prefix_caching,
        reserve_full_prompt=engine.reserve_full_prompt, offload=engine.offload_config())


def run_simulated(spec: ExperimentSpec, key: RunKey, out_dir: Path, spec_dir: Optional[Path] = None,
                  replicate: int = 0) -> dict:
    """Simulate one run in virtual time; writes its directory and returns its run.json."""
    spec.arm(key.arm)  # an unknown arm fails before anything is written
    run_dir = Path(out_dir) / "runs" / key.run_id
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    engine_spec = spec.engine_for(spec.arm(key.arm))
    pool_tokens, deployment = sim_pool_and_deployment(engine_spec)
    info = run_info(spec, key, engine_spec.kind, pool_tokens, **deployment)
    if replicate:
        info["replicate"] = replicate
    write_json_atomic(run_dir / "run.json", info)
    recorder = RunRecorder(run_dir, key.run_id, key.arm, key.seed, spec.recording.flush_interval_s,
                           replica_columns=engine_spec.replicas > 1, tree_columns=has_trees(spec))
    try:
        counts = simulate(spec, key, recorder, spec_dir, replicate)
        recorder.close()
    except BaseException as exc:
        recorder.stop()
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C is not the run's failure: running again redoes it
            info.update(status="interrupted", error=INTERRUPTED)
        else:
            info.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        write_json_atomic(run_dir / "run.json", info)
        raise
    info.update(status="completed", counts=counts)
    write_json_atomic(run_dir / "run.json", info)
    return info


def simulate(spec: ExperimentSpec, key: RunKey, recorder: RunRecorder, spec_dir: Optional[Path] = None,
             replicate: int = 0) -> dict:
    """Run one arm x seed in virtual time into ``recorder`` (not closed); returns run.json's counts.
    ``replicate``: which draw of the cost model's step jitter (none without jitter)."""
    arm = spec.arm(key.arm)
    ctl = spec.controller_for(arm)
    engine_spec = spec.engine_for(arm)
    clock = VirtualClock()
    cost = engine_spec.load_cost_model(spec_dir)
    engine = make_engine(clock, engine_spec, key, cost)
    sigma = cost.step_jitter_sigma
    if sigma > 0:  # each replica's steps draw from a stream of their own
        for i, replica in enumerate(getattr(engine, "replicas", [engine])):
            replica.engine.jitter = StepJitter(sigma, rng_for(Stream.STEP_JITTER, key.seed, key.arm, replicate, i))
    plans = plan_sessions(spec, arm, key.seed)
    policy = make_policy(ctl.name, **ctl.params)
    if getattr(policy, "needs_program_table", False):  # thunderagent: a program table, a periodic schedule
        replicas = getattr(engine, "replicas", [engine])
        gateway = ProgramGate(clock, policy, [r.pool_tokens for r in replicas], ctl.start_s)
        engine = UsageTap(engine, gateway)
    elif ctl.scope == "replica":  # a gate per replica, asked after routing
        gateway = ReplicaGates(clock, engine, [make_policy(ctl.name, **ctl.params) for _ in engine.replicas],
                               ctl.start_s, plans)
    else:
        gateway = Gateway(clock, policy, engine.pool_tokens, ctl.start_s)
    env = RunEnv(clock, engine, gateway, recorder)
    replay = spec.workload.replay
    if replay is not None:  # recorded prompts onto the engines by their content, every token gap kept
        attach_replay_placers(engine, replay.client_timeout_s)
    if any(plan.tree is not None for plan in plans):
        env.trees = start_trees(env, plans, lambda plan: _start_session(clock, plan, env), ctl.tree_policy)

    calls = [(plan.arrival_s, _start_session, (clock, plan, env)) for plan in plans]
    calls += [(trig.at_s, engine.flush, ()) for trig in arm.triggers if isinstance(trig, FlushTrigger)]
    interval = spec.recording.sample_interval_s
    num_samples = int(math.floor(spec.duration_s / interval + 1e-9))
    calls += [(i * interval, _sample, (env,)) for i in range(num_samples + 1)]
    clock.call_series(calls)
    clock.run(until_s=spec.duration_s)
    counts = env.counts
    extra = {}
    if replay is not None:
        if replay.until_done:  # on, sampling as before, until the last request is answered
            t = num_samples * interval
            while counts.completed_total + counts.crashed_total < len(plans):
                t += interval
                clock.call_at(t, _sample, env)
                clock.run(until_s=t)
        gaps = GapHistogram()
        for replica in getattr(engine, "replicas", [engine]):
            gaps.merge(replica.engine.gaps)  # set with the replay's placer (replay.py)
        extra = {"sessions_planned": len(plans), "ended_s": counts.last_ended_s, "inter_token_gaps": gaps.to_json()}
    return {
        "sessions_arrived": counts.arrived_total, "sessions_completed": counts.completed_total,
        "turns_completed": recorder.turns_completed,
        "engine_steps": engine.num_steps, "engine_preemptions": engine.num_preemptions,
        "flush_times_s": engine.flush_times_s, **extra}


def make_engine(clock: VirtualClock, engine_spec: SimEngineSpec, key: RunKey, cost: StepCostModel):
    """The simulated engine of a run: one engine, or ``replicas`` of them behind the spec's router
    (whose seed is the run's: the same spec and seed route the same way)."""
    if engine_spec.replicas == 1:
        return SimEngineClient(clock, engine_config(engine_spec.replica_engines()[0]), cost)
    router_spec = engine_spec.router
    seed = int(rng_for(Stream.ROUTER, key.seed, key.arm).integers(2**63))
    return DeploymentClient([SimEngineClient(clock, engine_config(replica), cost)
                             for replica in engine_spec.replica_engines()],
                            make_router(router_spec.policy, **router_spec.knobs), seed,
                            prefix_cache_block_size(engine_spec))


INTERRUPTED = "interrupted (Ctrl-C) before the run ended; running the same command again runs it again"
_UNDER_WAY = ("starting", "running", "interrupted")


def mark_interrupted(spec: ExperimentSpec, key: RunKey, out_dir: Path) -> dict:
    """Record that Ctrl-C stopped the run ``key`` before it ended: its run.json says ``interrupted``.

    A run under way keeps its header and the rows it wrote; a run that had not begun (or whose
    directory holds an earlier attempt) gets a fresh directory with the header alone; a run that
    completed with this spec is left as it is. Returns the run.json."""
    run_dir = Path(out_dir) / "runs" / key.run_id
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        info = None
    same_spec = isinstance(info, dict) and info.get("spec") == run_spec(spec, key)
    if same_spec and info.get("status") == "completed":
        return info
    if not same_spec or info.get("status") not in _UNDER_WAY:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        engine = spec.engine_for(spec.arm(key.arm))
        if isinstance(engine, SimEngineSpec):
            pool_tokens, deployment = sim_pool_and_deployment(engine)
            info = run_info(spec, key, engine.kind, pool_tokens, **deployment)
        else:
            info = run_info(spec, key, engine.kind, getattr(engine, "pool_tokens", None))
    info.update(status="interrupted", error=INTERRUPTED)
    write_json_atomic(run_dir / "run.json", info)
    return info


def sim_pool_and_deployment(engine: SimEngineSpec) -> tuple:
    """(C, run.json fields) of a simulated engine: a deployment's C is its replicas' pools together,
    and its run.json names the replicas and router (one engine's run.json is as before)."""
    if engine.replicas == 1:
        return engine.replica_engines()[0].pool_tokens, {}
    return sum(r.pool_tokens for r in engine.replica_engines()), {"replicas": engine.replicas,
                                                                   "router": engine.router.policy}


def run_spec(spec: ExperimentSpec, key: RunKey) -> dict:
    """The spec as a run records it (run.json "spec"): the experiment's, with only this seed."""
    return {**spec.model_dump(mode="json"), "seeds": [key.seed]}


def run_info(spec: ExperimentSpec, key: RunKey, engine: str, pool_tokens: Optional[int],
             status: str = "running", **extra) -> dict:
    """The run.json every run starts with, whatever runs it (docs/results-format.md)."""
    arm = spec.arm(key.arm)
    ctl = spec.controller_for(arm)
    return {
        "run_id": key.run_id, "experiment": spec.experiment, "arm": key.arm, "seed": key.seed,
        "status": status, "error": None, "duration_s": spec.duration_s,
        "pool_tokens": pool_tokens, "engine": engine,
        "engine_flavor": getattr(spec.engine_for(arm), "flavor", None),
        "offload_cpu_tokens": _offload_cpu_tokens(spec.engine_for(arm)),
        "prefix_cache_block_size": prefix_cache_block_size(spec.engine_for(arm)), **extra,
        "controller": ctl.name, "control_start_s": ctl.start_s,
        "triggers": [{"kind": t.kind, "start_s": t.window()[0], "end_s": t.window()[1]} for t in arm.triggers],
        "reference_trigger_end_s": spec.reference_trigger_end_s(),
        "loadgen_version": __version__,
        "spec": run_spec(spec, key),
    }


def _offload_cpu_tokens(engine) -> Optional[int]:
    """The simulated engine's host tier in tokens (whole blocks), None without one or for live engines."""
    offload = getattr(engine, "offload", None)
    if offload is None and getattr(engine, "simulator", None) is not None and getattr(engine, "kind", "") == "serve_sim":
        offload = engine.simulator.offload
        engine = engine.simulator
    if offload is None:
        return None
    return offload.cpu_tokens // engine.block_size * engine.block_size


def _start_session(clock: VirtualClock, plan, env: RunEnv) -> None:
    clock.spawn(run_session(plan, env))


def _sample(env: RunEnv) -> None:
    now = env.clock.now()
    env.recorder.sample(sample_row(env, env.engine.metrics(), now))
    for row in getattr(env.engine, "replica_rows", lambda _: ())(now):
        env.recorder.replica_sample(row)
    env.recorder.maybe_flush(now)


def sample_row(env: RunEnv, m, now: float) -> dict:
    """One samples.parquet row from the session counts, the gateway and engine metrics ``m``."""
    c = env.counts
    pool = env.engine.pool_tokens
    return {
        "t_s": now, "sessions_in_system": c.in_system, "sessions_thinking": c.thinking,
        "sessions_gateway_waiting": c.gateway_waiting, "sessions_parked": c.parked,
        "sessions_in_engine": c.in_engine, "num_running": m.num_running, "num_waiting": m.num_waiting,
        "kv_usage": m.kv_usage, "resident_demand_tokens": c.demand_tokens,
        "resident_demand_ratio": c.demand_tokens / pool, "pool_tokens": pool,
        "prefix_cache_queries_total": m.prefix_cache_queries_total,
        "prefix_cache_hits_total": m.prefix_cache_hits_total,
        "num_preemptions_total": m.num_preemptions_total,
        "turns_completed_total": env.recorder.turns_completed,
        "sessions_arrived_total": c.arrived_total, "sessions_completed_total": c.completed_total,
        "gateway_limit": env.gateway.limit(), "sessions_admitted": env.gateway.num_admitted,
    }


def recover_runs(out_dir: Path) -> list[str]:
    """Merge the parts of runs that died mid-way, so their rows can be read; returns run ids.

    A run whose parts cannot be merged (a corrupt part file) keeps them and is skipped: the
    summary lists it as unreadable (loadgen.analysis.summary), the other runs are recovered.
    """
    recovered = []
    for run_dir in sorted((Path(out_dir) / "runs").glob("*")):
        try:
            merged = merge_parts(run_dir)
        except (OSError, ValueError, pa.ArrowException):
            continue
        if merged:
            recovered.append(run_dir.name)
    return recovered


def completed_run(out_dir: Path, spec: ExperimentSpec, key: RunKey) -> Optional[dict]:
    """run.json of a run already completed with this spec (a changed spec runs again), else None.

    What `loadgen run --resume` and `loadgen sweep` skip."""
    try:
        info = json.loads((Path(out_dir) / "runs" / key.run_id / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(info, dict) and info.get("status") == "completed" and info.get("spec") == run_spec(spec, key):
        return info
    return None
