"""Session trees: a session whose turns spawn sub-agents, fork branches, join them and make parallel calls.

A tree is a node (one linear session: a :class:`SessionShape` for a drawn workload, a
:class:`RecordedSession` for a trace) plus what its turns start:

* a **branch** after turn ``after_turn`` starts children, either ``spawn`` (a fresh context: the
  child's prompts are its own, sharing at most a cross-session prefix such as a sub-agent system
  prompt, ``prefix_key``) or ``fork`` (the child's context begins with the parent's whole context
  after that turn, its prompt and its response, and the child's prompts include it);
* a branch may be **joined**: the parent's turn ``join_turn`` waits until ``wait_for`` of the
  children (all by default) have ended. For a drawn tree the parent then appends each awaited
  child's ``result_tokens`` to its context; a recorded tree's prompts already hold what the join
  appended (the trace records the whole context), so its children carry no result tokens;
* **parallel calls** at a turn: ``len(tails)`` more requests sent with the turn's call, each the
  turn's prompt followed by its own tail; they are leaves (the session's context goes on from the
  turn's own call, and the turn ends when every call has ended).

Children start ``start_delay_s`` after the response of the turn that spawns them (None where a
trace does not record it). A linear session is a tree without branches or parallel calls;
the linear workload keeps using plain :class:`SessionShape` values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Iterator, Mapping, Optional, Sequence, TypeVar, Union

from .records import RecordedSession
from .shape import SessionShape

SPAWN, FORK = "spawn", "fork"
MODES = (SPAWN, FORK)

Node = TypeVar("Node", SessionShape, RecordedSession)


@dataclass(frozen=True)
class Child(Generic[Node]):
    tree: "Tree[Node]"
    start_delay_s: Optional[float] = 0.0
    result_tokens: int = 0

    def __post_init__(self) -> None:
        if self.start_delay_s is not None and self.start_delay_s < 0:
            raise ValueError(f"start_delay_s must be >= 0, got {self.start_delay_s}")
        if self.result_tokens < 0:
            raise ValueError(f"result_tokens must be >= 0, got {self.result_tokens}")


@dataclass(frozen=True)
class Branch(Generic[Node]):
    after_turn: int
    mode: str
    children: tuple[Child[Node], ...]
    join_turn: Optional[int] = None  # the parent's turn that waits; None: nobody waits (background)
    wait_for: Optional[int] = None  # children that must end before join_turn; None: all

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"branch mode must be one of {MODES}, got {self.mode!r}")
        if not self.children:
            raise ValueError("a branch needs at least one child")
        if self.wait_for is not None:
            if self.join_turn is None:
                raise ValueError("wait_for needs a join_turn (nobody waits for a background branch)")
            if not 1 <= self.wait_for <= len(self.children):
                raise ValueError(f"wait_for must lie in [1, {len(self.children)}], got {self.wait_for}")

    @property
    def num_awaited(self) -> int:
        if self.join_turn is None:
            return 0
        return len(self.children) if self.wait_for is None else self.wait_for

    def join_tokens(self, ended: Optional[Sequence[int]] = None) -> int:
        """Tokens the join appends: the results of the children in ``ended`` (indices), by default
        all of them when the join waits for all, else the largest ``wait_for`` results (the most the
        join can append; which children end first is only known when the tree runs)."""
        results = [c.result_tokens for c in self.children]
        if ended is not None:
            return sum(results[i] for i in ended)
        return sum(sorted(results, reverse=True)[: self.num_awaited])


@dataclass(frozen=True)
class ParallelCalls:
    """More requests sent with turn ``turn``'s call: prompt + ``tail_tokens[i]``, generating ``output_tokens[i]``."""

    turn: int
    tail_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.tail_tokens or len(self.tail_tokens) != len(self.output_tokens):
            raise ValueError(f"parallel calls need as many tails as outputs (at least one), got "
                             f"{len(self.tail_tokens)} and {len(self.output_tokens)}")
        if min(self.tail_tokens) < 1 or min(self.output_tokens) < 1:
            raise ValueError("parallel calls' tails and outputs must be >= 1 token (a tail makes the call distinct)")


def num_turns(node: Union[SessionShape, RecordedSession]) -> int:
    return node.num_turns if isinstance(node, SessionShape) else node.num_calls


