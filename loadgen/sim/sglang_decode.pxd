# sglang_decode.py's DecodeBatch in the compiled build's chain of classes (sglang_state.py).

cimport cython

from .sglang_overlap cimport OverlapResults
from .sglang_state cimport _Req
from .step_machine cimport StepCosts


cdef class DecodeBatch(OverlapResults):
    @cython.locals(c=StepCosts, n=long, ctx=long)
    cpdef tuple _stretch_coeffs(self)
    cpdef _join(self, _Req r)
    @cython.locals(steps=long)
    cpdef _leave(self, _Req r, bint stats=*)
    @cython.locals(i=Py_ssize_t)
    cpdef _decode_token_times(self, _Req r)
    cpdef _stretch_bounds_now(self)
    cpdef long _max_stretch(self) except? -1
    @cython.locals(r=_Req, n=long, d=long, last=long, alpha=double, beta=double, end=double, first_end=double,
                   gap=double, heap=list, finishing=list, entry=tuple)
    cpdef _commit_stretch(self, double start_s, long num_steps, tuple coeffs=*)
    cpdef _update_running_batch(self)
    cpdef bint _check_decode_mem(self, long num_tokens) except -1
    cpdef _release(self, _Req r, long evict_tokens)


@cython.locals(r=_Req)
cdef bint _valid(tuple entry) except -1
