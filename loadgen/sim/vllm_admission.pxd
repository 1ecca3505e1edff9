# Typed locals of vllm_admission.py for the compiled build (setup.py); pure Python ignores it.

cimport cython

from .kv_pool cimport Stream
from .request cimport SimRequest
from .vllm_state cimport VllmState


cdef class Admission(VllmState):
    @cython.locals(bs=long, num_tokens=long, cap=long, own=Stream, prefix=Stream, hit_prefix=long, hit_own=long,
                   hit_tokens=long, n=long, total=long, need=long, evictable=long)
    cpdef _admission_plan(self, SimRequest req, long budget)

    @cython.locals(hit_prefix=long, hit_own=long, need=long, total=long, n=long, own=Stream, prefix=Stream,
                   hit_tokens=long)
    cpdef tuple _admit(self, SimRequest req, tuple plan)

    @cython.locals(prefix=Stream, full=long, done=long)
    cpdef _computed(self, SimRequest req, long num_computed)
