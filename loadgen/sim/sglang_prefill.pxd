# sglang_prefill.py's PrefillAdding in the compiled build's chain of classes (sglang_state.py).

from .sglang_decode cimport DecodeBatch


cdef class PrefillAdding(DecodeBatch):
    pass
