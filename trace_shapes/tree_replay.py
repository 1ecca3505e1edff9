"""Replaying recorded session trees: the linear replay's treatments (trace_shapes/replay.py), node by node.

Each session of a recorded tree gets the treatments a linear session gets: append-only prompts,
truncation at the engine's limit, gaps the trace does not record drawn from the gap fallback
(each session from its own stream, ``node_stream``). What a tree adds:

* a forked child's first prompt is raised, where needed, to what it inherits (its parent's
  context after the fork turn as replayed: the parent's prompts may have been raised);
* a session truncated before a branch's turn never starts that branch (its children are
  dropped, as the calls after the truncation are); one truncated before the joining turn starts
  the branch in the background (nobody waits);
* a child whose first call alone does not fit is dropped, and a branch left without children;
* a recorded join's prompt already holds what the children returned, so children append no
  result; an unrecorded start delay (null) starts the child at once;
* parallel calls of calls after the truncation are dropped with them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .loaders import LoadedTrace
from .replay import (GapFallback, ReplayOptions, TraceReplay, prepare, replay_stats, select_models, to_shape)
from .shape import SessionShape
from .tree import FORK, Branch, Child, RecordedTree, Tree
from .tree_presets import node_stream


@dataclass(frozen=True)
class LoadedTreeTrace(LoadedTrace):
    """A tree-format file whose sessions branch: ``sessions`` are the roots, ``trees`` the trees."""

    trees: tuple[RecordedTree, ...] = ()

    def recorded_gaps_s(self) -> list[float]:
        return [g for tree in self.trees for _, _, t in tree.walk() for g in t.node.gaps_s if g is not None]


@dataclass(frozen=True)
class TreeReplay(TraceReplay):
    """A pool of recorded trees (``pool``: their prepared roots, which the draw order and the
    statistics read); ``make`` replays one as a drawn tree."""

    trees: tuple[RecordedTree, ...] = ()

    def make(self, pool_index: int, rng: np.random.Generator) -> Tree[SessionShape]:
        tree = replay_tree(self.trees[pool_index], self.options, self.gap_fallback, rng)
        assert tree is not None  # the pool holds the trees whose root fits
        return tree


def replay_tree(tree: RecordedTree, options: ReplayOptions, fallback: Optional[GapFallback],
                rng: np.random.Generator, path: tuple[int, ...] = (),
                inherited: int = 0) -> Optional[Tree[SessionShape]]:
    """The replayed tree, or None when its root's first call alone does not fit."""
    node = tree.node
    if inherited > node.prompt_tokens[0]:
        node = dataclasses.replace(node, prompt_tokens=(inherited,) + tuple(node.prompt_tokens[1:]))
    prepared = prepare(node, options.truncate_at_tokens)
    if prepared is None:
        return None
    shape = to_shape(prepared, options, fallback, node_stream(rng, path))
    n = shape.num_turns
    branches = []
    for b, branch in enumerate(tree.branches):
        if branch.after_turn >= n:
            continue
        context = shape.prompt_tokens(branch.after_turn) + shape.output_tokens[branch.after_turn]
        children = []
        for c, child in enumerate(branch.children):
            sub = replay_tree(child.tree, options, fallback, rng, path + (b, c),
                              context if branch.mode == FORK else 0)
            if sub is not None:
                children.append(Child(sub, child.start_delay_s or 0.0))
        if not children:
            continue
        join = branch.join_turn if branch.join_turn is not None and branch.join_turn < n else None
        wait_for = min(branch.wait_for, len(children)) if join is not None and branch.wait_for else None
        branches.append(Branch(branch.after_turn, branch.mode, tuple(children), join, wait_for))
    parallel = tuple(p for p in tree.parallel if p.turn < n)
    return Tree(shape, tuple(branches), parallel)


def build_tree_replay(trees: Sequence[RecordedTree], options: ReplayOptions, gap_fallback: Optional[GapFallback],
                      models: Optional[Sequence[str]] = None, with_replacement: bool = False) -> TreeReplay:
    """Like ``build_replay``, over trees: a tree is chosen by its root's model and kept when its root fits."""
    chosen_roots = select_models([t.node for t in trees], models)
    keep = {id(r) for r in chosen_roots}
    chosen = [t for t in trees if id(t.node) in keep]
    prepared = [(t, prepare(t.node, options.truncate_at_tokens)) for t in chosen]
    kept = [(t, p) for t, p in prepared if p is not None]
    if not kept:
        smallest = min(t.node.prompt_tokens[0] + max(1, t.node.output_tokens[0]) for t in chosen)
        raise ValueError(f"no tree's root fits truncate_at_tokens={options.truncate_at_tokens}: the smallest "
                         f"first call needs {smallest} tokens")
    if gap_fallback is None and any(g is None for t, _ in kept for _, _, s in t.walk() for g in s.node.gaps_s):
        raise ValueError("some sessions have unrecorded gaps; a gap fallback is needed")
    pool = tuple(p for _, p in kept)
    return TreeReplay(pool, options, gap_fallback, with_replacement, replay_stats([t.node for t in chosen], pool),
                      tuple(t for t, _ in kept))
