# Typed layout of request.py's SimRequest for the compiled build (setup.py); pure Python ignores it.

cdef class SimRequest:
    cdef public object request_id
    cdef public object prefix  # a Stream here; the reference engines (tests/sim) put their own
    cdef public object stream
    cdef public long num_prompt_tokens
    cdef public long max_tokens
    cdef public object on_done
    cdef public object on_first_token
    cdef public object context
    cdef public double arrival_s
    cdef public object first_token_s
    cdef public object finish_s
    cdef public long num_cached_tokens
    cdef public long num_preemptions
    cdef public int state
    cdef public long num_tokens
    cdef public long num_computed
    cdef public long generated
    cdef public long alloc_blocks
    cdef public long admit_seq
    cdef public bint is_decoder
    cdef public long g0
    cdef public long nc0
    cdef public long gen0
    cdef public long residue
    cdef public bint is_builder
    cdef public long prefix_hit_blocks
    cdef public object last_token_s
    cdef public double max_token_gap_s
    cdef public long store_from
    cdef public long load_start
    cdef public long load_blocks
    cdef public double load_done_s
    cdef public bint loaded
    cdef public object segments
    cdef public list segment_hits
    cdef public list segment_builders
