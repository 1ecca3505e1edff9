"""The SGLang flavour's engine state, at the bottom of ``SGLangEngine``'s chain of classes.

``SGLangEngine`` (loadgen/sim/sglang_engine.py) is one chain, each layer a concern of its own:
``StepMachine`` (time, delivery, stretches) <- ``SGLangState`` (this module: the state every
layer reads) <- ``OverlapResults`` (sglang_overlap.py) <- ``DecodeBatch`` (sglang_decode.py) <-
``PrefillAdding`` (sglang_prefill.py) <- ``SGLangEngine`` (the event loop's step and the public
surface). A chain, not mixins, so that the compiled build can lay the state out as fields
(sglang_state.pxd) that every layer reads directly, as the vLLM flavour's (vllm_state.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable, Optional

from .cost import StepCostModel
from .kv_pool import Stream
from .radix_cache import RadixCache
from .request import SimRequest
from .step_machine import StepMachine

if TYPE_CHECKING:
    from .sglang_engine import SGLangConfig, _Req


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
        self.cost = cost
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

