# Typed layout of kv_pool.py's classes for the compiled build (setup.py); pure Python ignores it.

cdef class Stream:
    cdef public object key
    cdef public long base
    cdef public object num_blocks
    cdef public Stream parent
    cdef public long cached
    cdef public long ref_cnt
    cdef public object entry


cdef class BlockPool:
    cdef public long num_usable
    cdef public long num_free
    cdef public object queue

    cpdef double usage(self)
    cpdef long idle_cached(self, Stream stream)
    cpdef acquire(self, Stream stream, long keep)
    cpdef release(self, Stream stream)
    cpdef free_unhashed(self, long count)
    cpdef allocate(self, long count)
