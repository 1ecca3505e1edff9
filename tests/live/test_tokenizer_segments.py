"""Token ids held as shared pieces (loadgen/live/tokenizer.py: Segments, common_prefix) behave
as the flat lists they stand for."""

import bisect
import random

import pytest

from loadgen.live.tokenizer import Segments, common_prefix


def build(pieces):
    s = Segments()
    for piece in pieces:
        s = s.plus(list(piece))
    return s


@pytest.mark.parametrize("seed", range(20))
def test_head_plus_and_count_below_match_the_flat_list(seed):
    rng = random.Random(seed)
    s = build([rng.sample(range(1000), rng.randint(0, 6)) for _ in range(rng.randint(0, 6))])
    flat = list(s)
    assert len(s) == len(flat)
    for n in range(len(flat) + 1):
        assert list(s.head(n)) == flat[:n]
        assert list(s.head(n).plus([7, 8])) == flat[:n] + [7, 8]
    increasing = build([range(a, b) for a, b in ((0, 3), (3, 3), (3, 9), (9, 10))])
    for x in range(-1, 12):
        assert increasing.count_below(x) == bisect.bisect_left(list(increasing), x)


@pytest.mark.parametrize("seed", range(20))
def test_common_prefix_skips_shared_pieces_and_compares_the_rest(seed):
    rng = random.Random(seed)
    base = build([[rng.randrange(5) for _ in range(rng.randint(1, 5))] for _ in range(4)])
    cut = rng.randint(0, len(base))
    a = base.head(cut).plus([rng.randrange(5) for _ in range(rng.randint(0, 6))])
    b = base.head(rng.randint(0, len(base))).plus([rng.randrange(5) for _ in range(rng.randint(0, 6))])
    fa, fb = list(a), list(b)
    expected = next((i for i, (x, y) in enumerate(zip(fa, fb)) if x != y), min(len(fa), len(fb)))
    assert common_prefix(a, b) == expected
    assert common_prefix(fa, fb) == expected  # plain lists too
