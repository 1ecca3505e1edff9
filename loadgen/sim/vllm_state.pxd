# Typed layout of vllm_state.py's VllmState for the compiled build (setup.py); pure Python ignores it.

from .kv_pool cimport BlockPool
from .request cimport SimRequest
from .step_machine cimport StepCosts, StepMachine


cdef class VllmState(StepMachine):
    cdef public object config
    cdef public object cost
    cdef public StepCosts step_costs
    cdef public long block_size
    cdef public bint caching
    cdef public BlockPool pool
    cdef public dict streams
    cdef public object waiting
    cdef public dict running
    cdef public list prefilling
    cdef public long step_index
    cdef public long num_decoders
    cdef public long _decoder_ctx_const
    cdef public list _residues
    cdef public list _finish_heap
    cdef public long _admit_seq
    cdef public bint _flush_requested
    cdef public list _aborts
    cdef public list flush_times_s
    cdef public long prefix_cache_queries
    cdef public long prefix_cache_hits
    cdef public long num_preemptions
    cdef public long prompt_tokens_total
    cdef public long generation_tokens_total
    cdef public long num_steps
    cdef public double _last_end_s
    cdef public object host
    cdef public double _clock_s
    cdef public long num_loading
    cdef public long external_prefix_cache_queries
    cdef public long external_prefix_cache_hits
    cdef public long kv_offload_bytes_gpu_to_cpu
    cdef public long kv_offload_bytes_cpu_to_gpu
    cdef public object jitter

    cpdef _finish(self, SimRequest req, long kv_tokens)
    cpdef _preempt(self, SimRequest req, long g)
    cpdef _release_blocks(self, SimRequest req, long kv_tokens)
