"""The clock seam: the one place in the project that knows what time it is.

Session, gateway, workload and recording code only ever use a ``Clock``: ``now()``,
``sleep()``, ``call_at()``, ``create_future()`` and ``spawn()``. Two implementations:

* ``VirtualClock``: a tiny deterministic discrete-event kernel (a heap of timers and a FIFO of
  ready callbacks) that drives ordinary ``async def`` coroutines. Time jumps from one event to
  the next, so a 90-minute run takes as long as its events take to process. Ties are broken by
  insertion order, so the same program gives the same event order, bit for bit.
* ``WallClock``: the same surface over asyncio and the system's monotonic clock, optionally
  scaled (``time_scale=X`` makes every workload time X times shorter in real time). It measures
  how late each timer and sleep wakes against the scaled clock (``lateness``, in workload
  seconds; loadgen/core/lateness.py), since a busy loop silently stretches every workload time.

Nothing else in the project may read the system time (Trio's Clock/MockClock, SimPy's
Environment/RealtimeEnvironment).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, Optional, Protocol

from ..sim.keyed_heap import Keyed, heap_pop, heap_push
from .lateness import LatenessHistogram

if TYPE_CHECKING:  # asyncio (~20 ms) is imported by the wall clock, not by a simulated run
    import asyncio


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What sessions, the gateway and the engine adapters may ask of time."""

    lateness: LatenessHistogram  # how late timers fired against this clock (never, in virtual time)

    def now(self) -> float: ...

    def sleep(self, delay_s: float) -> Awaitable[None]: ...

    def call_at(self, when_s: float, callback: Callable[..., Any], *args: Any) -> TimerHandle: ...

    def create_future(self) -> Any: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> Any: ...


class TaskFailed(RuntimeError):
    """A coroutine run by the virtual kernel raised; the run stops with the original error."""


class _Future:
    """A one-shot result the virtual kernel's coroutines can await."""

    __slots__ = ("_clock", "_done", "_result", "_exception", "_waiters")

    def __init__(self, clock: "VirtualClock") -> None:
        self._clock = clock
        self._done = False
        self._result: Any = None
        self._exception: Optional[BaseException] = None
        self._waiters: list = []

    def done(self) -> bool:
        return self._done

    def result(self) -> Any:
        if self._exception is not None:
            raise self._exception
        return self._result

    def set_result(self, value: Any) -> None:
        if self._done:
            raise RuntimeError("future already resolved")
        self._done = True
        self._result = value
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        if self._done:
            raise RuntimeError("future already resolved")
        self._done = True
        self._exception = exc
        self._wake()

    def add_done_callback(self, fn: Callable[["_Future"], Any]) -> None:
        if self._done:
            self._clock._ready.append((fn, self))
        else:
            self._waiters.append(fn)

    def _wake(self) -> None:
        ready = self._clock._ready
        for fn in self._waiters:
            ready.append((fn, self))
        self._waiters = []

    def __await__(self):
        if not self._done:
            yield self
        return self.result()


class _Task(_Future):
    """Runs a coroutine on the virtual kernel, one ``send`` per wake-up."""

    __slots__ = ("_coro",)

    def __init__(self, clock: "VirtualClock", coro: Coroutine[Any, Any, Any]) -> None:
        super().__init__(clock)
        self._coro = coro
        clock._ready.append((self._step, None))

    def _step(self, fut: Optional[_Future]) -> None:
        try:
            if fut is not None and fut._exception is not None:
                awaited = self._coro.throw(fut._exception)
            else:
                awaited = self._coro.send(None if fut is None else fut._result)
        except StopIteration as stop:
            self.set_result(stop.value)
            return
        except Exception as exc:  # surfaces in VirtualClock.run; Ctrl-C (not an Exception) stops it at once, as itself
            self._clock._failure = exc
            self.set_exception(exc)
            return
        if awaited.__class__ is _Future or isinstance(awaited, _Future):
            awaited.add_done_callback(self._step)
        else:
            exc = TypeError(f"virtual-clock coroutines may only await this clock's futures, got {awaited!r}")
            self._clock._failure = exc
            self.set_exception(exc)


class _Timer(Keyed):
    """A timer in the virtual kernel's heap, ordered by (when, seq): its time, then its insertion
    (loadgen/sim/keyed_heap.py)."""

    __slots__ = ("callback", "args", "cancelled")

    def cancel(self) -> None:
        self.cancelled = True


def _timer(when: float, seq: int, callback: Callable[..., Any], args: tuple) -> _Timer:
    timer = _Timer.__new__(_Timer)  # compiled, a bare allocation (no __init__ found by name in the MRO)
    timer.when = when
    timer.seq = seq
    timer.callback = callback
    timer.args = args
    timer.cancelled = False
    return timer


def _timer_order(timer: _Timer) -> tuple:
    return timer.when, timer.seq


