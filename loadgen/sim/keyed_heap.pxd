# Typed layout of keyed_heap.py for the compiled build (setup.py); pure Python ignores it.

cimport cython


cdef class Keyed:
    cdef public double when
    cdef public long seq


cdef bint _earlier(Keyed a, Keyed b) noexcept

@cython.locals(pos=Py_ssize_t, parent_pos=Py_ssize_t, parent=Keyed)
cpdef heap_push(list heap, Keyed entry)

@cython.locals(last=Keyed, top=Keyed, child=Keyed, n=Py_ssize_t, pos=Py_ssize_t, child_pos=Py_ssize_t,
               right_pos=Py_ssize_t)
cpdef Keyed heap_pop(list heap)
