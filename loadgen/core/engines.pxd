# Typed layout of engines.py's SimEngineClient for the compiled build (setup.py); pure Python
# ignores it.

from ..sim.request cimport SimRequest

cdef class SimEngineClient:
    cdef public object clock
    cdef public object engine  # a StepMachine, or a test's reference engine (tests/sim/test_tree_differential.py)
    cdef public long pool_tokens
    cdef public object _timer
    cdef public object _armed_at
    cdef public long _seq
    cdef public object placer

    cpdef _rearm(self)
    cpdef _fire(self)


cpdef _resolve(SimRequest req)
