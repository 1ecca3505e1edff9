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


def test_many_timers_fire_in_time_order_ties_in_the_order_they_were_set():
    # enough pending timers for a deep heap, with many ties, some cancelled, some set while running
    import random
    rng = random.Random(7)
    clock = VirtualClock()
    fired, expected = [], []
    for i in range(3000):
        when = float(rng.randint(0, 200))
        timer = clock.call_at(when, fired.append, (when, i))
        if rng.random() < 0.2:
            timer.cancel()
        else:
            expected.append((when, i))

    def chain(k):
        fired.append((clock.now(), 10_000 + k))
        if k < 50:
            clock.call_at(clock.now() + 3.0, chain, k + 1)

    clock.call_at(0.0, chain, 0)
    clock.run()
    # each link of the chain is set after every timer above, so it fires after their ties
    expected += [(3.0 * k, 10_000 + k) for k in range(51)]
    assert fired == sorted(expected, key=lambda e: (e[0], e[1] >= 10_000, e[1]))


def _log_of(schedule):
    """What a program that schedules timers with ``schedule(clock, log)`` logs, in firing order."""
    clock = VirtualClock(start_s=1.0)
    log = []
    schedule(clock, log)
    clock.run(until_s=180.0)
    return log, clock.now()


def test_a_series_fires_as_the_same_timers_set_one_by_one_would():
    # unsorted times with ties, one before the clock's start (clamped to it), timers set before
    # and after the series, and timers its events set while the run goes
    import random
    rng = random.Random(11)
    times = [float(rng.randint(0, 200)) for _ in range(400)]

    def event(clock, log, i):
        log.append((clock.now(), i))
        if i % 7 == 0:  # ties with later events of the series and with the other timers
            clock.call_at(clock.now() + float(i % 3), log.append, (clock.now(), "set by", i))

    def one_by_one(clock, log):
        clock.call_at(50.0, log.append, "before")
        for i, when in enumerate(times):
            clock.call_at(when, event, clock, log, i)
        clock.call_at(50.0, log.append, "after")

    def as_series(clock, log):
        clock.call_at(50.0, log.append, "before")
        clock.call_series([(when, event, (clock, log, i)) for i, when in enumerate(times)])
        clock.call_at(50.0, log.append, "after")

    expected = _log_of(one_by_one)
    assert _log_of(as_series) == expected
    log, now = expected
    assert log[0][0] == 1.0 and len(log) > 300 and now == 180.0  # clamped to the start; ran until 180 s


def test_a_series_holds_one_timer_in_the_heap_at_a_time():
    clock = VirtualClock()
    fired = []
    clock.call_series([(float(i), fired.append, (i,)) for i in range(1000)])
    assert len(clock._heap) == 1
    clock.run(until_s=499.5)
    assert fired == list(range(500)) and len(clock._heap) == 1
    clock.run()
    assert fired == list(range(1000)) and not clock._heap


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


def test_ctrl_c_inside_a_task_stops_the_run_as_ctrl_c_not_as_the_task_s_failure():
    # a KeyboardInterrupt lands in whatever Python code runs at that moment, often a session's
    # coroutine: the runner must see it as Ctrl-C (run.json "interrupted"), not a failed run
    clock = VirtualClock()

    async def interrupted():
        await clock.sleep(1)
        raise KeyboardInterrupt

    clock.spawn(interrupted())
    with pytest.raises(KeyboardInterrupt):
        clock.run()
    assert clock.now() == 1


def test_a_90_minute_sleep_takes_no_real_time():
    clock = VirtualClock()

    async def long_sleep():
        await clock.sleep(5400)

    clock.spawn(long_sleep())
    clock.run()
    assert clock.now() == 5400


# ---------------------------------------------------------------- lateness (docs/results-format.md#lag)
import asyncio  # noqa: E402

from loadgen.core.clock import WallClock  # noqa: E402
from loadgen.core.lateness import LatenessHistogram, lag_report  # noqa: E402


