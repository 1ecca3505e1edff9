"""The end of ``loadgen calibrate``: noisy rows or a busy machine fail with --strict, a model whose
coefficients the rows do not pin down is not written unless --force, and the .fit.json says why."""

import json
import random

from loadgen.live.calibrate import CalibrationPlan, CalibrationResult, CalibrationRow
from loadgen.live.calibration_report import finish_calibration
from loadgen.sim.cost import StepCostModel, decode_step, fit_cost_model, prefill

TRUTH = StepCostModel(t0_s=0.02, a_s_per_token=60e-6, b_s_per_token2=10e-9, g_s_per_token=2e-6, name="truth")
PLAN = CalibrationPlan(chunk_tokens=2048)


def _result(rows_spec, noise: float, seed: int = 0, late_s: float = 0.0) -> CalibrationResult:
    """Rows timed by TRUTH (plus 3 ms of request overhead for a time to first token), each repeat
    off by up to +-``noise``."""
    rng = random.Random(seed)
    rows = []
    for kind, m in rows_spec:
        base = TRUTH.predict(m) + 0.003 * m.num_requests
        samples = [base * (1 + rng.uniform(-noise, noise)) for _ in range(3)]
        rows.append(CalibrationRow(m.__class__(**{**m.__dict__, "seconds": sorted(samples)[1]}), kind, samples))
    measurements = [r.measurement for r in rows]
    return CalibrationResult(fit_cost_model(measurements, name="m", fit_request_overhead=True), 400_000, 16,
                             measurements, rows, seed, "reset", [], {"p99_s": late_s})


def _ttft(m):
    return m.__class__(**{**m.__dict__, "num_requests": 1.0})


FULL = ([("cold", _ttft(prefill(f"cold {n}", 1, n, chunk_tokens=2048))) for n in (16, 1500, 3000, 6000)]
        + [("incremental", _ttft(prefill(f"{n} on {c}", 1, n, c, chunk_tokens=2048))) for c, n in ((1000, 500),
                                                                                              (16000, 1000))]
        + [("decode", decode_step(f"decode {b} at {c}", 1, b, c)) for b, c in ((1, 500), (4, 2000), (8, 4000))])
# no decode rows: g is not pinned down
NO_DECODE = [r for r in FULL if r[0] != "decode"]


def test_a_quiet_calibration_writes_the_model_with_its_jitter(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert finish_calibration(_result(FULL, 0.01), PLAN, out, None, tolerance=0.1, strict=True) == 0
    model = json.loads(out.read_text())
    fit = json.loads(out.with_suffix(".fit.json").read_text())
    assert 0 < model["step_jitter_sigma"] < 0.05 and fit["identification"]["unidentified"] == []
    assert fit["seed"] == 0 and fit["prefix_cache"] == "reset" and len(fit["rows"][0]["samples"]) == 3


def test_noisy_rows_and_a_busy_machine_warn_and_fail_with_strict(tmp_path, capsys):
    noisy = _result(FULL, 0.4)
    assert finish_calibration(noisy, PLAN, tmp_path / "a.json", None, tolerance=0.1, force=True) == 0
    assert "repeats spread" in capsys.readouterr().err
    assert finish_calibration(noisy, PLAN, tmp_path / "b.json", None, tolerance=0.1, strict=True, force=True) == 1
    busy = _result(FULL, 0.01, late_s=0.01)  # 10 ms late against a 23 ms shortest row
    assert finish_calibration(busy, PLAN, tmp_path / "c.json", None, tolerance=0.1, strict=True) == 1
    assert "this machine was busy" in capsys.readouterr().err


def test_a_model_the_rows_do_not_pin_down_is_not_written_unless_forced(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert finish_calibration(_result(NO_DECODE, 0.05), PLAN, out, None, tolerance=0.1) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert "not writing" in err and "g_s_per_token" in err
    fit = json.loads(out.with_suffix(".fit.json").read_text())
    assert "g_s_per_token" in fit["identification"]["unidentified"]
    assert finish_calibration(_result(NO_DECODE, 0.05), PLAN, out, None, tolerance=0.1, force=True) == 0
    assert out.exists()


def test_check_charges_each_row_the_request_overhead_this_calibration_measured():
    """Only the engine's steps are judged: a time to first token includes one request round trip
    (here 10 ms), which the check adds to the model's steps; without it the true model fails."""
    from loadgen.live.calibration_stats import check_rows

    rows = []
    for kind, m in FULL:
        seconds = TRUTH.predict(m) + 0.010 * m.num_requests
        rows.append(CalibrationRow(m.__class__(**{**m.__dict__, "seconds": seconds}), kind, [seconds] * 3))
    assert check_rows(TRUTH, rows, 0.010, tolerance=0.1).passed
    failed = check_rows(TRUTH, rows, 0.0, tolerance=0.1)
    assert not failed.passed and failed.classes["cold"]["worst"] == "cold 16"


def _timed(scale_first: float = 1.0, first_spread: float = 0.0) -> list:
    """FULL's rows timed by TRUTH, the first one ``scale_first`` times slower with its repeats
    spread +-``first_spread``."""
    rows = []
    for i, (kind, m) in enumerate(FULL):
        seconds = TRUTH.predict(m)
        spread = 0.0
        if i == 0:
            seconds, spread = seconds * scale_first, first_spread
        rows.append(CalibrationRow(m.__class__(**{**m.__dict__, "seconds": seconds}), kind,
                                   [seconds * (1 - spread), seconds, seconds * (1 + spread)]))
    return rows


def test_a_noisy_row_makes_the_check_inconclusive_never_passed():
    """A row 20% off with repeats spread +-10% used to pass (its bound widened to 3x the spread)."""
    from loadgen.live.calibration_stats import check_rows

    check = check_rows(TRUTH, _timed(scale_first=1.2, first_spread=0.1), 0.0, tolerance=0.1)
    assert not check.passed and check.failures == [] and len(check.inconclusive) == 1
    assert "within 3x its repeats' spread" in check.inconclusive[0] and "too noisy to tell" in check.table()
    # beyond 3x the spread it is off, as before
    assert check_rows(TRUTH, _timed(scale_first=1.2, first_spread=0.05), 0.0, tolerance=0.1).failures


def test_a_failed_calibration_on_a_busy_machine_says_what_to_change(tmp_path, capsys):
    busy = _result(NO_DECODE, 0.01, late_s=0.01)
    assert finish_calibration(busy, PLAN, tmp_path / "c.json", None, tolerance=0.1, time_scale=20.0) == 1
    assert "what to change: at --time-scale 20" in capsys.readouterr().err
