"""The closed-loop agent session: one coroutine per session, identical in virtual and wall time.

Each turn sends the whole context, waits for the completion, thinks (tool time), appends the
turn's output and the tool's output, and goes again. The gateway is asked before every turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import orjson

from trace_shapes.shape import SessionShape

from .clock import Clock
from .engines import EngineClient, TurnRequest
from .gateway import Gateway
from .recording import RunRecorder
from .workload import SessionPlan, Stream, rng_for


@dataclass
class SessionCounts:
    """Sessions by state, for the sampler (docs/experiments.md#measurements: sessions in the system)."""

    in_system: int = 0
    thinking: int = 0
    gateway_waiting: int = 0
    parked: int = 0
    in_engine: int = 0
    arrived_total: int = 0
    completed_total: int = 0
    demand_tokens: int = 0  # D over every session in the system
    crashed_total: int = 0  # sessions whose task raised (run_session_recording_crashes)
    last_ended_s: float = 0.0  # when the latest session ended (a replay's run ends then)


class TokenIds(list):
    """A session's token ids, which only ever grow, with their JSON array text kept up to date
    incrementally: ``json()`` encodes only the ids appended since its last call. Encoding a whole
    context every turn was the largest single cost of a streamed turn (~10% of the driver's CPU
    at 4K-token contexts, more as agent contexts grow; benchmarks/README.md)."""

    __slots__ = ("_json", "_num_json")

    def __init__(self, ids=()) -> None:
        super().__init__(ids)
        self._json = bytearray(b"[")
        self._num_json = 0

    def json(self) -> bytes:
        """The ids as a JSON array, the same bytes as ``orjson.dumps(list(self))``."""
        n = len(self)
        if n < self._num_json:  # shrunk (not done by sessions): encode it afresh
            self._json, self._num_json = bytearray(b"["), 0
        if n > self._num_json:
            new = orjson.dumps(self[self._num_json:])
            if self._num_json:
                self._json += b","
            self._json += new[1:-1]
            self._num_json = n
        return bytes(self._json) + b"]"


class TokenContext:
    """The real token ids of a session's context, for engines that need them (HTTP).

    Random ids, keyed by the run (seed, arm): the shared prefix from a generator keyed by the run,
    the prefix name and its length (identical in every session of the run), the rest from the
    session's own generator; a turn's output ids are the engine's when it returns them (so the
    next prompt reuses exactly what the engine cached). Another seed or arm sends other ids, so a
    server that still caches an earlier run (no flush) gives it no hits."""

    VOCAB = 30000
    content = None  # a token-id context sends ids, no text (loadgen/live/chat.py's TextContext sends text)
    drift_tokens = 0  # the next prompt appends the engine's own output ids: nothing is re-tokenized

    def __init__(self, shape: SessionShape, run_key: tuple[int, str], session_id: int) -> None:
        seed, arm = run_key
        # a system prompt is its name and its length: other lengths are other prompts, as the
        # simulated engine assumes (SimEngine.prefix_stream)
        prefix_rng = rng_for(Stream.SHARED_PREFIX_TOKENS, seed, arm, shape.prefix_key, shape.shared_prefix_tokens)
        self._rng = rng_for(Stream.SESSION_TOKENS, seed, arm, session_id)
        prefix = prefix_rng.integers(1, self.VOCAB, size=shape.shared_prefix_tokens).tolist()
        rest = self._rng.integers(1, self.VOCAB, size=shape.initial_tokens - shape.shared_prefix_tokens).tolist()
        self.ids: TokenIds = TokenIds(prefix + rest)

    def append(self, output_ids: Optional[list[int]], num_output: int, num_tool: int) -> None:
        if output_ids is None or len(output_ids) != num_output:
            output_ids = self._rng.integers(1, self.VOCAB, size=num_output).tolist()
        self.ids.extend(output_ids)
        if num_tool:  # drawing 0 ids consumes nothing of the generator: skipped, the same ids follow
            self.ids.extend(self._rng.integers(1, self.VOCAB, size=num_tool).tolist())

    # the session-side surface shared with text contexts, whose building may ask the server
    async def start(self) -> None:
        pass

    async def extend(self, result, num_output: int, num_tool: int) -> None:
        self.append(result.output_token_ids, num_output, num_tool)


@dataclass(frozen=True)
class RetryPolicy:
    """How a session retries a failed turn: up to ``max_attempts`` tries, exponential backoff.
    Client errors (HTTP 4xx other than 408 and 429) are not retried: they would fail again."""

    max_attempts: int = 3
    backoff_s: float = 1.0

    def should_retry(self, attempt: int, error: str) -> bool:
        if attempt >= self.max_attempts:
            return False
        return not (error.startswith("HttpStatusError: HTTP 4") and not error.startswith(
            ("HttpStatusError: HTTP 408", "HttpStatusError: HTTP 429")))

    def delay_s(self, attempt: int) -> float:
        return self.backoff_s * 2 ** (attempt - 1)


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass
class RunEnv:
    clock: Clock
    engine: EngineClient
    gateway: Gateway
    recorder: RunRecorder
    counts: SessionCounts = field(default_factory=SessionCounts)
    retry: RetryPolicy = NO_RETRY
    # shared prefixes (name, length) some request of this run has sent: an infinite cache holds
    # them for every later request (turns.parquet cacheable_prefix_tokens; per process in a fleet)
    sent_prefixes: set = field(default_factory=set)
    # session id -> a future of its context, started before its arrival (text prompts, which take
    # a tokenizer's time to build: loadgen/live/runner.py builds them ahead so arrivals stay on time)
    ready_contexts: dict = field(default_factory=dict)
    # the run's session trees (loadgen/core/tree_runtime.py), None in a run of linear sessions
    trees: Optional[object] = None
    # every streamed inter-token gap (a GapHistogram: a live replay's ITL percentiles), or None
    gaps: Optional[object] = None


class _Progress:
    """Where a session is, for undoing its counts when it crashes."""

    __slots__ = ("demand_tokens", "counted_as")

    def __init__(self) -> None:
        self.demand_tokens: Optional[int] = None  # its share of counts.demand_tokens once it arrived
        self.counted_as: Optional[str] = None  # the SessionCounts state it is counted in while it awaits




async def run_session_recording_crashes(plan: SessionPlan, env: RunEnv) -> None:
    """``run_session`` for live runs and session fleets: a session that raises is a recorded
    crash, not a lost task (``session_crashed``); the run goes on."""
    try:
        await run_session(plan, env)
    except Exception as exc:
        session_crashed(plan, env, exc)


def session_crashed(plan: SessionPlan, env: RunEnv, exc: BaseException) -> None:
    """A session's task raised ``exc``: release its place at the gateway (admission, or its
    place in a queue) so others are not held back by a session that is gone, write its
    sessions.parquet row (status ``error``, the exception text) and count it
    (``counts.crashed_total``, run.json ``counts.sessions_crashed``)."""
    sid = plan.session_id
    try:
        env.gateway.session_ended(sid)
    finally:
        env.recorder.session_crashed(sid, plan.is_trigger, plan.shape.kind, plan.shape.num_turns, plan.arrival_s,
                                     env.clock.now(), f"{type(exc).__name__}: {exc}")
        env.counts.crashed_total += 1


def _output_tokens_not_resent(tokens, result, num_output: int) -> int:
    """Of a turn's output, the tokens at its end the next prompt does not repeat: all of them when
    a token-id context got no ids from the engine (it appends random ones), else the text
    context's re-tokenization drift (0 when unknown: an upper bound)."""
    if isinstance(tokens, TokenContext):
        ids = result.output_token_ids
        return 0 if ids is not None and len(ids) == num_output else num_output
    return max(int(getattr(tokens, "drift_tokens", 0) or 0), 0)


async def run_session(plan: SessionPlan, env: RunEnv) -> None:
    """One session from arrival to its last turn. If it raises, it first leaves the counts as if
    it had ended (so samples stay true), then the exception propagates: a simulated run stops
    (a bug), a live run records it (``run_session_recording_crashes``)."""
    # one coroutine, not a wrapper awaiting the session's body: every wake-up of a simulated
    # session passes through each coroutine it is nested in
    progress = _Progress()
    try:
        clock, engine, gateway, recorder, counts = env.clock, env.engine, env.gateway, env.recorder, env.counts
        shape = plan.shape
        sid = plan.session_id
        node = env.trees.get(sid) if env.trees is not None else None
        num_turns = shape.num_turns
        context = shape.initial_tokens
        demand = context + shape.output_tokens[0]
        tokens = None
        replay = plan.replay  # a replayed trace's session: its own prompts and send times (replay.py)
        replay_ids = None
        if engine.needs_token_ids and replay is None:
            if plan.token_key is None:
                raise ValueError(f"session {sid}: a live run needs plans from plan_sessions (their token_key)")
            ready = env.ready_contexts.pop(sid, None)
            if ready is not None:
                tokens = await ready
            else:
                # an engine that sends text builds its own contexts (chat messages or text of exact lengths)
                make_context = getattr(engine, "session_context", None)
                tokens = (make_context(shape, plan.token_key, sid) if make_context is not None
                          else TokenContext(shape, plan.token_key, sid))
            if node is not None:  # a fork's or a parallel call's prompt begins with its parent's exact context
                env.trees.context_started(node, tokens)
            if ready is None:
                await tokens.start()
        # A gate in another process (actors.fleet.RemoteGate) cannot answer on the spot: it returns
        # an awaitable of the answer (None: go; else a future to await), one round trip per turn.
        gate_answers_later = getattr(gateway, "answers_later", False)
        counts.arrived_total += 1
        counts.in_system += 1
        counts.demand_tokens += demand
        progress.demand_tokens = demand
        ready = clock.now()
        recorder.session_arrived(sid, plan.is_trigger, shape.kind, num_turns, ready)
        wait = gateway.arrive(sid, demand)
        if gate_answers_later:
            wait = await wait
        if wait is not None:
            counts.gateway_waiting += 1
            progress.counted_as = "gateway_waiting"
            await wait
            counts.gateway_waiting -= 1
            progress.counted_as = None
        # a turn the gate let go at once waited 0 (a live clock moves between two reads of it)
        admit = ready if wait is None and not gate_answers_later else clock.now()
        recorder.session_admitted(sid, admit)
        # of the next prompt, what an infinite cache would hold from this session's earlier turns
        held_tokens = node.held_tokens() if node is not None else 0
        # read once: a shape does not change (frozen), and each read by name costs a lookup a turn
        output_tokens, growth_tokens, think_times_s = shape.output_tokens, shape.growth_tokens, shape.think_s
        kind, is_trigger, prefix_key = shape.kind, plan.is_trigger, shape.prefix_key
        shared_prefix_tokens = shape.shared_prefix_tokens
        prefix = (prefix_key, shared_prefix_tokens)
        sent_prefixes = env.sent_prefixes
        gap_histogram = env.gaps  # a live replay's streamed gaps (None otherwise)
        for k in range(num_turns):
            if k:
                ready = clock.now()
                wait = gateway.before_turn(sid, demand)
                if gate_answers_later:
                    wait = await wait
                if wait is not None:
                    recorder.session_parked(sid)
                    counts.parked += 1
                    progress.counted_as = "parked"
                    await wait
                    counts.parked -= 1
                    progress.counted_as = None
                admit = ready if wait is None and not gate_answers_later else clock.now()
            output = output_tokens[k]
            if replay is not None:
                replay_ids = replay.prompt_ids(k)
            request = TurnRequest(sid, k, context, output, shared_prefix_tokens, prefix_key,  # all positional: cheaper
                                  tokens.ids if tokens is not None else replay_ids,
                                  tokens.content if tokens is not None else None, k == num_turns - 1,
                                  node.parent_id if node is not None else None,
                                  node.fork_tokens if node is not None else 0)
            if replay is None:
                cacheable = max(held_tokens, shared_prefix_tokens if prefix in sent_prefixes else 0)
                sent_prefixes.add(prefix)
            else:  # what any earlier request of the run sent
                cacheable = replay.run.cacheable_tokens(replay_ids)
            if node is not None and node.tree.parallel:  # more calls over this prompt, sent with it
                env.trees.send_parallel(node, k, context)
            attempt = 0
            while True:
                attempt += 1
                if attempt > 1:
                    cacheable = context  # a retry resends a prompt already sent
                counts.in_engine += 1
                progress.counted_as = "in_engine"
                sent = clock.now()
                result = await engine.generate(request)
                counts.in_engine -= 1
                progress.counted_as = None
                if attempt == 1 and result.gateway_wait_s > 0:
                    # a gateway in front of the engine held the turn (its answer says how long):
                    # admitted then, as if by this run's own gate
                    admit += result.gateway_wait_s
                    recorder.gateway_held(sid, k, admit)
                gaps = result.inter_token_gaps_s
                if gaps and gap_histogram is not None:
                    for gap_s in gaps:
                        gap_histogram.add(gap_s)
                # streamed gaps (live) or the simulated engine's own per-token times
                itl_mean_s = sum(gaps) / len(gaps) if gaps else result.itl_mean_s
                itl_max_s = max(gaps) if gaps else result.itl_max_s
                # every attempt's row keeps the turn's ready and admit times: the agent wanted the
                # turn then, and waits for it across every attempt and backoff (its latency)
                recorder.turn(sid, k, is_trigger, kind, ready, admit, result.first_token_s, result.finish_s,
                              result.prompt_tokens, result.cached_tokens, result.output_tokens, result.num_preemptions,
                              result.error, itl_mean_s, itl_max_s, context,
                              tokens.drift_tokens if tokens is not None else 0, cacheable, attempt, sent, output,
                              result.replica, result.miss_routing_tokens, result.miss_eviction_tokens)
                if result.error is None or not env.retry.should_retry(attempt, result.error):
                    break
                await clock.sleep(env.retry.delay_s(attempt))
            if result.error is not None:
                break  # the session cannot continue without this turn's output
            if replay is not None:
                replay.answered(k, replay_ids, result.output_token_ids)
            # the engine's service time of the attempt that answered: what the gateway's policy reads
            gateway.turn_completed(sid, result.finish_s - sent)
            # a tree's turn starts its branches; the next may wait for them and append their results
            joined = (await env.trees.turn_done(node, k, context + output, result.output_token_ids, result.output_text)
                      if node is not None else 0)
            if k == num_turns - 1:
                break
            growth = growth_tokens[k] + joined
            # the engine computed this prompt and the output but its last token (never fed back)
            held_tokens = context + output - 1
            context += output + growth
            new_demand = context + output_tokens[k + 1]
            counts.demand_tokens += new_demand - demand
            demand = progress.demand_tokens = new_demand
            # a replayed turn goes at its recorded time, or now if the answer came later
            think = think_times_s[k] if replay is None else replay.send_at_s[k + 1] - clock.now()
            if tokens is not None:
                # building the tool output is the tool's time: it comes out of the think time
                # (a text context may count tokens with the server's /tokenize)
                built_at = clock.now()
                await tokens.extend(result, output, growth)
                think -= clock.now() - built_at
                # the next prompt departs from what the engine holds where the output is not resent as is
                held_tokens = max(0, min(held_tokens, held_tokens + 1 - _output_tokens_not_resent(tokens, result, output)))
            if think > 0:
                counts.thinking += 1
                progress.counted_as = "thinking"
                await clock.sleep(think)
                counts.thinking -= 1
                progress.counted_as = None
        gateway.session_ended(sid)
        recorder.session_ended(sid, clock.now())
        if node is not None:
            env.trees.ended(node)
        counts.in_system -= 1
        counts.demand_tokens -= demand
        progress.demand_tokens = None
        counts.completed_total += 1
        counts.last_ended_s = clock.now()
    except Exception:
        counts = env.counts
        if progress.demand_tokens is not None:
            counts.in_system -= 1
            counts.demand_tokens -= progress.demand_tokens
        if progress.counted_as is not None:
            setattr(counts, progress.counted_as, getattr(counts, progress.counted_as) - 1)
        raise