class FakeMonotonic:
    """A monotonic time source the test moves by hand: a 'slow' callback advances it."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_wall_clock_measures_how_late_timers_and_sleeps_wake_in_scaled_seconds():
    fake = FakeMonotonic()
    fired = []

    async def main():
        clock = WallClock(time_scale=10.0, time_source=fake)
        fake.t += 1.0  # 1 s of real time passes: run time 10 s

        def slow():  # a callback that holds the event loop for 0.3 s of real time
            fired.append(("slow", clock.now()))
            fake.t += 0.3

        # both already due, so the loop runs them at once, in deadline order, with no real wait
        clock.call_at(9.0, slow)
        clock.call_at(9.5, lambda: fired.append(("next", clock.now())))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

        async def sleeper():
            await clock.sleep(0.0)
            fired.append(("woke", clock.now()))

        task = clock.spawn(sleeper())
        await asyncio.sleep(0)  # the sleeper is now asleep
        fake.t += 0.05  # the loop is held for 0.05 s before it can wake the sleeper
        await task
        return clock

    clock = asyncio.run(main())
    assert [name for name, _ in fired] == ["slow", "next", "woke"]
    late = clock.lateness
    # slow fired 1 s (scaled) late; next waited for slow: 13 - 9.5; the sleeper woke 0.5 late
    assert late.count == 3 and late.max_s == pytest.approx(3.5) and late.sum_s == pytest.approx(5.0)
    summary = late.summary()
    assert summary["num_timers"] == 3 and summary["max_s"] == pytest.approx(3.5)
    assert 1.0 <= summary["p50_s"] <= 1.0 * 1.1  # the median timer, to one bucket (at most 9% high)
    assert summary["p99_s"] == pytest.approx(3.5)  # capped at the exact maximum


def test_a_cancelled_wall_clock_timer_records_nothing():
    fake = FakeMonotonic()

    async def main():
        clock = WallClock(time_scale=2.0, time_source=fake)
        clock.call_at(0.0, lambda: None).cancel()
        await asyncio.sleep(0)
        return clock

    assert asyncio.run(main()).lateness.count == 0


def test_virtual_time_is_never_late():
    clock = VirtualClock()

    async def sleeper():
        for _ in range(5):
            await clock.sleep(1.5)

    clock.spawn(sleeper())
    clock.call_at(3.0, lambda: None)
    clock.run()
    assert clock.lateness.summary() == {"num_timers": 0, "p50_s": 0.0, "p99_s": 0.0, "max_s": 0.0}


def test_a_snapshot_difference_is_one_window_of_a_long_lived_histogram():
    # serve-sim's histogram lives across runs: a run takes the difference of two snapshots
    hist = LatenessHistogram()
    for late in (0.001, 0.002, 5.0):  # an earlier run, one timer 5 s late
        hist.record(late)
    before = LatenessHistogram.from_json(hist.to_json())
    for late in [0.01] * 98 + [0.2, 0.3]:
        hist.record(late)
    window = hist.since(before)
    assert window.count == 100 and window.sum_s == pytest.approx(0.98 + 0.5)
    s = window.summary()
    assert 0.01 <= s["p50_s"] <= 0.011 and 0.2 <= s["p99_s"] <= 0.22
    assert 0.3 <= s["max_s"] <= 0.33  # the earlier run's 5 s is not this window's
    restarted = LatenessHistogram()  # serve-sim restarted between the snapshots: all of it is the window
    restarted.record(0.5)
    assert restarted.since(before).summary() == {"num_timers": 1, "p50_s": 0.5, "p99_s": 0.5, "max_s": 0.5}


def test_fleets_histograms_merge_into_the_histogram_of_all_their_timers():
    lates = ([0.001] * 50, [0.002] * 40 + [0.4] * 9 + [2.0])  # two fleets' clocks of one run
    parts, whole = [], LatenessHistogram()
    for fleet in lates:
        hist = LatenessHistogram()
        for late in fleet:
            hist.record(late)
            whole.record(late)
        parts.append(hist)
    assert LatenessHistogram.merged(parts).to_json() == whole.to_json()
    assert LatenessHistogram.merged([]).summary()["num_timers"] == 0


def test_a_run_is_lagging_when_the_worse_sides_p99_passes_5_percent_of_the_median_turn():
    driver, server = LatenessHistogram(), LatenessHistogram()
    for _ in range(100):
        driver.record(0.01)
        server.record(0.2)
    lagging, lag = lag_report(driver, server, median_turn_s=2.0)  # bound 0.1 s
    assert lagging and lag["source"] == "server" and lag["bound_s"] == pytest.approx(0.1)
    assert lag["p99_s"] == lag["server"]["p99_s"] >= 0.2 and lag["driver"]["p99_s"] < 0.011
    lagging, lag = lag_report(driver, None, median_turn_s=2.0)  # a real server: the driver's own
    assert not lagging and lag["source"] == "driver" and lag["server"] is None
    lagging, lag = lag_report(server, None, median_turn_s=None)  # no completed turn: no bound
    assert not lagging and lag["bound_s"] is None
