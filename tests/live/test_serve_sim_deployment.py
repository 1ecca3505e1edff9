"""``serve-sim --replicas 2 --router consistent_hash``: one process, one URL, a simulated deployment
(loadgen/live/serve_deployment.py). A live run with the session header keeps each session on
one replica (the X-Loadgen-Replica of each response, recorded per turn with
``engine.replica_header``), and reads each replica's /metrics under /replica/<i> into
replica_samples.parquet."""

from __future__ import annotations

import json
import urllib.request

import pyarrow.parquet as pq

from loadgen.core.runner import RunKey
from loadgen.live.runner import run_live
from tests.live.test_router_serve_sim import HEADER, TIME_SCALE, live_spec, run_dir


def _post(url: str, body: dict, headers: dict) -> tuple[dict, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read()), dict(resp.headers)


def test_a_deployment_behind_one_url_pins_sessions_and_serves_each_replicas_metrics(tmp_path, serve_sim_factory):
    server = serve_sim_factory(TIME_SCALE, "--replicas", "2", "--router", "consistent_hash")
    body = {"model": "sim", "prompt": list(range(1, 200)), "max_tokens": 4}
    seen = {}
    for session in ("a", "b", "c", "d", "e", "f"):
        for _ in range(2):
            answer, headers = _post(server.url + "/v1/completions", body, {HEADER: session})
            assert answer["usage"]["completion_tokens"] == 4
            seen.setdefault(session, set()).add(headers["X-Loadgen-Replica"])
    assert all(len(r) == 1 for r in seen.values())  # a session stays on its replica
    assert set().union(*seen.values()) == {"0", "1"}  # and the ring spreads sessions over both

    replicas = [f"{server.url}/replica/{i}" for i in (0, 1)]
    info = run_live(live_spec(server.url, session_header=HEADER, metrics_urls=replicas,
                              replica_header="X-Loadgen-Replica"), RunKey("base", 3), tmp_path)
    assert info["status"] == "completed" and info["pool_tokens"] == 800000
    per_replica = pq.read_table(run_dir(tmp_path) / "replica_samples.parquet").to_pydict()
    assert set(per_replica["replica_index"]) == {0, 1} and all(per_replica["scraped"])
    last = max(per_replica["t_s"])
    hits = [h for t, h in zip(per_replica["t_s"], per_replica["prefix_cache_hits_total"]) if t == last]
    assert len(hits) == 2 and min(hits) > 0  # both replicas served sessions that hit
    # the replica of every turn, from the router's response header: one per session, both used
    turns = pq.read_table(run_dir(tmp_path) / "turns.parquet").to_pydict()
    where = {}
    for session, replica, error in zip(turns["session_id"], turns["replica"], turns["error"]):
        if error is None:
            where.setdefault(session, set()).add(replica)
    assert where and all(len(r) == 1 for r in where.values())
    assert set().union(*where.values()) == {0, 1}
