# sglang_overlap.py's OverlapResults in the compiled build's chain of classes (sglang_state.py).

cimport cython

from .sglang_state cimport SGLangState, _Req


cdef class OverlapResults(SGLangState):
    cpdef bint _has_deliveries(self) except -1
    cpdef long _lag(self, _Req r) except -1
    @cython.locals(r=_Req, finished=bint)
    cpdef _apply_results(self, tuple held)
    cpdef _finish_lingering(self, _Req r)
    cpdef _token_before_last(self, _Req r)
    cpdef tuple _take_results(self)
    cpdef _drop_result(self, _Req r, prev_token_s)
