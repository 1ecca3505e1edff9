"""The vLLM flavour's engine state, at the bottom of ``SimEngine``'s chain of classes.

``SimEngine`` (loadgen/sim/engine.py) is one chain, each layer a concern of its own:
``StepMachine`` (time, delivery, stretches) <- ``VllmState`` (this module: the state every layer
reads) <- ``Admission`` (vllm_admission.py) <- ``DecodeAggregates`` (vllm_decode.py) <-
``StreamTree`` (vllm_stream_tree.py) <- ``OffloadScheduling`` (vllm_offload.py) <- ``SimEngine``
(the scheduler's step, requests leaving, the public surface). A layer calls those below it; the
three ways out of the running set, which every layer uses, are hooks here that SimEngine fills.
A chain, not mixins, so that the compiled build can lay the state out as typed fields
(vllm_state.pxd) that every layer reads directly.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Hashable, Optional

from .cost import StepCostModel
from .kv_pool import BlockPool, Stream
from .offload import HostTier
from .request import EngineConfig, SimRequest
from .step_machine import StepCosts, StepMachine


class VllmState(StepMachine):
    """What a vLLM engine holds: its configuration, pool, queues, decoder aggregates and counters."""

    def __init__(self, config: EngineConfig, cost: StepCostModel) -> None:
        if config.max_num_batched_tokens < 1 or config.max_num_seqs < 1 or config.block_size < 1:
            raise ValueError("block_size, max_num_batched_tokens and max_num_seqs must be >= 1")
        self.config = config
        self.cost = cost
        self.step_costs = StepCosts(cost)
        self.block_size = config.block_size
        self.caching = config.enable_prefix_caching
        self.pool = BlockPool(config.num_blocks)
        self.streams: dict[Hashable, Stream] = {}
        self.waiting: deque[SimRequest] = deque()
        self.running: dict[SimRequest, None] = {}  # insertion order is vLLM's running order
        self.prefilling: list[SimRequest] = []  # running requests still in prefill, in order
        self.step_index = 0  # G: index of the next step
        self.num_decoders = 0
        self._decoder_ctx_const = 0  # sum over decoders of (nc0 - g0 + 1): their context is this + R*G
        self._residues = [0] * config.block_size  # decoders needing a block at steps G % block_size
        self._finish_heap: list = []  # (finish step, admit_seq, request)
        self._admit_seq = 0
        self._init_step_machine()
        self._flush_requested = False
        self._aborts: list[SimRequest] = []  # to abort at the next step boundary, in request order
        self.flush_times_s: list[float] = []
        # vLLM-like counters (token counters, like vllm:prefix_cache_*_total)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_steps = 0
        self._last_end_s = 0.0  # end of the latest committed step
        self.host: Optional[HostTier] = None
        if config.offload is not None:
            if not config.enable_prefix_caching:
                raise ValueError("the CPU offload tier needs prefix caching (blocks are found by their hashes)")
            self.host = HostTier(config.offload)
        # the time of what the engine applies now: a store is submitted to its copy link then
        self._clock_s = 0.0
        self.num_loading = 0  # waiting requests that hold GPU blocks: loading, or loaded and not yet admitted
        # vllm:external_prefix_cache_{queries,hits} (tokens) and vllm:kv_offload_total_bytes by direction
        self.external_prefix_cache_queries = 0
        self.external_prefix_cache_hits = 0
        self.kv_offload_bytes_gpu_to_cpu = 0
        self.kv_offload_bytes_cpu_to_gpu = 0
        self.jitter: Optional[Callable[[], float]] = None  # per-step time multiplier (loadgen/sim/jitter.py)


    # ------------------------------------------------------------------ hooks (SimEngine's)
    def _finish(self, req: SimRequest, kv_tokens: int) -> None:
        """``req`` finished: out of the running set, its blocks freed, delivered at the step's end."""
        raise NotImplementedError

    def _preempt(self, req: SimRequest, g: int) -> None:
        """``req`` is preempted at the start of step ``g``: blocks freed, back to the waiting queue."""
        raise NotImplementedError

    def _release_blocks(self, req: SimRequest, kv_tokens: int) -> None:
        """Free ``req``'s blocks tail first, the full blocks of its first ``kv_tokens`` keeping their hashes."""
        raise NotImplementedError
