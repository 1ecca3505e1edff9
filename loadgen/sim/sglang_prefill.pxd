# sglang_prefill.py's PrefillAdding in the compiled build's chain of classes (sglang_state.py).

cimport cython

from .sglang_decode cimport DecodeBatch
from .sglang_state cimport _Req


cdef class PrefillAdding(DecodeBatch):
    @cython.locals(r=_Req, running_bs=long)
    cpdef list _get_new_batch_prefill(self)
