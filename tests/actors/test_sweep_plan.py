"""How a sweep divides the cluster and what it resumes (no cluster needed)."""

from __future__ import annotations

import asyncio
import json

from actors.sweep import _RunSlots, completed_run, cpu_run_slots, pairs_of, run_spec
from loadgen.core.runner import RunKey, run_keys
from tests.conftest import make_spec


def test_gpu_less_engines_run_one_per_cpu_and_a_pair_whole():
    assert cpu_run_slots(2, {"CPU": 8}) == 8
    assert cpu_run_slots(3, {"CPU": 2}) == 3


def test_pairs_are_the_arms_of_one_seed_in_seed_order():
    spec = make_spec(seeds=[7, 3])
    assert pairs_of(run_keys(spec)) == [[RunKey("base", 7), RunKey("burst", 7)],
                                        [RunKey("base", 3), RunKey("burst", 3)]]


def test_a_pair_waits_until_the_cluster_has_room_for_all_its_arms():
    async def scenario() -> list[str]:
        slots = _RunSlots(4)
        events: list[str] = []

        async def pair(name: str, size: int, hold: asyncio.Event) -> None:
            await slots.take(size)
            events.append(f"{name} runs")
            await hold.wait()
            await slots.give(size)

        first, second, third = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [asyncio.ensure_future(pair("a", 2, first)), asyncio.ensure_future(pair("b", 2, second)),
                 asyncio.ensure_future(pair("c", 2, third))]
        await asyncio.sleep(0)
        events.append("a ends")
        first.set()
        second.set()
        third.set()
        await asyncio.gather(*tasks)
        return events

    assert asyncio.run(scenario()) == ["a runs", "b runs", "a ends", "c runs"]


def test_only_a_completed_run_of_the_same_spec_is_skipped(tmp_path):
    spec, key = make_spec(), RunKey("base", 1)
    run_dir = tmp_path / "runs" / key.run_id
    run_dir.mkdir(parents=True)
    assert completed_run(tmp_path, spec, key) is None
    for status, same_spec, skipped in (("failed", True, False), ("completed", False, False), ("completed", True, True)):
        recorded = run_spec(spec, key) if same_spec else run_spec(make_spec(duration_s=300), key)
        (run_dir / "run.json").write_text(json.dumps({"status": status, "spec": recorded}))
        assert (completed_run(tmp_path, spec, key) is not None) == skipped
