"""A vLLM-v1 block pool, compressed into runs.

vLLM keeps every KV block in one pool: blocks referenced by running requests, plus a free
queue of unreferenced blocks in eviction order, some still holding a cached hash (lazy
eviction: a block loses its hash only when it is popped for reuse). A request frees its
blocks tail first, so across requests eviction is LRU by free time and within one request the
cached prefix is trimmed from its tail.

Block-by-block bookkeeping costs thousands of Python operations per turn; this pool keeps the
same state in runs. Token contents are append-only streams (the shared system prompt; each
session's own context), and a block's hash is determined by its stream and position, so:

* a ``Stream`` owns absolute block positions ``[base, base + cached)`` that hold its hashes;
  they are contiguous from ``base`` because eviction always trims a stream from its top;
* the free queue is a deque of ``[owner, count]`` entries: ``count`` idle blocks of ``owner``
  (evicted top first), or ``count`` blocks holding no hash when ``owner`` is None.

The reference model in tests/sim/reference_engine.py keeps real per-block state with chained
hashes; the differential test checks that both report the same cached tokens per request.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Optional


class Stream:
    """An append-only token stream whose full blocks can be cached."""

    __slots__ = ("key", "base", "cached", "ref_cnt", "entry", "num_blocks", "parent")

    def __init__(self, key: Hashable, base: int, num_blocks: Optional[int] = None) -> None:
        self.key = key
        self.base = base  # first absolute block position this stream owns
        self.num_blocks = num_blocks  # a shared prefix's fixed length in blocks (None: append-only)
        # a tree of streams: this stream's blocks follow ``parent``'s (which ends at ``base``);
        # None for the engine's own two-level streams (a prefix at 0, a session after it)
        self.parent: Optional["Stream"] = None
        self.cached = 0  # positions [base, base + cached) hold this stream's hashes
        self.ref_cnt = 0  # requests holding these blocks (then they are not in the free queue)
        self.entry: Optional[list] = None  # its free-queue entry while unreferenced

    def __repr__(self) -> str:
        return f"Stream({self.key!r}, base={self.base}, cached={self.cached}, ref={self.ref_cnt})"


class BlockPool:
    """Free-block accounting and LRU eviction over streams."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is vLLM's null block), got {num_blocks}")
        self.num_usable = num_blocks - 1  # vLLM reserves block 0 as the null block
        self.num_free = self.num_usable
        self.queue: deque = deque([[None, self.num_usable]])

    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: cached-but-idle blocks count as free."""
        return 1.0 - self.num_free / self.num_usable

    def idle_cached(self, stream: Stream) -> int:
        """Blocks of ``stream`` that sit in the free queue (a hit would take them out)."""
        return stream.cached if stream.ref_cnt == 0 else 0

    def acquire(self, stream: Stream, keep: int) -> None:
        """A request takes a reference on ``stream`` and hits its first ``keep`` cached blocks.

        Cached blocks above ``keep`` (a hit cut short by the last-token cap or a broken parent
        chain) are recomputed by the request; their old copies lose their hash in place."""
        if stream.ref_cnt == 0:
            entry = stream.entry
            if entry is not None:
                self.num_free -= keep
                entry[0] = None
                entry[1] = stream.cached - keep
                stream.entry = None
            stream.cached = keep
        stream.ref_cnt += 1

    def release(self, stream: Stream) -> None:
        """A request drops its reference; an unreferenced stream's cached blocks become idle."""
        stream.ref_cnt -= 1
        if stream.ref_cnt == 0 and stream.cached > 0:
            entry = [stream, stream.cached]
            self.queue.append(entry)
            stream.entry = entry
            self.num_free += stream.cached

    def free_unhashed(self, count: int) -> None:
        if count <= 0:
            return
        self.num_free += count
        tail = self.queue[-1] if self.queue else None
        if tail is not None and tail[0] is None:
            tail[1] += count
        else:
            self.queue.append([None, count])

    def allocate(self, count: int) -> None:
        """Pop ``count`` blocks from the head of the free queue, evicting what they cached."""
        if count > self.num_free:
            raise RuntimeError(f"allocating {count} blocks with {self.num_free} free")
        self.num_free -= count
        queue = self.queue
        while count:
            entry = queue[0]
            size = entry[1]
            owner = entry[0]
            if size <= count:
                queue.popleft()
                count -= size
                if owner is not None:
                    owner.cached -= size
                    owner.entry = None
            else:
                entry[1] = size - count
                if owner is not None:
                    owner.cached -= count
                count = 0

    def split(self, stream: Stream, num_blocks: int, head: Stream) -> None:
        """Cut ``stream`` after its first ``num_blocks`` blocks: ``head`` (new, empty) takes them over
        and becomes its parent; ``stream`` keeps the rest. Idle cached blocks stay where they are
        in eviction order (the top ones, evicted first, still ``stream``'s); a held stream's holders
        hold both."""
        head.ref_cnt = stream.ref_cnt
        head.base, head.num_blocks, head.parent = stream.base, num_blocks, stream.parent
        stream.parent = head
        stream.base += num_blocks
        if stream.num_blocks is not None:
            stream.num_blocks -= num_blocks
        moved = min(stream.cached, num_blocks)
        head.cached, stream.cached = moved, stream.cached - moved
        entry = stream.entry
        if entry is None or not moved:
            return
        if not stream.cached:
            entry[0], head.entry, stream.entry = head, entry, None
            return
        entry[1] = stream.cached
        head.entry = [head, moved]
        self.queue.insert(self.queue.index(entry) + 1, head.entry)

    def reset(self, streams) -> None:
        """Drop every cached hash (vLLM reset_prefix_cache, which needs every block unreferenced)."""
        if self.num_free != self.num_usable:
            raise RuntimeError("reset_prefix_cache with blocks still referenced by running requests")
        for stream in streams:
            stream.cached = 0
            stream.entry = None
        self.queue = deque([[None, self.num_free]])
