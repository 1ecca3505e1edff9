# Typed locals of engine.py for the compiled build (setup.py); pure Python ignores it.

cimport cython

from .kv_pool cimport BlockPool, Stream
from .request cimport SimRequest
from .vllm_offload cimport OffloadScheduling


cdef class SimEngine(OffloadScheduling):
    @cython.locals(prefix=Stream)
    cpdef submit(self, SimRequest request, double now_s)

    cpdef bint _at_boundary(self) except -1

    @cython.locals(budget=long)
    cpdef _stretch_bounds_now(self)

    @cython.locals(bs=long, g=long, budget=long, preempted=bint, need=long, r=long, num_tokens=long, decode_ctx=long,
                   attention=double, completed=list, req=SimRequest, victim=SimRequest, nc=long, n=long,
                   hit_tokens=long, step_s=double, end=double, gap_s=double)
    cpdef _step(self, double start_s)

    cpdef _finish(self, SimRequest req, long kv_tokens)

    cpdef _preempt(self, SimRequest req, long g)

    @cython.locals(bs=long, pool=BlockPool, own=Stream, prefix=Stream, alloc=long, base=long, own_alloc=long,
                   own_cached=long, held=long)
    cpdef _release_blocks(self, SimRequest req, long kv_tokens)
