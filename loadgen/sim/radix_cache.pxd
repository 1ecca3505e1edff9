# Typed layout of radix_cache.py for the compiled build (setup.py); pure Python ignores it.
# ChainNode and ChainRadixCache (radix_chains.py) stay Python subclasses of these.

cimport cython

from .keyed_heap cimport Keyed, heap_pop, heap_push


cdef class Node:
    cdef public Node parent
    cdef public dict children
    cdef public long start
    cdef public long length
    cdef public object pid
    cdef public long plen
    cdef public object own
    cdef public long lock_ref
    cdef public long access
    cdef public bint alive
    cdef public long nid
    cdef public object last_key
    cdef public Node last_child


cdef class _Leaf(Keyed):
    cdef public Node node


cdef class RadixCache:
    cdef public long page_size
    cdef public object _ids
    cdef public long clock
    cdef public Node root
    cdef public long evictable_size
    cdef public long protected_size
    cdef public list _heap
    cdef public long num_nodes

    @cython.locals(stamp=long, node=Node, page=long, pos=long, child=Node, n=long)
    cpdef tuple match_prefix(self, pid, long plen, own, long key_len)

    @cython.locals(node=Node, page=long, pos=long, child=Node, n=long)
    cpdef long peek_prefix(self, pid, long plen, own, long key_len) except? -1

    @cython.locals(stamp=long, node=Node, page=long, pos=long, child=Node, n=long)
    cpdef long insert(self, pid, long plen, own, long key_len) except? -1

    @cython.locals(stamp=long, node=Node, page=long, pos=long, child=Node, n=long)
    cpdef tuple insert_matched(self, pid, long plen, own, long key_len)

    @cython.locals(new=Node)
    cpdef Node _add_leaf(self, Node node, long pos, pid, long plen, own, long key_len, long stamp)

    @cython.locals(parent=Node, top=Node)
    cpdef Node _split(self, Node child, long n)

    @cython.locals(root=Node, newly=long)
    cpdef inc_lock_ref(self, Node node)

    @cython.locals(root=Node, freed=long, lock_ref=long)
    cpdef dec_lock_ref(self, Node node)

    cpdef _push(self, Node node)

    @cython.locals(freed=long, heap=list, leaf=_Leaf, node=Node, parent=Node)
    cpdef long evict(self, long num_tokens) except? -1


@cython.locals(leaf=_Leaf)
cdef _Leaf _leaf(Node node)

cdef bint _evictable(Node node) except -1
