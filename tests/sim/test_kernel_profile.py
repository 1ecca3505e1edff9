"""A GPU's step cost from a kernel profile (loadgen/sim/kernel_profile.py, profile_fit.py,
`loadgen calibrate --from-profile`): steps composed from per-layer rows, the fit, bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from loadgen.sim.kernel_profile import ProfileError, load_profile
from loadgen.sim.profile_fit import fit_profile

# the profile rows of the real-run extract (tests/fixtures/gpu/README.md)
EXTRACT = (Path(__file__).parents[1] / "fixtures" / "gpu" / "llmservingsim" / "profiler" / "perf" / "RTXPRO6000"
           / "meta-llama" / "Llama-3.1-8B" / "bf16")


def _rows(name: str) -> list[dict]:
    with (EXTRACT / "tp1" / name).open() as f:
        return list(csv.DictReader(f))


def _dense(layer: str, tokens: int) -> float:
    return next(float(r["time_us"]) for r in _rows("dense.csv") if r["layer"] == layer and int(r["tokens"]) == tokens)


def _per_sequence(layer: str, sequences: int) -> float:
    return next(float(r["time_us"]) for r in _rows("per_sequence.csv")
                if r["layer"] == layer and int(r["sequences"]) == sequences)


def _attention(c: int, p: int, n: int, kv: int) -> float:
    return next(float(r["time_us"]) for r in _rows("attention.csv")
                if (int(r["prefill_chunk"]), int(r["kv_prefill"]), int(r["n_decode"]), int(r["kv_decode"])) == (c, p, n, kv))


BLOCK = ("layernorm", "qkv_proj", "rotary_emb", "o_proj", "layernorm", "gate_up_proj", "act_fn", "down_proj")


@pytest.mark.parametrize("c, p, n, kv, tokens, head", [
    (0, 0, 128, 1024, 128, lambda: _per_sequence("lm_head", 128) + _per_sequence("sampler", 128)),
    (512, 0, 0, 0, 512, lambda: _per_sequence("lm_head", 1) + _per_sequence("sampler", 1)),
    # 17 sequences (16 decodes and the chunk's request): a quarter of the way from 16 to 20
    (256, 1024, 16, 2048, 272, lambda: sum(_per_sequence(x, 16) + (_per_sequence(x, 20) - _per_sequence(x, 16)) / 4
                                           for x in ("lm_head", "sampler"))),
])
def test_a_step_is_the_llama_order_of_its_layers_rows(c, p, n, kv, tokens, head):
    profile = load_profile(EXTRACT)
    assert (profile.num_layers, profile.tp, profile.architecture) == (32, 1, "llama")  # from the model's config
    by_hand_us = (_dense("embedding", tokens) + _dense("final_layernorm", tokens) + head()
                  + 32 * (sum(_dense(layer, tokens) for layer in BLOCK) + _attention(c, p, n, kv)))
    assert profile.kernel_s(c, p, n, kv) == pytest.approx(by_hand_us * 1e-6, rel=1e-12)


def _synthetic_profile(root: Path, truth: dict, layers: int = 4, decode_extra_s: float = 0.0) -> Path:
    """A profile whose steps follow the step model exactly: every dense layer a + b T, the head
    constant, attention b' c (p + c / 2) + g' n kv (+ m' n kv beside a chunk) (+ a decode token's
    extra cost per decode)."""
    folder = root / "perf" / "GPU" / "org" / "m" / "bf16"
    (folder / "tp1").mkdir(parents=True)
    (folder / "meta.yaml").write_text(yaml.safe_dump({"model": "org/m", "architecture": "toy", "tp_degrees": [1],
                                                      "engine_effective": {"max_num_batched_tokens": 2048}}))
    dense_layers = ("embedding", "layernorm", "qkv_proj", "down_proj", "final_layernorm")
    per_layer_a, per_layer_b = 3.0, 0.02  # us, us per token
    with (folder / "tp1" / "dense.csv").open("w") as f:
        f.write("layer,tokens,time_us\n")
        for layer in dense_layers:
            for t in (1, 16, 64, 256, 1024, 2048):
                f.write(f"{layer},{t},{per_layer_a + per_layer_b * t}\n")
    with (folder / "tp1" / "per_sequence.csv").open("w") as f:
        f.write("layer,sequences,time_us\n" + "".join(f"{x},{s},100\n" for x in ("lm_head", "sampler")
                                                       for s in (1, 16, 256)))
    with (folder / "tp1" / "attention.csv").open("w") as f:
        f.write("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n")
        for c in (0, 16, 256, 1024):
            for p in (0, 512, 4096):
                for n, kv in ((0, 0), (1, 128), (64, 1024), (256, 8192)):
                    if (c == 0 and p) or (c + n == 0):
                        continue
                    us = (truth["b"] * c * (p + c / 2) + truth["g"] * n * kv + (truth["m"] * n * kv if c else 0)
                          + decode_extra_s * n) / layers
                    f.write(f"{c},{p},{n},{kv},{us * 1e6}\n")
    # every dense layer but the embedding and the final layernorm once per block, layernorm twice
    block = len(dense_layers) - 2 + 1
    truth.update(t0=(2 + layers * block) * per_layer_a * 1e-6 + 200e-6, a=(2 + layers * block) * per_layer_b * 1e-6)
    return folder


def test_the_fit_recovers_the_coefficients_a_profile_was_made_with(tmp_path):
    truth = {"b": 3e-9, "g": 90e-9, "m": 150e-9}
    folder = _synthetic_profile(tmp_path, truth)
    fit = fit_profile(load_profile(folder, num_layers=4), np.random.default_rng(1), num_resamples=10)
    got = fit.coefficients
    for name, key in (("t0_s", "t0"), ("a_s_per_token", "a"), ("b_s_per_token2", "b"), ("g_s_per_token", "g"),
                      ("mixed_decode_s_per_token", "m")):
        assert got[name] == pytest.approx(truth[key], rel=1e-6), name
        low, high = fit.intervals[name]
        assert low <= got[name] * (1 + 1e-9) and high >= got[name] * (1 - 1e-9)
    assert max(abs(r) for r in fit.residuals) < 1e-6
    # the same tokens priced alike: the decode-token constant comes out as a's
    assert fit.with_decode_token["decode_s_per_token"] == pytest.approx(truth["a"], rel=1e-6)


def _calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen.cli", "calibrate", *args], capture_output=True, text=True)


def test_calibrate_from_a_profile_writes_a_cost_model_the_simulator_reads(tmp_path):
    truth = {"b": 3e-9, "g": 90e-9, "m": 150e-9}
    folder = _synthetic_profile(tmp_path, truth)
    out = tmp_path / "cost.json"
    proc = _calibrate("--from-profile", str(folder), "--layers", "4", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "residuals (model - profile) / profile by step kind" in proc.stdout and "decode" in proc.stdout
    from loadgen.sim.cost import StepCostModel

    model = StepCostModel.from_file(out)
    assert model.g_s_per_token == pytest.approx(90e-9, rel=1e-6) and model.name == "cost"
    assert json.loads(out.with_suffix(".fit.json").read_text())["num_layers"] == 4


@pytest.mark.parametrize("args, expected", [
    (["--tp", "2"], "--tp 2: the profile has tp [1]"),
    ([], "the layer count of org/m is unknown: pass --layers N"),
    (["--layers", "4", "--endpoint", "http://127.0.0.1:9"], "not both"),
])
def test_bad_profile_input_exits_2_naming_it(tmp_path, args, expected):
    folder = _synthetic_profile(tmp_path, {"b": 3e-9, "g": 90e-9, "m": 0.0})
    proc = _calibrate("--from-profile", str(folder), "--out", str(tmp_path / "c.json"), *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert expected in proc.stderr


def test_a_missing_column_or_folder_is_named(tmp_path):
    folder = _synthetic_profile(tmp_path, {"b": 3e-9, "g": 90e-9, "m": 0.0})
    (folder / "tp1" / "dense.csv").write_text("layer,time_us\nqkv_proj,3\n")
    with pytest.raises(ProfileError, match=r"dense.csv: missing column\(s\) \['tokens'\]"):
        load_profile(folder, num_layers=4)
    with pytest.raises(ProfileError, match="no meta.yaml"):
        load_profile(tmp_path)


def test_a_decode_token_cost_enters_the_model_only_where_the_profile_shows_it(tmp_path):
    truth = {"b": 3e-9, "g": 90e-9, "m": 150e-9}
    alike = fit_profile(load_profile(_synthetic_profile(tmp_path / "alike", dict(truth)), num_layers=4),
                        np.random.default_rng(1), num_resamples=10)
    assert not alike.decode_token_supported and alike.model("x").decode_s_per_token is None
    truth_apart = dict(truth)
    folder = _synthetic_profile(tmp_path / "apart", truth_apart, decode_extra_s=15e-6)
    apart = fit_profile(load_profile(folder, num_layers=4), np.random.default_rng(1), num_resamples=10)
    assert apart.decode_token_supported
    model = apart.model("x", host_s_per_step=0.003)
    assert model.decode_s_per_token == pytest.approx(truth_apart["a"] + 15e-6, rel=1e-6)
    assert model.a_s_per_token == pytest.approx(truth_apart["a"], rel=1e-6)
    # a step of 2 decodes and a 100-token chunk: the decodes at their own price, the host time once
    want = model.step_time(102, 100 * 50.0, 2 * 1000, 2 * 1000) + (15e-6) * 2
    assert model.step_time(102, 100 * 50.0, 2 * 1000, 2 * 1000, num_decode_tokens=2) == pytest.approx(want, rel=1e-9)


def test_host_time_is_its_own_term_and_refused_below_zero(tmp_path):
    folder = _synthetic_profile(tmp_path, {"b": 3e-9, "g": 90e-9, "m": 0.0})
    out = tmp_path / "cost.json"
    proc = _calibrate("--from-profile", str(folder), "--layers", "4", "--out", str(out), "--host-s-per-step", "0.002")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["host_s_per_step"] == 0.002 and data["t0_s"] == pytest.approx(
        (2 + 4 * 4) * 3e-6 + 200e-6, rel=1e-6)  # t0 is the kernels' alone
    proc = _calibrate("--from-profile", str(folder), "--layers", "4", "--out", str(out), "--host-s-per-step", "-1")
    assert proc.returncode == 2 and "--host-s-per-step must be a number of seconds >= 0" in proc.stderr


def test_the_gpu_terms_survive_a_cost_json_and_old_files_read_as_before():
    from loadgen.sim.cost import QWEN3_8B_MI300X, StepCostModel

    assert "decode_s_per_token" not in QWEN3_8B_MI300X.to_json() and "host_s_per_step" not in QWEN3_8B_MI300X.to_json()
    model = StepCostModel(0.01, 2e-5, 3e-9, 8e-8, name="g", decode_s_per_token=1.5e-5, host_s_per_step=0.004)
    assert StepCostModel.from_json(model.to_json()) == model
    with pytest.raises(ValueError, match="decode_s_per_token: expected a finite number >= 0"):
        StepCostModel.from_json({**model.to_json(), "decode_s_per_token": -1.0})


def _real_run(root: Path, model, host_s: float, running: int = 16) -> Path:
    """A run in LLMServingSim's layout whose decode-only seconds took ``model``'s kernels plus ``host_s``
    a step: ``running`` requests decoding from t=0 to t=10 s, two output tokens each (contexts stay ~1000)."""
    base = root / "vllm"
    base.mkdir(parents=True)
    t0 = 5000.0
    base.joinpath("requests.jsonl").write_text("".join(
        json.dumps({"input_toks": 1000, "output_toks": 2, "queued_ts": t0, "first_token_ts": t0,
                    "last_token_ts": t0 + 10.0}) + "\n" for _ in range(running)))
    rows = ["t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct"]
    for t in range(1, 11):
        context = running * (1000 + (t - 0.5) / 10.0)  # the time average over the tick
        step_s = model.step_time(running, 0.0, context, 0.0, running) + host_s
        rows.append(f"{t},0,{running / step_s},{running},0,0")
    rows.append("11,500,10,1,0,0")  # a prefill second: not decode-only
    base.joinpath("timeseries.csv").write_text("\n".join(rows) + "\n")
    return root


def test_the_host_time_is_read_from_a_real_runs_decode_only_seconds(tmp_path):
    from loadgen.sim.cost import StepCostModel
    from loadgen.sim.host_time import host_time_from_run

    model = StepCostModel(0.011, 2.6e-5, 2.7e-9, 8.5e-8, decode_s_per_token=2.0e-5)
    host_s, ticks = host_time_from_run(model, _real_run(tmp_path / "run", model, 0.0015))
    assert len(ticks) == 10 and host_s == pytest.approx(0.0015, rel=1e-3)
    folder = _synthetic_profile(tmp_path / "profile", {"b": 3e-9, "g": 90e-9, "m": 0.0})
    proc = _calibrate("--from-profile", str(folder), "--layers", "4", "--out", str(tmp_path / "c.json"),
                      "--host-from-run", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "--host-from-run:" in proc.stderr and "cannot read" in proc.stderr


def _moe_profile(tmp_path: Path) -> Path:
    truth = {"b": 3e-9, "g": 90e-9, "m": 0.0}
    folder = _synthetic_profile(tmp_path / "perf-root", truth)
    config = tmp_path / "perf-root" / "configs" / "model" / "org" / "m.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"num_hidden_layers": 4, "num_experts": 64, "num_experts_per_tok": 4}))
    with (folder / "tp1" / "moe.csv").open("w") as f:
        f.write("tokens,activated_experts,time_us\n")
        for t in (1, 16, 256, 2048):
            for e in (4, 16, 64):
                if e <= 4 * t:
                    f.write(f"{t},{e},{1000.0 * e + 0.5 * t}\n")  # every activated expert streams its weights
    return folder


def test_an_moe_block_reads_its_experts_time_at_the_experts_a_step_activates(tmp_path):
    folder = _moe_profile(tmp_path)
    moe = load_profile(folder)
    assert moe.moe is not None and moe.num_layers == 4
    # 16 tokens activate 64 (1 - (1 - 4/64)^16) = 41.3 of 64 experts: between the 16- and 64-expert rows
    experts = 64 * (1 - (1 - 4 / 64) ** 16)
    want_us = 1000.0 * experts + 0.5 * 16
    no_moe = load_profile(folder, num_layers=4)
    no_moe.moe = None
    assert moe.kernel_s(16, 0, 0, 0) - no_moe.kernel_s(16, 0, 0, 0) == pytest.approx(4 * want_us * 1e-6, rel=1e-9)
    # the step model has no term that saturates with the experts: the fit is refused, --force writes it
    out = tmp_path / "moe.json"
    proc = _calibrate("--from-profile", str(folder), "--out", str(out))
    assert proc.returncode == 1 and not out.exists() and "an MoE step's expert time saturates" in proc.stderr
    proc = _calibrate("--from-profile", str(folder), "--out", str(out), "--force")
    assert proc.returncode == 0 and out.exists()


def test_skew_rows_say_whether_mixed_contexts_cost_their_mean_or_their_longest(tmp_path):
    folder = _synthetic_profile(tmp_path, {"b": 3e-9, "g": 90e-9, "m": 0.0})
    rows = [("pure", 64, 0, "0.0"), ("pure", 64, 0, "0.1"), ("pure", 64, 0, "0.2"), ("mixed", 4, 16, "0.9"),
            ("mixed", 4, 16, "")]  # an empty alpha: the longest took no longer than the mean
    (folder / "tp1" / "skew.csv").write_text("regime,n,pc,alpha\n" + "".join(f"{r},{n},{pc},{a}\n" for r, n, pc, a in rows))
    skew = load_profile(folder, num_layers=4).skew
    assert skew == [{"regime": "beside a chunk", "batch": "n < 32", "rows": 1, "median_alpha": 0.9, "p90_alpha": 0.9},
                    {"regime": "decode-only", "batch": "n >= 32", "rows": 3, "median_alpha": 0.1, "p90_alpha": 0.2}]
