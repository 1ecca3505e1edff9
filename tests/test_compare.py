import json

import pytest

from loadgen.analysis.compare import comparison_figure, compare_runs, format_comparison, write_comparison
from tests.factories import steady_turns, write_run_dir


def _dir(root, hit_after_trigger):
    turns = steady_turns(0, 600, 5, 0.9) + steady_turns(600, 1800, 5, hit_after_trigger)
    write_run_dir(root, "burst-s1", "burst", 1, turns, [], [{"kind": "burst", "start_s": 300, "end_s": 600}],
                  1800, 600)
    write_run_dir(root, "only-here-s1", "only-here", 1, steady_turns(0, 1800, 5, 0.9), [], [], 1800, 600)
    return root


def test_compare_matches_runs_and_scores_agreement(tmp_path):
    real = _dir(tmp_path / "real", 0.1)
    sim = _dir(tmp_path / "sim", 0.2)
    (sim / "runs" / "only-here-s1").rename(sim / "runs" / "elsewhere-s1")
    result = compare_runs(real, sim, width_s=300)
    (run,) = result["runs"]
    assert run["run_id"] == "burst-s1" and run["end_state_agrees"]
    assert run["real"]["persistently_degraded"] and run["sim"]["persistently_degraded"]
    # 2 windows at 0.9 on both sides, 4 windows differing by 0.1
    assert run["hit_ratio_mean_abs_diff"] == pytest.approx(4 * 0.1 / 6, abs=1e-6)
    assert result["only_real"] == ["only-here-s1"] and result["only_sim"] == ["elsewhere-s1"]
    assert "end-state agreement 100%" in format_comparison(result)
    paths = write_comparison(result, tmp_path / "out")
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["end_state_agreement"] == 1.0


def test_disagreeing_end_states_are_counted(tmp_path):
    result = compare_runs(_dir(tmp_path / "real", 0.1), _dir(tmp_path / "sim", 0.9), width_s=300)
    burst = [r for r in result["runs"] if r["run_id"] == "burst-s1"][0]
    assert not burst["end_state_agrees"] and result["end_state_agreement"] == 0.5


def test_no_common_runs_is_an_error(tmp_path):
    write_run_dir(tmp_path / "a", "x-s1", "x", 1, [], [], [], 600, None)
    write_run_dir(tmp_path / "b", "y-s1", "y", 1, [], [], [], 600, None)
    with pytest.raises(ValueError, match="no completed run ids in common"):
        compare_runs(tmp_path / "a", tmp_path / "b")


def _spec(rate=0.03, engine=None, start_s=300):
    return {"workload": {"arrival_rate_per_s": rate}, "seeds": [1], "engine": engine or {"kind": "sim"},
            "controller": {"name": "none"},
            "arms": [{"name": "burst", "triggers": [{"kind": "burst", "start_s": start_s}], "controller": None}]}


def _one_run(root, spec, status="completed", run_id="burst-s1"):
    write_run_dir(root, run_id, "burst", 1, steady_turns(0, 1800, 5, 0.9), [], [], 1800, 600, spec=spec,
                  status=status)
    return root


def test_compare_leaves_out_runs_that_did_not_complete_and_says_so(tmp_path):
    real, sim = tmp_path / "real", tmp_path / "sim"
    real_spec = _spec(engine={"kind": "openai", "url": "http://127.0.0.1:8000"})
    _one_run(real, real_spec)
    _one_run(real, real_spec, status="engine_lost", run_id="base-s1")
    _one_run(real, real_spec, status="failed", run_id="base-s2")
    for run_id in ("burst-s1", "base-s1", "base-s2"):
        _one_run(sim, _spec(), run_id=run_id)
    result = compare_runs(real, sim, width_s=300)
    assert [r["run_id"] for r in result["runs"]] == ["burst-s1"]  # the engine may differ
    assert result["left_out"] == [{"side": "real", "run_id": "base-s1", "status": "engine_lost"},
                                  {"side": "real", "run_id": "base-s2", "status": "failed"}]
    assert ("left out (only completed runs are compared): real base-s1 (engine_lost), real base-s2 (failed)"
            in format_comparison(result))
    assert result["only_sim"] == ["base-s1", "base-s2"]


@pytest.mark.parametrize("sim_spec,field", [
    (_spec(rate=0.05), "workload.arrival_rate_per_s (0.03 vs 0.05)"),
    (_spec(start_s=600), "arms[burst].triggers[0].start_s (300 vs 600)"),
    ({**_spec(), "seeds": [2]}, "seeds[0] (1 vs 2)"),
])
def test_compare_refuses_runs_of_another_workload_triggers_or_seed(tmp_path, sim_spec, field):
    real = _one_run(tmp_path / "real", _spec(engine={"kind": "openai", "url": "http://127.0.0.1:8000"}))
    sim = _one_run(tmp_path / "sim", sim_spec)
    with pytest.raises(ValueError) as info:
        compare_runs(real, sim)
    assert str(info.value).startswith(f"burst-s1: {real} and {sim} did not run the same experiment: {field}")


