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
A turn's parallel calls are one-turn sessions sent with the turn's own call, over its prompt; the
turn ends when they all have.

Identities: a child's session id is ``CHILD_ID_BASE + tree_id * MAX_TREE_SESSIONS + i``, where
the tree id is the root's session id and ``i`` the child's place in the tree's walk (parents
first), so that ids depend on the drawn tree only, never on timing. What each session's tokens
are, for the engines (loadgen/core/tree_engines.py): its own tokens, after either a shared
system prompt (root, spawned child) or its parent's first ``fork_tokens`` tokens (forked child).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from trace_shapes.shape import SessionShape
from trace_shapes.tree import FORK, Tree

from .clock import Clock
from .workload import SessionPlan

CHILD_ID_BASE = 1 << 40
MAX_TREE_SESSIONS = 1 << 16


class TreeSession:
    """One session of a running tree."""

    __slots__ = ("session_id", "tree_id", "parent", "edge", "depth", "tree", "plan", "fork_tokens",
                 "ended_children", "waiter", "root", "held", "calls_open", "tokens", "fork_ids",
                 "fork_head")

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
        # of its first prompt, what an infinite cache holds before it is sent: a fork's inherited
        # tokens but the parent's last output token, which the parent never fed back
        self.held = max(fork_tokens - 1, 0)
        self.calls_open = 0  # its parallel calls still running (leaves: edge (-1, k))
        self.tokens = None  # its token ids (live runs: loadgen/core/session.py TokenContext)
        self.fork_ids: Optional[list] = None  # live: the parent's ids it begins with, taken when it forks
        self.fork_head: Optional[tuple] = None  # live, text prompts: the parent's messages (or text) likewise

    @property
    def parent_id(self) -> Optional[int]:
        return self.parent.session_id if self.parent is not None else None

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
        return self.held


