"""Sweeps on a local Ray cluster with 4 fake GPUs (the session fixture in conftest.py).

Live runs use serve-sim engine actors at 60x real time, so a 10-minute run takes 10 s."""

from __future__ import annotations

import os
import signal

import pyarrow.parquet as pq
import pytest

from actors.sweep import run_sweep
from loadgen import run_experiment, run_keys
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec, make_spec_dict

pytestmark = pytest.mark.ray

TABLES = ("turns.parquet", "samples.parquet", "sessions.parquet")


def _live_spec():
    data = make_spec_dict(engine={"kind": "serve_sim", "simulator": {"pool_tokens": 160_000}}, time_scale=60.0)
    # the burst arm's gate parks and queues sessions: the controller actor's whole path
    data["arms"][1]["controller"] = {"name": "session-cap", "params": {"k": 2, "k_hi": 2}, "start_s": 150}
    return parse_spec(data)


class _Tracker:
    """Which runs are under way, from the sweep's own callbacks."""

    def __init__(self, kill=None) -> None:
        self.active: set[str] = set()
        self.most_at_once = 0
        self.done: list[str] = []
        self.kill = kill or {}

    def started(self, start) -> None:
        self.active.add(start.key.run_id)
        self.most_at_once = max(self.most_at_once, len(self.active))
        if start.key.run_id in self.kill:
            self.kill[start.key.run_id](start)

    def finished(self, key, info) -> None:
        self.active.discard(key.run_id)
        self.done.append(key.run_id)


def test_simulated_runs_are_ray_tasks_whose_files_equal_the_in_process_run(ray_local, tmp_path):
    spec = make_spec()
    keys = run_keys(spec)
    run_experiment(spec, tmp_path / "in-process", keys)
    results = run_sweep(spec, tmp_path / "ray", keys)
    assert [r["status"] for r in results] == ["completed"] * 4
    for key in keys:
        for name in (*TABLES, "run.json"):
            ray_file = tmp_path / "ray" / "runs" / key.run_id / name
            assert ray_file.read_bytes() == (tmp_path / "in-process" / "runs" / key.run_id / name).read_bytes()

    tracker = _Tracker()
    again = run_sweep(spec, tmp_path / "ray", keys, on_run_done=tracker.finished)
    assert tracker.done == [] and again == results  # all completed: nothing ran


def test_paired_arms_run_at_once_each_engine_on_its_own_gpu(ray_local, tmp_path):
    spec = _live_spec()
    keys = run_keys(spec)
    tracker = _Tracker()
    results = {r["run_id"]: r for r in run_sweep(spec, tmp_path, keys, num_fleets=2,
                                                 on_run_start=tracker.started, on_run_done=tracker.finished)}
    assert {r["status"] for r in results.values()} == {"completed"}, [r["error"] for r in results.values()]
    places = {run_id: r["placement"] for run_id, r in results.items()}
    gpus = [(p["node_id"], tuple(p["gpu_ids"])) for p in places.values()]
    assert len(set(gpus)) == 4 and all(len(g) == 1 for _, g in gpus)
    assert all(p["visible_devices"] == {"CUDA_VISIBLE_DEVICES": p["gpu_ids"][0]} for p in places.values())
    assert tracker.most_at_once == 4  # 4 GPUs: both pairs at once
    for seed in spec.seeds:
        base, burst = results[f"base-s{seed}"], results[f"burst-s{seed}"]
        # one placement group per pair, one bundle (GPU) per arm, one run-time origin
        assert base["placement"]["placement_group"] == burst["placement"]["placement_group"]
        assert {base["placement"]["bundle_index"], burst["placement"]["bundle_index"]} == {0, 1}
        assert base["origin_epoch_s"] == burst["origin_epoch_s"]
    assert places["base-s1"]["placement_group"] != places["base-s2"]["placement_group"]

    virtual = tmp_path / "virtual"
    run_experiment(make_spec(), virtual, keys)
    for run_id, info in results.items():
        turns = pq.read_table(tmp_path / "runs" / run_id / "turns.parquet").to_pydict()
        assert info["counts"]["turns_completed"] == len(turns["session_id"]) > 0
        assert max(turns["cached_tokens"]) > 0
        # the fleets ran the same sessions as virtual time: same prompt for every (session, turn)
        expected = pq.read_table(virtual / "runs" / run_id / "turns.parquet").to_pydict()
        prompts = dict(zip(zip(expected["session_id"], expected["turn_index"]), expected["prompt_tokens"]))
        live = dict(zip(zip(turns["session_id"], turns["turn_index"]), turns["prompt_tokens"]))
        assert len(live.keys() & prompts.keys()) > 0.8 * len(prompts)
        assert all(live[k] == prompts[k] for k in live.keys() & prompts.keys())
        samples = pq.read_table(tmp_path / "runs" / run_id / "samples.parquet").to_pydict()
        assert len(samples["t_s"]) == 61 and max(samples["sessions_in_system"]) > 0
    burst_sessions = pq.read_table(tmp_path / "runs" / "burst-s1" / "sessions.parquet").to_pydict()
    assert max(burst_sessions["first_admit_s"][i] - burst_sessions["arrival_s"][i]
               for i in range(len(burst_sessions["arrival_s"]))) > 0  # the controller actor made sessions wait