def test_compare_command_exits_2_naming_the_difference(tmp_path):
    import subprocess
    import sys

    real = _one_run(tmp_path / "real", _spec())
    sim = _one_run(tmp_path / "sim", _spec(rate=0.05))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "compare", str(real), str(sim)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "did not run the same experiment: workload.arrival_rate_per_s (0.03 vs 0.05)" in proc.stderr
    assert not (real / "compare").exists()


def test_compare_names_live_runs_that_fell_behind_their_time_scale(tmp_path, capsys):
    from loadgen.cli import main

    real, sim = _dir(tmp_path / "real", 0.1), _dir(tmp_path / "sim", 0.2)
    run_json = real / "runs" / "burst-s1" / "run.json"
    # what a live run whose serve-sim fell behind writes (loadgen.live.runner, lag_report)
    info = json.loads(run_json.read_text())
    info.update(lagging=True, lag={"p50_s": 0.02, "p99_s": 0.4, "max_s": 0.5, "bound_s": 0.1, "source": "server"})
    run_json.write_text(json.dumps(info))
    result = compare_runs(real, sim, width_s=300)
    assert result["lagging"] == [{"side": "real", "run_id": "burst-s1"}]
    assert main(["compare", str(real), str(sim), "--out", str(tmp_path / "cmp")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("warning: lagging runs")][0].endswith(": real burst-s1")
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["lagging"] == result["lagging"]
    # without the flag (simulated runs, older live runs) there is no warning
    assert compare_runs(sim, sim, width_s=300)["lagging"] == []
    assert "warning: lagging" not in format_comparison(compare_runs(sim, sim, width_s=300))


def test_compare_names_its_output_by_both_directories_and_never_overwrites_another_pair(tmp_path, capsys):
    from loadgen.cli import main

    real, sim = _dir(tmp_path / "real", 0.1), _dir(tmp_path / "sim", 0.2)
    (sim / "runs" / "only-here-s1").rename(sim / "runs" / "only-here-s2")  # a seed only the sim side has
    assert main(["compare", str(real), str(sim)]) == 0
    out = capsys.readouterr().out
    assert (real / "compare-vs-sim" / "compare.json").is_file() and not (real / "compare").exists()
    assert (f"unmatched runs (a seed or arm one side lacks; not compared): only in {real}: only-here-s1; "
            f"only in {sim}: only-here-s2") in out
    # the same pair again: a rerun rewrites its own output
    assert main(["compare", str(real), str(sim)]) == 0
    # another simulation whose directory has the same name: refused, not overwritten
    other = _dir(tmp_path / "elsewhere" / "sim", 0.9)
    before = (real / "compare-vs-sim" / "compare.json").read_bytes()
    assert main(["compare", str(real), str(other)]) == 2
    assert "holds the comparison of" in capsys.readouterr().err
    assert (real / "compare-vs-sim" / "compare.json").read_bytes() == before
    assert main(["compare", str(real), str(other), "--out", str(tmp_path / "cmp2")]) == 0


def test_the_figure_says_whether_the_simulator_ran_a_preset_or_a_calibrated_model(tmp_path):
    from loadgen.analysis.compare import describe_engine
    from loadgen.sim.cost import PRESETS

    preset = PRESETS["qwen3-8b-mi300x"].to_json()
    assert describe_engine({"spec": {"engine": {"kind": "sim", "cost_model": "qwen3-8b-mi300x"}}}) == \
        "simulator, preset qwen3-8b-mi300x"
    assert describe_engine({"spec": {"engine": {"kind": "sim", "cost_model": preset}}}) == \
        "simulator, preset qwen3-8b-mi300x"
    fitted = {**preset, "a_s_per_token": 1e-5, "name": "cpu-fit"}
    assert describe_engine({"spec": {"engine": {"kind": "sim", "cost_model": fitted}}}) == \
        "simulator, calibrated cost model 'cpu-fit'"
    assert describe_engine({"spec": {"engine": {"kind": "sim", "cost_model": "runs/cost.json"}}}) == \
        "simulator, calibrated cost model cost.json"
    assert describe_engine({"spec": {"engine": {"kind": "openai"}}}) == "engine openai"
    real = _one_run(tmp_path / "real", _spec(engine={"kind": "openai", "url": "http://127.0.0.1:1/v1"}))
    sim = _one_run(tmp_path / "sim", _spec(engine={"kind": "sim", "cost_model": "qwen3-8b-mi300x"}))
    result = compare_runs(real, sim, width_s=300)
    assert result["runs"][0]["sim_engine"] == "simulator, preset qwen3-8b-mi300x"
    title = comparison_figure(result, result["runs"][0]).axes[0].get_title()
    assert "calibrated" not in title and "sim (simulator, preset qwen3-8b-mi300x)" in title
