"""A recorded trace on its own clock (``workload.replay``, docs/replay.md): every request at its
recorded time / speed, with its recorded lengths and its recorded prefixes.

A trace row becomes one turn of a ``SessionPlan``: rows of one session id are one session (a
later turn is sent at its time or when the earlier turn's answer arrives, whichever is later);
other rows are sessions of one turn, so across sessions the replay is an open loop.

Prompts are real token ids, the same in the simulator and live: the recorded ids
(``input_tok_ids``), or ids drawn per block hash (``hash_ids``: one recorded id, the same
``block_tokens`` ids wherever it appears), or ids unique to the request. So requests that share
a recorded prefix share those ids: a live server hits on them, and the simulated engines find
them by their block hashes (vLLM, loadgen/sim/prefix_match.py ``BlockHashMatcher``) or token by
token (SGLang, ``TokenMatcher``), as serve-sim does with any prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from trace_shapes.shape import SessionShape

from ..sim.prefix_match import BlockHashMatcher, TokenMatcher, chained_hashes
from .gap_histogram import GapHistogram

if TYPE_CHECKING:  # a replayed trace was read by the spec, which imported its reader
    from trace_shapes.timed import TimedRequest, TimedTrace

VOCAB = 30000  # drawn ids lie in [1, VOCAB), as TokenContext draws them
MAX_CACHED_BLOCKS = 4096  # hash ids whose drawn ids are kept (a block's ids are the same drawn again)


class ReplayRun:
    """What the replayed sessions of one run share: where their drawn ids come from, and every
    prefix some request of the run has sent (a turn's ``cacheable_prefix_tokens``)."""

    def __init__(self, trace: TimedTrace, speed: float, block_size: int,
                 draw: Callable[[str, int], np.random.Generator]) -> None:
        self.trace = trace
        self.speed = speed
        self.block_size = block_size  # the granularity of cacheable_prefix_tokens
        # draw("block", hash id) / draw("row", row): the run's keyed generators (workload.replay_plans)
        self._draw = draw
        self._blocks: dict[int, list[int]] = {}
        self._sent: set[int] = set()

    def block_ids(self, hash_id: int) -> list[int]:
        ids = self._blocks.get(hash_id)
        if ids is None:
            if len(self._blocks) >= MAX_CACHED_BLOCKS:  # a long trace's blocks would not fit: draw again
                self._blocks.clear()
            rng = self._draw("block", hash_id)
            ids = self._blocks[hash_id] = rng.integers(1, VOCAB, size=self.trace.block_tokens).tolist()
        return ids

    def own_ids(self, row: int, num_tokens: int) -> list[int]:
        """Ids only row ``row`` sends (its rest after its hashes; a row without ids or hashes)."""
        if num_tokens <= 0:
            return []
        return self._draw("row", row).integers(1, VOCAB, size=num_tokens).tolist()

    def cacheable_tokens(self, token_ids: Sequence[int]) -> int:
        """The longest prefix of ``token_ids`` an earlier request of the run sent, in whole blocks
        (what an infinite cache holds), then records this prompt as sent."""
        hashes = chained_hashes(list(token_ids), self.block_size)
        sent = self._sent
        held = 0
        for h in hashes:
            if h not in sent:
                break
            held += 1
        sent.update(hashes)
        return held * self.block_size


class ReplaySession:
    """The turns of one replayed session: their send times and their prompts' ids."""

    __slots__ = ("run", "requests", "send_at_s", "_previous")

    def __init__(self, run: ReplayRun, requests: tuple[TimedRequest, ...]) -> None:
        self.run = run
        self.requests = requests
        self.send_at_s = tuple(r.t_s / run.speed for r in requests)
        self._previous: Optional[list[int]] = None  # the last prompt and its answer (aiperf sessions)

    def prompt_ids(self, turn: int) -> list[int]:
        req = self.requests[turn]
        if req.token_ids is not None:
            return list(req.token_ids)
        run = self.run
        # an aiperf session's turn repeats the history (its lengths are in input_tokens already)
        ids = list(self._previous) if turn and self._previous is not None else []
        for h in req.hash_ids or ():
            ids.extend(run.block_ids(h))
        del ids[req.input_tokens:]  # the last block may be partial
        ids.extend(run.own_ids(req.row, req.input_tokens - len(ids)))
        return ids

    def answered(self, turn: int, prompt_ids: list[int], output_ids: Optional[list[int]]) -> None:
        """Turn ``turn`` was answered: an aiperf session's next prompt repeats it and its answer
        (the engine's ids when it returned them, else ids drawn for it)."""
        if self.run.trace.format != "aiperf":
            return
        req = self.requests[turn]
        if output_ids is None or len(output_ids) != req.output_tokens:
            output_ids = self.run.own_ids(-req.row, req.output_tokens)
        self._previous = prompt_ids + list(output_ids)

    def shape(self, kind: str = "replay") -> SessionShape:
        reqs = self.requests
        growth = tuple(b.input_tokens - a.input_tokens - a.output_tokens for a, b in zip(reqs, reqs[1:]))
        return SessionShape(kind, reqs[0].input_tokens, tuple(r.output_tokens for r in reqs), growth,
                            tuple(0.0 for _ in reqs[1:]))


class ReplayPlacer:
    """Replayed prompts onto a simulated engine: by block hashes (vLLM) or token by token
    (SGLang), as serve-sim places any prompt (loadgen/live/serve_sim.py)."""

    def __init__(self, engine) -> None:
        from ..sim.sglang_engine import SGLangEngine

        self.engine = engine
        self._sglang = isinstance(engine, SGLangEngine)
        if self._sglang:
            from ..sim.radix_chains import ChainRadixCache

            engine.tree = ChainRadixCache(engine.config.page_size)
            self._tokens = TokenMatcher(engine.config.page_size)
        else:  # (the spec refuses the CPU offload tier: BlockHashMatcher needs the tree of streams)
            self._blocks = BlockHashMatcher(engine, engine.block_size)

    def streams(self, request):
        """(prefix, stream) of the request's prompt, and what to call when it leaves the engine."""
        ids = request.token_ids
        if self._sglang:
            chain = self._tokens.place(ids)
            return None, self.engine.stream(chain, 0), lambda _fut: self._tokens.finished(chain, ids)
        placement = self._blocks.place(ids)
        # its stream holds the prompt (the output is never resent by a replay: its blocks stay the stream's own)
        return placement.prefix, placement.stream, lambda _fut: self._blocks.finished(placement, ids)


def attach_replay_placers(engine_client, client_timeout_s: Optional[float] = None) -> None:
    """Give every simulated engine of a run (one, or a deployment's replicas) a replay placer, a
    histogram of its inter-token gaps (the replay's ITL percentiles) and the client's timeout."""
    for client in getattr(engine_client, "replicas", [engine_client]):
        client.placer = ReplayPlacer(client.engine)
        client.engine.gaps = GapHistogram()
        client.request_timeout_s = client_timeout_s
