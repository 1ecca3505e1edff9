"""Synthetic session trees: ``orchestrator-workers`` (spawn and join), ``tree-search`` (fork, keep the
best) and ``parallel-tools`` (turns that make several calls over one prompt).

Every session of a tree draws from its own keyed stream: the root from the generator it is given
(so a tree's root is drawn like any session of an arrival stream), each child from
:func:`node_stream` at its path in the tree ((branch index, child index) per level). A parent draws
its own turns and its branching (fan-out, when to spawn) from its stream; a child's shape depends
only on the root's seed and the child's path, never on its siblings or on how many there are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np

from .shape import SessionShape
from .tree import FORK, SPAWN, Branch, Child, ParallelCalls, Tree

TREE_TAG = 0x7472_6565  # "tree": spawn keys of tree nodes never collide with other uses of spawn keys


SESSION, EDGE = 0, 1  # a session's own draws; the draws of the edge that leads to it (its result, its start)


def node_stream(root: np.random.Generator, path: tuple[int, ...], purpose: int = SESSION) -> np.random.Generator:
    """The generator of the session at ``path`` of the tree whose root draws from ``root``
    (``purpose`` EDGE: of the edge that leads to it, so that a child's result and start delay
    change nothing about its own draws).

    Keys extend the root's seed sequence's spawn key with (tag, purpose, depth, path...): the
    length prefix makes two different paths different keys, all of them apart from the root's."""
    seed_seq = getattr(root.bit_generator, "seed_seq", None) or getattr(root.bit_generator, "_seed_seq", None)
    # a SeedSequence, or one that hashes as a SeedSequence and says so by carrying its three fields
    if not all(hasattr(seed_seq, field) for field in ("entropy", "spawn_key", "pool_size")):
        raise ValueError("a tree's root generator must be seeded from a SeedSequence (np.random.default_rng(seed))")
    if not path and purpose == SESSION:
        return root
    key = tuple(seed_seq.spawn_key) + (TREE_TAG, purpose, len(path)) + tuple(path)
    child = np.random.SeedSequence(seed_seq.entropy, spawn_key=key, pool_size=seed_seq.pool_size)
    return np.random.Generator(np.random.PCG64(child))


def _count(rng: np.random.Generator, mean: float, low: int, high: int) -> int:
    """An integer in [low, high]: low + Poisson(mean - low), capped."""
    return int(min(high, low + rng.poisson(max(mean - low, 0.0))))


def _lognormal_tokens(rng: np.random.Generator, median: float, sigma: float = 0.5) -> int:
    return max(1, int(round(median * math.exp(sigma * rng.standard_normal()))))


def _think(rng: np.random.Generator, mean_s: float, n: int) -> tuple[float, ...]:
    return tuple(float(x) for x in rng.exponential(mean_s, size=n)) if mean_s > 0 else (0.0,) * n


@dataclass(frozen=True)
class AgentShape:
    """One agent's own turns: a shared system prompt, its task, a drawn number of turns."""

    system_prompt_tokens: int
    task_median_tokens: float
    num_turns_mean: float
    output_tokens: int
    tool_tokens: int
    think_time_mean_s: float
    prefix_key: str
    max_turns: int = 64

    def draw(self, rng: np.random.Generator, kind: str, min_turns: int = 1,
             fork_of: Optional[tuple[int, SessionShape]] = None) -> SessionShape:
        """A fresh context over the agent's system prompt, or with ``fork_of`` (inherited tokens,
        parent) the parent's context followed by the branch's own instruction (its "task")."""
        n = _count(rng, self.num_turns_mean, min_turns, max(min_turns, self.max_turns))
        task = _lognormal_tokens(rng, self.task_median_tokens)
        if fork_of is None:
            initial, shared, key = self.system_prompt_tokens + task, self.system_prompt_tokens, self.prefix_key
        else:  # the parent's cross-session prefix is still the start of the context
            inherited, parent = fork_of
            initial, shared, key = inherited + task, parent.shared_prefix_tokens, parent.prefix_key
        return SessionShape(kind=kind, initial_tokens=initial, output_tokens=(self.output_tokens,) * n,
                            growth_tokens=(self.tool_tokens,) * (n - 1), think_s=_think(rng, self.think_time_mean_s, n - 1),
                            shared_prefix_tokens=shared, prefix_key=key)


