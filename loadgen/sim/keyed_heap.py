# cython: boundscheck=False, wraparound=False
"""A binary min-heap of ``Keyed`` entries, ordered by (when, seq), kept by hand.

The virtual clock's timers (loadgen/core/clock.py) and the SGLang radix cache's evictable leaves
(loadgen/sim/radix_cache.py) are both popped in (time, tie-breaker) order many times a run.
heapq over (when, seq, payload) tuples compares two entries with two or three generic
``PyObject_RichCompare`` calls; compiled, ``_earlier`` is two C comparisons, which took the
clock's pushes and pops from a fifth of a simulated run to a few per cent. (when, seq) is unique
among live entries (an entry may sit twice in the heap only as the same payload with the same
key), so any valid heap pops entries in the order heapq did.
"""

from __future__ import annotations

__all__ = ["Keyed", "heap_push", "heap_pop"]


class Keyed:
    """A heap entry's key; subclasses carry the payload and set both fields."""

    __slots__ = ("when", "seq")


def _earlier(a: Keyed, b: Keyed) -> bool:
    return a.when < b.when or (a.when == b.when and a.seq < b.seq)


def heap_push(heap: list, entry: Keyed) -> None:
    heap.append(entry)
    pos = len(heap) - 1
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = heap[parent_pos]
        if not _earlier(entry, parent):
            break
        heap[pos] = parent
        pos = parent_pos
    heap[pos] = entry


def heap_pop(heap: list) -> Keyed:
    """Removes and returns the earliest entry of a non-empty heap."""
    last = heap.pop()
    n = len(heap)
    if not n:
        return last
    top = heap[0]
    pos = 0
    child_pos = 1
    while child_pos < n:
        right_pos = child_pos + 1
        child = heap[child_pos]
        if right_pos < n and _earlier(heap[right_pos], child):
            child_pos = right_pos
            child = heap[right_pos]
        if not _earlier(child, last):
            break
        heap[pos] = child
        pos = child_pos
        child_pos = 2 * pos + 1
    heap[pos] = last
    return top
