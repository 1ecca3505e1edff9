# Typed locals of vllm_decode.py for the compiled build (setup.py); pure Python ignores it.

cimport cython

from .request cimport SimRequest
from .step_machine cimport StepCosts
from .vllm_admission cimport Admission


cdef class DecodeAggregates(Admission):
    cpdef _add_decoder(self, SimRequest req, long g0)

    @cython.locals(steps=long, gap_s=double)
    cpdef _remove_decoder(self, SimRequest req, long g)

    @cython.locals(c=StepCosts, r=long, alpha=double)
    cpdef tuple _stretch_coeffs(self)

    @cython.locals(heap=list, g=long, num_steps=long, r=long, free=long, bs=long, cycles=long, left=long, i=long,
                   res=list, base=long)
    cpdef long _max_stretch(self) except -1

    @cython.locals(g=long, bs=long, r=long, cycles=long, rest=long, blocks=long, res=list, first=long, alpha=double,
                   beta=double)
    cpdef _commit_stretch(self, double start_s, long num_steps, tuple coeffs=*)

    @cython.locals(bs=long, preempted=bint, req=SimRequest, victim=SimRequest)
    cpdef bint _decode_with_shortage(self, long g) except -1

    @cython.locals(heap=list, entry=tuple, req=SimRequest)
    cpdef _collect_finished(self, long g)


@cython.locals(seq=long, req=SimRequest)
cpdef bint _valid(tuple entry) except -1