def test_a_dead_engine_fails_only_its_run_and_a_rerun_completes_just_that(ray_local, tmp_path):
    import ray

    spec = _live_spec()
    keys = run_keys(spec)
    kill = {"base-s1": lambda start: ray.kill(start.engine),  # the engine actor dies
            "burst-s2": lambda start: os.kill(start.placement["pid"], signal.SIGKILL)}  # its server dies
    results = {r["run_id"]: r for r in run_sweep(spec, tmp_path, keys, on_run_start=_Tracker(kill).started)}
    assert results["base-s1"]["status"] == "failed" and "engine actor died" in results["base-s1"]["error"]
    assert results["burst-s2"]["status"] == "failed" and "exited with code -9" in results["burst-s2"]["error"]
    assert results["burst-s1"]["status"] == results["base-s2"]["status"] == "completed"
    kept = {run_id: (tmp_path / "runs" / run_id / "turns.parquet").stat().st_mtime_ns
            for run_id in ("burst-s1", "base-s2")}

    tracker = _Tracker()
    rerun = run_sweep(spec, tmp_path, keys, on_run_done=tracker.finished)
    assert sorted(tracker.done) == ["base-s1", "burst-s2"]
    assert {r["status"] for r in rerun} == {"completed"}
    assert all((tmp_path / "runs" / run_id / "turns.parquet").stat().st_mtime_ns == mtime
               for run_id, mtime in kept.items())


def test_a_server_that_cannot_start_fails_its_runs_with_its_log(ray_local, tmp_path):
    data = make_spec_dict(engine={"kind": "serve_sim", "flags": ["--no-such-flag"]}, seeds=[1])
    results = run_sweep(parse_spec(data), tmp_path, run_keys(parse_spec(data)))
    for info in results:
        assert info["status"] == "failed"
        assert "exited with code 2 while starting" in info["error"] and "--no-such-flag" in info["error"]


def test_a_chat_sweep_sends_message_lists_of_the_planned_lengths(ray_local, tmp_path):
    """api chat on a launched engine: the controller's preflight settles text prompts, and every
    fleet builds the same message lists to the same exact lengths (here with serve-sim's own
    /tokenize) as the run in virtual time plans them."""
    data = make_spec_dict(engine={"kind": "serve_sim", "api": "chat", "simulator": {"pool_tokens": 160_000}},
                          time_scale=60.0, seeds=[1], arms=[{"name": "base"}])
    spec = parse_spec(data)
    [info] = run_sweep(spec, tmp_path, run_keys(spec), num_fleets=2)
    assert info["status"] == "completed", info["error"]
    assert info["preflight"]["api"] == "chat" and info["preflight"]["prompt_lengths"]["exact"]
    # the fleets' clocks are checked for lag as a local run's is: every arrival's timer counted (at
    # 60x on a busy 2-core machine the run may well lag: the flag must then say so)
    lag = info["lag"]
    assert lag["source"] == "driver" and lag["driver"]["num_timers"] >= info["counts"]["sessions_arrived"] > 0
    assert info["lagging"] == (lag["p99_s"] > lag["bound_s"])
    turns = pq.read_table(tmp_path / "runs" / "base-s1" / "turns.parquet").to_pydict()
    virtual = tmp_path / "virtual"
    run_experiment(make_spec(time_scale=60.0, seeds=[1], arms=[{"name": "base"}]), virtual, run_keys(spec))
    expected = pq.read_table(virtual / "runs" / "base-s1" / "turns.parquet").to_pydict()
    planned = dict(zip(zip(expected["session_id"], expected["turn_index"]), expected["prompt_tokens"]))
    live = dict(zip(zip(turns["session_id"], turns["turn_index"]), turns["prompt_tokens"]))
    assert len(live) > 20 and all(e is None for e in turns["error"])
    assert all(live[k] == planned[k] for k in live.keys() & planned.keys())
    assert max(turns["cached_tokens"]) > 0
