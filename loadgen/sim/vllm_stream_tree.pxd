# vllm_stream_tree.py's StreamTree in the compiled build's chain of classes (vllm_state.py).

from .vllm_decode cimport DecodeAggregates


cdef class StreamTree(DecodeAggregates):
    pass
