"""SGLang's radix cache, compressed: nodes are runs of tokens named by the streams they come from.

SGLang (python/sglang/srt/mem_cache/radix_cache.py, 0.5.x) keeps every cached token in a radix
tree whose nodes hold runs of token ids and their KV slots:

* ``match_prefix`` walks from the root, stamps every node on the path with one access time
  (``last_access_time``), and splits a node when the match ends inside it;
* ``insert`` walks the same way (stamping and splitting) and hangs the unmatched rest of the key
  under the last node as one new leaf; it returns how much of the key was already there, so the
  caller frees its duplicate slots;
* ``inc_lock_ref`` / ``dec_lock_ref`` walk from a node to the root; a node with ``lock_ref > 0`` is
  protected, otherwise its tokens count as evictable;
* ``evict(n)`` pops unreferenced leaves by least recent access (a heap), frees each whole node and
  pushes its parent once that has no children left and no lock, until ``n`` tokens are freed;
* with ``page_size > 1`` keys are compared and inserted in whole pages.

Token ids are never materialised here. A request's tokens are its shared prefix (positions
``[0, plen)`` of the prefix ``pid``, the same for every request naming it) followed by its own
append-only stream ``own``. A node is a run ``[start, start + length)`` of positions; its first
token decides which child slot it takes (the prefix ``pid`` itself inside a prefix, the stream
``own`` after it: keys hashed and compared by identity, and never equal, since the engine keys
its prefix streams apart from its sessions' streams), and a node that runs past the end of its
prefix carries the stream it continues into.
That is everything needed to compare a node with a request's key, so a match or an insert costs
one step per node on the path, not one per token.

Access times are a counter bumped once per match or insert: ``time.monotonic()`` is increasing
between calls in SGLang, and a counter gives the same order without reading a clock. Leaves are
kept in a lazy heap of ``_Leaf`` entries (loadgen/sim/keyed_heap.py), one pushed whenever a
node becomes an evictable leaf (added, unlocked, or its last child evicted) and none when a walk
stamps it: an entry is dropped once its node is gone, locked or has children, and an entry older
than its node's last access goes back in at that access when it surfaces. Every evictable leaf
keeps an entry no later than its access, so the first entry to surface with its node's current
access is the least recently used leaf, and evictions come in exactly the order in which
SGLang's heap, rebuilt from its leaf set on every ``evict``, pops them: no two evictable leaves
ever share an access time (one call stamps one path, and a path holds at most one leaf).
"""

from __future__ import annotations

import itertools
from typing import Hashable, Optional

from .keyed_heap import Keyed, heap_pop, heap_push


_NO_KEY = object()  # a node's last_key before it has a child: no lookup key is this object


class Node:
    __slots__ = ("parent", "children", "start", "length", "pid", "plen", "own", "lock_ref", "access", "alive", "nid",
                 "last_key", "last_child")

    def __init__(self, parent: Optional["Node"], start: int, length: int, pid: Hashable, plen: int,
                 own: Hashable, access: int, nid: int) -> None:
        self.parent = parent
        self.children: dict = {}
        self.start = start
        self.length = length
        self.pid = pid  # the prefix the run starts in (None: the run starts in a stream's own tokens)
        self.plen = plen  # that prefix's length in tokens
        self.own = own  # the own stream the run covers past the prefix (None: it ends inside the prefix)
        self.lock_ref = 0
        self.access = access
        self.alive = True
        self.nid = nid
        # the child last found or added under ``children``, and its key: a session's path is a
        # node per turn, each with one child, so a walk finds it by one identity test, no hashing
        self.last_key = _NO_KEY
        self.last_child: Optional[Node] = None

    @property
    def key(self) -> Hashable:
        return self.pid if self.start < self.plen else self.own

    def __repr__(self) -> str:
        return (f"Node({self.key}, [{self.start}, {self.start + self.length}), lock={self.lock_ref}, "
                f"access={self.access})")


