"""Runs against a real endpoint in wall-clock time: the same sessions, gateway and recording.

Only the two seams change: a ``WallClock`` (optionally time-scaled) and an
``OpenAIEngineClient``. Before any load the endpoint is preflighted; during the run the
server's /metrics is scraped into samples.parquet; failed turns are recorded and retried per
the spec; a run whose engine stops answering ends with status ``engine_lost``. A run whose timers
(or serve-sim's step completions) ran too late against the scaled clock is marked ``lagging``
(loadgen/core/lateness.py).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from controllers import make_policy

from ..core.clock import WallClock
from ..core.gateway import Gateway
from ..core.lateness import lag_report
from .progress import LiveProgress, LiveSnapshot
from .http_client import EndpointOptions, OpenAIEngineClient, PreflightError, api_key_from_env
from .transport import Transport
from .replicas import ReplicaSetClient, make_client
from ..core.recording import RunRecorder, warm_up as warm_up_recording, write_json_atomic
from ..core.runner import run_info, sample_row
from ..core.session import RetryPolicy, RunEnv, run_session_recording_crashes
from ..core.spec import ControllerSpec, ExperimentSpec, FlushTrigger, OpenAIEngineSpec
from ..core.tree_engines import has_trees
from ..core.tree_runtime import TreeRuntime
from ..core.workload import plan_sessions


def endpoint_options(engine: OpenAIEngineSpec, run_id: str = "loadgen") -> EndpointOptions:
    return EndpointOptions(url=engine.url, model=engine.model, api_key=api_key_from_env(engine.api_key_env),
                           prompt_mode=engine.prompt_mode, request_timeout_s=engine.request_timeout_s,
                           server=engine.server, api=engine.api, tokenizer=engine.tokenizer,
                           session_header=engine.session_header, session_label=run_id,
                           replica_header=getattr(engine, "replica_header", None),
                           simulated_pool_tokens=getattr(engine, "simulated_pool_tokens", None))


def max_context_tokens(spec: ExperimentSpec) -> int:
    shapes = [spec.workload.sessions] + [t.sessions for a in spec.arms for t in a.triggers if t.kind == "mix_shift"]
    return max(s.max_context_tokens() for s in shapes)


async def flush_before_run(client: OpenAIEngineClient) -> None:
    """Reset the server's prefix cache before a run, or stop the run with what to change.

    A server that keeps earlier runs' blocks gives this run hits a fresh engine would not (its
    shared system prompt above all), so a failed reset is an error, not a note."""
    try:
        await client.flush_async()
    except PreflightError as exc:
        raise PreflightError(
            f"the prefix-cache reset every run starts with failed ({exc}); start vLLM with "
            "VLLM_SERVER_DEV_MODE=1 in its environment (SGLang serves /flush_cache), or set "
            "engine.flush_before_run: false to run on whatever the server has cached") from None
    client.flush_times_s.clear()


# how far ahead of its arrival (wall seconds) a session's text context is built
CONTEXT_LEAD_S = 1.0
# a build that waits for an arrival resumes this long (wall seconds) after that arrival is due
ARRIVAL_SETTLE_S = 1e-4


async def build_context(plan, client, ready_contexts: dict) -> None:
    """Start building a session's text context (chat messages or text of exact token lengths, a
    tokenizer's work, a millisecond or more): a future of it in ``ready_contexts``, which its
    session awaits when it arrives. A build that fails fails that session, as it would have."""
    ready = ready_contexts[plan.session_id] = asyncio.get_running_loop().create_future()
    try:
        context = client.session_context(plan.shape, plan.token_key, plan.session_id)
        await context.start()
    except Exception as exc:
        ready.set_exception(exc)
    else:
        ready.set_result(context)


async def build_contexts_ahead(plans, client, env: RunEnv, lead_s: float, prebuilt: frozenset = frozenset()) -> None:
    """Build each session's text context ``lead_s`` of run time before it arrives, one at a time,
    so that an arrival finds it ready and is sent on time. A build holds the event loop while it
    runs, so one is not started when an arrival is due sooner than two builds take: it waits
    until that arrival has been sent (unless its own session is due within half the lead). The
    contents do not depend on when they are built. ``prebuilt``: the sessions whose contexts were
    built before the run started."""
    clock = env.clock
    plans = sorted(plans, key=lambda p: p.arrival_s)
    arrivals = [p.arrival_s for p in plans]
    settle_s = ARRIVAL_SETTLE_S * clock.time_scale
    build_s = 0.0  # how long a build takes, in run time (a moving average)
    for plan in plans:
        if plan.session_id in prebuilt:
            continue
        await clock.sleep(plan.arrival_s - lead_s - clock.now(), record=False)
        while True:
            now = clock.now()
            nxt = bisect.bisect_right(arrivals, now)
            if nxt == len(arrivals) or arrivals[nxt] - now > 2 * build_s or plan.arrival_s - now < lead_s / 2:
                break
            await clock.sleep(arrivals[nxt] - now + settle_s, record=False)
        started_s = clock.now()
        await build_context(plan, client, env.ready_contexts)
        took_s = clock.now() - started_s
        build_s = took_s if build_s == 0.0 else 0.8 * build_s + 0.2 * took_s
        await asyncio.sleep(0)  # what is due (arrivals, turns) runs between two builds


def run_live(spec: ExperimentSpec, key, out_dir: Path, transport: Optional[Transport] = None,
             on_progress: Optional[Callable[[LiveSnapshot], None]] = None) -> dict:
    """One run (arm x seed) against ``spec.engine`` (an OpenAIEngineSpec); returns its run.json.

    ``on_progress`` gets a LiveSnapshot at every sample (run time, turns/s, hit ratio, sessions)."""
    with fewer_gc_pauses():
        return _event_loop_runner()(_run_live(spec, key, Path(out_dir), transport, on_progress))


@contextlib.contextmanager
def fewer_gc_pauses():
    """Rarer cyclic-GC passes while a live run drives its endpoint, the earlier settings after.

    A chat run keeps every session's message list and prompt encoding alive, and Python's default
    collector (a pass every 700 net allocations, older generations every 10th and 100th) walked
    that heap over and over: ~17% of the driver's CPU per chat turn in benchmarks/bench_driver.py.
    What exists before the run is frozen out of the collector's sight; a pass every 50,000
    allocations still collects the run's cyclic garbage (asyncio's futures and exceptions)."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def preflight_endpoint(spec: ExperimentSpec) -> dict:
    """The preflight alone, once before an experiment's runs: PreflightError (what to fix) when the
    endpoint cannot run this spec, so a dead or misconfigured server stops the experiment once
    instead of failing every run."""

    async def check() -> dict:
        client = make_client(WallClock(spec.time_scale), endpoint_options(spec.engine), spec.engine.metrics_urls)
        try:
            return await client.preflight(max_context_tokens(spec), spec.engine.pool_tokens)
        finally:
            await client.close()

    return _event_loop_runner()(check())


