"""A slow, literal vLLM-v1 engine: the reference the fast ``SimEngine`` is checked against.

Everything here is done the obvious way, one block and one step at a time, with no aggregates
and no closed forms, following vllm/v1/core/{block_pool,kv_cache_manager,sched/scheduler}.py:

* Blocks. ``num_blocks`` physical blocks; block 0 is the null block and is never handed out.
  Every block has a ``ref_cnt`` and an optional hash. The free queue is an ``OrderedDict`` that
  starts as blocks 1..n-1 in order. Allocation pops from its head and only then drops the
  block's old hash from the hash -> blocks map (lazy eviction). A request frees its block table
  in reverse order (tail first): each block's ref_cnt is decremented and the block is appended
  to the free-queue tail when it reaches 0. A cache hit "touches" blocks: ref_cnt + 1, and a
  block whose ref_cnt was 0 leaves the free queue.
* Token content. Token ``p`` of a request is ``(prefix key, p)`` when ``p`` lies in the shared
  prefix (``p < base_tokens`` of its own stream, and the request names a prefix stream) and
  ``(own stream key, p)`` otherwise: the shared prefix is the same for every request naming it,
  and a session's own stream is append-only across turns (outputs included). A full block's
  hash is ``intern((parent hash, tuple of its block_size token identities))``: a chained hash with no
  collisions. Only full blocks are hashed. The hash -> blocks map may hold several physical
  copies of one hash; a lookup takes the first one inserted (vLLM's ``get_one_block``).
* Hits (``get_computed_blocks``): the longest run of cached blocks from block 0, at most
  ``(num_tokens - 1) // block_size`` blocks. The counters ``prefix_cache_queries`` /
  ``prefix_cache_hits`` move once per admission (re-admission after preemption included),
  never on a failed admission attempt.
* Blocks are hashed as soon as the tokens filling them are scheduled (``cache_blocks`` at
  schedule time), outputs included; with prefix caching off nothing is ever hashed.
* Steps. Running requests first, in running order (a decode takes 1 token, a prefill
  ``min(remaining, budget)``); a request that cannot get its blocks preempts the last running
  request (and stops the running loop if that was itself). Then, only when nothing was
  preempted, waiting requests FCFS with head-of-line blocking.
* Time. A step's schedule is fixed at its start; its tokens are sampled at its end, when
  finished requests free their blocks and are delivered in running order. ``advance_to(t)``
  runs every step starting at or before ``t``; ``next_wakeup()`` is simply the end of the step
  in flight. At a step's end, ``on_first_token`` callbacks (if a request has one) run before
  ``on_done`` callbacks, each in running order.

* Step time: ``cost.step_time(tokens scheduled, sum over prefill chunks n * (c + n / 2), sum
  over decodes (num_computed + 1))``, plus ``mixed_decode_s_per_token`` x that decode sum when a
  prefill chunk is scheduled beside the decodes; a request decodes once it has sampled a token
  since its (re)admission, otherwise its tokens are a prefill chunk (a resumed request included).

Two conventions follow the project's spec rather than vLLM 0.11's code, on purpose (both engines
share them): vLLM bumps the prefix-cache counters on every ``get_computed_blocks`` call, so a
head-of-line-blocked request is counted again at every step it is retried, and with prefix
caching disabled it counts no queries at all; here queries and hits move once per admission,
and queries count even with caching off.

It shares ``EngineConfig``, ``SimRequest`` and ``StepCostModel`` with the fast engine and
implements the same public surface; only keys (never the fast engine's stream counters) are
read from the streams it is given.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Hashable, Optional

from loadgen.sim.cost import StepCostModel
from loadgen.sim.request import EngineConfig, SimRequest

WAITING, RUNNING, FINISHED, LOADING = 0, 1, 2, 3


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class RefStream:
    """A token stream: its key and where its own tokens start (after a shared prefix)."""

    __slots__ = ("key", "base", "base_tokens")

    def __init__(self, key: Hashable, base_tokens: int, block_size: int) -> None:
        self.key = key
        self.base_tokens = base_tokens
        self.base = base_tokens // block_size  # full prefix blocks, like the fast engine's Stream

    def __repr__(self) -> str:
        return f"RefStream({self.key!r}, base_tokens={self.base_tokens})"


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Optional[int] = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class RefState:
    """Everything the reference keeps about one request (SimRequest has fixed slots)."""

    __slots__ = ("req", "num_tokens", "num_computed", "blocks", "num_cached_blocks", "block_hashes",
                 "prefill_done",
                 "store_from", "load_start", "load_blocks", "load_done_s", "loaded")

    def __init__(self, req: SimRequest) -> None:
        self.req = req
        self.num_tokens = req.num_prompt_tokens  # prompt + generated so far
        self.num_computed = 0
        self.blocks: list[Block] = []  # the block table
        self.num_cached_blocks = 0  # leading blocks of the table that carry their hash
        self.block_hashes: list[int] = []  # hash of each full block of the token stream so far
        self.prefill_done = False  # sampled since (re)admission: from now on it decodes
        # CPU offload (vLLM OffloadingConnectorScheduler): next block index to store, the blocks
        # being loaded, when their copy lands, whether the request waits with them loaded
        self.store_from = 0
        self.load_start = self.load_blocks = 0
        self.load_done_s = 0.0
        self.loaded = False


class ReferenceEngine:
    """vLLM v1, block by block and step by step. Same public surface as ``SimEngine``."""

    def __init__(self, config: EngineConfig, cost: StepCostModel) -> None:
        if config.max_num_batched_tokens < 1 or config.max_num_seqs < 1 or config.block_size < 1:
            raise ValueError("block_size, max_num_batched_tokens and max_num_seqs must be >= 1")
        if config.num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is vLLM's null block), got {config.num_blocks}")
        self.config = config
        self.cost = cost
        self.block_size = config.block_size
        self.caching = config.enable_prefix_caching
        self.blocks = [Block(i) for i in range(config.num_blocks)]  # blocks[0] is the null block
        self.num_usable = config.num_blocks - 1
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, config.num_blocks))
        self.cached: dict[int, dict[int, None]] = {}  # block hash -> block ids holding it, insertion order
        self._intern: dict[tuple, int] = {}  # (parent hash, token identities) -> hash id
        self.streams: dict[Hashable, RefStream] = {}
        self.states: dict[SimRequest, RefState] = {}
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._inflight_end: Optional[float] = None
        self._inflight: list[tuple[RefState, int]] = []  # (request, tokens) scheduled by the step in flight
        self._next_start: Optional[float] = None
        self._flush_requested = False
        self._aborts: list[SimRequest] = []
        self.flush_times_s: list[float] = []
        # The CPU tier, as vllm/v1/kv_offload/lru_manager.py: block hash -> ref_cnt (loads in
        # flight), in LRU order; capacity config.offload.cpu_blocks.
        self.offload = config.offload
        if self.offload is not None and not self.caching:
            raise ValueError("the CPU offload tier needs prefix caching (blocks are found by their hashes)")
        self.host: OrderedDict[int, int] = OrderedDict()
        # Copy jobs as vllm/v1/kv_offload/worker/cpu_gpu.py runs them: one handler per direction,
        # each job's stream waiting for the end event of the direction's previous job. Every job
        # (direction, submitted, start, end) per link; with offload.shared_link both directions use "to_gpu".
        self.copy_jobs: dict[str, list[tuple[str, float, float, float]]] = {"to_gpu": [], "to_host": []}
        self._clock_s = 0.0  # when what is being applied happens (a store is submitted then)
        self.external_prefix_cache_queries = 0
        self.external_prefix_cache_hits = 0
        self.kv_offload_bytes_gpu_to_cpu = 0
        self.kv_offload_bytes_cpu_to_gpu = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_steps = 0

    # ------------------------------------------------------------------ public surface
    def prefix_stream(self, key: Hashable, num_tokens: int) -> RefStream:
        """A shared prefix is named by its key AND length (as SimEngine.prefix_stream): the key
        becomes the tokens' identity, so other lengths are other contents."""
        return self.stream(("prefix", key, num_tokens // self.block_size), 0)

    def stream(self, key: Hashable, base_tokens: int = 0) -> RefStream:
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = RefStream(key, base_tokens, self.block_size)
        elif stream.base != base_tokens // self.block_size:
            raise ValueError(f"stream {key!r} was used after {stream.base} shared blocks, "
                             f"now after {base_tokens // self.block_size}")
        return stream

    def validate(self, num_prompt_tokens: int, max_tokens: int) -> Optional[str]:
        if num_prompt_tokens < 1 or max_tokens < 1:
            return f"prompt_tokens and max_tokens must be >= 1 (got {num_prompt_tokens}, {max_tokens})"
        total = num_prompt_tokens + max_tokens
        if total > self.config.max_model_len:
            return (f"This model's maximum context length is {self.config.max_model_len} tokens; "
                    f"the request asks for {total} ({num_prompt_tokens} prompt + {max_tokens} output)")
        if cdiv(total, self.block_size) > self.num_usable:
            return f"the request needs {total} tokens of KV but the pool holds {self.num_usable * self.block_size}"
        return None

    def submit(self, request: SimRequest, now_s: float) -> None:
        reason = self.validate(request.num_prompt_tokens, request.max_tokens)
        if reason is not None:
            raise ValueError(reason)
        if request.prefix is not None and request.prefix.base != 0:
            raise ValueError("a prefix stream must start at block 0")
        self.advance_to(now_s)
        request.arrival_s = now_s
        request.state = WAITING
        self.prompt_tokens_total += request.num_prompt_tokens
        self.states[request] = RefState(request)
        self.waiting.append(request)
        if self._inflight_end is None:
            self._next_start = now_s
            self.advance_to(now_s)

    def flush(self, now_s: float) -> None:
        """Preempt every running request at the next step boundary, then drop every hash."""
        self.advance_to(now_s)
        self._flush_requested = True
        if self._inflight_end is None:
            self._apply_flush(now_s)

    def abort(self, request: SimRequest, now_s: float) -> bool:
        """Drop ``request`` at the next step boundary (vLLM's engine core handles aborts between
        steps): out of the waiting queue, or out of the running list with its block table freed
        tail first, hashes kept. A request the step in flight finishes is delivered instead."""
        self.advance_to(now_s)
        if request.state == FINISHED or any(
                st.req is request and st.num_computed >= st.num_tokens and request.generated + 1 >= request.max_tokens
                for st, _n in self._inflight):  # its last token is being sampled by the step in flight
            return False
        self._aborts.append(request)
        if self._inflight_end is None:
            self._clock_s = now_s
            self._apply_aborts()
        return True

    def advance_to(self, t_s: float) -> None:
        while True:
            if self._inflight_end is not None:
                end = self._inflight_end
                if end > t_s:
                    return
                first, done = self._end_step()
                self._inflight_end = None
                self._next_start = end
                for req in first:
                    req.on_first_token(req)
                for req in done:
                    req.finish_s = end
                    if req.on_done is not None:
                        req.on_done(req)
            if self._aborts:
                self._clock_s = self._next_start
                self._apply_aborts()
            if self._flush_requested:
                self._apply_flush(self._next_start)
            if not self.running and not self.waiting:
                self._next_start = None
                return
            self._start_step(self._next_start)

    def next_wakeup(self) -> Optional[float]:
        return self._inflight_end

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_usable

    # ------------------------------------------------------------------ token content and hashes
    def _token(self, req: SimRequest, pos: int) -> tuple:
        own = req.stream
        if req.prefix is not None and pos < getattr(own, "base_tokens", own.base * self.block_size):
            return (req.prefix.key, pos)
        return (own.key, pos)

    def _hashes(self, st: RefState, num_blocks: int) -> list[int]:
        """The chained hashes of the request's first ``num_blocks`` full blocks."""
        bs = self.block_size
        if num_blocks * bs > st.num_tokens:
            raise AssertionError("hashing a block whose tokens do not exist yet")
        hashes = st.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else -1
            content = (parent, tuple(self._token(st.req, p) for p in range(i * bs, (i + 1) * bs)))
            h = self._intern.get(content)
            if h is None:
                h = self._intern[content] = len(self._intern)
            hashes.append(h)
        return hashes

    # ------------------------------------------------------------------ block pool
    def _get_computed_blocks(self, st: RefState) -> list[Block]:
        if not self.caching:
            return []
        max_blocks = (st.num_tokens - 1) // self.block_size
        hit: list[Block] = []
        for h in self._hashes(st, max_blocks):
            copies = self.cached.get(h)
            if not copies:
                break
            hit.append(self.blocks[next(iter(copies))])
        return hit

    def _touch(self, blocks: list[Block]) -> None:
        for blk in blocks:
            if blk.ref_cnt == 0:
                del self.free_queue[blk.block_id]
            blk.ref_cnt += 1

    def _get_new_blocks(self, n: int) -> list[Block]:
        if n > len(self.free_queue):
            raise AssertionError(f"allocating {n} blocks with {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block_id, _ = self.free_queue.popitem(last=False)
            blk = self.blocks[block_id]
            assert blk.ref_cnt == 0 and block_id != 0
            if blk.block_hash is not None:  # lazy eviction
                copies = self.cached[blk.block_hash]
                del copies[block_id]
                if not copies:
                    del self.cached[blk.block_hash]
                blk.block_hash = None
            blk.ref_cnt = 1
            out.append(blk)
        return out

    def _free_request_blocks(self, st: RefState) -> None:
        for blk in reversed(st.blocks):
            blk.ref_cnt -= 1
            assert blk.ref_cnt >= 0
            if blk.ref_cnt == 0:
                self.free_queue[blk.block_id] = None
        st.blocks = []
        st.num_cached_blocks = 0

    def _cache_blocks(self, st: RefState) -> None:
        """Hash the request's blocks that its scheduled tokens have filled."""
        if not self.caching:
            return
        full = min(st.num_computed, st.num_tokens) // self.block_size
        if full <= st.num_cached_blocks:
            return
        hashes = self._hashes(st, full)
        for i in range(st.num_cached_blocks, full):
            blk = st.blocks[i]
            assert blk.block_hash is None, "caching a block that already holds a hash"
            blk.block_hash = hashes[i]
            self.cached.setdefault(hashes[i], {})[blk.block_id] = None
        st.num_cached_blocks = full

    def _allocate_slots(self, st: RefState, num_tokens_need_slot: int) -> bool:
        """Grow the block table to hold ``num_tokens_need_slot`` tokens, if the pool allows."""
        need = cdiv(num_tokens_need_slot, self.block_size) - len(st.blocks)
        if need > len(self.free_queue):
            return False
        if need > 0:
            st.blocks.extend(self._get_new_blocks(need))
        return True

    # ------------------------------------------------------------------ one step
    def _start_step(self, start_s: float) -> None:
        self._clock_s = start_s
        cfg = self.config
        bs = self.block_size
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[RefState, int]] = []
        num_tokens = 0
        attention = 0.0
        decode_ctx = 0
        preempted = False

        # 1. running requests, in running order
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            st = self.states[req]
            n = min(st.num_tokens - st.num_computed, budget)
            assert n > 0
            can_schedule = True
            while not self._allocate_slots(st, st.num_computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    can_schedule = False
                    break
            if not can_schedule:
                break
            if st.prefill_done:
                assert n == 1
                decode_ctx += st.num_computed + 1
            else:
                attention += n * (st.num_computed + n / 2)
            num_tokens += n
            budget -= n
            st.num_computed += n
            self._cache_blocks(st)
            scheduled.append((st, n))
            i += 1

        # 2. waiting requests, FCFS, only if nothing was preempted
        if not preempted and self.offload is not None:
            num_tokens, attention, budget = self._schedule_waiting_offload(start_s, scheduled, num_tokens,
                                                                           attention, budget)
            if num_tokens == 0 and any(r.state == LOADING for r in self.waiting):
                self._inflight = []
                self._inflight_end = max(start_s, min(self.states[r].load_done_s for r in self.waiting
                                                      if r.state == LOADING))
                return
        elif not preempted:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.waiting[0]
                st = self.states[req]
                hit = self._get_computed_blocks(st)
                hit_tokens = len(hit) * bs
                n = min(st.num_tokens - hit_tokens, budget)
                if cfg.reserve_full_prompt:
                    total = cdiv(st.num_tokens, bs)
                else:
                    total = cdiv(hit_tokens + n, bs)
                need = total - len(hit)
                evictable = sum(1 for blk in hit if blk.ref_cnt == 0)
                if need + evictable > len(self.free_queue):
                    break  # head-of-line blocking
                self.waiting.popleft()
                self._touch(hit)
                st.blocks = list(hit) + self._get_new_blocks(need)
                st.num_cached_blocks = len(hit)
                st.num_computed = hit_tokens
                st.prefill_done = False
                self.prefix_cache_queries += st.num_tokens
                self.prefix_cache_hits += hit_tokens
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = hit_tokens
                req.state = RUNNING
                self.running.append(req)
                attention += n * (hit_tokens + n / 2)
                num_tokens += n
                budget -= n
                st.num_computed += n
                self._cache_blocks(st)
                scheduled.append((st, n))

        self._inflight = scheduled
        # vLLM runs the attention of a step with a prefill chunk in it on another path than a
        # decode-only step's: its decodes pay the mixed-step term on top of g
        num_decodes = sum(1 for st, _ in scheduled if st.prefill_done)
        step_s = self.cost.step_time(num_tokens, attention, decode_ctx, 0.0, num_decodes)
        if len(scheduled) > num_decodes:
            step_s += self.cost.mixed_decode_s_per_token * decode_ctx
        self._inflight_end = start_s + step_s
        self.num_steps += 1

    def _end_step(self) -> tuple[list[SimRequest], list[SimRequest]]:
        """The step's tokens are sampled; finished requests free their blocks, in running order.
        Returns (requests whose first token this was and that want ``on_first_token``, finished)."""
        self._clock_s = self._inflight_end
        first = []
        for st, _n in self._inflight:
            if st.num_computed < st.num_tokens:
                continue  # a partial prefill chunk samples nothing
            req = st.req
            st.prefill_done = True
            req.generated += 1
            st.num_tokens += 1
            self.generation_tokens_total += 1
            # every token's sampling time, one at a time: the gap since the previous token
            if req.last_token_s is not None:
                gap_s = self._inflight_end - req.last_token_s
                if not gap_s <= req.max_token_gap_s:
                    req.max_token_gap_s = gap_s
            req.last_token_s = self._inflight_end
            if req.first_token_s is None:
                req.first_token_s = self._inflight_end
                if getattr(req, "on_first_token", None) is not None:
                    first.append(req)
        self._inflight = []
        done = []
        for req in list(self.running):
            if req.generated >= req.max_tokens:
                st = self.states[req]
                self.running.remove(req)
                self._host_store(st)
                self._free_request_blocks(st)
                req.state = FINISHED
                req.num_tokens = st.num_tokens
                req.num_computed = st.num_computed
                del self.states[req]
                done.append(req)
        return first, done

    # ------------------------------------------------------------------ CPU offload tier
    def _host_touch(self, hashes: list[int]) -> None:
        """LRUOffloadingManager.touch: reversed, so the request's first block is the most recent."""
        for h in reversed(hashes):
            if h in self.host:
                self.host.move_to_end(h)

    def _host_lookup(self, hashes: list[int]) -> int:
        hits = 0
        for h in hashes:
            if h not in self.host:
                break
            hits += 1
        return hits

    def _host_store(self, st: RefState) -> None:
        """prepare_store + complete_store of the request's full blocks from its next-store index:
        filter resident ones, evict LRU blocks no load holds (all or nothing), append, touch."""
        if self.offload is None:
            return
        end = min(st.num_computed, st.num_tokens) // self.block_size
        if end <= st.store_from:
            return
        hashes = self._hashes(st, end)
        new = [h for h in hashes[st.store_from:end] if h not in self.host]
        if new:
            to_evict = len(new) - (self.offload.cpu_blocks - len(self.host))
            if to_evict > 0:
                victims = [h for h, ref_cnt in self.host.items() if ref_cnt == 0][:to_evict]
                if len(victims) < to_evict:
                    return  # cannot store: retried at the next store
                for h in victims:
                    del self.host[h]
            for h in new:
                self.host[h] = 0
            self._copy("to_host", self._clock_s, len(new))
            self._host_touch(hashes[:end])
            self.kv_offload_bytes_gpu_to_cpu += len(new) * self.block_size * self.offload.kv_bytes_per_token
        st.store_from = end

    def _copy(self, direction: str, now_s: float, num_blocks: int) -> float:
        """Submit a copy of ``num_blocks`` blocks at ``now_s``; returns when it lands."""
        jobs = self.copy_jobs["to_gpu" if self.offload.shared_link else direction]
        start = now_s
        if jobs and jobs[-1][3] > start:
            start = jobs[-1][3]  # stream.wait_event(previous job's end event)
        end = start + self.offload.latency_s + (num_blocks * self.block_size * self.offload.kv_bytes_per_token
                                                / self.offload.bandwidth_bytes_per_s)
        jobs.append((direction, now_s, start, end))
        return end

    def _cancel_load(self, st: RefState) -> None:
        req = st.req
        if req.state == LOADING:
            for h in st.block_hashes[st.load_start:st.load_start + st.load_blocks]:
                self.host[h] -= 1
        self._free_request_blocks(st)
        st.loaded = False
        st.num_computed = 0
        req.state = WAITING

    def _schedule_waiting_offload(self, start_s: float, scheduled: list, num_tokens: int, attention: float,
                                  budget: int) -> tuple[int, float, int]:
        """vLLM's waiting loop with the offloading connector: a request whose copy is in flight is
        skipped and keeps its place; one whose copy landed continues from the loaded blocks; a fresh
        one looks up the host tier after its GPU hit and, on a hit, is parked while it loads."""
        cfg = self.config
        bs = self.block_size
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[i]
            st = self.states[req]
            if req.state == LOADING:
                if st.load_done_s > start_s:
                    i += 1
                    continue
                for h in st.block_hashes[st.load_start:st.load_start + st.load_blocks]:
                    self.host[h] -= 1
                req.state = WAITING
                st.loaded = True
                st.num_computed = min((st.load_start + st.load_blocks) * bs, st.num_tokens - 1)
                self._cache_blocks(st)
            if st.loaded:
                nc = st.num_computed
                n = min(st.num_tokens - nc, budget)
                if not self._allocate_slots(st, nc + n):
                    break
                st.loaded = False
                hit_tokens = nc
            else:
                hit = self._get_computed_blocks(st)
                h = len(hit)
                hashes = self._hashes(st, st.num_tokens // bs)
                k = self._host_lookup(hashes[h:])
                if k and any(self.host[hh] > 0 for hh in hashes[h:h + k]):
                    break  # vLLM _blocks_being_loaded: another request loads some of them (SimEngine says why)
                if cfg.reserve_full_prompt or k:  # a load reserves the whole prompt
                    total = cdiv(st.num_tokens, bs)
                else:
                    total = cdiv(h * bs + min(st.num_tokens - h * bs, budget), bs)
                need = total - h
                evictable = sum(1 for blk in hit if blk.ref_cnt == 0)
                if need + evictable > len(self.free_queue):
                    break  # head-of-line blocking
                self._host_touch(hashes)
                self._touch(hit)
                st.blocks = list(hit) + self._get_new_blocks(need)
                st.num_cached_blocks = h
                st.prefill_done = False
                self.prefix_cache_queries += st.num_tokens
                self.prefix_cache_hits += h * bs
                self.external_prefix_cache_queries += st.num_tokens
                if k:
                    for hh in hashes[h:h + k]:
                        self.host[hh] += 1
                    st.load_start, st.load_blocks = h, k
                    st.store_from = h + k
                    st.num_computed = 0
                    st.load_done_s = self._copy("to_gpu", start_s, k)
                    req.state = LOADING
                    self.external_prefix_cache_hits += k * bs
                    self.kv_offload_bytes_cpu_to_gpu += k * bs * self.offload.kv_bytes_per_token
                    i += 1
                    continue
                hit_tokens = h * bs
                st.num_computed = hit_tokens
                n = min(st.num_tokens - hit_tokens, budget)
            del self.waiting[i]
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = hit_tokens
            req.state = RUNNING
            self.running.append(req)
            attention += n * (hit_tokens + n / 2)
            num_tokens += n
            budget -= n
            st.num_computed += n
            self._cache_blocks(st)
            scheduled.append((st, n))
        return num_tokens, attention, budget

    def _preempt(self, req: SimRequest) -> None:
        st = self.states[req]
        self._host_store(st)
        self._free_request_blocks(st)
        st.num_computed = 0
        st.prefill_done = False
        req.state = WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        # behind waiting requests that hold blocks (loading or loaded): SimEngine._preempt says why
        i = 0
        while i < len(self.waiting) and (self.waiting[i].state == LOADING or self.states[self.waiting[i]].loaded):
            i += 1
        self.waiting.insert(i, req)

    def _apply_aborts(self) -> None:
        aborts, self._aborts = self._aborts, []
        for req in aborts:
            if req.state == LOADING or (req.state == WAITING and self.states[req].loaded):
                self.waiting.remove(req)
                self._cancel_load(self.states[req])
            elif req.state == WAITING:
                self.waiting.remove(req)
            elif req.state == RUNNING:
                self.running.remove(req)
                self._host_store(self.states[req])
                self._free_request_blocks(self.states[req])
            else:
                continue
            del self.states[req]
            req.state = FINISHED

    def _apply_flush(self, now_s: float) -> None:
        self._flush_requested = False
        self._clock_s = now_s
        for req in self.waiting:
            if req.state == LOADING or self.states[req].loaded:
                self._cancel_load(self.states[req])
        while self.running:
            self._preempt(self.running.pop())
        assert len(self.free_queue) == self.num_usable
        for blk in self.blocks:
            blk.block_hash = None
        self.cached.clear()
        self.flush_times_s.append(now_s)

    # ------------------------------------------------------------------ checks for tests
    def check_invariants(self) -> None:
        """Every block is free xor referenced; ref counts and the hash map are consistent."""
        refs = [0] * len(self.blocks)
        for st in self.states.values():
            for blk in st.blocks:
                refs[blk.block_id] += 1
        for blk in self.blocks[1:]:
            assert blk.ref_cnt == refs[blk.block_id], blk
            assert (blk.ref_cnt == 0) == (blk.block_id in self.free_queue), blk
        for h, copies in self.cached.items():
            assert copies
            for block_id in copies:
                assert self.blocks[block_id].block_hash == h
        assert sum(len(c) for c in self.cached.values()) == sum(b.block_hash is not None for b in self.blocks)
