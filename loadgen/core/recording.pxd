# Typed locals of recording.py's column copy for the compiled build (setup.py); pure Python
# ignores it (and never runs ``_typed_column``: loadgen/core/recording.py ``_COMPILED``).

cimport cython

ctypedef long long int64
ctypedef unsigned char uint8

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, row=tuple, float_buf=double[::1], int_buf=int64[::1], byte_buf=uint8[::1])
cpdef object _typed_column(list rows, Py_ssize_t j, int kind)
