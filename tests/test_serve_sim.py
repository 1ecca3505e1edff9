from loadgen.live.serve_sim_prompts import PromptMapper
from loadgen.core.session import TokenContext
from trace_shapes import SessionShape


def shape(initial=100, prefix=32):
    return SessionShape("synthetic", initial, (8, 8), (20,), (1.0,), shared_prefix_tokens=prefix)


def test_token_context_shares_the_prefix_and_appends_engine_ids():
    a, b = TokenContext(shape(), (1, "a"), 1), TokenContext(shape(), (1, "a"), 2)
    assert a.ids[:32] == b.ids[:32] and a.ids[32:] != b.ids[32:]
    a.append([7] * 8, 8, 20)
    assert a.ids[100:108] == [7] * 8 and len(a.ids) == 128
    b.append(None, 8, 20)  # no ids from the engine: random ones of the right length
    assert len(b.ids) == 128


def test_mapper_continues_a_stream_only_when_the_prompt_extends_all_of_it():
    m = PromptMapper(block_size=4)
    ctx = TokenContext(shape(), (1, "a"), 5)
    pk, ptok, s1 = m.map(ctx.ids, prefix_tokens=32)
    assert pk is not None and ptok == 32
    out = [9] * 8
    m.record(s1, m.chained_hashes(ctx.ids + out[:-1]))
    ctx.append(out, 8, 20)
    pk2, _, s2 = m.map(ctx.ids, prefix_tokens=32)
    assert s2 == s1 and pk2 == pk  # the next turn continues the same stream, same shared prefix
    m.release(s2)
    other = TokenContext(shape(), (1, "a"), 6)
    pk3, _, s3 = m.map(other.ids, prefix_tokens=32)
    assert s3 != s1 and pk3 == pk  # another session: own stream, same system prompt
    _, _, s4 = m.map(ctx.ids[:60], prefix_tokens=32)
    assert s4 not in (s1, s3)  # a truncated context cannot continue the stream


def test_a_busy_stream_is_not_continued_twice():
    m = PromptMapper(block_size=4)
    ids = list(range(1, 41))
    _, _, s1 = m.map(ids, 0)
    m.record(s1, m.chained_hashes(ids))
    _, _, s2 = m.map(ids + [1, 2, 3, 4], 0)
    _, _, s3 = m.map(ids + [5, 6, 7, 8], 0)
    assert s2 == s1 and s3 != s1
