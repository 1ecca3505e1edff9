"""The derived Qwen3-32B-on-MI300X preset: its arithmetic from the two models' shapes (docs/engine-model.md#calibration)."""

import pytest

from loadgen.sim.cost import PRESETS, QWEN3_8B, QWEN3_8B_MI300X, QWEN3_32B, QWEN3_32B_MI300X

GIB = 2 ** 30


def test_model_shapes_match_the_published_sizes():
    assert QWEN3_8B.kv_bytes_per_token() == 144 * 1024  # docs/engine-model.md#calibration: 144 KiB per token
    assert 400_000 * QWEN3_8B.kv_bytes_per_token() / 1e9 == pytest.approx(59, abs=0.1)  # "400K tokens (59 GB)"
    assert QWEN3_32B.kv_bytes_per_token() == 256 * 1024  # 64 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    # model cards: 8.2B parameters (6.95B without embeddings), 32.8B (31.2B)
    assert QWEN3_8B.weight_params() / 1e9 == pytest.approx(8.19, abs=0.01)
    assert QWEN3_8B.non_embedding_params() / 1e9 == pytest.approx(6.95, abs=0.01)
    assert QWEN3_32B.weight_params() / 1e9 == pytest.approx(32.76, abs=0.01)
    assert QWEN3_32B.non_embedding_params() / 1e9 == pytest.approx(31.21, abs=0.01)


def test_step_costs_are_the_8b_fit_times_the_ratios():
    m8, m32 = QWEN3_8B_MI300X, QWEN3_32B_MI300X
    assert m32.t0_s == pytest.approx(m8.t0_s * 32_761_446_400 / 8_190_427_136)  # weight bytes, x4.0
    assert m32.a_s_per_token == pytest.approx(m8.a_s_per_token * 31_205_621_760 / 6_945_767_424)  # x4.49
    assert m32.b_s_per_token2 == pytest.approx(m8.b_s_per_token2 * (64 * 64 * 128) / (36 * 32 * 128))  # x3.56
    assert m32.g_s_per_token == pytest.approx(m8.g_s_per_token * 256 / 144)  # KV bytes, x1.78
    assert PRESETS["qwen3-32b-mi300x"] is m32 and m32.name == "qwen3-32b-mi300x"
    # what that means: ~19 ms per decode step, so ~50 tokens/s for one request
    assert 1 / m32.step_time(1, 0, 6_000) == pytest.approx(50, abs=1)


def test_a_365k_pool_is_what_80_percent_of_an_mi300x_leaves():
    free = 0.8 * 192 * GIB - 2 * QWEN3_32B.weight_params()  # BF16 weights
    before_activations = free / QWEN3_32B.kv_bytes_per_token()
    assert before_activations == pytest.approx(379_000, rel=0.01)
    # docs/engine-model.md#calibration reports ~365K: vLLM also keeps a few GiB for activations
    reserve_gib = (before_activations - 365_000) * QWEN3_32B.kv_bytes_per_token() / GIB
    assert 1 < reserve_gib < 6
