# Typed layout of engines.py's records and SimEngineClient for the compiled build (setup.py); pure Python
# ignores it.

from ..sim.request cimport SimRequest

# TurnRequest and TurnResult as extension types: their fields are C slots (read-only: the records
# are frozen), any value as in pure Python
cdef class TurnRequest:
    cdef readonly object session_id
    cdef readonly object turn_index
    cdef readonly object prompt_tokens
    cdef readonly object max_tokens
    cdef readonly object shared_prefix_tokens
    cdef readonly object prefix_key
    cdef readonly object token_ids
    cdef readonly object prompt_content
    cdef readonly object final
    cdef readonly object parent_session_id
    cdef readonly object inherited_tokens


cdef class TurnResult:
    cdef readonly object submitted_s
    cdef readonly object first_token_s
    cdef readonly object finish_s
    cdef readonly object prompt_tokens
    cdef readonly object cached_tokens
    cdef readonly object output_tokens
    cdef readonly object num_preemptions
    cdef readonly object error
    cdef readonly object output_token_ids
    cdef readonly object inter_token_gaps_s
    cdef readonly object itl_mean_s
    cdef readonly object itl_max_s
    cdef readonly object output_text
    cdef readonly object replica
    cdef readonly object miss_routing_tokens
    cdef readonly object miss_eviction_tokens
    cdef readonly object gateway_wait_s


cdef class SimEngineClient:
    cdef public object clock
    cdef public object engine  # a StepMachine, or a test's reference engine (tests/sim/test_tree_differential.py)
    cdef public long pool_tokens
    cdef public object _timer
    cdef public object _armed_at
    cdef public long _seq
    cdef public object placer
    cdef public object request_timeout_s

    cpdef _rearm(self)
    cpdef _fire(self)


cpdef _resolve(SimRequest req)
