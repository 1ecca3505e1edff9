"""The engine seam: what a session sends and gets back, and the simulated engine behind it.

Sessions call ``await engine.generate(TurnRequest)`` and receive a ``TurnResult``; they cannot
tell a simulated engine from an HTTP one. The simulated engine is advanced lazily: whenever
something outside it happens (a request arrives, a sample is taken, the clock reaches its next
completion) it runs its steps up to that moment and arms one timer for its next wake-up.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Awaitable, Callable, Hashable, Optional, Protocol, Union

from .clock import Clock
from ..sim import EngineConfig, SimEngine, StepCostModel
from ..sim.request import SimRequest
from ..sim.sglang_engine import SGLangConfig, SGLangEngine


NAN = float("nan")

# TurnRequest and TurnResult are made once or more per turn. Compiled (setup.py), engines.pxd makes
# them extension types whose fields are C slots: Cython builds their dataclass methods itself, and
# one costs a few stores to make instead of a dict of 11-16 entries. Their ``__eq__`` and
# ``__hash__`` are written out so that both builds compare the same way: the tuples of the fields,
# as a dataclass does (equal records holding the same NaN object are equal), where Cython's own
# would compare field by field (NaN != NaN). An assignment to a field raises AttributeError in
# both builds (a FrozenInstanceError, its subclass, in pure Python).


def _field_values(record) -> tuple:
    return tuple([getattr(record, f.name) for f in fields(record)])


def _same_fields(record, other):
    if other.__class__ is not record.__class__:
        return NotImplemented
    return _field_values(record) == _field_values(other)


@dataclass(frozen=True, eq=False)
class TurnRequest:
    session_id: int
    turn_index: int
    prompt_tokens: int
    max_tokens: int
    shared_prefix_tokens: int = 0
    prefix_key: str = "system"
    token_ids: Optional[list[int]] = None  # only for engines that need real ids (HTTP)
    # the prompt as chat messages or text, for HTTP engines that send text (loadgen/live/chat.py);
    # prompt_tokens stays the planned length, which that text is built to
    prompt_content: Optional[Union[str, list]] = None
    final: bool = False  # the session's last turn (a gateway in front of the engine ends the session after it)
    # a session tree's child: the session that spawned or forked it (live: x-dynamo-parent-session-id),
    # and the tokens of the parent's context its prompts begin with (a fork's, a parallel call's)
    parent_session_id: Optional[int] = None
    inherited_tokens: int = 0

    def __eq__(self, other):
        return _same_fields(self, other)

    def __hash__(self):
        return hash(_field_values(self))


@dataclass(frozen=True, eq=False)
class TurnResult:
    submitted_s: float
    first_token_s: float  # NaN when the turn failed before its first token
    finish_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    num_preemptions: int = 0
    error: Optional[str] = None
    output_token_ids: Optional[list[int]] = None
    inter_token_gaps_s: tuple[float, ...] = ()  # per streamed token (live engines; OpenAIEngineClient.generate)
    # the simulated engine's per-token times, summarized (it computes them, it does not stream)
    itl_mean_s: float = NAN
    itl_max_s: float = NAN
    output_text: Optional[str] = None  # the returned text (live engines): a text context appends it
    # a deployment's (loadgen/core/deployment.py): the replica that served the turn and, of its
    # missed tokens, those resident only on another replica (routing) or evicted from this one
    replica: Optional[int] = None
    miss_routing_tokens: Optional[int] = None
    miss_eviction_tokens: Optional[int] = None
    # the time a gateway between the client and the engine held the request before sending it on
    # (loadgen gateway's response header; live only): a wait at admission the engine never saw
    gateway_wait_s: float = 0.0

    def __eq__(self, other):
        return _same_fields(self, other)

    def __hash__(self):
        return hash(_field_values(self))


@dataclass(frozen=True)
class EngineMetrics:
    """vLLM-like gauges and counters, sampled into samples.parquet."""

    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    num_preemptions_total: int


class EngineClient(Protocol):
    pool_tokens: int
    needs_token_ids: bool

    # awaited by the session: a coroutine (HTTP engines) or the clock's future (SimEngineClient)
    def generate(self, request: TurnRequest) -> Awaitable[TurnResult]: ...

    def metrics(self) -> EngineMetrics: ...

    def flush(self) -> None: ...


class SimEngineClient:
    """The simulated engine driven by a clock (virtual or wall)."""

    needs_token_ids = False

    def __init__(self, clock: Clock, config: Union[EngineConfig, SGLangConfig], cost: StepCostModel) -> None:
        self.clock = clock
        # the flavour follows the configuration: SGLang's radix-cache engine or vLLM's block pool
        self.engine = SGLangEngine(config, cost) if isinstance(config, SGLangConfig) else SimEngine(config, cost)
        self.pool_tokens = config.pool_tokens
        self._timer = None
        self._armed_at: Optional[float] = None
        self._seq = 0
        # where a session tree's or a replay's requests run (loadgen/core/tree_engines.py, replay.py):
        # streams(request) -> (prefix, stream, None or a callback for the turn's future when it resolves)
        self.placer = None
        # the client gives up on a request after this long and the engine aborts it (a replay's
        # client_timeout_s); None: it waits for the answer
        self.request_timeout_s = None

    def generate(self, request: TurnRequest, on_first_token: Optional[Callable[[float], None]] = None):
        """Run one turn: an awaitable of its ``TurnResult``, the clock's future, which the engine
        resolves when the turn completes. ``on_first_token(t_s)`` (a deployment's router, when it
        asks) is called when its first token is sampled."""
        engine = self.engine
        now = self.clock.now()
        fut = self.clock.create_future()
        reason = engine.validate(request.prompt_tokens, request.max_tokens)
        if reason is not None:
            fut.set_result(TurnResult(now, NAN, now, request.prompt_tokens, 0, 0, error=reason))
            return fut
        left = None
        if self.placer is not None:  # a session tree's (loadgen/core/tree_engines.py) or a replay's (replay.py)
            prefix, stream, left = self.placer.streams(request)
        else:
            prefix = (engine.prefix_stream(request.prefix_key, request.shared_prefix_tokens)
                      if request.shared_prefix_tokens >= engine.block_size else None)
            stream = engine.stream(request.session_id, request.shared_prefix_tokens if prefix is not None else 0)
        self._seq += 1
        req = SimRequest(self._seq, stream, request.prompt_tokens, request.max_tokens, prefix=prefix,
                         on_done=_resolve, context=fut)
        if on_first_token is not None:
            req.on_first_token = lambda r: on_first_token(r.first_token_s)
        engine.submit(req, now)
        if left is not None:  # the placer learns when the request leaves the engine
            fut.add_done_callback(left)
        if self.request_timeout_s is not None:
            timer = self.clock.call_at(now + self.request_timeout_s, lambda: self._give_up(req))
            fut.add_done_callback(lambda _fut: timer.cancel())
        self._rearm()
        return fut

    def _give_up(self, req: SimRequest) -> None:
        """The client's timeout: the engine aborts the request (unless the step in flight finishes
        it, then it is delivered) and the turn fails, with what it had received by then."""
        fut = req.context
        if fut.done():
            return
        now = self.clock.now()
        if self.engine.abort(req, now):
            first = req.first_token_s if req.first_token_s is not None else NAN
            fut.set_result(TurnResult(req.arrival_s, first, now, req.num_prompt_tokens, req.num_cached_tokens,
                                      req.generated, req.num_preemptions,
                                      f"timeout after {self.request_timeout_s:g} s (the client gave up; the engine "
                                      f"aborted the request)"))
        self._rearm()

    def cached_tokens(self, session_id: Hashable, prefix_key: Hashable, shared_prefix_tokens: int,
                      prompt_tokens: int) -> int:
        """The tokens of a turn's prompt (as ``generate`` names them) this engine's pool holds now,
        in whole blocks from the start: what its KV events (blocks stored, blocks removed) have
        told a listener."""
        engine = self.engine
        engine.advance_to(self.clock.now())
        self._rearm()
        prefix_tokens = shared_prefix_tokens if shared_prefix_tokens >= engine.block_size else 0
        return engine.block_size * engine.held_prompt_blocks(session_id, prefix_key, prefix_tokens, prompt_tokens)

    def metrics(self) -> EngineMetrics:
        engine = self.engine
        engine.advance_to(self.clock.now())
        self._rearm()
        return EngineMetrics(engine.num_running, engine.num_waiting, engine.kv_usage(),
                             engine.prefix_cache_queries, engine.prefix_cache_hits, engine.num_preemptions)

    def flush(self) -> None:
        self.engine.flush(self.clock.now())
        self._rearm()

    # run.json counts (a deployment sums its replicas')
    @property
    def num_steps(self) -> int:
        return self.engine.num_steps

    @property
    def num_preemptions(self) -> int:
        return self.engine.num_preemptions

    @property
    def flush_times_s(self) -> list[float]:
        return self.engine.flush_times_s

    def _rearm(self) -> None:
        wake = self.engine.next_wakeup()
        if wake == self._armed_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_at = wake
        if wake is not None:
            self._timer = self.clock.call_at(wake, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._armed_at = None
        self.engine.advance_to(self.clock.now())
        self._rearm()


def _resolve(req: SimRequest) -> None:
    """A simulated turn completed: its future gets its result (read from the request's typed fields)."""
    req.context.set_result(TurnResult(req.arrival_s, req.first_token_s, req.finish_s, req.num_prompt_tokens,
                                      req.num_cached_tokens, req.generated, req.num_preemptions, None, None, (),
                                      req.mean_token_gap_s, req.max_token_gap_s))  # all positional: cheaper
