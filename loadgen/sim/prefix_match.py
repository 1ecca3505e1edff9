"""Any token prompt onto the simulated vLLM engine's tree of streams, matched by block hashes.

vLLM finds a prompt's cached prefix by the chained hashes of its full blocks
(vllm/v1/core/kv_cache_utils.py ``hash_block_tokens``, ``BlockPool.get_cached_block``, 0.11):
any two prompts that agree on their first k blocks share those k blocks, whichever request
computed them. The simulated engine names blocks by stream and position instead, so this module
keeps which stream holds which content: a trie of nodes, one engine stream each (a node's blocks
follow its parent's), and every full block's chained hash -> its node. A prompt is matched to
the node of its longest known block; its request then runs on that node's chain:

* the match ends inside a node: the node is split there (``SimEngine.split_stream``), and the
  request branches off the head: a retry, an edit, a shared system prompt, a fork;
* the match ends at the end of a node nobody holds and nothing branches off: the request
  continues that stream (an append-only session keeps one stream, the engine's fast path);
* otherwise it branches off the end of the node.

Whether the blocks are still cached is the engine's business: the trie only says which content
is whose. A node may be split while requests hold it, even one still writing it (the same
prompt sent twice at once): they hold both halves, and the writer builds the head, so a later
request hits what it has computed so far, as in vLLM, which caches blocks as it schedules them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from .kv_pool import Stream


def list_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share (serve-sim passes its tokenizer's, which skips the
    parts two chat prompts share without comparing them)."""
    n = min(len(a), len(b))
    a, b = list(a[:n]), list(b[:n])
    if a == b:
        return n
    return next(i for i in range(n) if a[i] != b[i])


