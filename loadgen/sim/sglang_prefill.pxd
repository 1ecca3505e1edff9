# sglang_prefill.py's PrefillAdding in the compiled build's chain of classes (sglang_state.py).

cimport cython

from .radix_cache cimport Node, RadixCache
from .sglang_decode cimport DecodeBatch
from .sglang_state cimport _Req


cdef class PrefillAdding(DecodeBatch):
    @cython.locals(r=_Req, chunked=_Req, running_bs=long, ratio=double, clip=long, rem_total=double, extend=long,
                   truncated=bint)
    cpdef list _get_new_batch_prefill(self)
    cpdef _charge(self, long extend, long max_new)
    cpdef double _rem_total(self)
    @cython.locals(free=long)
    cpdef _budget_state(self)
    @cython.locals(tree=RadixCache, node=Node, clip=long, max_new=long, extend=long, total_tokens=long,
                   input_tokens=long, trunc=long)
    cpdef tuple _add_one_req(self, _Req r, long batch_len)
