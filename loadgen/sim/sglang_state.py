"""The SGLang flavour's configuration (``SGLangConfig``), per-request state (``_Req``) and engine
state, at the bottom of ``SGLangEngine``'s chain of classes.

``SGLangEngine`` (loadgen/sim/sglang_engine.py) is one chain, each layer a concern of its own:
``StepMachine`` (time, delivery, stretches) <- ``SGLangState`` (this module: the state every
layer reads) <- ``OverlapResults`` (sglang_overlap.py) <- ``DecodeBatch`` (sglang_decode.py) <-
``PrefillAdding`` (sglang_prefill.py) <- ``SGLangEngine`` (the event loop's step and the public
surface). A chain, not mixins, so that the compiled build can lay the state out as fields
(sglang_state.pxd) that every layer reads directly, as the vLLM flavour's (vllm_state.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable, Optional

from .cost import StepCostModel
from .kv_pool import Stream
from .radix_cache import RadixCache
from .request import SimRequest
from .step_machine import StepCosts, StepMachine


@dataclass(frozen=True)
class SGLangConfig:
    """SGLang's server arguments that shape caching and scheduling (its names and defaults)."""

    pool_tokens: int  # max_total_num_tokens
    page_size: int = 1
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int = 1024
    max_model_len: int = 40960  # context_len
    schedule_policy: str = "fcfs"
    init_new_token_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness 1.0
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    clip_max_new_tokens: int = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    enable_prefix_caching: bool = True
    # event_loop_overlap (loadgen/sim/sglang_overlap.py); SGLang's default is on (the spec's
    # engine.sglang.overlap_schedule defaults to true), off here so the engine alone is SGLang's
    # normal loop unless asked
    overlap_schedule: bool = False

    @property
    def block_size(self) -> int:
        return self.page_size

    @property
    def min_new_token_ratio(self) -> float:
        return min(self.init_new_token_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def new_token_ratio_decay(self) -> float:
        return (self.init_new_token_ratio - self.min_new_token_ratio) / self.new_token_ratio_decay_steps


class _Req:
    """SGLang's per-request scheduling state next to the public ``SimRequest``."""

    __slots__ = ("req", "pid", "plen", "own", "generated", "prefix_len", "last_node", "kv_len",
                 "already_computed", "cached_tokens", "protected", "order", "d0", "kv0", "gen0", "match_len", "match_node",
                 "last_token_s", "max_gap_s", "in_running", "prev_token_s", "lingering")

    def __init__(self, req: SimRequest, pid, plen: int, own) -> None:
        self.req = req
        self.pid, self.plen, self.own = pid, plen, own
        self.generated = 0  # len(output_ids)
        self.prefix_len = 0  # len(prefix_indices): where the next extend starts
        self.protected = 0  # cache_protected_len: the page-aligned part of it that is in the tree
        self.last_node = None
        self.kv_len = 0  # tokens with KV slots (seq_len)
        self.already_computed = 0
        self.cached_tokens = 0
        self.order = 0  # position in the running batch
        self.d0 = self.kv0 = self.gen0 = 0
        self.match_len = 0
        self.match_node = None
        self.last_token_s: Optional[float] = None
        self.max_gap_s = math.nan
        self.in_running = False
        self.prev_token_s: Optional[float] = None  # the token before the last (overlap: a retraction drops the last)
        self.lingering = False  # its last token is computed, the scheduler does not know yet (overlap)

    def fill_len(self) -> int:
        """The tokens a prefill fills: the prompt, then what it has generated (a retracted request's)."""
        return self.req.num_prompt_tokens + self.generated

    def __repr__(self) -> str:
        return f"_Req({self.req.request_id!r}, gen={self.generated}, kv={self.kv_len}, prefix={self.prefix_len})"


class SGLangState(StepMachine):
    """What an SGLang engine holds: its configuration, radix tree, queues, batch aggregates and counters."""

    def __init__(self, config: SGLangConfig, cost: StepCostModel) -> None:
        if not config.enable_prefix_caching:
            raise ValueError("the sglang flavour models the radix cache; --disable-radix-cache (enable_prefix_caching "
                             "false) schedules ignore_eos requests by another rule that is not modelled")
        if config.schedule_policy not in ("fcfs", "lpm"):
            raise ValueError(f"schedule_policy must be fcfs or lpm, got {config.schedule_policy!r}")
        if min(config.chunked_prefill_size, config.max_prefill_tokens, config.max_running_requests,
               config.page_size) < 1:
            raise ValueError("page_size, chunked_prefill_size, max_prefill_tokens and max_running_requests must be >= 1")
        self.config = config
        # the prefill adder's limits, read every iteration (sglang_prefill.py): C fields, not the
        # frozen configuration's attributes
        self.max_running_requests = config.max_running_requests
        self.clip_max_new_tokens = config.clip_max_new_tokens
        self.max_prefill_tokens = config.max_prefill_tokens
        self.chunked_prefill_size = config.chunked_prefill_size
        self.lpm = config.schedule_policy == "lpm"
        self.cost = cost
        self.step_costs = StepCosts(cost)
        self.block_size = config.page_size
        self.page = config.page_size
        self.tree = RadixCache(config.page_size)
        self.total_tokens = config.pool_tokens
        self.available = config.pool_tokens
        self.streams: dict[Hashable, Stream] = {}
        self.state: dict[SimRequest, _Req] = {}
        self.waiting: list[_Req] = []
        self.running: dict[_Req, None] = {}  # the running batch, in its order
        self.chunked: Optional[_Req] = None
        self.batch_is_full = False
        self._shrunk = False  # the running batch lost a request in the last decode step (filtered next decode)
        self.ratio_base = config.init_new_token_ratio
        self.ratio_steps = 0
        self.decay = config.new_token_ratio_decay
        self.min_ratio = config.min_new_token_ratio
        self.decode_index = 0  # D: decode steps so far
        self._ctx_const = 0  # sum over running of kv0 - d0: their KV is this + n x D
        self._finish_heap: list = []  # (decode step of the last token, order, _Req)
        self._order = 0
        self._joined: list[_Req] = []  # joined the running batch since the last decode step
        self._last_decode_end: Optional[float] = None
        self._init_step_machine()
        self.overlap = config.overlap_schedule
        self._hidden_s = cost.hidden_cpu_s if config.overlap_schedule else 0.0
        self._cold = True  # the next step starts from idle: nothing to hide its CPU share behind
        self._init_overlap()
        self._flush_pending = False
        self.flush_times_s: list[float] = []
        # counters: sglang:prompt_tokens_total / cached_tokens_total move when a request finishes
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.jitter: Optional[Callable[[], float]] = None  # per-step time multiplier (loadgen/sim/jitter.py)
        self.num_preemptions = 0  # retractions
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_steps = 0

    def _new_token_ratio(self) -> float:
        # the ratio after ``ratio_steps`` decays from ``ratio_base`` (a retraction's estimate or the
        # initial value); written in closed form so a stretch of decode steps moves it in O(1)
        if self.ratio_steps == 0:
            return self.ratio_base
        return max(self.ratio_base - self.ratio_steps * self.decay, self.min_ratio)

    # Hooks the layers above define. Declared at the bottom of the chain so that a layer calls a
    # method of a layer above it in C (sglang_state.pxd), not by name.
    def _leave(self, r: _Req, stats: bool = True) -> None:
        raise NotImplementedError

    def _cache_unfinished(self, r: _Req, kv_len: Optional[int] = None) -> None:
        raise NotImplementedError

    def _finish(self, r: _Req) -> None:
        raise NotImplementedError
