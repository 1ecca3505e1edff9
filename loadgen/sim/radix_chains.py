"""The radix cache over token prompts of any shape: a request's tokens named by a ``Chain``.

``RadixCache`` names a request's tokens by its shared prefix and its own append-only stream,
which is all loadgen's sessions need. A server fed arbitrary prompts (serve-sim, SGLang flavour)
needs more: a prompt that repeats, edits or forks another shares exactly its first k tokens.
loadgen/sim/prefix_match.py ``TokenMatcher`` finds those k tokens by their ids and names every
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
    """``RadixCache`` whose requests name their tokens by chains (the stream ``own`` keyed by one).

    ``RadixCache`` writes its walks out for the two-level names of loadgen's sessions (its hot
    path); this one walks the same way (stamping, splitting, whole pages) with a chain's child
    keys and segment-by-segment comparison."""

    node_class = ChainNode

    def match_prefix(self, pid: Hashable, plen: int, own, key_len: int) -> tuple[int, Node]:
        pos, node, _ = self._walk(own, key_len, inserting=False)
        return pos, node

    def insert(self, pid: Hashable, plen: int, own, key_len: int) -> int:
        key_len -= key_len % self.page_size
        pos, node, stamp = self._walk(own, key_len, inserting=True)
        if pos < key_len:
            self._add_leaf(node, pos, pid, plen, own, key_len, stamp)
        return pos

    def insert_matched(self, pid: Hashable, plen: int, own, key_len: int) -> tuple[int, Node]:
        pos = self.insert(pid, plen, own, key_len)
        return pos, self.match_prefix(pid, plen, own, key_len)[1]

    def _walk(self, own, key_len: int, inserting: bool) -> tuple[int, Node, int]:
        """Down from the root along ``own``'s first ``key_len`` tokens (page-floored): (tokens
        matched, the last node, the stamp). A match ending inside a node splits it (an insert
        splits it even where no whole page matched, as SGLang's insert does)."""
        self.clock += 1
        stamp = self.clock
        node = self.root
        node.access = stamp
        page = self.page_size
        key_len -= key_len % page
        chain = own.key
        pos = 0
        while pos < key_len:
            child = node.children.get(chain.page_key(pos))
            if child is None:
                break
            child.access = stamp
            n = _common(child, chain, key_len - pos)
            n -= n % page
            if n < child.length:
                if n > 0 or inserting:
                    node = self._split(child, n)
                    pos += n
                break
            pos += n
            node = child
        return pos, node, stamp


def _common(node: Node, chain: Chain, limit: int) -> int:
    """How many tokens of ``node`` the request named by ``chain`` shares, at most ``limit``
    (they agree at ``node.start``: the node is the child under the request's first page there)."""
    mine = node.own.key
    pos, end = node.start, node.start + min(node.length, limit)
    while pos < end:
        e1, id1 = mine.at(pos)
        e2, id2 = chain.at(pos)
        if id1 != id2:
            break
        pos = min(e1, e2, end)
    return int(pos) - node.start
