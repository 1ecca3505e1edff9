"""``loadgen sweep``: every run of a spec (seeds x arms) on a Ray cluster.

* Simulated engine: each run is a Ray task (one CPU) anywhere in the cluster; it simulates into
  a scratch directory and hands its files back, so the results are the files an in-process
  ``loadgen run`` writes, byte for byte.
* Launched engine (vllm, sglang, serve_sim): runs go a pair at a time (the arms of one seed). A
  placement group reserves one bundle of ``num_gpus`` GPUs per arm, so the arms run at the same
  time, each on its own engine, and share one run-time origin. As many pairs run at once as the
  cluster has GPUs for; the rest wait. Per run: an engine actor on its bundle, a controller actor
  beside it, the run's sessions sharded over the sweep's fleets, its rows written by the
  sweep's recorder on this node.

A failed run is marked failed in its run.json and the others go on; Ctrl-C marks every run that
has not ended ``interrupted``. Running the same sweep again
resumes it: a run whose run.json says completed, for the same spec, is skipped.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Optional

import ray
import yaml
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from loadgen.core.clock import epoch_s
from loadgen.live.http_client import EndpointOptions
from loadgen.live.runner import median_turn_latency_s
from loadgen.core.lateness import LatenessHistogram, lag_report
from loadgen.core.recording import write_json_atomic
from loadgen.core.runner import RunKey, completed_run, mark_interrupted, run_info, run_simulated, run_spec
from loadgen.core.same_spec import MixedSpecError, check_results_dir_spec
from loadgen.core.session import RetryPolicy
from loadgen.sim.cost import PRESETS
from loadgen.core.spec import ExperimentSpec, LaunchedEngineSpec, SimEngineSpec
from loadgen.core.workload import plan_sessions
from loadgen.gateway.in_run import SESSION_HEADER as GATEWAY_SESSION_HEADER

from .cluster import cluster_resources, num_alive_nodes
from .controller import ControllerActor, merge_counts
from .deployment import REPLICA_HEADER, first_exit, router_info
from .engine import EngineActor
from .fleet import LiveRunSettings, SessionFleet
from .recorder import RecorderActor

# wall seconds between sending a pair's sessions to the fleets and run time 0, so that every
# fleet and controller is ready when the first session arrives
START_LEAD_S = 1.0
# how long a pair may wait for its GPUs (others' runs, an autoscaler adding nodes) before its
# runs are marked failed
GPU_WAIT_S = 3600.0


class SweepError(ValueError):
    """A sweep that cannot run on this cluster or with this engine."""


@dataclass(frozen=True)
class RunStart:
    """A run has begun: where it runs, and (live runs) its engine actor."""

    key: RunKey
    placement: dict = field(default_factory=dict)
    engine: Any = None


RunStarted = Callable[[RunStart], None]
RunDone = Callable[[RunKey, dict], None]


def run_sweep(spec: ExperimentSpec, out_dir: Path, keys: list[RunKey], spec_dir: Optional[Path] = None,
              num_fleets: Optional[int] = None, on_run_start: Optional[RunStarted] = None,
              on_run_done: Optional[RunDone] = None) -> list[dict]:
    """Run ``keys`` on the connected Ray cluster, skipping completed ones; returns each run's run.json."""
    check_sweepable(spec)
    out_dir = Path(out_dir).resolve()
    try:  # the check `loadgen run` makes: one results directory, one spec
        check_results_dir_spec(out_dir, spec)
    except MixedSpecError as exc:
        raise SweepError(str(exc)) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    done = {key: info for key in keys if (info := completed_run(out_dir, spec, key)) is not None}
    todo = [key for key in keys if key not in done]
    ended: set[RunKey] = set()

    def run_done(key: RunKey, info: dict) -> None:
        ended.add(key)
        if on_run_done:
            on_run_done(key, info)

    try:
        if isinstance(spec.engine, SimEngineSpec):
            results = _simulate(spec, out_dir, todo, spec_dir, on_run_start, run_done)
        else:
            engine = _cost_file_resolved(spec.engine, spec_dir)
            results = asyncio.run(_LiveSweep(spec, engine, out_dir, num_fleets, on_run_start, run_done).run(todo))
    except KeyboardInterrupt:
        # Ctrl-C: every run that has not ended says so (a live run under way keeps its rows, its
        # sessions cancelled and its recorder closed on the way out); a re-run runs them again
        for key in todo:
            if key not in ended:
                mark_interrupted(spec, key, out_dir)
        raise
    results.update(done)
    return [results[key] for key in keys]


