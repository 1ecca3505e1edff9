# Typed locals of seeding.py's hashing for the compiled build (setup.py); pure Python ignores it.
# 64-bit unsigned arithmetic, masked to 32 bits after each product, is Python's int arithmetic here.

cimport cython

ctypedef unsigned long long uint64

cdef uint64 _MASK, _INIT_A, _MULT_A, _INIT_B, _MULT_B, _MIX_MULT_L, _MIX_MULT_R
cdef Py_ssize_t _POOL_SIZE
cdef int _XSHIFT

@cython.locals(result=uint64)
cdef uint64 _mix(uint64 x, uint64 y) noexcept

@cython.locals(hash_const=uint64, value=uint64, n=Py_ssize_t, i=Py_ssize_t, i_src=Py_ssize_t, i_dst=Py_ssize_t,
               pool=uint64[4])
cpdef list seed_state(list words, Py_ssize_t num_words)
