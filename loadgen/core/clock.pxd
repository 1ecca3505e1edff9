# Typed layout of clock.py's virtual kernel for the compiled build (setup.py); pure Python
# ignores it. WallClock stays a Python class.

cimport cython

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


cdef class _Timer:
    cdef public double when
    cdef public long seq
    cdef public object callback
    cdef public tuple args
    cdef public bint cancelled

    cpdef cancel(self)


cdef bint _earlier(_Timer a, _Timer b) noexcept

@cython.locals(pos=Py_ssize_t, parent_pos=Py_ssize_t, parent=_Timer)
cpdef _heap_push(list heap, _Timer timer)

@cython.locals(last=_Timer, top=_Timer, child=_Timer, n=Py_ssize_t, pos=Py_ssize_t, child_pos=Py_ssize_t,
               right_pos=Py_ssize_t)
cpdef _Timer _heap_pop(list heap)


cdef class VirtualClock:
    cdef object __weakref__
    cdef public object lateness
    cdef public double _now
    cdef public list _heap
    cdef public long _seq
    cdef public object _ready
    cdef public object _failure

    cpdef double now(self)
    cpdef _Future create_future(self)
    cpdef _Future sleep(self, double delay_s)
    cpdef _Task spawn(self, coro)

    @cython.locals(heap=list, when=double, timer=_Timer)
    cpdef run(self, until_s=*)