class _Series:
    """Timers that enter the heap one at a time, each as the one before it fires
    (``VirtualClock.call_series``)."""

    __slots__ = ("_heap", "_pending")

    def __init__(self, heap: list, pending: list) -> None:
        self._heap = heap
        self._pending = pending  # in reverse firing order

    def fire(self, callback: Callable[..., Any], args: tuple) -> None:
        if self._pending:
            heap_push(self._heap, self._pending.pop())
        callback(*args)


class VirtualClock:
    """Deterministic virtual time: timers in a heap, ties in insertion order."""

    is_virtual = True

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s
        self.lateness = LatenessHistogram()  # stays empty: a virtual timer fires exactly on time
        self._heap: list = []
        self._seq = 0
        self._ready: deque = deque()
        self._failure: Optional[BaseException] = None

    def now(self) -> float:
        return self._now

    def call_at(self, when_s: float, callback: Callable[..., Any], *args: Any) -> _Timer:
        self._seq += 1
        timer = _timer(when_s if when_s > self._now else self._now, self._seq, callback, args)
        heap_push(self._heap, timer)
        return timer

    def call_series(self, calls: list) -> None:
        """``call_at(when_s, callback, *args)`` for each ``(when_s, callback, args)`` of ``calls``,
        in that order, with one of them in the heap at a time: a run's arrivals and samples, known
        up front, would otherwise make every pop of the run's other timers walk a heap hundreds
        deep. Each keeps the insertion number ``call_at`` would have given it, so the events fire
        in exactly the same order."""
        now = self._now
        seq = self._seq
        timers = []
        series = _Series(self._heap, timers)
        for when_s, callback, args in calls:
            seq += 1
            timers.append(_timer(when_s if when_s > now else now, seq, series.fire, (callback, args)))
        self._seq = seq
        timers.sort(key=_timer_order, reverse=True)  # the heap's order, the next one last
        if timers:
            heap_push(self._heap, timers.pop())

    def create_future(self) -> _Future:
        return _Future(self)

    def sleep(self, delay_s: float) -> _Future:
        fut = _Future(self)
        self.call_at(self._now + delay_s, fut.set_result, None)
        return fut

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> _Task:
        return _Task(self, coro)

    def run(self, until_s: Optional[float] = None) -> None:
        """Process events in time order until none are left or the next lies beyond ``until_s``."""
        heap = self._heap
        ready = self._ready
        while True:
            while ready:
                fn, arg = ready.popleft()
                fn(arg)
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise TaskFailed(f"a simulated task failed: {failure!r}") from failure
            if not heap:
                break
            timer = heap[0]
            if until_s is not None and timer.when > until_s:
                self._now = until_s
                break
            heap_pop(heap)
            if timer.cancelled:
                continue
            self._now = timer.when
            timer.callback(*timer.args)


def epoch_s() -> float:
    """Seconds since the Unix epoch: the one time base shared by processes on different machines."""
    return time.time()


class WallClock:
    """Real time through asyncio; ``time_scale`` X compresses every workload time X-fold.

    ``lateness`` records, for every ``call_at`` callback and every ``sleep``, how much later than
    due (in scaled seconds) it ran. ``time_source`` (seconds, monotonic; default the loop's clock)
    is injectable so tests can drive lateness with a fake time instead of real waits."""

    is_virtual = False

    def __init__(self, time_scale: float = 1.0, loop: Optional[asyncio.AbstractEventLoop] = None,
                 origin_epoch_s: Optional[float] = None, time_source: Optional[Callable[[], float]] = None) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        import asyncio

        self._loop = loop or asyncio.get_event_loop()
        self._time = time_source or self._loop.time
        self._own_time_source = time_source is not None
        self._t0 = self._time()
        if origin_epoch_s is not None:
            # run time 0 at an agreed moment, so clocks in other processes (Ray actors, other
            # nodes) stamp the same run on one time axis; the loop's clock is per-process
            self._t0 += origin_epoch_s - epoch_s()
        self.lateness = LatenessHistogram()

    def now(self) -> float:
        return (self._time() - self._t0) * self.time_scale

    async def sleep(self, delay_s: float, record: bool = True) -> None:
        """``record=False``: background work that is not on the workload's schedule (its
        lateness would say nothing about the run's timing)."""
        due_s = self.now() + max(0.0, delay_s)
        import asyncio

        await asyncio.sleep(max(0.0, delay_s) / self.time_scale)
        if record:  # measured when the sleeper resumes: that is when the session acts on it
            self.lateness.record(self.now() - due_s)

    def call_at(self, when_s: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        deadline = self._t0 + when_s / self.time_scale
        if self._own_time_source:  # the loop schedules on its own clock: the same distance from now
            deadline += self._loop.time() - self._time()
        return self._loop.call_at(deadline, self._fire, when_s, callback, args)

    def _fire(self, when_s: float, callback: Callable[..., Any], args: tuple) -> None:
        self.lateness.record(self.now() - when_s)
        callback(*args)

    def create_future(self) -> asyncio.Future:
        return self._loop.create_future()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        return self._loop.create_task(coro)
