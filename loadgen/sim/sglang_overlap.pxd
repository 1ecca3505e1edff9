# sglang_overlap.py's OverlapResults in the compiled build's chain of classes (sglang_state.py).

from .sglang_state cimport SGLangState, _Req


cdef class OverlapResults(SGLangState):
    cpdef bint _has_deliveries(self) except -1
    cpdef long _lag(self, _Req r) except -1
