"""Session trees on the fast engines against the literal reference engines.

The fast engines place a tree's sessions on a tree of streams (vLLM: a fork's stream begins as a
copy of its parent's first k blocks, ``split_stream``) or name their tokens by chains (SGLang's
radix tree), loadgen/core/tree_engines.py. The reference engines know nothing of streams or
chains: every token is named by what it is (its session's content run at that position,
``TreeSession.segments``), and they hash and match those names block by block (vLLM) or token
by token (SGLang). Whole runs of drawn trees, with eviction and preemption, must give every turn
the same cached tokens and the same times."""

from __future__ import annotations

import math

import pytest

from loadgen.core import runner as runner_module
from loadgen.core import tree_engines
from loadgen.core.engines import SimEngineClient
from loadgen.core.recording import RunRecorder
from loadgen.core.runner import RunKey, engine_config, simulate
from loadgen.sim.radix_chains import Chain

from ..conftest import make_spec
from .reference_engine import ReferenceEngine
from .reference_sglang import ReferenceSGLang, RReq


class TreeReference(ReferenceEngine):
    """vLLM block by block; a token's identity is its content name (chain id, position)."""

    chains: dict

    def _token(self, req, pos: int) -> tuple:
        return (self.chains[req.stream.key].at(pos)[1], pos)


class TreeReferenceSGLang(ReferenceSGLang):
    """SGLang's radix tree over token lists; a token is its content name."""

    chains: dict

    def validate(self, num_prompt_tokens: int, max_tokens: int):
        from loadgen.sim.sglang_engine import request_error

        return request_error(self.config, self.config.pool_tokens, num_prompt_tokens, max_tokens)

    def submit(self, req, now: float) -> None:
        self.advance_to(now)
        req.arrival_s = now
        self.prompt_tokens_total += req.num_prompt_tokens
        chain = self.chains[req.stream.key]
        r = RReq(req, lambda p, ch=chain: (ch.at(p)[1], p))
        self.all[req] = r
        self.waiting.append(r)
        if self.inflight_end is None:
            self.next_start = now
            self.advance_to(now)


class ReferencePlacer:
    """A stream per session (the reference engines ignore it) and its content names."""

    def __init__(self, engine, trees) -> None:
        self.engine = engine
        self.trees = trees
        engine.chains = {}

    def streams(self, request):
        key = ("tree", request.session_id)
        if key not in self.engine.chains:
            self.engine.chains[key] = Chain(self.trees.get(request.session_id).segments())
        return None, self.engine.stream(key, 0), None


def tree_spec(preset: str, flavor: str, pool_tokens: int, params: dict = None):
    return make_spec(
        duration_s=240 if flavor == "vllm" else 100, seeds=[5],  # the SGLang reference is slow
        engine={"kind": "sim", "flavor": flavor, "pool_tokens": pool_tokens, "max_model_len": 60_000,
                "max_num_batched_tokens": 2048, "max_num_seqs": 24},
        workload={"arrival_rate_per_s": 0.06, "sessions": {"kind": "tree", "preset": preset, "params": params or {}}},
        arms=[{"name": "base"}])


def run(spec, reference: bool, monkeypatch, seed: int = 5):
    if reference:
        flavor = spec.engine.flavor
        cls = TreeReferenceSGLang if flavor == "sglang" else TreeReference

        def make_engine(clock, engine_spec, key, cost):
            client = SimEngineClient(clock, engine_config(engine_spec), cost)
            client.engine = cls(engine_config(engine_spec), cost)
            return client

        def attach(engine_client, trees):
            engine_client.placer = ReferencePlacer(engine_client.engine, trees)

        monkeypatch.setattr(runner_module, "make_engine", make_engine)
        monkeypatch.setattr(tree_engines, "attach_placers", attach)
    recorder = RunRecorder(None, "r", "base", seed, 1e9, tree_columns=True)
    simulate(spec, RunKey("base", seed), recorder)
    recorder.close()
    monkeypatch.undo()
    turns = recorder.tables()["turns"].to_pandas()
    return turns.sort_values(["session_id", "turn_index", "attempt"]).reset_index(drop=True)


def _same(fast, ref) -> None:
    assert len(fast) == len(ref) > 20
    assert list(fast.session_id) == list(ref.session_id)
    assert list(fast.prompt_tokens) == list(ref.prompt_tokens)
    assert list(fast.cached_tokens) == list(ref.cached_tokens)
    assert list(fast.num_preemptions) == list(ref.num_preemptions)
    for col in ("first_token_s", "finish_s"):
        for a, b in zip(fast[col], ref[col]):
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b)), col


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
@pytest.mark.parametrize("preset, params", [
    ("tree-search", {"refork_probability": 0.6}),
    ("orchestrator-workers", {"wait_for_fraction": 0.6, "start_delay_mean_s": 0.5, "fan_out_mean": 3.0}),
    ("parallel-tools", {"parallel_probability": 0.6, "agent": {"num_turns_mean": 6.0}}),
])
def test_tree_runs_hit_what_the_reference_engines_hit(flavor, preset, params, monkeypatch):
    spec = tree_spec(preset, flavor, pool_tokens=60_000, params=params)
    fast = run(spec, False, monkeypatch)
    ref = run(spec, True, monkeypatch)
    _same(fast, ref)
    forked = fast[(fast.turn_index == 0) & (fast.depth > 0)]
    assert forked.cached_tokens.sum() > 0  # the children's first turns hit something


def test_tree_differential_workloads_evict_and_preempt(monkeypatch):
    """The workloads above are hard: parents' blocks are evicted while they wait, requests are preempted."""
    fast = run(tree_spec("orchestrator-workers", "vllm", 60_000, {"wait_for_fraction": 0.6, "start_delay_mean_s": 0.5,
                                                                  "fan_out_mean": 3.0}), False, monkeypatch)
    assert fast.num_preemptions.sum() > 0
    later = fast[fast.turn_index > 0]
    # some later turn hit less than its session's earlier context: evicted while it waited or thought
    assert (later.cached_tokens < later.cacheable_prefix_tokens - 16).any()