def chained_hashes(token_ids: list[int], block_size: int, start: int = 0, parent: int = 0) -> list[int]:
    """The chained hash of every full block of ``token_ids`` from block ``start`` on (``parent``
    is block ``start - 1``'s hash): equal hashes, equal token ids up to the end of that block."""
    out = []
    h = parent
    for j in range(start, len(token_ids) // block_size):
        h = hash((h, tuple(token_ids[j * block_size:(j + 1) * block_size])))
        out.append(h)
    return out


@dataclass(eq=False)
class Node:
    stream: Stream
    hashes: list[int] = field(default_factory=list)  # its blocks' chained hashes, from stream.base on
    parent: Optional["Node"] = None
    num_children: int = 0
    num_users: int = 0  # requests in the engine whose chain or own stream this is
    writing: bool = False  # a request in the engine appends to it

    @property
    def base(self) -> int:
        return self.stream.base

    @property
    def end(self) -> int:
        return self.stream.base + len(self.hashes)


@dataclass
class Placement:
    """Where a request runs: ``prefix`` (None or the last stream of its chain) and ``stream``."""

    prefix: Optional[Stream]
    stream: Stream
    own: Node
    chain: tuple[Node, ...]


class BlockHashMatcher:
    """Token prompts onto ``engine``'s tree of streams (a ``SimEngine``; see the module docstring)."""

    def __init__(self, engine, block_size: int) -> None:
        self.engine = engine
        self.block_size = block_size
        self._owner: dict[int, Node] = {}  # chained hash -> the node that holds that block
        self._ids = itertools.count()

    def _new(self, parent: Optional[Node]) -> Node:
        if parent is not None:
            parent.num_children += 1
            parent.stream.num_blocks = len(parent.hashes)
        return Node(self.engine.branch(("node", next(self._ids)), parent.stream if parent else None), parent=parent)

    def _split(self, node: Node, num_blocks: int) -> Node:
        head = Node(self.engine.split_stream(node.stream, num_blocks, ("node", next(self._ids))),
                    node.hashes[:num_blocks], node.parent, num_children=1)
        node.hashes = node.hashes[num_blocks:]
        node.parent = head
        for h in head.hashes:
            if self._owner.get(h) is node:
                self._owner[h] = head
        return head

    def _add(self, node: Node, hashes: list[int]) -> None:
        """``hashes`` are the node's next blocks; a block whose content some node already holds
        keeps that owner (vLLM's lookup takes the first copy cached)."""
        node.hashes.extend(hashes)
        for h in hashes:
            self._owner.setdefault(h, node)

    def place(self, token_ids: list[int], prefix_tokens: int = 0) -> Placement:
        """Where the prompt ``token_ids`` runs; held until ``finished``. ``prefix_tokens``: a shared
        prefix the client names (loadgen's header), a node of its own from the start, so that the
        sessions sharing it share one stream without splits (the engine's two-level fast path)."""
        bs = self.block_size
        hashes = chained_hashes(token_ids, bs)
        node, matched = None, 0
        for j in range(len(hashes) - 1, -1, -1):
            node = self._owner.get(hashes[j])
            if node is not None:
                matched = j + 1
                break
        own = None
        if node is not None:
            if matched < node.end or node.writing:
                # the prompt shares only part of the node, or all a request is still writing
                node = self._split(node, matched - node.base)
            if (not node.num_children and not node.num_users and not node.writing
                    and node.stream.cached <= len(node.hashes)):
                own = node  # continue it: blocks cached past its content (an aborted output) would not be its
                node.stream.num_blocks = None
        if own is None:
            hint = min(prefix_tokens // bs, len(hashes))
            if hint > matched:  # the named shared prefix becomes a node of its own
                node = self._new(node)
                self._add(node, hashes[matched:hint])
                matched = hint
            own = self._new(node)
            self._add(own, hashes[matched:])
        else:
            self._add(own, hashes[own.end:])
        chain = []
        up = own.parent
        while up is not None:
            up.stream.num_blocks = len(up.hashes)
            chain.append(up)
            up = up.parent
        for n in (own, *chain):
            n.num_users += 1
        own.writing = True
        return Placement(own.parent.stream if own.parent else None, own.stream, own, tuple(chain))

    def finished(self, placement: Placement, content_ids: list[int]) -> None:
        """The request left the engine; ``content_ids`` is what its stream now holds (the prompt and
        the output the client saw, but the last output token, which never enters the KV cache)."""
        own = placement.own
        parent = own.hashes[-1] if own.hashes else (own.parent.hashes[-1] if own.parent else 0)
        self._add(own, chained_hashes(content_ids, self.block_size, own.end, parent))
        own.writing = False
        for n in (own, *placement.chain):
            n.num_users -= 1


class _TokenNode:
    __slots__ = ("start", "tokens", "segment", "children")

    def __init__(self, start: int, tokens: list[int], segment) -> None:
        self.start = start
        self.tokens = tokens
        self.segment = segment  # the content these positions are (a chain's segment id)
        self.children: dict[int, "_TokenNode"] = {}


class TokenMatcher:
    """Token prompts onto an engine that caches every token (SGLang's radix cache, serve-sim's
    ``--flavor sglang``): a trie of token ids says which content each position of a prompt is, as a
    ``Chain`` (loadgen/sim/radix_chains.py) whose segments are the content it shares with earlier
    prompts, then its own new segment. The engine's tree (``ChainRadixCache``) decides what is still
    cached. A prompt's tokens go into the trie when it is placed (a prompt sent while another with
    the same tokens is being prefilled shares what that one has inserted, as in SGLang), its output
    when it finishes."""

    def __init__(self, page_size: int = 1,
                 common_prefix: Callable[[Sequence[int], Sequence[int]], int] = list_common_prefix) -> None:
        self.page_size = page_size
        self._common_prefix = common_prefix
        self._root = _TokenNode(0, [], None)
        self._ids = itertools.count()

    def _walk(self, token_ids: list[int], split: bool) -> tuple[int, list, _TokenNode]:
        """(tokens matched, [(end, segment)] of the matched part, last node reached); with ``split``
        the node a match ends inside is cut there (for an insert below it)."""
        node, pos, segments = self._root, 0, []
        while pos < len(token_ids):
            child = node.children.get(token_ids[pos])
            if child is None:
                break
            k = self._common_prefix(child.tokens, token_ids[pos:pos + len(child.tokens)])
            if segments and segments[-1][1] == child.segment:
                segments[-1] = (pos + k, child.segment)
            else:
                segments.append((pos + k, child.segment))
            pos += k
            if k < len(child.tokens):
                if split:
                    tail = _TokenNode(child.start + k, child.tokens[k:], child.segment)
                    tail.children, child.children = child.children, {tail.tokens[0]: tail}
                    child.tokens = child.tokens[:k]
                    node = child
                break
            node = child
        return pos, segments, node

    def _insert(self, token_ids: list[int], chain) -> None:
        pos, _, node = self._walk(token_ids, split=True)
        while pos < len(token_ids):  # the rest, one node per segment of the chain
            end, segment = chain.at(pos)
            upto = int(min(end, len(token_ids)))
            new = _TokenNode(pos, token_ids[pos:upto], segment)
            node.children[token_ids[pos]] = new
            node, pos = new, upto

    def place(self, token_ids: list[int]):
        """The chain naming the prompt's tokens (the key of the request's stream)."""
        from .radix_chains import Chain

        _, segments, _ = self._walk(token_ids, split=False)
        chain = Chain([*segments, (math.inf, ("own", next(self._ids)))], self.page_size)
        self._insert(token_ids, chain)
        return chain

    def finished(self, chain, content_ids: list[int]) -> None:
        """The request's prompt and output (but the last token, which never enters the cache)."""
        self._insert(content_ids, chain)
