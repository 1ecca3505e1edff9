"""A simulated request and the vLLM flavour's configuration: what callers build and read back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional

from .kv_pool import Stream
from .offload import OffloadConfig

# LOADING: parked while its host-tier blocks are copied to the GPU (vLLM WAITING_FOR_REMOTE_KVS)
WAITING, RUNNING, FINISHED, LOADING = 0, 1, 2, 3


@dataclass(frozen=True)
class EngineConfig:
    """The engine knobs that shape caching and scheduling (vLLM's names)."""

    num_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    max_model_len: int = 40960
    enable_prefix_caching: bool = True
    reserve_full_prompt: bool = True
    offload: Optional[OffloadConfig] = None  # a CPU KV tier (loadgen/sim/offload.py); None: GPU pool only

    @property
    def pool_tokens(self) -> int:
        """C as vLLM reports it: num_gpu_blocks x block_size."""
        return self.num_blocks * self.block_size


class SimRequest:
    """One request: a prompt of ``num_prompt_tokens`` on ``stream`` (after a shared ``prefix``)."""

    __slots__ = (
        "request_id", "prefix", "stream", "num_prompt_tokens", "max_tokens", "on_done", "on_first_token", "context",
        "arrival_s", "first_token_s", "finish_s", "num_cached_tokens", "num_preemptions",
        "state", "num_tokens", "num_computed", "generated", "alloc_blocks", "admit_seq",
        "is_decoder", "g0", "nc0", "gen0", "residue", "is_builder", "prefix_hit_blocks",
        "last_token_s", "max_token_gap_s", "store_from", "load_start", "load_blocks", "load_done_s", "loaded",
        "segments", "segment_hits", "segment_builders",
    )

    def __init__(self, request_id: Hashable, stream: Stream, num_prompt_tokens: int, max_tokens: int,
                 prefix: Optional[Stream] = None, on_done: Optional[Callable[["SimRequest"], Any]] = None,
                 context: Any = None) -> None:
        self.request_id = request_id
        self.prefix = prefix
        self.stream = stream
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.on_done = on_done
        self.on_first_token: Optional[Callable[["SimRequest"], Any]] = None  # live serving only
        self.context = context
        self.arrival_s = math.nan
        self.first_token_s: Optional[float] = None
        self.finish_s: Optional[float] = None
        self.num_cached_tokens = -1  # fixed at first scheduling, as vLLM reports it
        self.num_preemptions = 0
        self.state = WAITING
        self.num_tokens = num_prompt_tokens  # prompt + generated (before the current decode stretch)
        self.num_computed = 0
        self.generated = 0
        self.alloc_blocks = 0
        self.admit_seq = -1
        self.is_decoder = False
        self.g0 = self.nc0 = self.gen0 = self.residue = 0
        self.is_builder = False
        self.prefix_hit_blocks = 0
        # Per-token timing: when the latest token was sampled and the longest gap between two
        # consecutive tokens so far (a preempted request's gap spans its wait and recompute).
        self.last_token_s: Optional[float] = None
        self.max_token_gap_s = math.nan
        # CPU offload tier: the first block not yet stored to the host (vLLM _next_stored_block_idx),
        # the host blocks [load_start, load_start + load_blocks) being or having been loaded, when
        # the copy lands, and whether the request waits with its loaded blocks
        self.store_from = 0
        self.load_start = self.load_blocks = 0
        self.load_done_s = math.nan
        self.loaded = False
        # a prefix in a tree of streams (prefix.parent set, loadgen/sim/vllm_stream_tree.py): the
        # chain of streams from block 0 to the own stream, the blocks hit in each and which ones
        # this request builds
        self.segments: Optional[tuple] = None
        self.segment_hits: list = []
        self.segment_builders: list = []

    @property
    def mean_token_gap_s(self) -> float:
        """Mean gap between consecutive tokens: (last token - first token) / (tokens - 1)."""
        if self.generated < 2 or self.first_token_s is None or self.last_token_s is None:
            return math.nan
        return (self.last_token_s - self.first_token_s) / (self.generated - 1)

    def __repr__(self) -> str:
        return (f"SimRequest({self.request_id!r}, prompt={self.num_prompt_tokens}, "
                f"cached={self.num_cached_tokens}, state={self.state})")