def _event_loop_runner():
    """uvloop where installed (measured: lower driver CPU per turn and arrival lateness), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


async def _run_live(spec: ExperimentSpec, key, out_dir: Path, transport: Optional[Transport],
                    on_progress: Optional[Callable[[LiveSnapshot], None]] = None) -> dict:
    engine_spec: OpenAIEngineSpec = spec.engine
    arm = spec.arm(key.arm)
    ctl = spec.controller_for(arm)
    run_dir = out_dir / "runs" / key.run_id
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    info = run_info(spec, key, "openai", engine_spec.pool_tokens, endpoint=engine_spec.url,
                    time_scale=spec.time_scale)
    write_json_atomic(run_dir / "run.json", info)
    client = proxy = None
    try:  # everything before the first turn: a failure here ends the run "failed", never "running"
        options = endpoint_options(engine_spec, key.run_id)
        if spec.workload.replay is not None and spec.workload.replay.client_timeout_s:
            options.request_timeout_s = spec.workload.replay.client_timeout_s
        replica_urls = engine_spec.metrics_urls
        if engine_spec.gateway is not None:  # the limit is the proxy's (loadgen/gateway/in_run.py)
            from ..gateway.in_run import SESSION_HEADER, proxy_sample, start_run_gateway

            proxy = await start_run_gateway(engine_spec.gateway, engine_spec.url, ctl, spec.time_scale,
                                            engine_spec.request_timeout_s,
                                            engine_spec.pool_tokens or engine_spec.simulated_pool_tokens,
                                            engine_spec.session_header, pool_urls=engine_spec.metrics_urls)
            options.url = f"http://127.0.0.1:{proxy.port}"
            options.session_header = options.session_header or SESSION_HEADER
            replica_urls = replica_urls or [engine_spec.url]
            ctl = ControllerSpec()
        client = make_client(WallClock(spec.time_scale), options, replica_urls, transport)
        plans = plan_sessions(spec, arm, key.seed)  # a trace that cannot be read fails before any load
        info["preflight"] = await client.preflight(max_context_tokens(spec), engine_spec.pool_tokens)
        info["pool_tokens"] = client.pool_tokens
        # which engine answered, as the preflight saw it (its /metrics names, or the spec's engine.server)
        info["prefix_cache_block_size"] = info["preflight"]["block_size"]
        server = info["preflight"]["server"]
        info["engine_flavor"] = server if server in ("vllm", "sglang") else "unknown"
        if engine_spec.flush_before_run:
            await flush_before_run(client)
        info["flushed_before_run"] = engine_spec.flush_before_run
        server_lateness_before = await client.server_lateness()  # serve-sim's, since it started
        text_prompts = getattr(client, "prompts", None) is not None
        lead_s = CONTEXT_LEAD_S * spec.time_scale
        ready_contexts: dict = {}
        if text_prompts:  # the first second's arrivals find theirs built before the clock starts
            for plan in plans:
                if plan.arrival_s < lead_s:
                    await build_context(plan, client, ready_contexts)
        warm_up_recording()
        # the endpoint is a loadgen gateway (not the run's own proxy): its gate starts with the run
        info["endpoint_gateway_started"] = proxy is None and await client.start_run_at_gateway()
    except Exception as exc:
        info.update(status="failed", error=f"preflight: {exc}" if isinstance(exc, PreflightError)
                    else f"setup: {type(exc).__name__}: {exc}")
        write_json_atomic(run_dir / "run.json", info)
        if client is not None:
            await client.close()
        if proxy is not None:
            await proxy.close()
        raise

    clock = WallClock(spec.time_scale)  # run time 0 is now, after the preflight
    client.clock = clock
    if proxy is not None:
        # the proxy's gate starts with the run, on a clock of the run's scale that reads time finely
        # (proxy_clock): its holds are measured, not rounded to the loop's millisecond
        from ..gateway.proxy import proxy_clock

        proxy.reset(proxy_clock(spec.time_scale))
    gateway = Gateway(clock, make_policy(ctl.name, **ctl.params), client.pool_tokens, ctl.start_s)
    # a live run is not re-runnable in a second: write its rows at least every real minute
    flush_interval_s = min(spec.recording.flush_interval_s, 60.0 * spec.time_scale)
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loadgen-parquet")
    recorder = RunRecorder(run_dir, key.run_id, key.arm, key.seed, flush_interval_s, writer,
                           replica_columns=bool(getattr(engine_spec, "replica_header", None)),
                           tree_columns=has_trees(spec))
    retry = RetryPolicy(engine_spec.retry.max_attempts, engine_spec.retry.backoff_s)
    env = RunEnv(clock, client, gateway, recorder, retry=retry, ready_contexts=ready_contexts)
    if spec.workload.replay is not None:  # every streamed gap, for ITL percentiles
        from ..core.gap_histogram import GapHistogram

        env.gaps = GapHistogram()
    tasks: set[asyncio.Task] = set()
    stop = asyncio.Event()
    flush_errors: list[str] = []

    def start(plan) -> None:
        task = clock.spawn(run_session_recording_crashes(plan, env))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def flush() -> None:
        try:
            await client.flush_async()
        except PreflightError as exc:
            flush_errors.append(str(exc))

    if any(plan.tree is not None for plan in plans):  # session trees (loadgen/core/tree_runtime.py)
        env.trees = TreeRuntime(clock, recorder, start, env.counts, gateway, ctl.tree_policy)
        for plan in plans:
            env.trees.add_root(plan)
    for plan in plans:
        clock.call_at(plan.arrival_s, start, plan)
    if text_prompts:
        tasks.add(clock.spawn(build_contexts_ahead(plans, client, env, lead_s, prebuilt=frozenset(ready_contexts))))
    for trig in arm.triggers:
        if isinstance(trig, FlushTrigger):
            clock.call_at(trig.at_s, lambda: tasks.add(clock.spawn(flush())))

    progress = LiveProgress(spec.duration_s)
    replay = spec.workload.replay
    until_done = replay is not None and replay.until_done  # a replay runs on until every request is answered

    def all_done() -> bool:
        return env.counts.completed_total + env.counts.crashed_total >= len(plans)

    async def sampler() -> None:
        interval = spec.recording.sample_interval_s
        i = 0
        while i * interval <= spec.duration_s + 1e-9 or (until_done and not all_done()):
            await clock.sleep(i * interval - clock.now())
            now = clock.now()
            row = sample_row(env, await client.metrics_async(), now)
            if proxy is not None:  # the gate that decides is the proxy's
                row.update(proxy_sample(proxy))
            recorder.sample(row)
            if isinstance(client, ReplicaSetClient):
                for replica_row in client.replica_rows(now):
                    recorder.replica_sample(replica_row)
            recorder.maybe_flush(now)
            if on_progress is not None:
                on_progress(progress.sample(row))
            # run time runs time_scale x faster than the wall clock the engine lives on
            if client.engine_gone(now, engine_spec.engine_gone_after_s * spec.time_scale):
                info["status_reason"] = (f"every request failed since t={client.first_failure_s:.1f} s "
                                         f"(> {engine_spec.engine_gone_after_s:g} s)")
                stop.set()
                return
            i += 1

    async def run_time() -> None:
        await asyncio.sleep(spec.duration_s / spec.time_scale)
        while until_done and not all_done():
            await asyncio.sleep(0.01)

    sampler_task = asyncio.ensure_future(sampler())
    try:
        await asyncio.wait([asyncio.ensure_future(stop.wait()), asyncio.ensure_future(run_time())],
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        sampler_task.cancel()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(sampler_task, *tasks, return_exceptions=True)
        try:
            recorder.close()
        finally:
            writer.shutdown()
        server_lateness = await client.server_lateness()
        await client.close()
        if proxy is not None:
            from ..gateway.in_run import run_gateway_info

            info["gateway"] = run_gateway_info(proxy)
            await proxy.close()
    c = env.counts
    status, error = ("engine_lost", info.get("status_reason")) if stop.is_set() else ("completed", None)
    if c.crashed_total and not stop.is_set():
        status = "completed_with_errors"
        error = f"{c.crashed_total} session(s) crashed (sessions.parquet status 'error' has the exception)"
    info.update(status=status, error=error,
                counts={"sessions_arrived": c.arrived_total, "sessions_completed": c.completed_total,
                        "sessions_crashed": c.crashed_total,
                        "turns_completed": recorder.turns_completed, "flush_times_s": client.flush_times_s,
                        "flush_errors": flush_errors,
                        **({"sessions_planned": len(plans), "ended_s": c.last_ended_s,
                            "inter_token_gaps": env.gaps.to_json()} if replay is not None else {})})
    if server_lateness is not None and server_lateness_before is not None:
        server_lateness = server_lateness.since(server_lateness_before)  # this run's window only
    # a flag beside the status, not a failure: the rows are what happened, on a clock that slipped
    info["lagging"], info["lag"] = lag_report(clock.lateness, server_lateness,
                                              median_turn_latency_s(run_dir / "turns.parquet"))
    write_json_atomic(run_dir / "run.json", info)
    return info


def median_turn_latency_s(turns_path: Path) -> Optional[float]:
    """Median send-to-finish time of a run's successful attempts (workload seconds): the time
    scale the lag bound is a fraction of. None when no turn succeeded or the file cannot be read."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..core.arrow_numpy import bool_values, float_values

    try:
        turns = pq.read_table(turns_path, columns=["submitted_s", "finish_s", "error"])
    except (OSError, pa.ArrowException):
        return None
    ok = bool_values(turns.column("error").is_null())
    latency = (float_values(turns.column("finish_s")) - float_values(turns.column("submitted_s")))[ok]
    latency = latency[np.isfinite(latency)]
    return float(np.median(latency)) if len(latency) else None
