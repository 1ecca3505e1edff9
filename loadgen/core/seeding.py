"""NumPy's ``SeedSequence`` hashing of a list of 32-bit words, without NumPy's per-call overhead.

Every random stream of a run is ``Generator(PCG64(SeedSequence(words)))`` (loadgen/core/workload.py
``rng_for``), one per session: building those SeedSequences took ~4% of a simulated run, almost all
of it NumPy's generic handling of its input. ``KeyedSeed(words)`` hashes the same words with the
same algorithm (O'Neill's seed_seq as NumPy implements it: pool of 4 words, its mixing constants)
and hands PCG64 the same state, so the streams are the same numbers
(tests/test_random_streams.py compares them with NumPy's for many keys).
"""

from __future__ import annotations

import numpy as np
from numpy.random.bit_generator import ISeedSequence

__all__ = ["KeyedSeed", "seed_state"]

_MASK = 0xFFFFFFFF
_POOL_SIZE = 4
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_MULT_L = 0xCA01F9DD
_MIX_MULT_R = 0x4973F715
_XSHIFT = 16


def _mix(x: int, y: int) -> int:
    result = (_MIX_MULT_L * x - _MIX_MULT_R * y) & _MASK
    return result ^ (result >> _XSHIFT)


def seed_state(words: list, num_words: int) -> list:
    """``SeedSequence(words).generate_state(num_words, np.uint32)`` as a list of ints, for
    ``words`` of ints in [0, 2^32) (each is then one entropy word, as NumPy coerces it)."""
    hash_const = _INIT_A
    pool = [0, 0, 0, 0]
    n = len(words)
    # the words up to the pool's size, hashed in (zeros where there are fewer)
    for i in range(_POOL_SIZE):
        value = words[i] if i < n else 0
        value = (value ^ hash_const) & _MASK
        hash_const = (hash_const * _MULT_A) & _MASK
        value = (value * hash_const) & _MASK
        pool[i] = value ^ (value >> _XSHIFT)
    # every pool word mixed into every other
    for i_src in range(_POOL_SIZE):
        for i_dst in range(_POOL_SIZE):
            if i_src != i_dst:
                value = (pool[i_src] ^ hash_const) & _MASK
                hash_const = (hash_const * _MULT_A) & _MASK
                value = (value * hash_const) & _MASK
                pool[i_dst] = _mix(pool[i_dst], value ^ (value >> _XSHIFT))
    # the remaining words, each mixed into every pool word
    for i_src in range(_POOL_SIZE, n):
        for i_dst in range(_POOL_SIZE):
            value = (words[i_src] ^ hash_const) & _MASK
            hash_const = (hash_const * _MULT_A) & _MASK
            value = (value * hash_const) & _MASK
            pool[i_dst] = _mix(pool[i_dst], value ^ (value >> _XSHIFT))
    state = []
    hash_const = _INIT_B
    for i in range(num_words):
        value = (pool[i % _POOL_SIZE] ^ hash_const) & _MASK
        hash_const = (hash_const * _MULT_B) & _MASK
        value = (value * hash_const) & _MASK
        state.append(value ^ (value >> _XSHIFT))
    return state


class KeyedSeed(ISeedSequence):
    """What PCG64 asks of a seed sequence: ``generate_state``, as ``SeedSequence(words)`` gives it.

    It also carries SeedSequence's ``entropy``, ``spawn_key`` and ``pool_size``, so code that derives
    further streams from a generator's seed sequence (trace_shapes' tree nodes) derives the same
    ones as from ``SeedSequence(words)``."""

    spawn_key = ()
    pool_size = _POOL_SIZE

    def __init__(self, words: list) -> None:
        for word in words:
            if not (type(word) is int and 0 <= word <= _MASK):
                raise ValueError(f"seed words are ints in [0, 2^32), got {word!r}")
        self.words = words

    @property
    def entropy(self) -> list:
        return self.words

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype == np.uint32:
            return np.array(seed_state(self.words, n_words), dtype=np.uint32)
        if dtype == np.uint64:
            # pairs of 32-bit words read as one little-endian 64-bit word, as NumPy does
            halves = seed_state(self.words, 2 * n_words)
            return np.array([halves[2 * i] | (halves[2 * i + 1] << 32) for i in range(n_words)], dtype=np.uint64)
        raise ValueError(f"only uint32 and uint64 states, not {dtype}")
