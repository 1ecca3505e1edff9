# Typed locals of vllm_offload.py for the compiled build (setup.py); pure Python ignores it.

cimport cython

from .request cimport SimRequest
from .vllm_stream_tree cimport StreamTree


cdef class OffloadScheduling(StreamTree):
    cpdef _offload_plan(self, SimRequest req, long budget)

    @cython.locals(req=SimRequest, i=long)
    cpdef tuple _admit_waiting_offload(self, double start_s, long num_tokens, double attention, long budget,
                                       list completed)

    cpdef _start_load(self, SimRequest req, tuple plan, double start_s)
    cpdef _finish_load(self, SimRequest req)
    cpdef _cancel_load(self, SimRequest req)
    cpdef _offload_store(self, SimRequest req, long kv_tokens)

    @cython.locals(req=SimRequest)
    cpdef _offload_stretch_bounds(self, long budget)
