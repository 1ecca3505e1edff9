# sglang_decode.py's DecodeBatch in the compiled build's chain of classes (sglang_state.py).

from .sglang_overlap cimport OverlapResults


cdef class DecodeBatch(OverlapResults):
    cpdef tuple _stretch_coeffs(self)
    cpdef _stretch_bounds_now(self)
    cpdef _commit_stretch(self, double start_s, long num_steps, tuple coeffs=*)
