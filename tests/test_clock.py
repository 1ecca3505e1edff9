from loadgen.core.clock import TaskFailed, VirtualClock

import pytest


def test_virtual_clock_orders_events_by_time_then_insertion():
    clock = VirtualClock()
    log = []

    async def worker(name, delays):
        for d in delays:
            await clock.sleep(d)
            log.append((clock.now(), name))

    clock.spawn(worker("a", [1.0, 1.0]))
    clock.spawn(worker("b", [2.0]))
    clock.run()
    # a and b both wake at t=2: a's timer was armed first (at t=1? no: b armed at t=0), so b first
    assert log == [(1.0, "a"), (2.0, "b"), (2.0, "a")]


def test_virtual_clock_runs_until_and_stops_time_there():
    clock = VirtualClock()
    hits = []
    for t in (5.0, 15.0):
        clock.call_at(t, hits.append, t)
    clock.run(until_s=10.0)
    assert hits == [5.0] and clock.now() == 10.0


def test_futures_pass_results_and_exceptions():
    clock = VirtualClock()
    fut = clock.create_future()
    got = []

    async def waiter():
        got.append(await fut)

    clock.spawn(waiter())
    clock.call_at(3.0, fut.set_result, 42)
    clock.run()
    assert got == [42] and clock.now() == 3.0


def test_a_failing_task_stops_the_run_with_its_error():
    clock = VirtualClock()

    async def boom():
        await clock.sleep(1)
        raise KeyError("bad")

    clock.spawn(boom())
    with pytest.raises(TaskFailed) as info:
        clock.run()
    assert isinstance(info.value.__cause__, KeyError)


def test_a_90_minute_sleep_takes_no_real_time():
    clock = VirtualClock()

    async def long_sleep():
        await clock.sleep(5400)

    clock.spawn(long_sleep())
    clock.run()
    assert clock.now() == 5400
