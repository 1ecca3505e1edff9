"""A live run measures how late it, and serve-sim, run against the scaled clock: a run whose lag
passes the bound is marked ``lagging`` in run.json (a flag, not a failure) and the report warns.

The blocked event loops are test hooks that sleep in a callback: on serve-sim's loop (run here on
a thread, so the test can reach its loop) or on the driver's (``on_progress``, called at every
sample). The assertions are on run.json and the printed report, never on elapsed time."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen.core.runner import RunKey
from loadgen.core.spec import SimEngineSpec, parse_spec
from loadgen.live.runner import run_live
from loadgen.live.serve_sim import SimServer, serve
from loadgen.sim import EngineConfig
from tests.conftest import make_spec_dict
from tests.servers import free_port, wait_ready


def lag_spec(url: str, time_scale: float, duration_s: float, arrival_rate_per_s: float = 0.2):
    # 300 output tokens: turns of ~2 s of engine time, so the bound (5% of the median turn) is ~0.1 s
    data = make_spec_dict(duration_s=duration_s, seeds=[3])
    data["workload"]["arrival_rate_per_s"] = arrival_rate_per_s
    data["workload"]["sessions"]["output_tokens"] = 300
    data["arms"] = [{"name": "base"}]
    return parse_spec({**data, "engine": {"kind": "openai", "url": url}, "time_scale": time_scale})


class ThreadedServeSim:
    """serve-sim (the same SimServer as ``loadgen serve-sim``) on a thread's event loop."""

    def __init__(self, time_scale: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = EngineConfig(num_blocks=400_000 // 16, block_size=16, max_num_batched_tokens=8192,
                              max_model_len=40960)
        self.server = SimServer(config, SimEngineSpec().load_cost_model(Path.cwd()), time_scale=time_scale)
        self.loop = asyncio.new_event_loop()
        self._stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        wait_ready(self.url, 30.0)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = self.loop.run_until_complete(serve(self.server, "127.0.0.1", self.port))
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())
        self._stopped.set()

    def block_loop(self, every_s: float, for_s: float) -> None:
        """From now on, hold serve-sim's event loop for ``for_s`` seconds every ``every_s``."""

        def hold() -> None:
            time.sleep(for_s)  # the test hook: a callback that blocks the loop
            self.loop.call_later(every_s, hold)

        self.loop.call_soon_threadsafe(hold)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._stopped.wait(10)


def read_run_json(out: Path) -> dict:
    return json.loads((out / "runs" / "base-s3" / "run.json").read_text())


def test_a_normal_live_run_is_not_lagging_and_records_both_sides_lag(tmp_path, serve_sim_factory):
    # time scale 1: the event loops' millisecond-scale lateness is far below a 2 s turn's 5%
    server = serve_sim_factory(1.0)
    spec = lag_spec(server.url, time_scale=1.0, duration_s=15, arrival_rate_per_s=0.3)
    info = run_live(spec, RunKey("base", 3), tmp_path)
    assert info == read_run_json(tmp_path)
    assert info["status"] == "completed" and info["lagging"] is False
    lag = info["lag"]
    assert lag["driver"]["num_timers"] > 0 and lag["server"]["num_timers"] > 0  # serve-sim answered /loadgen/lag
    assert lag["bound_s"] == pytest.approx(0.05 * lag["median_turn_s"]) and lag["median_turn_s"] > 1.0
    assert lag["p99_s"] <= lag["bound_s"]
    assert lag["p99_s"] == max(lag["driver"]["p99_s"], lag["server"]["p99_s"])
    from urllib.request import urlopen

    with urlopen(server.url + "/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert "loadgen_serve_sim_lag_p99_seconds " in metrics


def test_a_run_against_a_serve_sim_whose_loop_is_blocked_is_lagging_and_reported(tmp_path, capsys):
    server = ThreadedServeSim(10.0)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(lag_spec(server.url, time_scale=10.0, duration_s=60).model_dump_json())
    out_dir = tmp_path / "res"
    try:
        server.block_loop(every_s=0.2, for_s=0.1)  # 0.1 s real = 1 s of run time, a third of the time
        code = main(["run", str(spec_path), "--out", str(out_dir), "--no-report", "--quiet"])
    finally:
        server.close()
    assert code == 0  # lagging is a flag beside the status, not a failure
    info = read_run_json(out_dir)
    assert info["status"] == "completed"
    lag = info["lag"]
    assert info["lagging"] is True and lag["source"] == "server" and lag["p99_s"] > lag["bound_s"]
    assert lag["server"]["p99_s"] > lag["driver"]["p99_s"]
    err = " ".join(capsys.readouterr().err.split())
    assert f"warning: run base-s3 lagged: the server's timers fired p99 {lag['p99_s']:.3g} s late" in err

    assert main(["report", str(out_dir), "--no-figures"]) == 0
    out = capsys.readouterr().out
    warning = [line for line in out.splitlines() if line.startswith("warning: lagging runs")]
    assert len(warning) == 1 and warning[0].endswith(": base-s3")
    summary = json.loads((out_dir / "summary.json").read_text())
    assert [run["lagging"] for run in summary["runs"]] == [True]


def test_a_run_whose_driver_loop_is_blocked_is_lagging_on_the_driver_side(tmp_path, serve_sim_factory):
    server = serve_sim_factory(10.0)
    spec = lag_spec(server.url, time_scale=10.0, duration_s=60)
    spec = spec.model_copy(update={"recording": spec.recording.model_copy(update={"sample_interval_s": 2.0})})
    # every sample (0.2 s of real time apart) holds the driver's loop for 0.1 s
    info = run_live(spec, RunKey("base", 3), tmp_path, on_progress=lambda snapshot: time.sleep(0.1))
    assert info["status"] == "completed"
    lag = info["lag"]
    assert info["lagging"] is True and lag["source"] == "driver" and lag["p99_s"] > lag["bound_s"]