@dataclass(frozen=True)
class Tree(Generic[Node]):
    node: Node
    branches: tuple[Branch[Node], ...] = ()
    parallel: tuple[ParallelCalls, ...] = ()

    def __post_init__(self) -> None:
        n = num_turns(self.node)
        for b in self.branches:
            if not 0 <= b.after_turn < n:
                raise ValueError(f"branch after turn {b.after_turn}: the session has {n} turns")
            if b.join_turn is not None and not b.after_turn < b.join_turn < n:
                raise ValueError(f"branch after turn {b.after_turn}: join_turn {b.join_turn} must lie in "
                                 f"({b.after_turn}, {n})")
            if isinstance(self.node, RecordedSession) and any(c.result_tokens for c in b.children):
                raise ValueError("a recorded tree's join prompts already hold the children's results; "
                                 "result_tokens are for drawn trees")
            if b.mode == FORK:
                inherited = self.context_after(b.after_turn)
                for c in b.children:
                    first = c.tree.prompt_tokens(0)
                    if first < inherited:
                        raise ValueError(f"a fork after turn {b.after_turn} inherits {inherited} tokens, but "
                                         f"its child's first prompt is {first}")
        turns = [p.turn for p in self.parallel]
        if len(set(turns)) != len(turns) or any(not 0 <= t < n for t in turns):
            raise ValueError(f"parallel calls: turns {turns} must be distinct and lie in [0, {n})")

    # ---------------------------------------------------------------- context
    def num_turns(self) -> int:
        return num_turns(self.node)

    def output_tokens(self, turn: int) -> int:
        return self.node.output_tokens[turn]

    def prompt_tokens(self, turn: int, ended: Optional[Mapping[int, Sequence[int]]] = None) -> int:
        """The whole context turn ``turn`` sends. A drawn node adds what its joins before it appended
        (``ended[branch index]``: the children that had ended, as in :meth:`Branch.join_tokens`)."""
        if isinstance(self.node, RecordedSession):
            return self.node.prompt_tokens[turn]
        ended = ended or {}
        joined = sum(b.join_tokens(ended.get(i)) for i, b in enumerate(self.branches)
                     if b.join_turn is not None and b.join_turn <= turn)
        return self.node.prompt_tokens(turn) + joined

    def context_after(self, turn: int) -> int:
        """The context after turn ``turn``'s response: what a fork at that turn inherits."""
        return self.prompt_tokens(turn) + self.output_tokens(turn)

    def gaps_s(self) -> tuple[Optional[float], ...]:
        """The pause before each turn after the first (after the previous turn ends and, at a join,
        after the awaited children have ended)."""
        return self.node.gaps_s if isinstance(self.node, RecordedSession) else self.node.think_s

    def shared_prefix(self) -> tuple[int, Optional[str]]:
        """(tokens, key) of the cross-session prefix the node's first prompt starts with."""
        if isinstance(self.node, RecordedSession):
            return self.node.shared_prefix_tokens or 0, self.node.prefix_key
        return self.node.shared_prefix_tokens, self.node.prefix_key

    # ---------------------------------------------------------------- structure
    def is_linear(self) -> bool:
        return not self.branches and not self.parallel

    def walk(self, depth: int = 0, path: tuple[int, ...] = ()) -> Iterator[tuple[int, tuple[int, ...], "Tree[Node]"]]:
        """(depth, path, subtree) of every session, parents first; a path is (branch index, child
        index) per level, () for the root."""
        yield depth, path, self
        for b, branch in enumerate(self.branches):
            for c, child in enumerate(branch.children):
                yield from child.tree.walk(depth + 1, path + (b, c))

    def num_sessions(self) -> int:
        return sum(1 for _ in self.walk())

    def depth(self) -> int:
        return max(d for d, _, _ in self.walk())

    def inherited_tokens(self) -> dict[tuple[int, ...], int]:
        """Path -> the tokens a forked session's context starts with from its parent (forks only)."""
        found = {}
        for _, path, tree in self.walk():
            for b, branch in enumerate(tree.branches):
                if branch.mode == FORK:
                    for c in range(len(branch.children)):
                        found[path + (b, c)] = tree.context_after(branch.after_turn)
        return found

    def as_recorded(self, session_id: str) -> "Tree[RecordedSession]":
        """The same tree with its sessions as recorded numbers (a drawn tree's joins at their largest
        appended results), the form ``shapes describe`` reads."""
        if isinstance(self.node, RecordedSession):
            return self  # type: ignore[return-value]
        n = self.num_turns()
        key_tokens, key = self.shared_prefix()
        node = RecordedSession(session_id, self.node.kind, tuple(self.prompt_tokens(k) for k in range(n)),
                               tuple(self.node.output_tokens), tuple(self.node.think_s),
                               shared_prefix_tokens=key_tokens, prefix_key=key)
        branches = tuple(
            Branch(b.after_turn, b.mode,
                   tuple(Child(c.tree.as_recorded(f"{session_id}.{i}.{j}"), c.start_delay_s)
                         for j, c in enumerate(b.children)),
                   b.join_turn, b.wait_for)
            for i, b in enumerate(self.branches))
        return Tree(node, branches, self.parallel)


RecordedTree = Tree[RecordedSession]
