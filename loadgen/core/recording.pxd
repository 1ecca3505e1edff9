# Typed locals of recording.py's column copy for the compiled build (setup.py); pure Python
# ignores it (and never runs ``_typed_column``: loadgen/core/recording.py ``_COMPILED``).

cimport cython

ctypedef long long int64
ctypedef unsigned char uint8

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, row=tuple, float_buf=double[::1], int_buf=int64[::1], byte_buf=uint8[::1])
cpdef object _typed_column(list rows, Py_ssize_t j, int kind)


# The recorder and its buffers as extension types: a turn's row reads the recorder's fields from C
# slots, not from the instance's dict, four thousand times a run
cdef class _Columns:
    cdef public object schema
    cdef public list names
    cdef public list rows
    cdef public list _kinds

    cpdef append(self, tuple row)


cdef class _OpenSession:
    cdef public object is_trigger
    cdef public object kind
    cdef public object num_turns
    cdef public object arrival_s
    cdef public object first_admit_s
    cdef public long turns_completed
    cdef public long num_parks


cdef class RunRecorder:
    cdef public object run_dir
    cdef public object run_id
    cdef public object arm
    cdef public object seed
    cdef public object flush_interval_s
    cdef public object _next_flush_s
    cdef public object _in_memory
    cdef public object _parts
    cdef public dict _written
    cdef public object _writer
    cdef public list _writes
    cdef public dict _streams
    cdef public bint replica_columns
    cdef public bint tree_columns
    cdef public dict _tree_of
    cdef public dict _root_rows
    cdef public dict _trees_ended
    cdef public dict _joined
    cdef public _Columns _turns
    cdef public _Columns _samples
    cdef public _Columns _sessions
    cdef public _Columns _replica_samples
    cdef public dict _open_sessions
    cdef public long turns_completed
