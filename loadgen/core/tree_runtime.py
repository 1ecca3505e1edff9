"""Session trees at run time: a turn spawns or forks child sessions, and a later turn waits for them.

A tree's root arrives like any session (its plan carries the drawn ``Tree``, trace_shapes/tree.py).
When one of its turns ends (its response is back), the branches after that turn start their
children, each ``start_delay_s`` later, as sessions of their own (the same loop,
loadgen/core/session.py, the same gateway and engine); a fork's child begins with the parent's
context as it is at that moment. A branch joined at turn j makes the parent wait, before turn j's
think time, until ``wait_for`` of its children (all by default) have ended, then append the
results of those that have ended by then (``Branch.join_tokens``) to its context: a quorum goes on
without the rest, who keep running. While it waits, the parent counts as thinking (its context
sits idle in the cache) and keeps its place at the gateway, which knows it waits
(``Gateway.join_started``: the liveness rule then treats it as unable to end a turn). With
``tree_policy: trees`` a child is admitted on arrival (the tree was admitted as a whole; the
policy may still park it at a turn boundary); with ``sessions`` each child queues like a new session.

Identities: a child's session id is ``CHILD_ID_BASE + tree_id * MAX_TREE_SESSIONS + i``, where
the tree id is the root's session id and ``i`` the child's place in the tree's walk (parents
first), so that ids depend on the drawn tree only, never on timing. What each session's tokens
are, for the engines (loadgen/core/tree_engines.py): its own tokens, after either a shared
system prompt (root, spawned child) or its parent's first ``fork_tokens`` tokens (forked child).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from trace_shapes import FORK, Tree

from .clock import Clock
from .workload import SessionPlan

CHILD_ID_BASE = 1 << 40
MAX_TREE_SESSIONS = 1 << 16


class TreeSession:
    """One session of a running tree."""

    __slots__ = ("session_id", "tree_id", "parent", "edge", "depth", "tree", "plan", "fork_tokens",
                 "ended_children", "waiter", "root")

    def __init__(self, plan: SessionPlan, tree_id: int, parent: Optional["TreeSession"],
                 edge: tuple, depth: int, fork_tokens: int, root: Optional["_TreeState"]) -> None:
        self.session_id = plan.session_id
        self.tree_id = tree_id
        self.parent = parent
        self.edge = edge  # (branch index, child index) under the parent; () for the root
        self.depth = depth
        self.tree: Tree = plan.tree
        self.plan = plan
        self.fork_tokens = fork_tokens  # tokens of the parent's context this one begins with (forks)
        self.ended_children: list[list[int]] = [[] for _ in self.tree.branches]  # child indices, in end order
        self.waiter = None  # a future the session awaits at a join
        self.root = root

    @property
    def forked_from(self) -> Optional["TreeSession"]:
        return self.parent if self.fork_tokens else None

    def segments(self) -> list[tuple[float, tuple]]:
        """What each position of the session's prompts is, as (end, content id) runs from position 0:
        the shared system prompt or the parent's first ``fork_tokens`` tokens, then its own (to
        infinity). Two sessions' prompts agree at a position exactly where they name the same id."""
        if self.fork_tokens:
            head = []
            start = 0
            for end, seg in self.parent.segments():
                if start >= self.fork_tokens:
                    break
                head.append((min(end, self.fork_tokens), seg))
                start = end
        else:
            shape = self.plan.shape
            n = shape.shared_prefix_tokens
            head = [(n, ("prefix", shape.prefix_key, n))] if n else []
        return head + [(math.inf, ("own", self.session_id))]

    def held_tokens(self) -> int:
        """Of the first prompt, what an infinite cache holds before it is sent: a fork's inherited
        tokens but the parent's last output token, which the parent never fed back."""
        return max(self.fork_tokens - 1, 0)


class _TreeState:
    __slots__ = ("num_started", "num_open", "index")

    def __init__(self, index: dict) -> None:
        self.num_started = 1
        self.num_open = 1
        self.index = index  # path -> place in the walk