ORCHESTRATOR = AgentShape(system_prompt_tokens=2000, task_median_tokens=2000, num_turns_mean=6, output_tokens=300,
                          tool_tokens=400, think_time_mean_s=2.0, prefix_key="orchestrator-system")
WORKER = AgentShape(system_prompt_tokens=1500, task_median_tokens=800, num_turns_mean=5, output_tokens=250,
                    tool_tokens=700, think_time_mean_s=1.0, prefix_key="worker-system")


@dataclass(frozen=True)
class OrchestratorWorkers:
    """An orchestrator whose turns spawn workers (fresh contexts over the workers' shared system
    prompt) and wait for them at the next turn, appending each worker's result.

    ``spawn_probability``: each turn but the last spawns a round of workers with it (at least one
    round). Fan-out: 1 + Poisson(``fan_out_mean`` - 1), at most ``max_fan_out``. A worker is an
    orchestrator itself with ``recurse_probability`` while its depth is below ``max_depth``.
    ``wait_for_fraction`` < 1 makes the join go on once that share of the round (rounded up) has
    ended (a quorum); ``start_delay_mean_s``: mean (exponential) delay of each worker's start."""

    orchestrator: AgentShape = ORCHESTRATOR
    worker: AgentShape = WORKER
    spawn_probability: float = 0.5
    fan_out_mean: float = 4.0
    max_fan_out: int = 16
    max_depth: int = 1
    recurse_probability: float = 0.0
    result_median_tokens: float = 400.0
    wait_for_fraction: float = 1.0
    start_delay_mean_s: float = 0.0
    kind: str = "orchestrator-workers"

    def make(self, rng: np.random.Generator) -> Tree[SessionShape]:
        return self._node(rng, (), 0, self.orchestrator)

    def _node(self, root: np.random.Generator, path: tuple[int, ...], depth: int, agent: AgentShape) -> Tree:
        rng = node_stream(root, path)
        is_orchestrator = agent is self.orchestrator
        shape = agent.draw(rng, self.kind if not path else f"{self.kind}/{'orchestrator' if is_orchestrator else 'worker'}",
                           min_turns=2 if is_orchestrator else 1)
        if not is_orchestrator or depth >= self.max_depth:
            return Tree(shape)
        rounds = [k for k in range(shape.num_turns - 1) if rng.random() < self.spawn_probability]
        rounds = rounds or [int(rng.integers(shape.num_turns - 1))]
        branches = []
        for b, after in enumerate(rounds):
            fan_out = _count(rng, self.fan_out_mean, 1, self.max_fan_out)
            children = []
            for c in range(fan_out):
                child_path = path + (b, c)
                edge = node_stream(root, child_path, EDGE)
                recurse = depth + 1 < self.max_depth and edge.random() < self.recurse_probability
                delay = float(edge.exponential(self.start_delay_mean_s)) if self.start_delay_mean_s > 0 else 0.0
                result = _lognormal_tokens(edge, self.result_median_tokens)
                child = self._node(root, child_path, depth + 1, self.orchestrator if recurse else self.worker)
                children.append(Child(child, delay, result))
            wait_for = None if self.wait_for_fraction >= 1 else max(1, math.ceil(self.wait_for_fraction * fan_out))
            branches.append(Branch(after, SPAWN, tuple(children), join_turn=after + 1, wait_for=wait_for))
        return Tree(shape, tuple(branches))


SEARCH_ROOT = AgentShape(system_prompt_tokens=2000, task_median_tokens=3000, num_turns_mean=3, output_tokens=300,
                         tool_tokens=600, think_time_mean_s=1.0, prefix_key="search-system")
