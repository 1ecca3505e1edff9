"""Where a tree's sessions run in the simulated engines: a fork shares its parent's blocks.

A session of a linear run names its tokens by a shared prefix and its own append-only stream (the
engines' two-level fast path). A forked session's prompts begin with its parent's first
``fork_tokens`` tokens (loadgen/core/tree_runtime.py), so both engines must see those tokens as
the same content:

* vLLM (``SimEngine``'s tree of streams, loadgen/sim/vllm_stream_tree.py): each tree session has
  its own stream, following the system prompt's stream or, for a fork, its parent's streams cut
  at the fork's last full block (``split_stream``): the child's stream begins as a copy of the
  parent's first k blocks, which vLLM's chained block hashes would find
  (vllm/v1/core/kv_cache_utils.py ``hash_block_tokens``, 0.11). A block that holds both inherited
  and own tokens is the child's own (its hash differs from the parent's).
* SGLang (``ChainRadixCache``, loadgen/sim/radix_chains.py): every request names its tokens by the
  session's content runs (``TreeSession.segments``), and the radix tree matches them token by
  token (page by page), as SGLang's ``RadixCache.match_prefix`` matches token ids.

Only runs whose workload is trees use this; a linear run keeps the engines' fast path.
"""

from __future__ import annotations

from typing import Optional

from ..sim.kv_pool import Stream
from ..sim.radix_chains import Chain, ChainRadixCache
from .engines import TurnRequest
from .tree_runtime import TreeRuntime


class VllmTreePlacer:
    """Tree sessions onto a ``SimEngine``'s tree of streams."""

    def __init__(self, engine, trees: TreeRuntime) -> None:
        if engine.host is not None:
            raise ValueError("session trees are not modelled with the CPU offload tier (engine.offload)")
        self.engine = engine
        self.trees = trees
        self._own: dict[int, Stream] = {}  # session id -> its own stream (the tail of its chain)

    def streams(self, request: TurnRequest) -> tuple[Optional[Stream], Stream, None]:
        own = self._own_stream(request.session_id)
        return own.parent, own, None

    def _own_stream(self, session_id: int) -> Stream:
        own = self._own.get(session_id)
        if own is not None:
            return own
        node = self.trees.get(session_id)
        bs = self.engine.block_size
        parent = node.forked_from
        if parent is not None:
            follows = self._cut(parent.session_id, node.fork_tokens // bs)
        else:
            shape = node.plan.shape
            n = shape.shared_prefix_tokens
            follows = self.engine.prefix_stream(shape.prefix_key, n) if n >= bs else None
        own = self._own[session_id] = self.engine.branch(("tree", session_id), follows)
        return own

    def _cut(self, session_id: int, num_blocks: int) -> Optional[Stream]:
        """The stream of ``session_id``'s chain that ends at block ``num_blocks`` (cut there if needed)."""
        seg = self._own_stream(session_id)
        while seg is not None and num_blocks < seg.base:
            seg = seg.parent
        if seg is None or num_blocks == seg.base:
            return seg.parent if seg is not None else None
        if not (isinstance(seg.key, tuple) and seg.key[0] in ("tree", "tree-cut")):
            raise ValueError(f"a fork at block {num_blocks} falls inside shared stream {seg.key!r}")
        return self.engine.split_stream(seg, num_blocks - seg.base, ("tree-cut", session_id, num_blocks))


class SGLangTreePlacer:
    """Tree sessions onto an ``SGLangEngine`` whose radix tree names tokens by chains."""

    def __init__(self, engine, trees: TreeRuntime) -> None:
        engine.tree = ChainRadixCache(engine.config.page_size)
        self.engine = engine
        self.trees = trees
        self._own: dict[int, Stream] = {}

    def streams(self, request: TurnRequest) -> tuple[None, Stream, None]:
        own = self._own.get(request.session_id)
        if own is None:
            chain = Chain(self.trees.get(request.session_id).segments(), self.engine.config.page_size)
            own = self._own[request.session_id] = self.engine.stream(chain, 0)
        return None, own, None


def attach_placers(engine_client, trees: TreeRuntime) -> None:
    """Give every simulated engine of a run (one, or a deployment's replicas) a tree placer."""
    from ..sim.sglang_engine import SGLangEngine

    for client in getattr(engine_client, "replicas", [engine_client]):
        sim = client.engine
        client.placer = (SGLangTreePlacer if isinstance(sim, SGLangEngine) else VllmTreePlacer)(sim, trees)


def start_trees(env, plans, start, tree_policy: str = "sessions") -> TreeRuntime:
    """The run's tree runtime over ``env``'s engines and gateway, with every tree root of ``plans``
    registered; ``start(plan)`` starts a child session now."""
    trees = TreeRuntime(env.clock, env.recorder, start, env.counts, env.gateway, tree_policy)
    for plan in plans:
        if plan.tree is not None:
            trees.add_root(plan)
    attach_placers(env.engine, trees)
    return trees


def has_trees(spec) -> bool:
    """Whether a spec's workload draws session trees (its run then writes the tree columns)."""
    from .spec import MixShiftTrigger
    from .spec.sessions import draws_trees

    sessions = [spec.workload.sessions] + [t.sessions for a in spec.arms for t in a.triggers
                                           if isinstance(t, MixShiftTrigger)]
    return any(draws_trees(s) for s in sessions)
