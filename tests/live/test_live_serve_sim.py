"""The live path end to end: real HTTP to a serve-sim process, faults included."""

import json
import threading

import pyarrow.parquet as pq
import pytest

from loadgen.live.runner import run_live
from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import OpenAIEngineSpec, parse_spec
from tests.conftest import make_spec_dict
from tests.live.conftest import FaultProxy

TIME_SCALE = 30.0


def live_spec(url: str, duration_s: float = 240, **engine):
    data = make_spec_dict(duration_s=duration_s, seeds=[3])
    data["workload"]["arrival_rate_per_s"] = 0.05
    data["arms"] = [{"name": "base"}]
    spec = parse_spec({**data, "engine": {"kind": "sim", "pool_tokens": 400000}})
    live = spec.model_copy(update={
        "engine": OpenAIEngineSpec(url=url, **engine), "time_scale": TIME_SCALE})
    return spec, live


def turns(out, run_id="base-s3"):
    return pq.read_table(out / "runs" / run_id / "turns.parquet").to_pydict()


def by_turn(t, ok_only=True):
    return {(s, k): (p, c) for s, k, p, c, e in zip(t["session_id"], t["turn_index"], t["prompt_tokens"],
                                                     t["cached_tokens"], t["error"]) if e is None or not ok_only}


def test_live_run_against_serve_sim_agrees_with_virtual_time(tmp_path, serve_sim_factory):
    server = serve_sim_factory(TIME_SCALE)
    sim_spec, spec = live_spec(server.url)
    info = run_live(spec, RunKey("base", 3), tmp_path / "live")
    assert info["status"] == "completed" and info["preflight"]["pool_tokens"] == 400000
    run_simulated(sim_spec, RunKey("base", 3), tmp_path / "virtual")
    live, virtual = by_turn(turns(tmp_path / "live")), by_turn(turns(tmp_path / "virtual"))
    common = set(live) & set(virtual)
    assert len(common) >= 0.85 * len(virtual) > 20
    assert all(live[key] == virtual[key] for key in common)  # same prompts, same cached tokens, turn by turn
    hit = lambda d: sum(c for p, c in d.values()) / sum(p for p, c in d.values())
    assert abs(hit({k: live[k] for k in common}) - hit(virtual)) < 0.05
    samples = pq.read_table(tmp_path / "live" / "runs" / "base-s3" / "samples.parquet").to_pydict()
    assert max(samples["prefix_cache_hits_total"]) > 0 and samples["pool_tokens"][0] == 400000


@pytest.mark.parametrize("mode", ["500", "hang"])
def test_failing_requests_are_recorded_retried_and_the_run_goes_on(tmp_path, serve_sim_factory, mode):
    server = serve_sim_factory(TIME_SCALE)
    proxy = FaultProxy(server.url, mode, every=5)
    try:
        _, spec = live_spec(proxy.url, request_timeout_s=1.0, retry={"max_attempts": 4, "backoff_s": 0.3})
        info = run_live(spec, RunKey("base", 3), tmp_path)
    finally:
        proxy.close()
    assert info["status"] == "completed" and proxy.num_faults > 0
    t = turns(tmp_path)
    errors = [e for e in t["error"] if e is not None]
    assert errors and all(("HTTP 500" if mode == "500" else "timeout after 1 s") in e for e in errors)
    ok = by_turn(t)
    # each failed attempt was retried: its (session, turn) later succeeded
    failed_keys = {(s, k) for s, k, e in zip(t["session_id"], t["turn_index"], t["error"]) if e is not None}
    assert sum(key in ok for key in failed_keys) >= 0.8 * len(failed_keys)


def test_a_server_killed_mid_run_ends_the_run_with_a_clear_status(tmp_path, serve_sim_factory):
    server = serve_sim_factory(TIME_SCALE)
    _, spec = live_spec(server.url, duration_s=600, engine_gone_after_s=1.5,
                        retry={"max_attempts": 2, "backoff_s": 0.3})
    threading.Timer(4.0, server.kill).start()
    info = run_live(spec, RunKey("base", 3), tmp_path)
    assert info["status"] == "engine_lost" and "every request failed" in info["error"]
    t = turns(tmp_path)  # what was recorded before and after the death is readable
    assert any(e is None for e in t["error"]) and any(e is not None for e in t["error"])


def test_a_live_run_of_session_trees_sends_the_parents_ids_and_hits_where_virtual_time_hits(tmp_path,
                                                                                            serve_sim_factory):
    """tree-search forks and parallel-tools calls against serve-sim: every child's prompt begins with
    its parent's exact token ids, so serve-sim's block hashes find the parent's blocks, turn for
    turn as in the virtual-time run; children name their parent in x-dynamo-parent-session-id."""
    server = serve_sim_factory(TIME_SCALE)
    for preset in ("tree-search", "parallel-tools"):
        data = make_spec_dict(duration_s=240, seeds=[3])
        data["workload"] = {"arrival_rate_per_s": 0.03, "sessions": {"kind": "tree", "preset": preset}}
        data["arms"] = [{"name": "base"}]
        sim_spec = parse_spec({**data, "engine": {"kind": "sim", "pool_tokens": 400000}})
        live_spec_ = parse_spec({**data, "engine": {"kind": "openai", "url": server.url, "session_header": "X-Session-ID"},
                                 "time_scale": TIME_SCALE})
        out = tmp_path / preset
        info = run_live(live_spec_, RunKey("base", 3), out / "live")
        assert info["status"] == "completed", info.get("error")
        run_simulated(sim_spec, RunKey("base", 3), out / "virtual")
        live, virtual = by_turn(turns(out / "live")), by_turn(turns(out / "virtual"))
        common = set(live) & set(virtual)
        assert len(common) >= 0.8 * len(virtual) > 20
        children = [key for key in common if key[0] >= 1 << 40 and key[1] == 0]
        assert len(children) > 5
        same = sum(live[key] == virtual[key] for key in common)
        assert same >= 0.9 * len(common)
        assert all(live[key][0] == virtual[key][0] for key in common)  # exact prompt lengths
        assert sum(live[k][1] for k in children) >= 0.9 * sum(virtual[k][1] for k in children) > 0


def test_a_run_at_another_time_scale_than_serve_sims_is_refused_before_any_load(tmp_path, serve_sim_factory):
    server = serve_sim_factory(1.0)  # the run below is at x30
    _, spec = live_spec(server.url)
    from loadgen.live.http_client import PreflightError

    with pytest.raises(PreflightError, match="serve-sim at --time-scale 1, and this run's time scale is 30"):
        run_live(spec, RunKey("base", 3), tmp_path)  # `loadgen run` says it and exits 2 (loadgen/experiment.py)
    info = json.loads((tmp_path / "runs" / "base-s3" / "run.json").read_text())
    assert info["status"] == "failed" and "start serve-sim with --time-scale 30" in info["error"]
    assert not (tmp_path / "runs" / "base-s3" / "turns.parquet").exists()
