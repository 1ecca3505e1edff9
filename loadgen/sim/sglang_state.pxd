# Typed layout of sglang_state.py's SGLangState for the compiled build (setup.py); pure Python
# ignores it. Fields whose values are not always of one C type stay objects.

from .radix_cache cimport RadixCache
from .request cimport SimRequest
from .step_machine cimport StepCosts, StepMachine


cdef class _Req:
    cdef public SimRequest req
    cdef public object pid
    cdef public long plen
    cdef public object own
    cdef public long generated
    cdef public long prefix_len
    cdef public object last_node
    cdef public long kv_len
    cdef public long already_computed
    cdef public long cached_tokens
    cdef public long protected
    cdef public long order
    cdef public long d0
    cdef public long kv0
    cdef public long gen0
    cdef public long match_len
    cdef public object match_node
    cdef public object last_token_s
    cdef public double max_gap_s
    cdef public bint in_running
    cdef public object prev_token_s
    cdef public bint lingering

    cpdef long fill_len(self) except? -1


cdef class SGLangState(StepMachine):
    cdef public object config
    cdef public long max_running_requests
    cdef public long clip_max_new_tokens
    cdef public long max_prefill_tokens
    cdef public long chunked_prefill_size
    cdef public bint lpm
    cdef public object cost
    cdef public StepCosts step_costs
    cdef public long block_size
    cdef public long page
    cdef public RadixCache tree
    cdef public long total_tokens
    cdef public long available
    cdef public dict streams
    cdef public dict state
    cdef public list waiting
    cdef public dict running
    cdef public object chunked
    cdef public bint batch_is_full
    cdef public bint _shrunk
    cdef public object ratio_base
    cdef public long ratio_steps
    cdef public object decay
    cdef public object min_ratio
    cdef public long decode_index
    cdef public long _ctx_const
    cdef public list _finish_heap
    cdef public long _order
    cdef public list _joined
    cdef public object _last_decode_end
    cdef public bint overlap
    cdef public double _hidden_s
    cdef public bint _cold
    cdef public bint _flush_pending
    cdef public list flush_times_s
    cdef public long prefix_cache_queries
    cdef public long prefix_cache_hits
    cdef public object jitter
    cdef public long num_preemptions
    cdef public long prompt_tokens_total
    cdef public long generation_tokens_total
    cdef public long num_steps
    # the overlap schedule's (sglang_overlap.py)
    cdef public list _ops
    cdef public list _first_ops
    cdef public object _ops_end
    cdef public bint _ops_from_prefill
    cdef public bint _last_decode
    cdef public object _prev_decode_end
    cdef public set _last_prefilled
    # the prefill adder's budget (sglang_prefill.py)
    cdef public double _rem_total_offset
    cdef public long _cur_offset
    cdef public long _rem_input
    cdef public long _rem_chunk

    cpdef _new_token_ratio(self)
    cpdef _leave(self, _Req r, bint stats=*)
    cpdef _cache_unfinished(self, _Req r, kv_len=*)
    cpdef _finish(self, _Req r)
