"""Two serve-sim replicas behind a small round-robin router (loopback): with the session affinity
header a session stays on one replica and gets the hits one engine gives it; without, its turns
are spread and it misses; the replicas' metrics are summed into samples.parquet and kept per
replica in replica_samples.parquet (loadgen/live/replicas.py)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from loadgen.analysis.summary import write_summary
from loadgen.core.runner import RunKey
from loadgen.core.spec import OpenAIEngineSpec, parse_spec
from loadgen.live.runner import run_live
from tests.conftest import make_spec_dict
from tests.servers import ThreadedProxy

TIME_SCALE = 30.0
SYSTEM_PROMPT_TOKENS = 2000  # the tiny spec's default; a multiple of the block size (16)
HEADER = "X-Session-ID"


class Router(ThreadedProxy):
    """Forwards every request to one of ``upstreams``: a request carrying ``header`` goes where the
    first request with that value went (new values in turn, round robin), any other request to the
    next upstream in turn. Records where each session value went."""

    def __init__(self, upstreams: list[str], header: str = HEADER) -> None:
        self.upstreams = upstreams
        self.header = header
        self.sticky: dict[str, int] = {}  # header value -> upstream index, in order of first sight
        self.completions: list[tuple[str, int]] = []  # (header value or "", upstream) per completion
        self._next = 0
        super().__init__()

    def _pick(self, value: str) -> int:
        if value and value in self.sticky:
            return self.sticky[value]
        index = self._next % len(self.upstreams)
        self._next += 1
        if value:
            self.sticky[value] = index
        return index

    async def route(self, request) -> str:
        value = request.headers.get(self.header, "")
        index = self._pick(value)
        if request.path.endswith("/completions"):
            self.completions.append((value, index))
        return self.upstreams[index]


def live_spec(url: str, **engine):
    data = make_spec_dict(duration_s=240, seeds=[3])
    data["workload"]["arrival_rate_per_s"] = 0.05
    data["arms"] = [{"name": "base"}]
    spec = parse_spec({**data, "engine": {"kind": "sim", "pool_tokens": 400000}})
    return spec.model_copy(update={"engine": OpenAIEngineSpec(url=url, **engine), "time_scale": TIME_SCALE})


def run_dir(out):
    return out / "runs" / "base-s3"


def cached_by_turn(out, finished_by_s: float = float("inf")) -> dict:
    t = pq.read_table(run_dir(out) / "turns.parquet").to_pydict()
    return {(s, k): c for s, k, c, e, f in zip(t["session_id"], t["turn_index"], t["cached_tokens"], t["error"],
                                               t["finish_s"]) if e is None and f <= finished_by_s}


@pytest.fixture
def replicas(serve_sim_factory):
    return [serve_sim_factory(TIME_SCALE), serve_sim_factory(TIME_SCALE)]


def test_two_replicas_behind_a_router_with_session_affinity_hit_as_one_engine(tmp_path, replicas, serve_sim_factory):
    single = serve_sim_factory(TIME_SCALE)
    info = run_live(live_spec(single.url), RunKey("base", 3), tmp_path / "one")
    assert info["status"] == "completed"
    one = cached_by_turn(tmp_path / "one")

    router = Router([r.url for r in replicas])
    try:
        info = run_live(live_spec(router.url, session_header=HEADER, metrics_urls=[r.url for r in replicas]),
                        RunKey("base", 3), tmp_path / "two")
    finally:
        router.close()
    assert info["status"] == "completed"
    two = cached_by_turn(tmp_path / "two")

    # the header reached the router on every turn: the run's id and the session's, one replica per session
    sessions = {value for value, _ in router.completions}
    assert "base-s3/preflight" in sessions and all(v.startswith("base-s3/") for v in sessions)
    assert {int(v.split("/")[1]) for v in sessions if not v.endswith("preflight")} >= {s for s, _ in two}
    assert len({(v, i) for v, i in router.completions}) == len(sessions)  # never two replicas for one session
    # turn by turn the same hits as one engine, except that the first session on each replica finds
    # no system prompt cached there yet (on one engine only the very first session of the run)
    first_on = {}
    for value, index in router.completions:
        if not value.endswith("preflight"):
            first_on.setdefault(index, int(value.split("/")[1]))
    assert set(first_on) == {0, 1}
    common = set(one) & set(two)
    assert len(common) >= 0.85 * len(one) > 20
    differing = {key: one[key] - two[key] for key in common if one[key] != two[key]}
    assert set(differing) <= {(s, 0) for s in first_on.values()} and len(differing) <= 1
    assert all(d == SYSTEM_PROMPT_TOKENS for d in differing.values())

    # the replicas' metrics: summed into samples.parquet, one row per replica per sample beside it
    samples = pq.read_table(run_dir(tmp_path / "two") / "samples.parquet").to_pydict()
    per_replica = pq.read_table(run_dir(tmp_path / "two") / "replica_samples.parquet").to_pydict()
    assert info["pool_tokens"] == 800000 and set(samples["pool_tokens"]) == {800000}
    assert [r["pool_tokens"] for r in info["preflight"]["replicas"]] == [400000, 400000]
    assert info["prefix_cache_block_size"] == 16
    rows = {}
    for t_s, index, url, hits, queries, scraped in zip(per_replica["t_s"], per_replica["replica_index"],
                                                        per_replica["replica_url"], per_replica["prefix_cache_hits_total"],
                                                        per_replica["prefix_cache_queries_total"], per_replica["scraped"]):
        assert url == replicas[index].url and scraped
        rows.setdefault(t_s, {})[index] = (hits, queries)
    assert sorted(rows) == samples["t_s"] and all(set(r) == {0, 1} for r in rows.values())
    for t_s, hits, queries in zip(samples["t_s"], samples["prefix_cache_hits_total"],
                                  samples["prefix_cache_queries_total"]):
        assert hits == rows[t_s][0][0] + rows[t_s][1][0] and queries == rows[t_s][0][1] + rows[t_s][1][1]
    last = rows[max(rows)]
    assert last[0][0] > 0 and last[1][0] > 0  # both replicas served sessions and hit
    # the engines count a hit when they admit the request: by the last sample, every turn finished by
    # then (and the preflight's probes besides)
    finished = cached_by_turn(tmp_path / "two", samples["t_s"][-1])
    assert samples["prefix_cache_hits_total"][-1] >= sum(finished.values()) > 0

    # the ideal hit ratio from the recorded turns bounds the measured one
    run = write_summary(tmp_path / "two")["runs"][0]
    assert run["ideal_hit_ratio"] >= run["measured_hit_ratio"] > 0.5


def test_without_the_affinity_header_a_round_robin_router_spreads_sessions_and_they_miss(tmp_path, replicas):
    urls = [r.url for r in replicas]
    results = {}
    for name, engine in (("sticky", {"session_header": HEADER}), ("spread", {})):
        router = Router(urls)
        try:
            info = run_live(live_spec(router.url, metrics_urls=urls, **engine), RunKey("base", 3), tmp_path / name)
        finally:
            router.close()
        assert info["status"] == "completed"
        results[name] = write_summary(tmp_path / name)["runs"][0]
        if name == "spread":
            assert all(value == "" for value, _ in router.completions)  # no header sent
    sticky, spread = results["sticky"], results["spread"]
    # the same prompts: the same ideal; the engines (the router) made the spread run miss
    assert spread["ideal_hit_ratio"] == pytest.approx(sticky["ideal_hit_ratio"], abs=0.03)
    assert spread["measured_hit_ratio"] < sticky["measured_hit_ratio"] - 0.1
    assert spread["engine_miss_share"] > sticky["engine_miss_share"] + 0.3
    summary = json.loads((tmp_path / "spread" / "summary.json").read_text())
    assert summary["runs"][0]["ideal_hit_ratio"] == spread["ideal_hit_ratio"]