SEARCH_BRANCH = AgentShape(system_prompt_tokens=0, task_median_tokens=150, num_turns_mean=3, output_tokens=300,
                           tool_tokens=800, think_time_mean_s=1.0, prefix_key="search-system")


@dataclass(frozen=True)
class TreeSearch:
    """A root that forks ``num_branches`` candidates after its first turn; each inherits the root's
    context, adds its own instruction and explores for a few turns, forking again with
    ``refork_probability`` while above ``max_depth``. The parent waits for all and keeps the best:
    only the best branch (highest drawn score) appends its result; the others append nothing."""

    root: AgentShape = SEARCH_ROOT
    branch: AgentShape = SEARCH_BRANCH
    num_branches: int = 3
    max_depth: int = 2
    refork_probability: float = 0.3
    result_median_tokens: float = 500.0
    kind: str = "tree-search"

    def make(self, rng: np.random.Generator) -> Tree[SessionShape]:
        return self._node(rng, (), 0, None)

    def _node(self, root: np.random.Generator, path: tuple[int, ...], depth: int,
              fork_of: Optional[tuple[int, SessionShape]]) -> Tree:
        rng = node_stream(root, path)
        if fork_of is None:
            shape = self.root.draw(rng, self.kind, min_turns=2)
        else:
            shape = self.branch.draw(rng, f"{self.kind}/branch", fork_of=fork_of)
        forks = (depth < self.max_depth and shape.num_turns >= 2
                 and (fork_of is None or rng.random() < self.refork_probability))
        if not forks:
            return Tree(shape)
        after = 0
        context = shape.prompt_tokens(after) + shape.output_tokens[after]
        scores = rng.random(self.num_branches)
        best = int(np.argmax(scores))
        children = []
        for c in range(self.num_branches):
            child = self._node(root, path + (0, c), depth + 1, (context, shape))
            result = _lognormal_tokens(node_stream(root, path + (0, c), EDGE), self.result_median_tokens)
            children.append(Child(child, 0.0, result if c == best else 0))
        return Tree(shape, (Branch(after, FORK, tuple(children), join_turn=after + 1),))


TOOLS_AGENT = AgentShape(system_prompt_tokens=2000, task_median_tokens=3000, num_turns_mean=15, output_tokens=250,
                         tool_tokens=900, think_time_mean_s=1.0, prefix_key="system")


@dataclass(frozen=True)
class ParallelTools:
    """A linear agent whose turns make, with ``parallel_probability``, 1 + Poisson(``calls_mean`` - 2)
    more calls over the same prompt (at most ``max_calls`` in all), each with its own tail."""

    agent: AgentShape = TOOLS_AGENT
    parallel_probability: float = 0.3
    calls_mean: float = 3.0
    max_calls: int = 8
    tail_median_tokens: float = 200.0
    output_tokens: int = 150
    kind: str = "parallel-tools"

    def make(self, rng: np.random.Generator) -> Tree[SessionShape]:
        shape = self.agent.draw(rng, self.kind)
        parallel = []
        for turn in range(shape.num_turns):
            if rng.random() < self.parallel_probability:
                num_extra = _count(rng, self.calls_mean, 2, self.max_calls) - 1
                tails = tuple(_lognormal_tokens(rng, self.tail_median_tokens) for _ in range(num_extra))
                parallel.append(ParallelCalls(turn, tails, (self.output_tokens,) * num_extra))
        return Tree(shape, (), tuple(parallel))


TreeModel = Union[OrchestratorWorkers, TreeSearch, ParallelTools]
TREE_PRESETS: dict[str, Callable[[], TreeModel]] = {
    "orchestrator-workers": OrchestratorWorkers,
    "tree-search": TreeSearch,
    "parallel-tools": ParallelTools,
}


def tree_preset(name: str) -> TreeModel:
    try:
        return TREE_PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown tree preset {name!r}; presets: {sorted(TREE_PRESETS)}") from None
