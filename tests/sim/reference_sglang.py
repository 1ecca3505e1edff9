"""A slow, literal SGLang engine: the reference the fast ``SGLangEngine`` is checked against.

Everything is done the obvious way, with real token lists and one step at a time, following
SGLang 0.5.x's python/sglang/srt/mem_cache/radix_cache.py and managers/{scheduler,
schedule_policy,schedule_batch}.py:

* Tokens. Token ``p`` of a request is ``("p", prefix key, p)`` inside its shared prefix and
  ``("s", stream key, p)`` after it; a session's stream is append-only across turns.
* The radix tree holds lists of tokens per node. ``match_prefix`` compares token by token (page
  by page), stamps every node on the path with one new access time and splits a node the match
  ends inside; ``insert`` does the same and adds the rest as one new leaf; ``evict`` builds a heap
  of every unlocked leaf on each call (as SGLang does) and pops by access time.
* Slots: a free count; a request holds ``kv_len - prefix_len`` slots of its own beside its
  locked tree nodes.
* Steps: a prefill batch when the PrefillAdder admits anything, else one decode step of the
  whole running batch with SGLang's memory check, retraction and new-token-ratio decay; the
  ratio is ``max(base - steps x decay, min)`` (the fast engine's closed form, computed here
  after every step).
"""

from __future__ import annotations

import heapq
import math
from typing import Hashable, Optional

from loadgen.sim.cost import StepCostModel
from loadgen.sim.request import FINISHED, RUNNING, WAITING, SimRequest
from loadgen.sim.kv_pool import Stream
from loadgen.sim.sglang_engine import SGLangConfig


class TNode:
    def __init__(self, parent, key: list, access: int, nid: int) -> None:
        self.parent = parent
        self.key = key
        self.children: dict = {}
        self.lock_ref = 0
        self.access = access
        self.nid = nid


