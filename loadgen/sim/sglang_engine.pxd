# sglang_engine.py's SGLangEngine in the compiled build's chain of classes (sglang_state.py).

cimport cython

from .kv_pool cimport Stream
from .request cimport SimRequest
from .sglang_prefill cimport PrefillAdding
from .sglang_state cimport _Req


cdef class SGLangEngine(PrefillAdding):
    @cython.locals(prefix=Stream, own=Stream, r=_Req)
    cpdef submit(self, SimRequest request, double now_s)
    cpdef bint _at_boundary(self) except -1
    cpdef _step(self, double start_s)
    @cython.locals(r=_Req, finished_any=bint)
    cpdef _run_prefill(self, double start_s, batch)
    @cython.locals(first=bint, gap=double)
    cpdef bint _prefill_token(self, _Req r, double end) except -1
    @cython.locals(r=_Req, prefilled=list)
    cpdef _prefill_results(self, batch, double end)
    cpdef _cache_unfinished(self, _Req r, kv_len=*)
    cpdef _finish(self, _Req r)
