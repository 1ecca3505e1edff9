"""A live run through ``loadgen gateway --router consistent_hash`` in front of three serve-sim
engines: the run records each turn's ``replica`` from the gateway's X-Loadgen-Replica, each session
stays on one, and the gateway's per-upstream metrics count what each upstream was sent."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request

import pyarrow.parquet as pq

from loadgen.core.runner import RunKey
from loadgen.live.runner import run_live
from tests.live.conftest import ServeSim
from tests.live.test_router_serve_sim import HEADER, TIME_SCALE, live_spec, run_dir
from tests.servers import free_port, start_server


def test_a_live_run_through_the_gateways_router_records_the_replica_of_every_turn(tmp_path):
    engines = [ServeSim(TIME_SCALE) for _ in range(3)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = None
    try:
        gateway = start_server([sys.executable, "-m", "loadgen.cli", "gateway", "--quiet", "--router", "consistent_hash",
                                "--time-scale", str(TIME_SCALE),  # the run's: its preflight checks it
                                "--listen", f"127.0.0.1:{port}", *[a for e in engines for a in ("--upstream", e.url)]],
                               url, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        info = run_live(live_spec(url, session_header=HEADER, replica_header="X-Loadgen-Replica",
                                  metrics_urls=[e.url for e in engines]), RunKey("base", 3), tmp_path)
        assert info["status"] == "completed"
        turns = pq.read_table(run_dir(tmp_path) / "turns.parquet").to_pydict()
        where: dict[int, set] = {}
        per_replica = [0, 0, 0]
        for session, replica, error in zip(turns["session_id"], turns["replica"], turns["error"]):
            if error is None:
                where.setdefault(session, set()).add(replica)
                per_replica[replica] += 1
        assert len(where) > 3 and all(len(r) == 1 for r in where.values())
        assert len(set().union(*where.values())) > 1
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        sent = {u: float(n) for u, n in re.findall(r'^loadgen_gateway_upstream_requests_total\{upstream="([^"]+)"\} '
                                                   r'(\S+)$', text, re.M)}
        # every recorded turn went to the upstream its replica names (the preflight's probes come on top)
        assert all(sent.get(e.url, 0) >= n for e, n in zip(engines, per_replica))
        assert sum(sent.values()) >= len(turns["session_id"])
    finally:
        if gateway is not None:
            gateway.kill()
            gateway.wait()
        for engine in engines:
            engine.kill()
