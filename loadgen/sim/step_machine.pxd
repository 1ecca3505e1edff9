# Typed layout of step_machine.py's StepMachine for the compiled build (setup.py); pure Python
# ignores it. The flavour's hooks are cpdef: each flavour (SimEngine, SGLangEngine) overrides them
# in C.

cimport cython


cdef class StepCosts:
    cdef public double t0_s
    cdef public double a_s
    cdef public double b_s
    cdef public double g_s
    cdef public double m_s
    cdef public double dd_s
    cdef public double h_s

    cpdef double step_time(self, double num_tokens, double attention_tokens2, double decode_context_tokens,
                           double mixed_decode_context_tokens, double num_decode_tokens=*)


cdef class StepMachine:
    cdef object __weakref__  # an engine can be weakly referenced, as a Python object can
    cdef public object _inflight_end
    cdef public object _next_start
    cdef public list _done
    cdef public list _first
    cdef public list _gap_steps
    cdef public list _gap_max_s
    cdef public long _version
    cdef public long _bounds_version
    cdef public object _bounds
    cdef public long _coeffs_version
    cdef public tuple _coeffs
    cdef public object gaps

    cpdef _init_step_machine(self)
    cpdef bint _at_boundary(self) except -1
    cpdef _stretch_bounds_now(self)
    cpdef tuple _stretch_coeffs(self)
    cpdef _commit_stretch(self, double start_s, long num_steps, tuple coeffs=*)
    cpdef _step(self, double start_s)
    cpdef _start_if_idle(self, double now_s)
    cpdef advance_to(self, double t_s)
    cpdef _deliver(self, double end_s)
    cpdef bint _has_deliveries(self) except -1
    cpdef next_wakeup(self)
    cpdef _changed(self)
    cpdef _stretch_bounds(self)
    cpdef tuple _state_coeffs(self)
    cpdef long _stretch_len(self, double start_s, object limit_s, tuple bounds) except -1
    @cython.locals(alpha=double, beta=double, budget=double, b1=double, root=double, i=long)
    cpdef long _steps_starting_by(self, double start_s, double limit_s, long num_steps, bint strict) except -1
    @cython.locals(steps=list, gaps=list, last_s=double)
    cpdef _push_gap(self, long first_step, double longest_s)