class TreeRuntime:
    """The running trees of one run. ``start(plan)`` starts a session at the clock's current time."""

    def __init__(self, clock: Clock, recorder, start: Callable[[SessionPlan], None], counts, gateway=None,
                 tree_policy: str = "sessions") -> None:
        self.clock = clock
        self.recorder = recorder
        self.start = start
        self.counts = counts
        self.gateway = gateway
        self.tree_policy = tree_policy  # "trees": children of an admitted tree are admitted on arrival
        self.sessions: dict[int, TreeSession] = {}

    def add_root(self, plan: SessionPlan) -> None:
        index = {path: i for i, (_, path, _) in enumerate(plan.tree.walk())}
        if len(index) > MAX_TREE_SESSIONS:
            raise ValueError(f"session {plan.session_id}: a tree of {len(index)} sessions; at most "
                             f"{MAX_TREE_SESSIONS} are supported")
        node = TreeSession(plan, plan.session_id, None, (), 0, 0, _TreeState(index))
        self.sessions[plan.session_id] = node
        self.recorder.tree_session(plan.session_id, None, plan.session_id, 0)

    def get(self, session_id: int) -> Optional[TreeSession]:
        return self.sessions.get(session_id)

    async def turn_done(self, node: TreeSession, turn: int, context_after: int) -> int:
        """Turn ``turn`` of ``node`` has its response (``context_after``: prompt + output): start the
        branches after it; if the next turn joins branches, wait for them. Returns the tokens the
        joins append to the next prompt."""
        tree = node.tree
        for b, branch in enumerate(tree.branches):
            if branch.after_turn == turn:
                self._spawn(node, b, context_after)
        joined = 0
        for b, branch in enumerate(tree.branches):
            if branch.join_turn != turn + 1:
                continue
            ended = node.ended_children[b]
            while len(ended) < branch.num_awaited:
                node.waiter = self.clock.create_future()
                self.counts.thinking += 1
                if self.gateway is not None:
                    self.gateway.join_started(node.session_id)
                await node.waiter
                if self.gateway is not None:
                    self.gateway.join_ended(node.session_id)
                self.counts.thinking -= 1
            joined += branch.join_tokens(list(ended))
        if joined:
            self.recorder.tree_joined(node.session_id, turn + 1, joined)
        return joined

    def _spawn(self, node: TreeSession, b: int, context_after: int) -> None:
        branch = node.tree.branches[b]
        state = node.root
        now = self.clock.now()
        path = _path(node)
        for c, child in enumerate(branch.children):
            sid = CHILD_ID_BASE + node.tree_id * MAX_TREE_SESSIONS + state.index[path + (b, c)]
            plan = SessionPlan(sid, now + (child.start_delay_s or 0.0), child.tree.node, is_trigger=node.plan.is_trigger,
                               token_key=node.plan.token_key, tree=child.tree)
            # a fork inherits the context as it is now (a quorum join may have appended less than drawn)
            fork_tokens = min(context_after, child.tree.prompt_tokens(0)) if branch.mode == FORK else 0
            kid = TreeSession(plan, node.tree_id, node, (b, c), node.depth + 1, fork_tokens, state)
            self.sessions[sid] = kid
            self.recorder.tree_session(sid, node.session_id, node.tree_id, kid.depth)
            state.num_started += 1
            state.num_open += 1
            if self.tree_policy == "trees" and self.gateway is not None:
                self.gateway.admit_on_arrival.add(sid)
            self.clock.call_at(plan.arrival_s, self.start, plan)

    def ended(self, node: TreeSession) -> None:
        """``node``'s session has ended (its last turn, or a turn that failed)."""
        parent = node.parent
        if parent is not None:
            b, c = node.edge
            parent.ended_children[b].append(c)
            waiter = parent.waiter
            if waiter is not None and not waiter.done():
                parent.waiter = None
                waiter.set_result(None)
        state = node.root
        state.num_open -= 1
        if state.num_open == 0:
            self.recorder.tree_ended(node.tree_id, state.num_started, self.clock.now())


def _path(node: TreeSession) -> tuple[int, ...]:
    edges = []
    while node.parent is not None:
        edges.append(node.edge)
        node = node.parent
    return tuple(x for edge in reversed(edges) for x in edge)
