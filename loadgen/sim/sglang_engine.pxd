# sglang_engine.py's SGLangEngine in the compiled build's chain of classes (sglang_state.py).

from .sglang_prefill cimport PrefillAdding


cdef class SGLangEngine(PrefillAdding):
    cpdef bint _at_boundary(self) except -1
    cpdef _step(self, double start_s)