class _TreeState:
    __slots__ = ("num_started", "num_open", "index", "next_call")

    def __init__(self, index: dict) -> None:
        self.num_started = 1
        self.num_open = 1
        self.index = index  # path -> place in the walk
        self.next_call = len(index)  # parallel calls take the places after the walk's, as they are sent


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
        self.recorder.tree_session(plan.session_id, None, plan.session_id, 0, plan.shape.name)

    def get(self, session_id: int) -> Optional[TreeSession]:
        return self.sessions.get(session_id)

    def context_started(self, node: TreeSession, tokens) -> None:
        """A live session's context, before it is built (``start``): a fork's (or parallel call's)
        first ``fork_tokens`` are its parent's, as the parent sent and received them, so a server's
        prefix cache can hit them: a fork's were taken when it forked (the parent's prompt and the
        response's output ids), a parallel call's are its turn's prompt (built before the call is
        sent). Text prompts (chat messages, completions text) likewise begin with the parent's
        messages as sent, then the returned text as the assistant's message (``TextContext.fork``)."""
        node.tokens = tokens
        if not node.fork_tokens or tokens is None:
            return
        if tokens.ids is None:
            tokens.fork(node.fork_head, node.fork_tokens)
            return
        ids = node.fork_ids if node.fork_ids is not None else node.parent.tokens.ids[:node.fork_tokens]
        tokens.ids[:len(ids)] = ids

    async def turn_done(self, node: TreeSession, turn: int, context_after: int,
                        output_ids: Optional[list] = None, output_text: Optional[str] = None) -> int:
        """Turn ``turn`` of ``node`` has its response (``context_after``: prompt + output; live, the
        output's ``output_ids`` and ``output_text``): start the branches after it; if the next turn
        joins branches, wait for them. Returns the tokens the joins append to the next prompt."""
        tree = node.tree
        if node.calls_open:  # the turn ends when its parallel calls have ended
            await self._wait(node, lambda: not node.calls_open)
        for b, branch in enumerate(tree.branches):
            if branch.after_turn == turn:
                self._spawn(node, b, context_after, output_ids, output_text)
        joined, joins = 0, False
        for b, branch in enumerate(tree.branches):
            if branch.join_turn != turn + 1:
                continue
            ended = node.ended_children[b]
            await self._wait(node, lambda: len(ended) >= branch.num_awaited)
            joined += branch.join_tokens(list(ended))
            joins = True
        if joins:  # a recorded trace's join appends 0 tokens (its next prompt holds the results already)
            self.recorder.tree_joined(node.session_id, turn + 1, joined)
        return joined

    async def _wait(self, node: TreeSession, done: Callable[[], bool]) -> None:
        """Until ``done()``, re-checked whenever one of ``node``'s children or calls ends."""
        while not done():
            node.waiter = self.clock.create_future()
            self.counts.thinking += 1
            if self.gateway is not None:
                self.gateway.join_started(node.session_id)
            await node.waiter
            if self.gateway is not None:
                self.gateway.join_ended(node.session_id)
            self.counts.thinking -= 1

    def send_parallel(self, node: TreeSession, turn: int, prompt_tokens: int) -> None:
        """Turn ``turn``'s parallel calls, sent now with its own call: each a one-turn session whose
        prompt is this turn's prompt followed by its tail (a fork of the prompt, not of the response)."""
        for calls in node.tree.parallel:
            if calls.turn != turn:
                continue
            state = node.root
            for tail, output in zip(calls.tail_tokens, calls.output_tokens):
                shape = node.plan.shape
                leaf = SessionShape(f"{shape.kind}/call", prompt_tokens + tail, (output,), (), (),
                                    shape.shared_prefix_tokens, shape.prefix_key, shape.name)
                sid = CHILD_ID_BASE + node.tree_id * MAX_TREE_SESSIONS + state.next_call
                state.next_call += 1
                if state.next_call > MAX_TREE_SESSIONS:
                    raise ValueError(f"tree {node.tree_id}: more than {MAX_TREE_SESSIONS} sessions and calls")
                self._start(node, SessionPlan(sid, self.clock.now(), leaf, is_trigger=node.plan.is_trigger,
                                              token_key=node.plan.token_key, tree=Tree(leaf)),
                            (-1, turn), prompt_tokens)
                call = self.sessions[sid]
                call.held = prompt_tokens  # the turn's own call, just sent, holds all it shares
                if node.tokens is not None and node.tokens.ids is None:  # text: the turn's messages as sent
                    call.fork_head = node.tokens.fork_head()
                node.calls_open += 1

    def _start(self, parent: TreeSession, plan: SessionPlan, edge: tuple, fork_tokens: int) -> None:
        kid = TreeSession(plan, parent.tree_id, parent, edge, parent.depth + 1, fork_tokens, parent.root)
        self.sessions[plan.session_id] = kid
        self.recorder.tree_session(plan.session_id, parent.session_id, parent.tree_id, kid.depth, plan.shape.name)
        state = parent.root
        state.num_started += 1
        state.num_open += 1
        if self.tree_policy == "trees" and self.gateway is not None:
            self.gateway.admit_on_arrival.add(plan.session_id)
        self.clock.call_at(plan.arrival_s, self.start, plan)

    def _spawn(self, node: TreeSession, b: int, context_after: int, output_ids: Optional[list],
               output_text: Optional[str]) -> None:
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
            self._start(node, plan, (b, c), fork_tokens)
            if fork_tokens and node.tokens is not None:
                if node.tokens.ids is None:  # text: the parent's messages as sent and the text returned
                    self.sessions[sid].fork_head = node.tokens.fork_head(output_text)
                else:
                    self.sessions[sid].fork_ids = _fork_ids(node.tokens.ids, output_ids, context_after, fork_tokens)

    def ended(self, node: TreeSession) -> None:
        """``node``'s session has ended (its last turn, or a turn that failed)."""
        parent = node.parent
        if parent is not None:
            b, c = node.edge
            if b < 0:  # a parallel call
                parent.calls_open -= 1
            else:
                parent.ended_children[b].append(c)
            waiter = parent.waiter
            if waiter is not None and not waiter.done():
                parent.waiter = None
                waiter.set_result(None)
        state = node.root
        state.num_open -= 1
        if state.num_open == 0:
            self.recorder.tree_ended(node.tree_id, state.num_started, self.clock.now())


def _fork_ids(prompt_ids: list, output_ids: Optional[list], context_after: int, fork_tokens: int) -> list:
    """The ids a fork begins with: the parent's prompt and its response's output ids (only the
    prompt when the server returned no output ids, which the parent then draws itself)."""
    num_output = context_after - len(prompt_ids)
    ids = list(prompt_ids)
    if output_ids is not None and len(output_ids) == num_output:
        ids += output_ids
    return ids[:fork_tokens]


def _path(node: TreeSession) -> tuple[int, ...]:
    edges = []
    while node.parent is not None:
        edges.append(node.edge)
        node = node.parent
    return tuple(x for edge in reversed(edges) for x in edge)