class RadixCache:
    """The tree and its token accounting (``evictable_size`` and ``protected_size`` as SGLang's)."""

    node_class = Node  # what insert and split make (loadgen/sim/radix_chains.py names tokens otherwise)

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._ids = itertools.count()
        self.reset()

    def reset(self) -> None:
        self.clock = 0
        self.root = Node(None, 0, 0, None, 0, None, 0, next(self._ids))
        self.root.lock_ref = 1  # as SGLang's root: never evictable
        self.evictable_size = 0
        self.protected_size = 0
        self._heap: list = []
        self.num_nodes = 0

    # ------------------------------------------------------------------ match / insert
    # The walks are written out in one loop each (a child's slot, the tokens it shares with the
    # key, page flooring, stamping): a path holds a node per turn of a session, and these loops
    # were most of the SGLang flavour's time.
    def match_prefix(self, pid: Hashable, plen: int, own: Hashable, key_len: int) -> tuple[int, Node]:
        """Longest cached prefix of the first ``key_len`` tokens: (tokens, last node). Stamps the path."""
        self.clock += 1
        stamp = self.clock
        node = self.root
        node.access = stamp
        page = self.page_size
        if page > 1:
            key_len -= key_len % page
        pos = 0
        while pos < key_len:
            key = pid if pos < plen else own
            if node.last_key is key:
                child = node.last_child
            else:
                child = node.children.get(key)
                if child is None:
                    break
                node.last_key = key
                node.last_child = child
            child.access = stamp
            n = child.length
            if child.start < child.plen and child.own is not None and child.own is not own:
                n = child.plen - child.start  # the same prefix, then another stream's tokens
            if n > key_len - pos:
                n = key_len - pos
            if page > 1:
                n -= n % page
            if n < child.length:
                if n > 0:
                    node = self._split(child, n)
                    pos += n
                break
            pos += n
            node = child
        return pos, node

    def peek_prefix(self, pid: Hashable, plen: int, own: Hashable, key_len: int) -> int:
        """Tokens of the longest cached prefix of the first ``key_len`` tokens, as ``match_prefix``
        finds it, without stamping or splitting anything (what the tree's KV events have told a
        listener). Written out beside match_prefix, as that walk is, rather than sharing it: a
        flag in that hot loop would cost every match."""
        node = self.root
        page = self.page_size
        if page > 1:
            key_len -= key_len % page
        pos = 0
        while pos < key_len:
            key = pid if pos < plen else own
            if node.last_key is key:
                child = node.last_child
            else:
                child = node.children.get(key)
                if child is None:
                    break
                node.last_key = key
                node.last_child = child
            n = child.length
            if child.start < child.plen and child.own is not None and child.own is not own:
                n = child.plen - child.start
            n = min(n, key_len - pos)
            if page > 1:
                n -= n % page
            pos += n
            if n < child.length:
                break
            node = child
        return pos

    def insert(self, pid: Hashable, plen: int, own: Hashable, key_len: int) -> int:
        """Insert the first ``key_len`` tokens (page-aligned); returns how many were already cached."""
        self.clock += 1
        stamp = self.clock
        node = self.root
        node.access = stamp
        page = self.page_size
        if page > 1:
            key_len -= key_len % page
        pos = 0
        while pos < key_len:
            key = pid if pos < plen else own
            if node.last_key is key:
                child = node.last_child
            else:
                child = node.children.get(key)
                if child is None:
                    break
                node.last_key = key
                node.last_child = child
            child.access = stamp
            n = child.length
            if child.start < child.plen and child.own is not None and child.own is not own:
                n = child.plen - child.start
            if n > key_len - pos:
                n = key_len - pos
            if page > 1:
                n -= n % page
            pos += n
            if n < child.length:
                node = self._split(child, n)
                break  # the rest of the key differs from the rest of the child
            node = child
        if pos < key_len:
            self._add_leaf(node, pos, pid, plen, own, key_len, stamp)
        return pos

    def insert_matched(self, pid: Hashable, plen: int, own: Hashable, key_len: int) -> tuple[int, Node]:
        """``insert`` then ``match_prefix`` of the same key, as SGLang's cache_unfinished_req calls
        them, in one walk: (tokens already cached, the node the key ends at). The match would
        find the whole key, which the insert has just put there, and only stamp its path again:
        so the path gets the match's access time and the node a split leaves below the key keeps
        the insert's."""
        self.clock += 2
        stamp = self.clock
        node = self.root
        node.access = stamp
        page = self.page_size
        if page > 1:
            key_len -= key_len % page
        pos = 0
        while pos < key_len:
            key = pid if pos < plen else own
            if node.last_key is key:
                child = node.last_child
            else:
                child = node.children.get(key)
                if child is None:
                    break
                node.last_key = key
                node.last_child = child
            child.access = stamp
            n = child.length
            if child.start < child.plen and child.own is not None and child.own is not own:
                n = child.plen - child.start
            if n > key_len - pos:
                n = key_len - pos
            if page > 1:
                n -= n % page
            pos += n
            if n < child.length:
                child.access = stamp - 1
                node = self._split(child, n)
                node.access = stamp
                break
            node = child
        if pos < key_len:
            return pos, self._add_leaf(node, pos, pid, plen, own, key_len, stamp)
        return pos, node

    def _add_leaf(self, node: Node, pos: int, pid: Hashable, plen: int, own: Hashable, key_len: int,
                  stamp: int) -> Node:
        """The unmatched rest ``[pos, key_len)`` of a key, as one new leaf under ``node``."""
        new = self.node_class(node, pos, key_len - pos, pid if pos < plen else None, plen if pos < plen else 0,
                              own if key_len > plen else None, stamp, next(self._ids))
        key = new.key
        node.children[key] = new
        node.last_key = key
        node.last_child = new
        self.num_nodes += 1
        self.evictable_size += new.length
        self._push(new)  # a new leaf, unlocked
        return new

    def _split(self, child: Node, n: int) -> Node:
        """SGLang's _split_node: a new node for the first ``n`` tokens of ``child``, above it."""
        parent = child.parent
        top = self.node_class(parent, child.start, n, child.pid, child.plen,
                   child.own if child.start + n > child.plen else None, child.access, next(self._ids))
        top.lock_ref = child.lock_ref
        del parent.children[child.key]
        child.start += n
        child.length -= n
        if child.start >= child.plen:
            child.pid, child.plen = None, 0
        parent.children[top.key] = top
        if parent.last_child is child:
            parent.last_key = top.key
            parent.last_child = top
        top.last_key = child.key
        top.children[top.last_key] = child
        top.last_child = child
        child.parent = top
        self.num_nodes += 1
        return top

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: Node) -> None:
        root = self.root
        newly = 0  # tokens of nodes that were unlocked
        while node is not root:
            if node.lock_ref == 0:
                newly += node.length
            node.lock_ref += 1
            node = node.parent
        self.evictable_size -= newly
        self.protected_size += newly

    def dec_lock_ref(self, node: Node) -> None:
        root = self.root
        freed = 0  # tokens of nodes left unlocked
        while node is not root:
            lock_ref = node.lock_ref - 1
            node.lock_ref = lock_ref
            if lock_ref == 0:
                freed += node.length
                if not node.children:
                    self._push(node)
            node = node.parent
        self.evictable_size += freed
        self.protected_size -= freed

    # ------------------------------------------------------------------ eviction
    def _push(self, node: Node) -> None:
        """An unlocked leaf goes into the eviction heap."""
        heap_push(self._heap, _leaf(node))
        if len(self._heap) > 4 * self.num_nodes + 64:
            self._compact()

    def _compact(self) -> None:
        """The heap rebuilt: one entry per evictable leaf, at its latest access."""
        seen = set()
        live: list = []
        for leaf in self._heap:
            if _evictable(leaf.node) and leaf.seq not in seen:
                seen.add(leaf.seq)
                heap_push(live, _leaf(leaf.node))
        self._heap = live

    def evict(self, num_tokens: int) -> int:
        """Free unreferenced leaves, least recently used first, until ``num_tokens`` are freed;
        returns the tokens freed (whole nodes, so possibly more)."""
        freed = 0
        heap = self._heap
        while freed < num_tokens and heap:
            leaf = heap_pop(heap)
            node = leaf.node
            if not _evictable(node):
                continue
            if node.access != leaf.when:  # stamped since it was pushed
                heap_push(heap, _leaf(node))
                continue
            freed += node.length
            parent = node.parent
            del parent.children[node.key]
            if parent.last_child is node:
                parent.last_key = _NO_KEY
                parent.last_child = None
            node.alive = False
            self.num_nodes -= 1
            self.evictable_size -= node.length
            if not parent.children and parent.lock_ref == 0:
                heap_push(heap, _leaf(parent))
        return freed

    def total_size(self) -> int:
        return self.evictable_size + self.protected_size


class _Leaf(Keyed):
    """An eviction-heap entry for ``node``, keyed by its access and id at the push (when, seq)."""

    __slots__ = ("node",)


def _leaf(node: Node) -> _Leaf:
    leaf = _Leaf.__new__(_Leaf)  # compiled, a bare allocation (no __init__ call by name)
    leaf.when = node.access
    leaf.seq = node.nid
    leaf.node = node
    return leaf


def _evictable(node: Node) -> bool:
    return node.alive and node.lock_ref == 0 and not node.children