class RefTree:
    def __init__(self, page: int) -> None:
        self.page = page
        self.reset()

    def reset(self) -> None:
        self.clock = 0
        self.nid = 0
        self.root = TNode(None, [], 0, 0)
        self.root.lock_ref = 1

    def _child_key(self, key: list):
        return tuple(key[:self.page])

    def _match_len(self, a: list, b: list) -> int:
        n = 0
        while n + self.page <= min(len(a), len(b)) and a[n:n + self.page] == b[n:n + self.page]:
            n += self.page
        return n

    def _split(self, child: TNode, n: int) -> TNode:
        self.nid += 1
        top = TNode(child.parent, child.key[:n], child.access, self.nid)
        top.lock_ref = child.lock_ref
        child.parent.children[self._child_key(child.key)] = top
        child.key = child.key[n:]
        top.children[self._child_key(child.key)] = child
        child.parent = top
        return top

    def match(self, key: list):
        key = key[:len(key) // self.page * self.page]
        self.clock += 1
        node = self.root
        node.access = self.clock
        matched = 0
        while key and self._child_key(key) in node.children:
            child = node.children[self._child_key(key)]
            child.access = self.clock
            n = self._match_len(child.key, key)
            if n < len(child.key):
                node = self._split(child, n)
                matched += n
                break
            matched += n
            node = child
            key = key[n:]
        return matched, node

    def insert(self, key: list) -> int:
        key = key[:len(key) // self.page * self.page]
        self.clock += 1
        node = self.root
        node.access = self.clock
        total = 0
        while key and self._child_key(key) in node.children:
            node = node.children[self._child_key(key)]
            node.access = self.clock
            n = self._match_len(node.key, key)
            total += n
            key = key[n:]
            if n < len(node.key):
                node = self._split(node, n)
        if key:
            self.nid += 1
            new = TNode(node, list(key), self.clock, self.nid)
            node.children[self._child_key(key)] = new
        return total

    def inc(self, node: TNode) -> None:
        while node is not self.root:
            node.lock_ref += 1
            node = node.parent

    def dec(self, node: TNode) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            node = node.parent

    def nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def evictable_size(self) -> int:
        return sum(len(n.key) for n in self.nodes() if n is not self.root and n.lock_ref == 0)

    def total_size(self) -> int:
        return sum(len(n.key) for n in self.nodes())

    def evict(self, num_tokens: int) -> int:
        heap = [(n.access, n.nid, n) for n in self.nodes()
                if n is not self.root and not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            freed += len(x.key)
            del x.parent.children[self._child_key(x.key)]
            if not x.parent.children and x.parent.lock_ref == 0:
                heapq.heappush(heap, (x.parent.access, x.parent.nid, x.parent))
        return freed


class RReq:
    def __init__(self, req: SimRequest, tokens_of) -> None:
        self.req = req
        self.tokens_of = tokens_of  # position -> token
        self.output = 0
        self.prefix_len = 0  # len(prefix_indices)
        self.protected = 0  # cache_protected_len
        self.last_node = None
        self.kv_len = 0
        self.already_computed = 0
        self.cached = 0
        self.match_len = 0
        self.match_node = None
        self.last_token_s = None
        self.max_gap = math.nan
        self.retracted = False  # overlap: retracted while the last batch's results were unprocessed

    def tokens(self, n: int) -> list:
        return [self.tokens_of(p) for p in range(n)]

    @property
    def fill(self) -> int:
        return self.req.num_prompt_tokens + self.output


class ReferenceSGLang:
    flavor = "sglang"

    def __init__(self, config: SGLangConfig, cost: StepCostModel) -> None:
        self.config = config
        self.cost = cost
        self.page = self.block_size = config.page_size
        self.tree = RefTree(config.page_size)
        self.available = config.pool_tokens
        self.streams: dict = {}
        self.waiting: list = []
        self.running: list = []
        self.chunked = None
        self.all: dict = {}
        self.batch_is_full = False
        self.shrunk = False
        self.ratio_base = config.init_new_token_ratio
        self.ratio_steps = 0
        self.inflight_end = None
        self.next_start = None
        self.done: list = []
        self.first: list = []
        self.flush_pending = False
        self.flush_times_s: list = []
        self.prefix_cache_queries = self.prefix_cache_hits = self.num_preemptions = 0
        self.prompt_tokens_total = self.generation_tokens_total = self.num_steps = 0
        # overlap schedule: the last batch's results, processed after the next batch is launched
        self.overlap = config.overlap_schedule
        self.hidden = cost.hidden_cpu_s if config.overlap_schedule else 0.0
        self.cold = True
        self.results = None
        self.num_dropped_tokens = 0  # tokens of retracted requests never processed (overlap)

    # ------------------------------------------------------------------ surface
    def stream(self, key: Hashable, base_tokens: int = 0) -> Stream:
        base = base_tokens - base_tokens % self.page
        s = self.streams.get(key)
        if s is None:
            s = self.streams[key] = Stream(key, base)
        return s

    def prefix_stream(self, key: Hashable, num_tokens: int) -> Stream:
        aligned = num_tokens - num_tokens % self.page
        k = ("prefix", key, aligned)
        s = self.streams.get(k)
        if s is None:
            s = self.streams[k] = Stream(k, 0, aligned)
        return s

    def submit(self, req: SimRequest, now: float) -> None:
        self.advance_to(now)
        req.arrival_s = now
        self.prompt_tokens_total += req.num_prompt_tokens
        prefix, own = req.prefix, req.stream
        plen = own.base if prefix is not None else 0
        pkey = prefix.key if prefix is not None else None

        def tokens_of(p: int, pkey=pkey, plen=plen, okey=own.key):
            return ("p", pkey, p) if p < plen else ("s", okey, p)

        r = RReq(req, tokens_of)
        self.all[req] = r
        self.waiting.append(r)
        if self.inflight_end is None:
            self.next_start = now
            self.advance_to(now)

    def flush(self, now: float) -> None:
        self.advance_to(now)
        if not self.try_flush(now):
            self.flush_pending = True

    def try_flush(self, now: float) -> bool:
        self.advance_to(now)
        if self.inflight_end is not None or self.all:
            return False
        self._flush(now)
        return True

    def _flush(self, now: float) -> None:
        self.flush_pending = False
        self.tree.reset()
        self.available = self.config.pool_tokens
        self.ratio_base = self.config.init_new_token_ratio
        self.ratio_steps = 0
        self.flush_times_s.append(now)

    def advance_to(self, t: float) -> None:
        while True:
            if self.inflight_end is not None:
                if self.inflight_end > t:
                    return
                end = self.inflight_end
                self.inflight_end = None
                self.next_start = end
                self._deliver(end)
            if not self.all:
                if self.flush_pending and self.next_start is not None:
                    self._flush(self.next_start)
                self.next_start = None
                self.cold = True
                return
            self._iteration(self.next_start)

    def _deliver(self, end: float) -> None:
        first, self.first = self.first, []
        for req in first:
            req.on_first_token(req)
        done, self.done = self.done, []
        for req in done:
            req.finish_s = end
            if req.on_done is not None:
                req.on_done(req)

    def next_wakeup(self) -> Optional[float]:
        return self.inflight_end

    @property
    def num_running(self) -> int:
        return len(self.all) - len(self.waiting)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        return 1.0 - (self.available + self.tree.evictable_size()) / self.config.pool_tokens

    def ratio(self) -> float:
        if self.ratio_steps == 0:
            return self.ratio_base
        return max(self.ratio_base - self.ratio_steps * self.config.new_token_ratio_decay,
                   self.config.min_new_token_ratio)

    def check_invariants(self) -> None:
        held = sum(r.kv_len - r.protected for r in self.all.values())
        assert self.available + self.tree.total_size() + held == self.config.pool_tokens

    # ------------------------------------------------------------------ one iteration
    def _step_time(self, *features) -> float:
        t = self.cost.step_time(*features) - (0.0 if self.cold else self.hidden)
        self.cold = False
        return t

    def _iteration(self, start: float) -> None:
        last, self.results = self.results, None
        left = self._schedule_and_run(start)
        if self.overlap:  # event_loop_overlap: the batch is launched, now the last one's results
            self._process(last)
        if left is not None:  # stashed at the next get_next_batch_to_run
            self._cache_unfinished(left)

    def _schedule_and_run(self, start: float):
        batch = self._prefill_batch()
        if not batch and not self.running:
            self.shrunk = False
            self.batch_is_full = False
            batch = self._prefill_batch()
        if batch:
            return self._run_prefill(start, batch)
        assert self.running, "stuck"
        shrunk, self.shrunk = self.shrunk, False
        if not self._check_mem(len(self.running)):
            self._retract()
            shrunk = True
            self.ratio_steps = 0
        else:
            self.ratio_steps += 1
        if shrunk:
            self.batch_is_full = False
        self._run_decode(start)
        return None

    def _check_mem(self, n: int) -> bool:
        if self.available < n:
            self.available += self.tree.evict(n)
        return self.available >= n

    def _retract(self) -> None:
        cfg = self.config
        order = sorted(self.running, key=lambda r: (r.output, -r.req.num_prompt_tokens), reverse=True)
        retracted = []
        first = True
        while first or not self._check_mem(len(order)):
            if len(order) == 1:
                break
            first = False
            r = order.pop()
            retracted.append(r)
            r.retracted = True
            self.available += r.kv_len - r.protected
            if r.last_node is not None:
                self.tree.dec(r.last_node)
            need = len(order) * cfg.retract_decode_steps
            if self.available < need:
                self.available += self.tree.evict(need)
            r.prefix_len = r.protected = r.kv_len = r.already_computed = 0
            r.last_node = None
        self.running = order
        self.ratio_base = min(1.0, (sum(r.output for r in order) + cfg.retract_decode_steps * len(order))
                              / sum(r.req.max_tokens for r in order))
        for r in retracted:
            r.req.num_preemptions += 1
            r.req.state = WAITING
            self.num_preemptions += 1
            self.waiting.append(r)

    def _run_decode(self, start: float) -> None:
        n = len(self.running)
        self.available -= n
        for r in self.running:
            r.kv_len += 1
        ctx = sum(r.kv_len for r in self.running)
        end = start + self._step_time(n, 0.0, ctx, 0.0, n)
        self.inflight_end = end
        self.num_steps += 1
        self.generation_tokens_total += n
        if self.overlap:
            self.results = ("decode", list(self.running), end, None)
            return
        keep = []
        for r in self.running:
            r.output += 1
            gap = end - r.last_token_s
            if not gap <= r.max_gap:
                r.max_gap = gap
            r.last_token_s = end
            if r.output >= r.req.max_tokens:
                self._finish(r)
                self.shrunk = True
            else:
                keep.append(r)
        self.running = keep

    # ------------------------------------------------------------------ prefill
    def _prefill_batch(self) -> list:
        cfg = self.config
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return []
        running_bs = len(self.running)
        if cfg.max_running_requests - running_bs <= 0 and self.chunked is None:
            self.batch_is_full = True
            return []
        computed = False
        if cfg.schedule_policy == "lpm" and len(self.waiting) <= 128:
            inbatch = RefTree(1)
            deferred = set()
            for r in self.waiting:
                r.match_len, r.match_node = self.tree.match(r.tokens(r.fill - 1))
                if r.match_len <= 32:
                    full = r.tokens(r.fill)
                    m, _ = inbatch.match(full)
                    if m >= 32:
                        deferred.add(r)
                    else:
                        inbatch.insert(full)
            self.waiting.sort(key=lambda r: math.inf if r in deferred else -r.match_len)
            computed = True
        ratio = self.ratio()
        clip = cfg.clip_max_new_tokens
        self.off_total = sum(min(r.req.max_tokens - r.output, clip) * ratio for r in self.running)
        self.off_cur = 0
        self.rem_input = cfg.max_prefill_tokens
        self.rem_chunk = cfg.chunked_prefill_size
        batch = []
        ch = self.chunked
        if ch is not None:
            extend = ch.fill - ch.prefix_len
            trunc = extend > self.rem_chunk
            extend = min(extend, self.rem_chunk)
            self._charge(extend, 0 if trunc else min(ch.req.max_tokens, clip))
            batch.append((ch, extend, trunc))
            self.chunked = ch if trunc else None
        new_chunked = None
        taken = []
        for r in self.waiting:
            if len(batch) >= cfg.max_running_requests - running_bs:
                self.batch_is_full = True
                break
            if not computed:
                r.match_len, r.match_node = self.tree.match(r.tokens(r.fill - 1))
            res, item = self._add(r, len(batch))
            if item is not None:
                batch.append(item)
                taken.append(r)
                if item[2]:
                    new_chunked = r
            if res != "continue":
                if res == "no_token":
                    self.batch_is_full = True
                break
        self.waiting = [r for r in self.waiting if r not in taken]
        if new_chunked is not None:
            self.chunked = new_chunked
        return batch

    def _charge(self, extend: int, max_new: int) -> None:
        extend = -(-extend // self.page) * self.page
        self.off_total += extend + max_new
        self.off_cur += extend
        self.rem_input -= extend
        self.rem_chunk -= extend

    def _add(self, r: RReq, batch_len: int):
        clip = self.config.clip_max_new_tokens
        max_new = min(r.req.max_tokens - r.output, clip)
        extend = r.fill - r.match_len
        input_tokens = -(-extend // self.page) * self.page
        self.tree.inc(r.match_node)
        try:
            if extend + max_new >= self.available + self.tree.evictable_size() - self.off_total:
                return "no_token", None
            if input_tokens >= self.rem_input and batch_len:
                return "other", None
            if input_tokens <= self.rem_chunk:
                item = (r, extend, False)
                self._charge(extend, max_new)
            else:
                trunc = self.rem_chunk - self.rem_chunk % self.page
                if trunc <= 0:
                    return "other", None
                item = (r, trunc, True)
                self._charge(trunc, 0)
            self.tree.inc(r.match_node)
            r.prefix_len = r.protected = r.match_len
            r.last_node = r.match_node
        finally:
            self.tree.dec(r.match_node)
        r.req.state = RUNNING
        free = self.available + self.tree.evictable_size()
        if free - self.off_total <= 0 or free - self.off_cur <= 0:
            return "no_token", item
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            return "other", item
        return "continue", item

    def _run_prefill(self, start: float, batch: list) -> None:
        total = sum(e for _, e, _ in batch)
        if self.available < total:
            self.available += self.tree.evict(total)
        assert self.available >= total, "prefill out of memory"
        self.available -= total
        attention = 0.0
        for r, extend, _ in batch:
            r.cached += r.prefix_len - r.already_computed
            r.kv_len = r.prefix_len + extend
            r.already_computed = r.kv_len
            attention += extend * (r.prefix_len + extend / 2)
        end = start + self._step_time(total, attention, 0.0)
        self.inflight_end = end
        self.num_steps += 1
        left = None
        finished = False
        if self.overlap:  # everyone prefilled joins the running batch: nobody is known to have finished
            done = [r for r, _, trunc in batch if not trunc]
            self.generation_tokens_total += len(done)
            self.running.extend(done)
            self.results = ("prefill", done, end, {r: r.kv_len for r in done})
            return next((r for r, _, trunc in batch if trunc), None)
        for r, extend, trunc in batch:
            if trunc:
                left = r
                continue
            self.generation_tokens_total += 1
            self._token(r, end)
            req = r.req
            if r.output >= req.max_tokens:
                self._finish(r)
                finished = True
            else:
                self._cache_unfinished(r)
                self.running.append(r)
        if finished:
            self.batch_is_full = False
        return left

    def _token(self, r: RReq, end: float) -> None:
        """A prefill's (or, processed late, any step's) token: the first, or a gap since the last."""
        r.output += 1
        req = r.req
        if req.first_token_s is None:
            req.first_token_s = end
            if req.on_first_token is not None:
                self.first.append(req)
        elif r.last_token_s is not None:
            gap = end - r.last_token_s
            if not gap <= r.max_gap:
                r.max_gap = gap
        r.last_token_s = end

    def _process(self, results) -> None:
        """process_batch_result of the last batch (overlap): outputs, finishes, the tree, the client."""
        if results is not None:
            kind, reqs, end, prefill_kv = results
            finished = False
            for r in reqs:
                if r.retracted:
                    self.num_dropped_tokens += 1
                if r.retracted or r.req.state == FINISHED:  # dropped (computed again later), or the
                    continue  # token after a request's last, computed before the scheduler knew
                self._token(r, end)
                req = r.req
                if r.output >= req.max_tokens:
                    extra = r.kv_len - (r.fill - 1)  # the slot of the token computed after the last
                    self.available += extra
                    r.kv_len -= extra
                    self.running.remove(r)
                    self._finish(r)
                    self.shrunk = True
                    finished = finished or kind == "prefill"
                elif kind == "prefill":
                    self._cache_unfinished(r, prefill_kv[r])
            if finished:
                self.batch_is_full = False
            self._deliver(end)
        for r in self.all.values():
            r.retracted = False

    def _cache_unfinished(self, r: RReq, kv_len: Optional[int] = None) -> None:
        kv_len = r.kv_len if kv_len is None else kv_len
        aligned = kv_len // self.page * self.page
        new_prefix = self.tree.insert(r.tokens(aligned))
        if new_prefix > r.protected:
            self.available += new_prefix - r.protected
        m, node = self.tree.match(r.tokens(aligned))
        assert m == aligned
        if r.last_node is not None:
            self.tree.dec(r.last_node)
        self.tree.inc(node)
        r.protected = aligned
        r.prefix_len = kv_len
        r.last_node = node

    def _finish(self, r: RReq) -> None:
        aligned = r.kv_len // self.page * self.page
        new_prefix = self.tree.insert(r.tokens(aligned))
        if new_prefix > r.protected:
            self.available += new_prefix - r.protected
        self.available += r.kv_len - aligned
        if r.last_node is not None:
            self.tree.dec(r.last_node)
        r.prefix_len = r.protected = r.kv_len = 0
        r.last_node = None
        req = r.req
        req.generated = r.output
        req.num_cached_tokens = r.cached
        req.last_token_s = r.last_token_s
        req.max_token_gap_s = r.max_gap
        req.state = FINISHED
        self.prefix_cache_queries += req.num_prompt_tokens
        self.prefix_cache_hits += r.cached
        del self.all[req]
        self.done.append(req)
