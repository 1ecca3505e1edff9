"""The simulated engine: vLLM v1's scheduler as a step machine over the run-compressed pool.

Each step is *schedule, then update*, as in vllm/v1/core/sched/scheduler.py:

1. running requests first, in running order: a decode takes one token, a prefill
   ``min(remaining, budget)`` tokens (chunked prefill); when a request cannot get a block the
   last running request is preempted (blocks freed tail first, hashes kept, progress reset,
   put at the FRONT of the waiting queue);
2. then, only if nothing was preempted, waiting requests FCFS with head-of-line blocking: the
   head is admitted only if the blocks it needs fit (the whole prompt with
   ``reserve_full_prompt``, as vLLM 0.33; else the hit plus its first chunk, as 0.11);
3. the step takes ``StepCostModel.step_time`` seconds; its tokens are sampled at its end.

Why it is fast. In vLLM the running list is always [decoders..., at most one request still in
prefill]: a request is appended when admitted, and a partial prefill exhausts the step's budget
so nothing is admitted behind it. So every step advances *every* decoder by one token, and a
decoder's state is a line in the global step index G: it computed ``nc0 + (G - g0)`` tokens
before step G, needs a new block exactly at the steps G = g0 - nc0 (mod block size), and
finishes at a known step. The engine keeps decoders as aggregates (count, sum of contexts,
block-crossing residues, a heap of finish steps), so a step costs O(1) in the number of
decoders, and a stretch of pure-decode steps is committed in closed form (its duration is a
quadratic in its length). Per-request work happens only at admission, finish and preemption.

Time. ``advance_to(t)`` commits every step that *starts* at or before t (a step's schedule is
fixed when it starts; arrivals during it wait for the next one). The last committed step is
"in flight": its finished requests are delivered when the clock reaches its end.
``next_wakeup()`` says when something observable happens next if nothing arrives.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional

from .cost import StepCostModel
from .kv_pool import BlockPool, Stream
from .offload import HostTier, OffloadConfig

# LOADING: parked while its host-tier blocks are copied to the GPU (vLLM WAITING_FOR_REMOTE_KVS)
WAITING, RUNNING, FINISHED, LOADING = 0, 1, 2, 3


@dataclass(frozen=True)
class EngineConfig:
    """The engine knobs that shape caching and scheduling (vLLM's names)."""

    num_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    max_model_len: int = 40960
    enable_prefix_caching: bool = True
    reserve_full_prompt: bool = True
    offload: Optional[OffloadConfig] = None  # a CPU KV tier (loadgen/sim/offload.py); None: GPU pool only

    @property
    def pool_tokens(self) -> int:
        """C as vLLM reports it: num_gpu_blocks x block_size."""
        return self.num_blocks * self.block_size


class SimRequest:
    """One request: a prompt of ``num_prompt_tokens`` on ``stream`` (after a shared ``prefix``)."""

    __slots__ = (
        "request_id", "prefix", "stream", "num_prompt_tokens", "max_tokens", "on_done", "on_first_token", "context",
        "arrival_s", "first_token_s", "finish_s", "num_cached_tokens", "num_preemptions",
        "state", "num_tokens", "num_computed", "generated", "alloc_blocks", "admit_seq",
        "is_decoder", "g0", "nc0", "gen0", "residue", "is_builder", "prefix_hit_blocks",
        "last_token_s", "max_token_gap_s", "store_from", "load_start", "load_blocks", "load_done_s", "loaded",
        "segments", "segment_hits", "segment_builders",
    )

    def __init__(self, request_id: Hashable, stream: Stream, num_prompt_tokens: int, max_tokens: int,
                 prefix: Optional[Stream] = None, on_done: Optional[Callable[["SimRequest"], Any]] = None,
                 context: Any = None) -> None:
        self.request_id = request_id
        self.prefix = prefix
        self.stream = stream
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.on_done = on_done
        self.on_first_token: Optional[Callable[["SimRequest"], Any]] = None  # live serving only
        self.context = context
        self.arrival_s = math.nan
        self.first_token_s: Optional[float] = None
        self.finish_s: Optional[float] = None
        self.num_cached_tokens = -1  # fixed at first scheduling, as vLLM reports it
        self.num_preemptions = 0
        self.state = WAITING
        self.num_tokens = num_prompt_tokens  # prompt + generated (before the current decode stretch)
        self.num_computed = 0
        self.generated = 0
        self.alloc_blocks = 0
        self.admit_seq = -1
        self.is_decoder = False
        self.g0 = self.nc0 = self.gen0 = self.residue = 0
        self.is_builder = False
        self.prefix_hit_blocks = 0
        # Per-token timing: when the latest token was sampled and the longest gap between two
        # consecutive tokens so far (a preempted request's gap spans its wait and recompute).
        self.last_token_s: Optional[float] = None
        self.max_token_gap_s = math.nan
        # CPU offload tier: the first block not yet stored to the host (vLLM _next_stored_block_idx),
        # the host blocks [load_start, load_start + load_blocks) being or having been loaded, when
        # the copy lands, and whether the request waits with its loaded blocks
        self.store_from = 0
        self.load_start = self.load_blocks = 0
        self.load_done_s = math.nan
        self.loaded = False
        # a prefix in a tree of streams (prefix.parent set): the chain of streams from block 0 to
        # the own stream, the blocks hit in each and which ones this request builds
        self.segments: Optional[tuple] = None
        self.segment_hits: list = []
        self.segment_builders: list = []

    @property
    def mean_token_gap_s(self) -> float:
        """Mean gap between consecutive tokens: (last token - first token) / (tokens - 1)."""
        if self.generated < 2 or self.first_token_s is None or self.last_token_s is None:
            return math.nan
        return (self.last_token_s - self.first_token_s) / (self.generated - 1)

    def __repr__(self) -> str:
        return (f"SimRequest({self.request_id!r}, prompt={self.num_prompt_tokens}, "
                f"cached={self.num_cached_tokens}, state={self.state})")


class SimEngine:
    """A vLLM v1 engine in simulated time. See the module docstring."""

    def __init__(self, config: EngineConfig, cost: StepCostModel) -> None:
        if config.max_num_batched_tokens < 1 or config.max_num_seqs < 1 or config.block_size < 1:
            raise ValueError("block_size, max_num_batched_tokens and max_num_seqs must be >= 1")
        self.config = config
        self.cost = cost
        self.block_size = config.block_size
        self.caching = config.enable_prefix_caching
        self.pool = BlockPool(config.num_blocks)
        self.streams: dict[Hashable, Stream] = {}
        self.waiting: deque[SimRequest] = deque()
        self.running: dict[SimRequest, None] = {}  # insertion order is vLLM's running order
        self.prefilling: list[SimRequest] = []  # running requests still in prefill, in order
        self.step_index = 0  # G: index of the next step
        self.num_decoders = 0
        self._decoder_ctx_const = 0  # sum over decoders of (nc0 - g0 + 1): their context is this + R*G
        self._residues = [0] * config.block_size  # decoders needing a block at steps G % block_size
        self._finish_heap: list = []  # (finish step, admit_seq, request)
        self._admit_seq = 0
        self._inflight_end: Optional[float] = None
        self._next_start: Optional[float] = None
        self._done: list[SimRequest] = []  # finishing at the end of the in-flight step
        self._first: list[SimRequest] = []  # first token at the end of the in-flight step (with on_first_token)
        self._flush_requested = False
        self._aborts: list[SimRequest] = []  # to abort at the next step boundary, in request order
        self.flush_times_s: list[float] = []
        # vLLM-like counters (token counters, like vllm:prefix_cache_*_total)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_steps = 0
        # Step durations for per-token gaps, kept O(1) per committed chunk (one general step or
        # one closed-form decode stretch): a stack of (first step index, longest step in it)
        # with strictly decreasing durations, so the longest step from step g on is the first
        # entry at or after g. A decoder spans whole chunks (it joins after a general step and
        # leaves at a chunk's end), so its longest gap is one lookup when it leaves.
        self._gap_steps: list[int] = []
        self._gap_max_s: list[float] = []
        self._last_end_s = 0.0  # end of the latest committed step
        self.host: Optional[HostTier] = None
        if config.offload is not None:
            if not config.enable_prefix_caching:
                raise ValueError("the CPU offload tier needs prefix caching (blocks are found by their hashes)")
            self.host = HostTier(config.offload)
        self.num_loading = 0  # waiting requests that hold GPU blocks: loading, or loaded and not yet admitted
        # vllm:external_prefix_cache_{queries,hits} (tokens) and vllm:kv_offload_total_bytes by direction
        self.external_prefix_cache_queries = 0
        self.external_prefix_cache_hits = 0
        self.kv_offload_bytes_gpu_to_cpu = 0
        self.kv_offload_bytes_cpu_to_gpu = 0
        self.jitter: Optional[Callable[[], float]] = None  # per-step time multiplier (loadgen/sim/jitter.py)

    # ------------------------------------------------------------------ public surface
    def stream(self, key: Hashable, base_tokens: int = 0) -> Stream:
        """The stream for ``key``; its own blocks start after ``base_tokens`` shared tokens."""
        stream = self.streams.get(key)
        base = base_tokens // self.block_size
        if stream is None:
            stream = self.streams[key] = Stream(key, base)
        elif stream.base != base:
            raise ValueError(f"stream {key!r} was used after {stream.base} shared blocks, now after {base}")
        return stream

    def branch(self, key: Hashable, parent: Optional[Stream]) -> Stream:
        """A new stream in a tree of streams: its blocks follow the fixed-length ``parent``'s
        (a fork, a repeated or edited prompt); a request on it names ``parent`` as its prefix."""
        if key in self.streams:
            raise ValueError(f"stream {key!r} exists already")
        base = parent.base + parent.num_blocks if parent is not None else 0
        stream = self.streams[key] = Stream(key, base)
        stream.parent = parent
        return stream

    def split_stream(self, stream: Stream, num_blocks: int, key: Hashable) -> Stream:
        """Cut ``stream`` after its first ``num_blocks`` blocks (a prompt that shares only those):
        a new stream ``key`` takes them and becomes its parent. The requests that hold ``stream``,
        waiting or running, hold both from now on; one writing it builds the new one."""
        if key in self.streams:
            raise ValueError(f"stream {key!r} exists already")
        if self.host is not None:
            raise ValueError("a tree of streams is not modelled with the CPU offload tier")
        head = self.streams[key] = Stream(key, 0)
        holders = [r for r in (*self.running, *self.waiting)
                   if r.stream is stream or r.prefix is stream or (r.segments and stream in r.segments)]
        self.pool.split(stream, num_blocks, head)
        bs = self.block_size
        for r in holders:
            admitted = r.state == RUNNING
            if r.segments is None:  # the two-level form: into a chain
                r.segments = (r.prefix,) if r.prefix is not None else ()
                r.segment_hits = [r.prefix_hit_blocks] if r.prefix is not None else []
                r.segment_builders = [r.is_builder] if r.prefix is not None else []
            if r.stream is stream:  # it writes the stream: it builds the head from what it computed
                r.segments += (head,)
                r.prefix = head
                if admitted:
                    r.segment_hits.append(head.cached)
                    r.segment_builders.append(self.caching)
                    r.is_builder = self.caching
                    head.cached = max(head.cached, min(num_blocks, r.num_computed // bs - head.base))
                continue
            i = r.segments.index(stream)
            r.segments = r.segments[:i] + (head,) + r.segments[i:]
            if admitted:
                h = r.segment_hits[i]
                r.segment_hits[i:i + 1] = [min(h, num_blocks), max(0, h - num_blocks)]
                r.segment_builders.insert(i, r.segment_builders[i])
        return head

    def prefix_stream(self, key: Hashable, num_tokens: int) -> Stream:
        """The shared prefix (system prompt) ``key`` of ``num_tokens`` tokens: its full blocks.

        A prefix is one prompt of one length: the same name with another length is another
        prompt (loadgen's sessions draw its tokens from the name and the length), so every
        request holding a prefix stream holds all of it and one reference count is exact."""
        num_blocks = num_tokens // self.block_size
        full_key = ("prefix", key, num_blocks)
        stream = self.streams.get(full_key)
        if stream is None:
            stream = self.streams[full_key] = Stream(full_key, 0, num_blocks)
        return stream

    def validate(self, num_prompt_tokens: int, max_tokens: int) -> Optional[str]:
        """Why vLLM would reject this request up front (400), or None."""
        if num_prompt_tokens < 1 or max_tokens < 1:
            return f"prompt_tokens and max_tokens must be >= 1 (got {num_prompt_tokens}, {max_tokens})"
        total = num_prompt_tokens + max_tokens
        if total > self.config.max_model_len:
            return (f"This model's maximum context length is {self.config.max_model_len} tokens; "
                    f"the request asks for {total} ({num_prompt_tokens} prompt + {max_tokens} output)")
        if -(-total // self.block_size) > self.pool.num_usable:
            return f"the request needs {total} tokens of KV but the pool holds {self.pool.num_usable * self.block_size}"
        return None

    def submit(self, request: SimRequest, now_s: float) -> None:
        """A request arrives at ``now_s``; it is considered at the next step start."""
        reason = self.validate(request.num_prompt_tokens, request.max_tokens)
        if reason is not None:
            raise ValueError(reason)
        prefix = request.prefix
        if prefix is not None and prefix.parent is not None:
            request.segments = self._segments(request)
        elif prefix is not None:
            if prefix.base != 0:
                raise ValueError("a prefix stream must start at block 0")
            if prefix.num_blocks is None:
                prefix.num_blocks = request.stream.base
            elif prefix.num_blocks != request.stream.base:
                raise ValueError(
                    f"prefix {prefix.key!r} holds {prefix.num_blocks} blocks but this request's own tokens start "
                    f"after {request.stream.base}: a prefix names one prompt of one length (prefix_stream())")
        self.advance_to(now_s)
        request.arrival_s = now_s
        self.prompt_tokens_total += request.num_prompt_tokens
        self.waiting.append(request)
        if self._inflight_end is None:
            self._next_start = now_s
            self.advance_to(now_s)

    def _segments(self, request: SimRequest) -> tuple:
        chain = []
        seg = request.prefix
        while seg is not None:
            chain.append(seg)
            seg = seg.parent
        chain.reverse()
        end = 0
        for seg in chain:
            if seg.base != end or seg.num_blocks is None:
                raise ValueError(f"stream {seg.key!r} does not follow its parent (base {seg.base}, parent ends at "
                                 f"{end}) or has no fixed length")
            end += seg.num_blocks
        if end != request.stream.base:
            raise ValueError(f"the prefix chain ends at block {end} but stream {request.stream.key!r} starts at "
                             f"{request.stream.base}")
        if self.host is not None:
            raise ValueError("a tree of streams is not modelled with the CPU offload tier")
        return tuple(chain)

    def flush(self, now_s: float) -> None:
        """Reset the prefix cache, preempting running requests (vLLM reset_running_requests)."""
        self.advance_to(now_s)
        self._flush_requested = True
        if self._inflight_end is None:
            self._apply_flush(now_s)

    def abort(self, request: SimRequest, now_s: float) -> bool:
        """The client went away: drop ``request`` as vLLM aborts it (its output is never delivered).

        vLLM's engine core takes aborts between steps, so it leaves at the next step boundary:
        a request the step in flight finishes is delivered as usual; otherwise it leaves the
        waiting queue or the running set, its blocks are freed tail first and the full blocks it
        computed keep their hashes, so a retry of the same prompt hits them. Returns False when
        the request finishes anyway (it is delivered, ``on_done`` included), True when aborted."""
        self.advance_to(now_s)
        if request.state == FINISHED:
            return False
        self._aborts.append(request)
        if self._inflight_end is None:
            self._apply_aborts()
        return True

    def advance_to(self, t_s: float) -> None:
        """Commit every step starting at or before ``t_s``; deliver requests finished by then."""
        while True:
            end = self._inflight_end
            if end is not None:
                if end > t_s:
                    return
                self._inflight_end = None
                self._next_start = end
                if self._first:
                    first, self._first = self._first, []
                    for req in first:
                        req.on_first_token(req)
                if self._done:
                    done, self._done = self._done, []
                    for req in done:
                        req.finish_s = end
                        if req.on_done is not None:
                            req.on_done(req)
            if self._aborts:
                self._apply_aborts()
            if self._flush_requested:
                self._apply_flush(self._next_start)
            if not self.running and not self.waiting:
                self._next_start = None
                return
            start = self._next_start
            if self._can_stretch():
                num_steps = self._stretch_len(start, t_s)
                if num_steps:
                    self._commit_stretch(start, num_steps)
                    continue
            self._step(start)

    def next_wakeup(self) -> Optional[float]:
        """When the engine next needs the clock, if nothing new arrives (None when idle)."""
        end = self._inflight_end
        if end is None:
            return None
        if self._done or self._first or self._flush_requested or self._aborts or not self._can_stretch():
            return end
        num_steps = self._stretch_len(end, None)
        if num_steps == 0:
            return end
        alpha, beta = self._stretch_coeffs()
        return end + alpha * num_steps + beta * num_steps * (num_steps - 1)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        return self.pool.usage()

    def _push_gap(self, first_step: int, longest_s: float) -> None:
        steps, gaps = self._gap_steps, self._gap_max_s
        while gaps and gaps[-1] <= longest_s:
            gaps.pop()
            steps.pop()
        steps.append(first_step)
        gaps.append(longest_s)

    # ------------------------------------------------------------------ decoders as aggregates
    def _add_decoder(self, req: SimRequest, g0: int) -> None:
        req.is_decoder = True
        req.g0 = g0
        req.nc0 = req.num_computed
        req.gen0 = req.generated
        req.residue = (g0 - req.nc0) % self.block_size
        self._residues[req.residue] += 1
        self.num_decoders += 1
        self._decoder_ctx_const += req.nc0 - g0 + 1
        heapq.heappush(self._finish_heap, (g0 + req.max_tokens - req.gen0 - 1, req.admit_seq, req))

    def _remove_decoder(self, req: SimRequest, g: int) -> None:
        """Take ``req`` out of the aggregates with its state as of the start of step ``g``."""
        req.is_decoder = False
        self._residues[req.residue] -= 1
        self.num_decoders -= 1
        self._decoder_ctx_const -= req.nc0 - req.g0 + 1
        steps = g - req.g0
        req.num_computed = req.nc0 + steps
        req.generated = req.gen0 + steps
        req.num_tokens = req.num_prompt_tokens + req.generated
        if steps > 0:
            # its tokens were sampled at the ends of steps g0 .. g-1, the last one just committed
            gap_s = self._gap_max_s[bisect.bisect_left(self._gap_steps, req.g0)]
            if not gap_s <= req.max_token_gap_s:
                req.max_token_gap_s = gap_s
            req.last_token_s = self._last_end_s

    def _stretch_coeffs(self) -> tuple[float, float]:
        """Step i of a pure-decode stretch from G lasts alpha + 2 * beta * i."""
        c = self.cost
        r = self.num_decoders
        alpha = c.t0_s + c.a_s_per_token * r + c.g_s_per_token * (self._decoder_ctx_const + r * self.step_index)
        return alpha, c.g_s_per_token * r / 2.0

    # ------------------------------------------------------------------ stretches
    def _can_stretch(self) -> bool:
        if self.jitter is not None:  # every step draws its own jitter
            return False
        if self.prefilling or not self.num_decoders or self._flush_requested or self._aborts or self.num_loading:
            return False
        if self.host is not None:
            return not self.waiting or self._offload_plan(self.waiting[0],
                                                          self.config.max_num_batched_tokens - self.num_decoders) in (None, ("skip",))
        return not self.waiting or self._admission_plan(self.waiting[0],
                                                        self.config.max_num_batched_tokens - self.num_decoders) is None

    def _stretch_len(self, start_s: float, limit_s: Optional[float]) -> int:
        """Pure-decode steps to commit: up to the first finish, before a block shortage, and
        (with ``limit_s``) only steps starting at or before ``limit_s``."""
        heap = self._finish_heap
        while heap and not _valid(heap[0]):
            heapq.heappop(heap)
        g = self.step_index
        num_steps = heap[0][0] - g + 1
        # blocks: r per full cycle of block_size steps, then the residues step by step
        r = self.num_decoders
        free = self.pool.num_free
        bs = self.block_size
        cycles = free // r
        if cycles * bs < num_steps:
            left = free - cycles * r
            i = 0
            res = self._residues
            base = g + cycles * bs
            while i < bs and res[(base + i) % bs] <= left:
                left -= res[(base + i) % bs]
                i += 1
            num_steps = min(num_steps, cycles * bs + i)
        if limit_s is not None and num_steps > 1:
            alpha, beta = self._stretch_coeffs()
            budget = limit_s - start_s  # steps i with T(i) = alpha*i + beta*i*(i-1) <= budget start in time
            if alpha > 0:  # zero-cost engines (load-generator benchmarks) run every step at once
                if beta > 0:
                    b1 = alpha - beta
                    i = int((-b1 + math.sqrt(b1 * b1 + 4 * beta * max(budget, 0.0))) / (2 * beta))
                else:
                    i = int(max(budget, 0.0) / alpha)
                while i > 0 and alpha * i + beta * i * (i - 1) > budget:
                    i -= 1
                while i + 1 < num_steps and alpha * (i + 1) + beta * (i + 1) * i <= budget:
                    i += 1
                num_steps = min(num_steps, i + 1)
        return num_steps

    def _commit_stretch(self, start_s: float, num_steps: int) -> None:
        g = self.step_index
        bs = self.block_size
        r = self.num_decoders
        cycles, rest = divmod(num_steps, bs)
        blocks = cycles * r + sum(self._residues[(g + cycles * bs + i) % bs] for i in range(rest))
        self.pool.allocate(blocks)
        alpha, beta = self._stretch_coeffs()
        self._inflight_end = start_s + alpha * num_steps + beta * num_steps * (num_steps - 1)
        self._last_end_s = self._inflight_end
        self._push_gap(g, alpha + 2 * beta * (num_steps - 1))  # its steps grow longer: the last is longest
        self.step_index = g + num_steps
        self.num_steps += num_steps
        self.generation_tokens_total += r * num_steps
        self._collect_finished(g + num_steps - 1)

    # ------------------------------------------------------------------ one general step
    def _step(self, start_s: float) -> None:
        cfg = self.config
        bs = self.block_size
        g = self.step_index
        budget = cfg.max_num_batched_tokens
        preempted = False
        if self.num_decoders:
            need = self._residues[g % bs]
            if need <= self.pool.num_free:
                self.pool.allocate(need)
            else:
                preempted = self._decode_with_shortage(g)
        r = self.num_decoders
        num_tokens = r
        budget -= r
        decode_ctx = self._decoder_ctx_const + r * g
        attention = 0.0
        completed: list[SimRequest] = []
        for req in list(self.prefilling):
            if budget <= 0:
                break
            if req.state != RUNNING:
                continue
            nc = req.num_computed
            n = min(req.num_tokens - nc, budget)
            if not cfg.reserve_full_prompt:
                need = -(-(nc + n) // bs) - req.alloc_blocks
                while need > self.pool.num_free:
                    victim = next(reversed(self.running))
                    self._preempt(victim, g)
                    preempted = True
                    if victim is req:
                        break
                if req.state != RUNNING:
                    break
                if need > 0:
                    self.pool.allocate(need)
                    req.alloc_blocks += need
            attention += n * (nc + n / 2)
            num_tokens += n
            budget -= n
            self._computed(req, nc + n)
            if req.num_computed == req.num_tokens:
                completed.append(req)
        if not preempted and self.host is not None:
            num_tokens, attention, budget = self._admit_waiting_offload(start_s, num_tokens, attention, budget,
                                                                        completed)
            landing = [r.load_done_s for r in self.waiting if r.state == LOADING] if num_tokens == 0 else None
            if landing:
                # nothing to compute, copies in flight: vLLM's empty steps poll until one lands
                self._inflight_end = max(start_s, min(landing))
                return
        elif not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = waiting[0]
                plan = self._admission_plan(req, budget)
                if plan is None:
                    break  # head-of-line blocking
                waiting.popleft()
                hit_tokens, n = self._admit(req, plan)
                attention += n * (hit_tokens + n / 2)
                num_tokens += n
                budget -= n
                if req.num_computed == req.num_tokens:
                    completed.append(req)
                else:
                    self.prefilling.append(req)
        step_s = self.cost.step_time(num_tokens, attention, decode_ctx)
        end = start_s + (step_s if self.jitter is None else step_s * self.jitter())
        self._inflight_end = end
        self._last_end_s = end
        self._push_gap(g, end - start_s)
        self.step_index = g + 1
        self.num_steps += 1
        self.generation_tokens_total += r + len(completed)
        self._collect_finished(g)
        for req in completed:
            if req in self.prefilling:
                self.prefilling.remove(req)
            req.generated += 1
            if req.last_token_s is not None:  # resumed after a preemption
                gap_s = end - req.last_token_s
                if not gap_s <= req.max_token_gap_s:
                    req.max_token_gap_s = gap_s
            req.last_token_s = end
            if req.first_token_s is None:
                req.first_token_s = end
                if req.on_first_token is not None:
                    self._first.append(req)
            if req.generated >= req.max_tokens:
                req.num_tokens = req.num_prompt_tokens + req.generated
                self._finish(req, req.num_computed)
            else:
                self._add_decoder(req, g + 1)

    def _decode_with_shortage(self, g: int) -> bool:
        """Too few free blocks for this step's decoders: allocate one by one in running order,
        preempting the last running request when one cannot get its block (vLLM's loop)."""
        bs = self.block_size
        preempted = False
        for req in list(self.running):
            if req.state != RUNNING or not req.is_decoder:
                continue
            if (g - req.residue) % bs:
                continue
            while self.pool.num_free < 1:
                victim = next(reversed(self.running))
                self._preempt(victim, g)
                preempted = True
                if victim is req:
                    break
            if req.state == RUNNING:
                self.pool.allocate(1)
        return preempted

    # ------------------------------------------------------------------ admission
    def _admission_plan(self, req: SimRequest, budget: int) -> Optional[tuple]:
        """(prefix hit, own hit, blocks to allocate, total blocks, tokens to schedule) if ``req``
        can be admitted now, else None."""
        if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return None
        bs = self.block_size
        num_tokens = req.num_tokens
        cap = (num_tokens - 1) // bs  # the last token is always computed
        own = req.stream
        prefix = req.prefix
        hit_prefix = hit_own = 0
        if self.caching:
            if req.segments is not None:
                hits, whole = _segment_hits(req.segments, cap)
                req.segment_hits = hits
                hit_prefix = sum(hits)
                if whole:
                    hit_own = min(own.cached, cap - own.base)
            elif prefix is not None:
                hit_prefix = min(prefix.cached, own.base, cap)
                if hit_prefix == own.base:
                    hit_own = min(own.cached, cap - own.base)
            else:
                hit_own = min(own.cached, cap)
        elif req.segments is not None:
            req.segment_hits = [0] * len(req.segments)
        hit_tokens = (hit_prefix + hit_own) * bs
        n = min(num_tokens - hit_tokens, budget)
        if self.config.reserve_full_prompt:
            total = -(-num_tokens // bs)
        else:
            total = -(-(hit_tokens + n) // bs)
        need = total - hit_prefix - hit_own
        evictable = hit_own if own.ref_cnt == 0 else 0
        if req.segments is not None:
            evictable += sum(h for seg, h in zip(req.segments, req.segment_hits) if seg.ref_cnt == 0)
        elif prefix is not None and prefix.ref_cnt == 0:
            evictable += hit_prefix
        if need + evictable > self.pool.num_free:
            return None
        return hit_prefix, hit_own, need, total, n

    def _admit(self, req: SimRequest, plan: tuple) -> tuple[int, int]:
        """Move the waiting head into the running list; returns (hit tokens, scheduled tokens)."""
        hit_prefix, hit_own, need, total, n = plan
        own = req.stream
        if own.ref_cnt:
            raise RuntimeError(f"stream {own.key!r} already has a request in the engine")
        prefix = req.prefix
        if req.segments is not None:
            req.segment_builders = [self.caching and seg.ref_cnt == 0 for seg in req.segments]
            req.is_builder = any(req.segment_builders)
            for seg, h in zip(req.segments, req.segment_hits):
                self.pool.acquire(seg, h)
        elif prefix is not None:
            req.is_builder = self.caching and prefix.ref_cnt == 0
            req.prefix_hit_blocks = hit_prefix
            self.pool.acquire(prefix, hit_prefix)
        self.pool.acquire(own, hit_own)
        self.pool.allocate(need)
        req.alloc_blocks = total
        hit_tokens = (hit_prefix + hit_own) * self.block_size
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = hit_tokens
        self.prefix_cache_queries += req.num_tokens
        self.prefix_cache_hits += hit_tokens
        self.running[req] = None
        req.state = RUNNING
        req.admit_seq = self._admit_seq
        self._admit_seq += 1
        self._computed(req, hit_tokens + n)
        return hit_tokens, n

    def _computed(self, req: SimRequest, num_computed: int) -> None:
        """Blocks are cached as soon as their tokens are scheduled (vLLM cache_blocks)."""
        req.num_computed = num_computed
        if req.is_builder and req.segments is not None:
            done = num_computed // self.block_size
            for seg, builds in zip(req.segments, req.segment_builders):
                full = min(done, seg.base + seg.num_blocks) - seg.base
                if builds and full > seg.cached:
                    seg.cached = full
        elif req.is_builder:
            prefix = req.prefix
            full = min(num_computed // self.block_size, req.stream.base)
            if full > prefix.cached:
                prefix.cached = full

    # ------------------------------------------------------------------ leaving the running set
    def _collect_finished(self, g: int) -> None:
        """Decoders whose last token is produced by step ``g`` finish at its end, in running order."""
        heap = self._finish_heap
        while heap:
            entry = heap[0]
            if not _valid(entry):
                heapq.heappop(heap)
                continue
            if entry[0] != g:
                if entry[0] < g:
                    raise AssertionError(f"decoder {entry[2]!r} should have finished at step {entry[0]} < {g}")
                return
            heapq.heappop(heap)
            req = entry[2]
            self._remove_decoder(req, g + 1)
            self._finish(req, req.num_computed)

    def _finish(self, req: SimRequest, kv_tokens: int) -> None:
        del self.running[req]
        self._release_blocks(req, kv_tokens)
        req.state = FINISHED
        self._done.append(req)

    def _preempt(self, req: SimRequest, g: int) -> None:
        if req.is_decoder:
            self._remove_decoder(req, g)
        else:
            self.prefilling.remove(req)
        del self.running[req]
        self._release_blocks(req, req.num_computed)
        req.num_computed = 0
        req.state = WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        if self.num_loading:
            # Behind the waiting requests that hold blocks (loading or loaded), not at the very front
            # as vLLM puts it: there it could wait, with nothing running, for blocks they hold while
            # they wait behind it, forever. They hold their whole prompt, so they always fit.
            i = 0
            while i < len(self.waiting) and (self.waiting[i].state == LOADING or self.waiting[i].loaded):
                i += 1
            self.waiting.insert(i, req)
        else:
            self.waiting.appendleft(req)

    def _release_blocks(self, req: SimRequest, kv_tokens: int) -> None:
        """Free in reverse block order (tail first): own partial blocks, own cached blocks, the
        prefix blocks this request computed without caching them, then the shared prefix."""
        bs = self.block_size
        pool = self.pool
        if self.host is not None:
            self._offload_store(req, kv_tokens)
        own = req.stream
        # a decoder holds exactly the blocks its KV needs; a prefill holds its reservation
        alloc = max(req.alloc_blocks, -(-kv_tokens // bs))
        base = own.base
        own_alloc = max(0, alloc - base)
        own_cached = max(0, kv_tokens // bs - base) if self.caching else 0
        pool.free_unhashed(own_alloc - own_cached)
        own.cached = own_cached
        pool.release(own)
        prefix = req.prefix
        if req.segments is not None:
            for seg, h, builds in reversed(list(zip(req.segments, req.segment_hits, req.segment_builders))):
                held = max(0, min(alloc, seg.base + seg.num_blocks) - seg.base)
                pool.free_unhashed(held - (seg.cached if builds else h))
                pool.release(seg)
        elif prefix is not None:
            held = min(alloc, base)
            if req.is_builder:
                pool.free_unhashed(held - prefix.cached)
            else:
                pool.free_unhashed(held - req.prefix_hit_blocks)
            pool.release(prefix)
        req.is_builder = False
        req.alloc_blocks = 0

    # ------------------------------------------------------------------ CPU offload tier
    def _offload_plan(self, req: SimRequest, budget: int) -> Optional[tuple]:
        """What admitting the waiting ``req`` would do now, or None if it cannot be admitted:
        ("resume", blocks to allocate, tokens) for a request whose host blocks have been loaded;
        ("load", prefix hit, own hit, blocks to allocate, total blocks, host blocks) when blocks
        after its GPU hit are in the host tier (vLLM get_num_new_matched_tokens: they are loaded,
        the request takes no tokens this step); else ("admit", <_admission_plan>)."""
        if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return None
        bs = self.block_size
        if req.loaded:
            nc = req.num_computed
            n = min(req.num_tokens - nc, budget)
            need = max(0, -(-(nc + n) // bs) - req.alloc_blocks)
            return None if need > self.pool.num_free else ("resume", need, n)
        plan = self._admission_plan(req, budget)
        own, prefix = req.stream, req.prefix
        hit_prefix = min(prefix.cached, own.base, (req.num_tokens - 1) // bs) if prefix is not None else 0
        hit_own = 0
        if prefix is None or hit_prefix == own.base:
            hit_own = min(own.cached, (req.num_tokens - 1) // bs - own.base)
        h = hit_prefix + hit_own
        k = self.host.lookup(prefix, own, h, req.num_tokens // bs)
        if k == 0:
            return None if plan is None else ("admit", plan)
        if self.host.any_pinned(prefix, own, h, h + k):
            return ("skip",)  # another request is loading some of these blocks: retry next step
        total = -(-req.num_tokens // bs)  # a load reserves the whole prompt (see _preempt)
        need = total - h
        evictable = hit_own if own.ref_cnt == 0 else 0
        if prefix is not None and prefix.ref_cnt == 0:
            evictable += hit_prefix
        if need + evictable > self.pool.num_free:
            return None
        return "load", hit_prefix, hit_own, need, total, k

    def _admit_waiting_offload(self, start_s: float, num_tokens: int, attention: float, budget: int,
                               completed: list) -> tuple[int, float, int]:
        """The waiting loop with a host tier: requests whose copy is in flight are skipped (they
        keep their place), a landed one is scheduled in place, head-of-line blocking otherwise."""
        waiting = self.waiting
        i = 0
        while i < len(waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = waiting[i]
            if req.state == LOADING:
                if req.load_done_s > start_s:
                    i += 1
                    continue
                self._finish_load(req)
            plan = self._offload_plan(req, budget)
            if plan is None:
                break  # head-of-line blocking
            if plan[0] == "skip":
                # vLLM retries it next step and lets the requests behind it go on; here it holds
                # the queue, so the requests holding blocks stay at its front (see _preempt)
                break
            if plan[0] == "load":
                self._start_load(req, plan[1:], start_s)
                i += 1
                continue
            del waiting[i]
            if plan[0] == "resume":
                _, need, n = plan
                self.num_loading -= 1
                req.loaded = False
                self.pool.allocate(need)
                req.alloc_blocks += need
                hit_tokens = req.num_computed
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = hit_tokens
                self.running[req] = None
                req.state = RUNNING
                req.admit_seq = self._admit_seq
                self._admit_seq += 1
                self._computed(req, hit_tokens + n)
            else:
                self.host.touch(req.prefix, req.stream, req.num_tokens // self.block_size)
                self.external_prefix_cache_queries += req.num_tokens
                hit_tokens, n = self._admit(req, plan[1])
            attention += n * (hit_tokens + n / 2)
            num_tokens += n
            budget -= n
            if req.num_computed == req.num_tokens:
                completed.append(req)
            else:
                self.prefilling.append(req)
        return num_tokens, attention, budget

    def _start_load(self, req: SimRequest, plan: tuple, start_s: float) -> None:
        """Allocate GPU blocks for the GPU hit and the host hit and start copying the host blocks."""
        hit_prefix, hit_own, need, total, k = plan
        bs = self.block_size
        own, prefix = req.stream, req.prefix
        if own.ref_cnt:
            raise RuntimeError(f"stream {own.key!r} already has a request in the engine")
        host = self.host
        host.touch(prefix, own, req.num_tokens // bs)
        if prefix is not None:
            req.is_builder = prefix.ref_cnt == 0
            req.prefix_hit_blocks = hit_prefix
            self.pool.acquire(prefix, hit_prefix)
        self.pool.acquire(own, hit_own)
        self.pool.allocate(need)
        req.alloc_blocks = total
        h = hit_prefix + hit_own
        host.pin(prefix, own, h, h + k)
        req.load_start, req.load_blocks = h, k
        req.store_from = h + k
        req.load_done_s = start_s + host.config.transfer_s(k, bs)
        req.state = LOADING
        self.num_loading += 1
        self.prefix_cache_queries += req.num_tokens
        self.prefix_cache_hits += h * bs
        self.external_prefix_cache_queries += req.num_tokens
        self.external_prefix_cache_hits += k * bs
        self.kv_offload_bytes_cpu_to_gpu += k * bs * host.config.kv_bytes_per_token

    def _finish_load(self, req: SimRequest) -> None:
        """The copy landed: the loaded blocks are computed (and cached); the last prompt token is
        always recomputed (vLLM _update_waiting_for_remote_kv)."""
        start, k = req.load_start, req.load_blocks
        self.host.unpin(req.prefix, req.stream, start, start + k)
        req.state = WAITING
        req.loaded = True
        self._computed(req, min((start + k) * self.block_size, req.num_tokens - 1))

    def _cancel_load(self, req: SimRequest) -> None:
        """Drop a waiting request's loaded or loading blocks (flush, abort): it starts over."""
        if req.state == LOADING:
            self.host.unpin(req.prefix, req.stream, req.load_start, req.load_start + req.load_blocks)
        self.num_loading -= 1
        kv_tokens = req.num_computed if req.loaded else req.load_start * self.block_size  # what is cached
        req.loaded = False
        self._release_blocks(req, kv_tokens)
        req.num_computed = 0
        req.state = WAITING

    def _offload_store(self, req: SimRequest, kv_tokens: int) -> None:
        """The request's full blocks from its next-store index on go to the host tier when it
        finishes or is preempted (when vLLM's stores become visible)."""
        end = kv_tokens // self.block_size
        if end <= req.store_from:
            return
        stored = self.host.store(req.prefix, req.stream, req.store_from, end)
        if stored is not None:
            req.store_from = end
            self.kv_offload_bytes_gpu_to_cpu += stored * self.block_size * self.host.config.kv_bytes_per_token

    def _apply_aborts(self) -> None:
        aborts, self._aborts = self._aborts, []
        g = self.step_index
        for req in aborts:
            if req.state == LOADING or req.loaded:
                self.waiting.remove(req)
                self._cancel_load(req)
            elif req.state == WAITING:
                self.waiting.remove(req)  # waiting requests hold no blocks (a preempted one freed them)
            elif req.state == RUNNING:
                if req.is_decoder:
                    self._remove_decoder(req, g)
                else:
                    self.prefilling.remove(req)
                del self.running[req]
                self._release_blocks(req, req.num_computed)
            else:
                continue
            req.state = FINISHED

    def _apply_flush(self, now_s: float) -> None:
        self._flush_requested = False
        g = self.step_index
        if self.num_loading:
            for req in self.waiting:
                if req.state == LOADING or req.loaded:
                    self._cancel_load(req)
        for req in reversed(list(self.running)):
            self._preempt(req, g)
        self.pool.reset(self.streams.values())
        self.flush_times_s.append(now_s)


def _segment_hits(segments: tuple, cap: int) -> tuple[list, bool]:
    """Blocks hit in each stream of a prefix chain (the lookup stops at the first miss, at most
    ``cap`` blocks), and whether the whole chain hit."""
    hits = []
    whole = True
    for seg in segments:
        h = max(0, min(seg.cached, seg.num_blocks, cap - seg.base)) if whole else 0
        hits.append(h)
        whole = h == seg.num_blocks
    return hits, whole


def _valid(entry: tuple) -> bool:
    _, seq, req = entry
    return req.state == RUNNING and req.is_decoder and req.admit_seq == seq
