"""How many closed-loop turns per second one engine's controller actor can gate, on local Ray.

    python benchmarks/bench_gate.py [--fleets 2] [--sessions 512] [--duration 10] [--json OUT]

A run's sessions ask its controller actor (actors/controller.py) before every turn and tell it
when a turn completed (actors/fleet.py RemoteGate). Here ``--fleets`` fleet actors host
``--sessions`` sessions in all, each a loop of exactly that gate traffic with no engine behind it
(ask before the turn, tell it completed), against a real ``ControllerActor`` (policy ``none``,
preflighted against benchmarks/zero_server.py). Measured twice in one run:

* ``per_call``: every question and every notification a Ray call of its own (RemoteGate before
  batching, kept here as the baseline);
* ``batched``: RemoteGate as it is: notifications ride with the fleet's next question.

Reported: turns/s through the gate, the ceiling on one engine's turns/s through the controller
whatever the engine's speed (per_call: two controller calls a turn; batched: one, plus the
notifications no question took along).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from actors.controller import ControllerActor  # noqa: E402
from actors.fleet import RemoteGate  # noqa: E402
from loadgen.core.spec import parse_spec  # noqa: E402
from loadgen.live.http_client import EndpointOptions  # noqa: E402
from tests.servers import free_port, start_server  # noqa: E402


class PerCallGate:
    """RemoteGate before batching: one controller call per question and per notification."""

    answers_later = True

    def __init__(self, controller) -> None:
        self.controller = controller

    async def arrive(self, session, demand_tokens):
        if await self.controller.arrive.remote(session, demand_tokens):
            return None
        return self.controller.admitted.remote(session)

    async def before_turn(self, session, demand_tokens):
        if await self.controller.before_turn.remote(session, demand_tokens):
            return None
        return self.controller.admitted.remote(session)

    def turn_completed(self, session, latency_s):
        self.controller.turn_completed.remote(session, latency_s)

    def session_ended(self, session):
        self.controller.session_ended.remote(session)


@ray.remote(num_cpus=0)
class GateLoad:
    """A fleet's sessions reduced to their gate traffic."""

    async def run(self, controller, session_ids: list[int], duration_s: float, batched: bool) -> int:
        gate = RemoteGate(controller) if batched else PerCallGate(controller)
        end = time.perf_counter() + duration_s
        turns = 0

        async def session(sid: int) -> None:
            nonlocal turns
            wait = await gate.arrive(sid, 1000)
            if wait is not None:
                await wait
            while time.perf_counter() < end:
                wait = await gate.before_turn(sid, 1000)
                if wait is not None:
                    await wait
                await asyncio.sleep(0)  # the turn itself (no engine here)
                gate.turn_completed(sid, 0.01)
                turns += 1
            gate.session_ended(sid)

        await asyncio.gather(*(session(sid) for sid in session_ids))
        await asyncio.sleep(0.1)  # the last notifications out
        return turns


def measure(controller, num_fleets: int, num_sessions: int, duration_s: float, batched: bool) -> dict:
    loads = [GateLoad.remote() for _ in range(num_fleets)]
    ray.get([load.__ray_ready__.remote() for load in loads])
    ids = list(range(num_sessions))
    t0 = time.perf_counter()
    turns = sum(ray.get([load.run.remote(controller, ids[i::num_fleets], duration_s, batched)
                         for i, load in enumerate(loads)]))
    wall = time.perf_counter() - t0
    for load in loads:
        ray.kill(load)
    return {"turns": turns, "turns_per_s": turns / duration_s, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fleets", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=512)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server([sys.executable, str(ROOT / "benchmarks" / "zero_server.py"), "--port", str(port)], url,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        spec = parse_spec({"experiment": "gate-bench", "seeds": [1], "duration_s": 60,
                           "engine": {"kind": "openai", "url": url, "flush_before_run": False},
                           "workload": {"arrival_rate_per_s": 1.0, "sessions": {"kind": "synthetic"}},
                           "arms": [{"name": "a"}]})
        results = {}
        for name, batched in (("per_call", False), ("batched", True)):
            controller = ControllerActor.remote(spec, "a", f"gate-{name}", EndpointOptions(url=url))
            ray.get(controller.preflight.remote(None, False))
            ray.get(controller.begin.remote(time.time()))
            results[name] = measure(controller, args.fleets, args.sessions, args.duration, batched)
            ray.kill(controller)
            print(name, json.dumps(results[name]), flush=True)
        results["speedup"] = results["batched"]["turns_per_s"] / results["per_call"]["turns_per_s"]
    finally:
        ray.shutdown()
        server.kill()
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
