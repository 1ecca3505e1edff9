# Typed layout of clock.py's virtual kernel for the compiled build (setup.py); pure Python
# ignores it. WallClock stays a Python class.

cimport cython

from ..sim.keyed_heap cimport Keyed, heap_pop, heap_push

cdef class _Future:
    cdef object __weakref__
    cdef VirtualClock _clock
    cdef bint _done
    cdef object _result
    cdef object _exception
    cdef list _waiters

    cpdef bint done(self) except -1
    cpdef result(self)
    cpdef set_result(self, value)
    cpdef set_exception(self, exc)
    cpdef add_done_callback(self, fn)
    cpdef _wake(self)


cdef class _Task(_Future):
    cdef object _coro

    cpdef _step(self, _Future fut)


cdef class _Timer(Keyed):
    cdef public object callback
    cdef public tuple args
    cdef public bint cancelled

    cpdef cancel(self)


@cython.locals(timer=_Timer)
cdef _Timer _timer(double when, long seq, callback, tuple args)


cdef class _Series:
    cdef list _heap
    cdef list _pending

    cpdef fire(self, callback, tuple args)


cdef class VirtualClock:
    cdef object __weakref__
    cdef public object lateness
    cdef public double _now
    cdef public list _heap
    cdef public long _seq
    cdef public object _ready
    cdef public object _failure

    cpdef double now(self)
    @cython.locals(now=double, seq=long, timers=list, series=_Series)
    cpdef call_series(self, list calls)
    cpdef _Future create_future(self)
    cpdef _Future sleep(self, double delay_s)
    cpdef _Task spawn(self, coro)

    @cython.locals(heap=list, when=double, timer=_Timer)
    cpdef run(self, until_s=*)
