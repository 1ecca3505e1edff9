"""A tree of streams for the vLLM flavour: prompts that share a prefix of any length with others.

loadgen's sessions name their tokens by a shared prefix (a system prompt at block 0) and their
own append-only stream. A server fed arbitrary prompts (serve-sim, loadgen/sim/prefix_match.py)
needs more: a fork, a retry or an edit shares exactly the first k blocks of another prompt. Such
a prompt's prefix is a chain of fixed-length streams, each following its ``parent``
(``Stream.parent``); a request on it carries the chain (``SimRequest.segments``), the blocks hit
in each stream (``segment_hits``: vLLM's lookup walks the chained block hashes and stops at the
first miss) and the streams it builds (``segment_builders``). A request whose prefix has no
parent takes the two-level path, as before. Not modelled with the CPU offload tier.

A layer of ``SimEngine`` (loadgen/sim/engine.py) over the state of loadgen/sim/vllm_state.py.
"""

from __future__ import annotations

from typing import Hashable, Optional

from .kv_pool import Stream
from .request import RUNNING, SimRequest
from .vllm_decode import DecodeAggregates


class StreamTree(DecodeAggregates):
    """Streams that follow other streams, and the requests holding a stream that is cut."""

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

    def _segments(self, request: SimRequest) -> tuple:
        """The chain of ``request``'s prefix, from block 0 (refused unless each stream follows its
        parent and the last ends where the request's own stream starts)."""
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
