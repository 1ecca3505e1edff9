# Typed layout of engines.py's SimEngineClient for the compiled build (setup.py); pure Python
# ignores it.

from ..sim.request cimport SimRequest
from ..sim.step_machine cimport StepMachine

cdef class SimEngineClient:
    cdef public object clock
    cdef public StepMachine engine
    cdef public long pool_tokens
    cdef public object _timer
    cdef public object _armed_at
    cdef public long _seq
    cdef public object placer

    cpdef _rearm(self)
    cpdef _fire(self)


cpdef _resolve(SimRequest req)