def _cost_file_resolved(engine: LaunchedEngineSpec, spec_dir: Optional[Path]) -> LaunchedEngineSpec:
    """serve_sim's cost.json, like every path in a spec, is relative to the spec's directory; the
    engine actor runs elsewhere, so it gets the absolute path."""
    cost = engine.simulator.cost_model
    if engine.kind != "serve_sim" or not isinstance(cost, str) or cost in PRESETS or spec_dir is None:
        return engine
    simulator = engine.simulator.model_copy(update={"cost_model": str((spec_dir / cost).resolve())})
    return engine.model_copy(update={"simulator": simulator})


def check_sweepable(spec: ExperimentSpec) -> None:
    if not isinstance(spec.engine, (SimEngineSpec, LaunchedEngineSpec)):
        raise SweepError(f"engine kind {spec.engine.kind!r}: a sweep launches its own engines (vllm, sglang, "
                         "serve_sim) or simulates (sim); run against a shared endpoint with `loadgen run --endpoint`")


# ---------------------------------------------------------------- simulated engine: Ray tasks
@dataclass(frozen=True)
class SimulatedRun:
    info: dict
    files: dict[str, bytes]  # path inside the run directory -> content


@ray.remote(num_cpus=1)
def simulate_run(spec: ExperimentSpec, key: RunKey, spec_dir: Optional[str]) -> SimulatedRun:
    """One simulated run on whichever node Ray picks; its files come back with the result."""
    with tempfile.TemporaryDirectory(prefix="loadgen-sim-") as scratch:
        try:
            info = run_simulated(spec, key, Path(scratch), Path(spec_dir) if spec_dir else None)
        except Exception as exc:  # run.json (status failed) and the rows so far are in the files
            info = {"run_id": key.run_id, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        run_dir = Path(scratch) / "runs" / key.run_id
        files = {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    return SimulatedRun(info, files)


def _simulate(spec: ExperimentSpec, out_dir: Path, keys: list[RunKey], spec_dir: Optional[Path],
              on_run_start: Optional[RunStarted], on_run_done: Optional[RunDone]) -> dict[RunKey, dict]:
    pending = {}
    for key in keys:
        pending[simulate_run.remote(spec, key, str(spec_dir) if spec_dir else None)] = key
        if on_run_start:
            on_run_start(RunStart(key))
    results: dict[RunKey, dict] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        key = pending.pop(ready[0])
        try:
            run = ray.get(ready[0])
        except ray.exceptions.RayError as exc:  # the task's worker or node died
            run = SimulatedRun({"run_id": key.run_id, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}, {})
        _write_run_files(out_dir / "runs" / key.run_id, run.files)
        results[key] = run.info
        if on_run_done:
            on_run_done(key, run.info)
    return results


def _write_run_files(run_dir: Path, files: dict[str, bytes]) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    for name, content in files.items():
        path = run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


# ---------------------------------------------------------------- launched engines: actors
def cpu_run_slots(arms_per_pair: int, resources: dict[str, float]) -> int:
    """Runs at once for GPU-less engines (serve_sim with num_gpus 0): one per CPU, a whole pair at least."""
    return max(int(resources.get("CPU", 0)), arms_per_pair)


def pairs_of(keys: list[RunKey]) -> list[list[RunKey]]:
    """The runs of each seed together, seeds in order: the arms of a pair run at the same time."""
    by_seed: dict[int, list[RunKey]] = {}
    for key in keys:
        by_seed.setdefault(key.seed, []).append(key)
    return list(by_seed.values())


class _RunSlots:
    """Room for runs; a pair waits until it can take a slot for each of its arms."""

    def __init__(self, total: int) -> None:
        self.free = total
        self.changed = asyncio.Condition()

    async def take(self, n: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.free >= n)
            self.free -= n

    async def give(self, n: int) -> None:
        async with self.changed:
            self.free += n
            self.changed.notify_all()


class EngineDied(RuntimeError):
    """The run's engine server exited, or its actor died, before the run ended."""


class _LiveSweep:
    def __init__(self, spec: ExperimentSpec, engine: LaunchedEngineSpec, out_dir: Path, num_fleets: Optional[int],
                 on_run_start: Optional[RunStarted], on_run_done: Optional[RunDone]) -> None:
        self.spec = spec
        self.engine = engine
        self.out_dir = out_dir
        self.num_fleets = num_fleets
        self.on_run_start = on_run_start
        self.on_run_done = on_run_done
        self.recorder = None
        self.fleets: list = []
        self.cpu_slots: Optional[_RunSlots] = None

    async def run(self, keys: list[RunKey]) -> dict[RunKey, dict]:
        if not keys:
            return {}
        pairs = pairs_of(keys)
        if not self.engine.num_gpus:
            engines_per_pair = max(len(p) for p in pairs) * self.engine.replicas
            self.cpu_slots = _RunSlots(cpu_run_slots(engines_per_pair, cluster_resources()))
        # the recorder writes under out_dir, which is on this node
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.recorder = RecorderActor.options(scheduling_strategy=here).remote()
        num_fleets = self.num_fleets or max(2, num_alive_nodes())
        self.fleets = [SessionFleet.options(scheduling_strategy="SPREAD").remote() for _ in range(num_fleets)]
        try:
            done = await _gather_all(self._pair(pair) for pair in pairs)
        finally:
            for actor in (self.recorder, *self.fleets):
                ray.kill(actor)
        return {key: info for pair in done for key, info in pair.items()}

    async def _pair(self, keys: list[RunKey]) -> dict[RunKey, dict]:
        runs: list[_LiveRun] = []
        try:
            async with self._room_for(len(keys)) as group:
                runs = [_LiveRun(self, key, group, i) for i, key in enumerate(keys)]
                try:
                    await _gather_all(run.prepare() for run in runs)
                    # one origin for the pair: both arms see the same run time at the same moment
                    origin = epoch_s() + START_LEAD_S
                    await _gather_all(run.execute(origin) for run in runs if run.prepared)
                finally:
                    await _gather_all(run.release() for run in runs)
        except asyncio.TimeoutError:
            runs = [_LiveRun(self, key, None, i) for i, key in enumerate(keys)]
            for run in runs:
                run.unplaced(len(keys))
        for run in runs:
            if self.on_run_done:
                self.on_run_done(run.key, run.info)
        return {run.key: run.info for run in runs}

    @asynccontextmanager
    async def _room_for(self, num_runs: int) -> AsyncIterator[Optional[PlacementGroup]]:
        """A placement group with a GPU bundle per engine (``replicas`` per run); Ray queues the pairs
        the cluster has no room for yet (and an autoscaling cluster adds GPU nodes for them)."""
        num_engines = num_runs * self.engine.replicas
        if self.cpu_slots is not None:
            await self.cpu_slots.take(num_engines)
            try:
                yield None
            finally:
                await self.cpu_slots.give(num_engines)
            return
        group = placement_group([{"GPU": self.engine.num_gpus, "CPU": 0}] * num_engines, strategy="PACK")
        try:
            await asyncio.wait_for(group.ready(), GPU_WAIT_S)
            yield group
        finally:
            remove_placement_group(group)


class _LiveRun:
    """One run of a pair: its engine actors (``engine.replicas``, one per bundle) and controller actor,
    its shard of sessions per fleet."""

    def __init__(self, sweep: _LiveSweep, key: RunKey, group: Optional[PlacementGroup], index: int) -> None:
        self.sweep = sweep
        self.key = key
        spec = sweep.spec
        self.arm = spec.arm(key.arm)
        self.run_dir = sweep.out_dir / "runs" / key.run_id
        self.num_replicas = sweep.engine.replicas
        # run i of the pair has bundles i*N .. i*N+N-1, one per replica
        self.bundles = [index * self.num_replicas + r for r in range(self.num_replicas)]
        self.strategies = [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=b)
                           if group is not None else "DEFAULT" for b in self.bundles]
        self.strategy = self.strategies[0]  # the controller (and its proxy) beside the first engine
        self.info: dict = run_info(
            spec, key, spec.engine.kind, None, status="starting", endpoint=None, time_scale=spec.time_scale,
            placement={"placement_group": group.id.hex() if group is not None else None,
                       "bundle_index": self.bundles[0] if group is not None else None})
        if self.num_replicas > 1:
            self.info.update(replicas=self.num_replicas, **router_info(sweep.engine))
        self.engine_actors: list = []
        self.engine_actor = None
        self.controller_actor = None
        self.endpoint: Optional[EndpointOptions] = None
        self.prepared = False

    def _start_record(self) -> None:
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True)
        self._write()

    def unplaced(self, num_runs: int) -> None:
        self._start_record()
        gpus = cluster_resources().get("GPU", 0)
        self._fail(TimeoutError(f"no room for this pair's {num_runs * self.num_replicas} engines x "
                                f"{self.sweep.engine.num_gpus} GPUs "
                                f"after {GPU_WAIT_S:g} s (the cluster has {gpus:g} GPUs)"))

    async def prepare(self) -> None:
        """Start the engine on its bundle and preflight it; a failure fails this run only."""
        self._start_record()
        spec, engine = self.sweep.spec, self.sweep.engine
        try:
            self.engine_actors = [
                EngineActor.options(num_gpus=engine.num_gpus, scheduling_strategy=strategy).remote(
                    engine, spec.time_scale, self.key.run_id) for strategy in self.strategies]
            self.engine_actor = self.engine_actors[0]
            every_served = await _gather_all(actor.start.remote() for actor in self.engine_actors)
            served = every_served[0]
            placed = ("node_id", "node_ip", "gpu_ids", "visible_devices", "pid")
            self.info["placement"].update({k: served[k] for k in placed})
            self.info.update(endpoint=served["url"], server_command=served["command"])
            urls = [s["url"] for s in every_served]
            if self.num_replicas > 1:  # where each replica serves (its own bundle, GPU and server)
                self.info["placement"]["replicas"] = [
                    {"url": s["url"], "bundle_index": b if self.info["placement"]["bundle_index"] is not None
                     else None, **{k: s[k] for k in placed}} for s, b in zip(every_served, self.bundles)]
            self.endpoint = EndpointOptions(url=served["url"], model=served["model"],
                                            request_timeout_s=engine.request_timeout_s,
                                            api=engine.api, tokenizer=engine.tokenizer,
                                            server="sglang" if engine.kind == "sglang" else "vllm")
            self.controller_actor = ControllerActor.options(scheduling_strategy=self.strategy).remote(
                spec, self.key.arm, self.key.run_id, self.endpoint, urls if self.num_replicas > 1 else None)
            pool_tokens = sum(s["pool_tokens"] for s in every_served)
            preflight = await self.controller_actor.preflight.remote(pool_tokens, engine.flush_before_run)
            self.info.update(preflight=preflight, pool_tokens=preflight["pool_tokens"])
            if engine.gateway is not None or self.num_replicas > 1:
                # the fleets' turns go through a proxy beside the (first) engine: it enforces the
                # limit (engine.gateway) and routes between the replicas, naming each response's replica
                replica_header = REPLICA_HEADER if self.num_replicas > 1 else None
                knobs = engine.router.knobs if engine.router is not None and self.info.get("router_note") is None else {}
                url = await self.controller_actor.start_proxy.remote(
                    urls, preflight["pool_tokens"], self.info.get("router", "sticky-hash"), replica_header, knobs)
                self.endpoint = replace(self.endpoint, url=url, session_header=GATEWAY_SESSION_HEADER,
                                        replica_header=replica_header)
            self.prepared = True
        except Exception as exc:  # recorded in run.json; the sweep goes on
            self._fail(exc)

    async def execute(self, origin_epoch_s: float) -> None:
        sweep, spec, key = self.sweep, self.sweep.spec, self.key
        recording = False
        lateness: Optional[dict] = None
        exited: Optional[asyncio.Future] = None
        ran: Optional[asyncio.Future] = None
        try:
            await sweep.recorder.open.remote(str(self.run_dir), key.run_id, key.arm, key.seed,
                                             spec.recording.flush_interval_s, self.num_replicas > 1)
            recording = True
            await self.controller_actor.begin.remote(origin_epoch_s)
            retry = sweep.engine.retry
            settings = LiveRunSettings(key.run_id, self.endpoint, self.info["preflight"]["prompt_mode"],
                                       RetryPolicy(retry.max_attempts, retry.backoff_s), spec.time_scale,
                                       origin_epoch_s, spec.duration_s)
            plans = plan_sessions(spec, self.arm, key.seed)
            fleets = sweep.fleets
            exited = asyncio.ensure_future(first_exit([actor.wait_exit.remote() for actor in self.engine_actors]))
            ran = asyncio.ensure_future(asyncio.gather(
                self.controller_actor.run.remote(fleets, sweep.recorder),
                *(fleet.run.remote(settings, plans[i::len(fleets)], self.controller_actor, sweep.recorder)
                  for i, fleet in enumerate(fleets))))
            self.info.update(status="running", origin_epoch_s=origin_epoch_s, num_fleets=len(fleets))
            self._write()
            if sweep.on_run_start:
                sweep.on_run_start(RunStart(key, dict(self.info["placement"]), self.engine_actor))
            await asyncio.wait([ran, exited], return_when=asyncio.FIRST_COMPLETED)
            if not ran.done() or ran.exception() is not None:
                await self._stop_sessions(ran)
                raise (await self._engine_death(exited) if exited.done() else ran.exception())
            flushes, *fleet_counts = ran.result()
            if sweep.engine.gateway is not None:
                self.info["gateway"] = await self.controller_actor.gateway_info.remote()
            counts = merge_counts(fleet_counts)
            lateness = counts.lateness
            crashed = counts.sessions.crashed_total
            # as a live run (loadgen.live.runner): the run reached its end, but the load it offered
            # was not the spec's if a session crashed
            self.info.update(
                status="completed_with_errors" if crashed else "completed",
                error=f"{crashed} session(s) crashed (sessions.parquet status 'error' has the exception)"
                if crashed else None,
                counts={"sessions_arrived": counts.sessions.arrived_total,
                        "sessions_completed": counts.sessions.completed_total,
                        "sessions_crashed": crashed,
                        "turns_completed": counts.turns_completed, **flushes})
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.run cancels the sweep): stop the sessions, so that the fleets ship
            # their last rows before the recorder closes; run_sweep then marks the run interrupted
            if ran is not None:
                await self._stop_sessions(ran)
                _settle(ran)
            raise
        except Exception as exc:  # recorded in run.json; the sweep goes on
            self._fail(exc)
        finally:
            if exited is not None:
                _settle(exited)
            if recording:
                await sweep.recorder.close.remote(key.run_id)
            if lateness is not None:  # as a live run: a flag beside the status when the fleets' clocks slipped
                self.info["lagging"], self.info["lag"] = lag_report(
                    LatenessHistogram.from_json(lateness), None, median_turn_latency_s(self.run_dir / "turns.parquet"))
            self._write()

    async def _engine_death(self, exited: asyncio.Future) -> EngineDied:
        try:
            replica, code = exited.result()
        except ray.exceptions.RayError as exc:
            return EngineDied(f"the engine actor died: {type(exc).__name__}")
        tail = await self.engine_actors[replica].server_log_tail.remote()
        which = f" of replica {replica}" if self.num_replicas > 1 else ""
        return EngineDied(f"the engine server{which} exited with code {code} before the run ended; log tail:\n{tail}")

    async def _stop_sessions(self, ran: asyncio.Future) -> None:
        for fleet in self.sweep.fleets:
            fleet.stop.remote(self.key.run_id)
        self.controller_actor.stop.remote()
        await asyncio.wait([ran])

    async def release(self) -> None:
        for actor in self.engine_actors:
            try:
                await actor.stop.remote()
            except ray.exceptions.RayError:
                pass  # the actor is already gone, and its server with it
            ray.kill(actor)
        if self.controller_actor is not None:
            ray.kill(self.controller_actor)

    def _fail(self, exc: BaseException) -> None:
        self.info.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        self._write()

    def _write(self) -> None:
        write_json_atomic(self.run_dir / "run.json", self.info)


async def _gather_all(awaitables: Iterable[Awaitable]) -> list:
    """Run every awaitable to its end, then raise the first failure, if any.

    ``asyncio.gather`` returns at the first child that fails or is cancelled and leaves the others
    running: on Ctrl-C (asyncio.run cancels the sweep) the sweep would then kill the recorder, the
    fleets and the engines under runs still stopping their sessions and closing their files."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _settle(watch: asyncio.Future) -> None:
    """Stop watching: cancel a pending watch, or take the error of one that ended (so that asyncio
    does not report it as never retrieved)."""
    if not watch.done():
        watch.cancel()
    elif not watch.cancelled():
        watch.exception()
