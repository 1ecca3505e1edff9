"""The radix cache over token prompts of any shape: a request's tokens named by a ``Chain``.

``RadixCache`` names a request's tokens by its shared prefix and its own append-only stream,
which is all loadgen's sessions need. A server fed arbitrary prompts (serve-sim, SGLang flavour)
needs more: a prompt that repeats, edits or forks another shares exactly its first k tokens.
loadgen/live/prefix_match.py ``TokenMatcher`` finds those k tokens by their ids and names every
position of a prompt by the content it shares: a ``Chain`` of segments, position p being
(segment id, p); two prompts agree at p exactly when they name the same segment there. This
tree compares nodes with requests segment by segment, so a match still costs a few steps per
node, never one per token. The request's stream key is its chain (``SGLangEngine.stream(chain)``,
no prefix stream)."""

from __future__ import annotations

import bisect
import math
from typing import Hashable

from .radix_cache import Node, RadixCache


class Chain:
    """Segments ``(end, id)``: positions [previous end, end) are segment ``id``'s; the last ends
    at infinity (the request's own tokens, and its output). ``page``: the tree's page size."""

    __slots__ = ("ends", "ids", "page")

    def __init__(self, segments: list[tuple[int, Hashable]], page: int = 1) -> None:
        if not segments or segments[-1][0] != math.inf:
            raise ValueError("a chain's last segment runs to infinity")
        self.ends = [e for e, _ in segments]
        self.ids = [i for _, i in segments]
        self.page = page

    def at(self, pos: int) -> tuple[float, Hashable]:
        i = bisect.bisect_right(self.ends, pos)
        return self.ends[i], self.ids[i]

    def page_key(self, pos: int) -> tuple:
        """What the page starting at ``pos`` is (SGLang keys a node's children by their first page)."""
        end, seg = self.at(pos)
        if self.page == 1 or end >= pos + self.page:
            return ("c", seg)
        parts, p = [], pos
        while p < pos + self.page:
            end, seg = self.at(p)
            parts.append((seg, int(min(end, pos + self.page)) - pos))
            p = end
        return ("c", tuple(parts))

    def __repr__(self) -> str:
        return f"Chain({list(zip(self.ends, self.ids))})"


class ChainNode(Node):
    __slots__ = ()

    @property
    def key(self) -> tuple:
        return self.own.key.page_key(self.start)


class ChainRadixCache(RadixCache):
    """``RadixCache`` whose requests name their tokens by chains (the stream ``own`` keyed by one)."""

    node_class = ChainNode

    @staticmethod
    def _child_key(pos: int, pid: Hashable, plen: int, own) -> tuple:
        return own.key.page_key(pos)

    @staticmethod
    def _common(node: Node, pid: Hashable, plen: int, own, limit: int) -> int:
        mine, theirs = node.own.key, own.key
        pos, end = node.start, node.start + min(node.length, limit)
        while pos < end:
            e1, id1 = mine.at(pos)
            e2, id2 = theirs.at(pos)
            if id1 != id2:
                break
            pos = min(e1, e2, end)
        return int(pos) - node.start
