"""Simulated runs over local worker processes, results handed back as each run finishes.

Every simulated run owns its engine, clock and seeded generators and writes only its own
directory, so running several at once changes no byte of any run: ``--workers 1`` and
``--workers N`` write the same files. Each worker writes its run as it goes, exactly as a run in
this process would.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import time
from typing import Callable, Iterator, Optional, Sequence, TypeVar

Key = TypeVar("Key")
LIVENESS_POLL_S = 0.5  # how often, while no run finishes, the workers are checked for one that died


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_pooled(work: Callable[[Key], dict], keys: Sequence[Key], num_workers: int,
               on_start: Optional[Callable[[Key], None]] = None,
               on_lost: Optional[Callable[[Key, Optional[int]], dict]] = None) -> Iterator[tuple[Key, dict, float]]:
    """``work(key)`` for every key over ``num_workers`` forked processes: (key, result, wall
    seconds) as each finishes. At most ``num_workers`` keys are under way; ``on_start`` is told
    when one starts. ``work`` must catch what a run may raise (a failed run is a result).

    A worker that dies under a key (killed for memory, a crash in native code) gives that key the
    result ``on_lost(key, exit code)`` (without ``on_lost``: RuntimeError) and is replaced.

    Ctrl-C (SIGINT to the whole process group, or to this process alone: the workers are sent
    it too) stops the runs under way, which record it themselves (loadgen.core.runner), and
    raises KeyboardInterrupt here with the keys that were under way in ``exc.args[1]``."""
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    results = ctx.Queue()

    def start_worker() -> list:  # [process, its task queue, the index it runs or None]
        tasks = ctx.SimpleQueue()
        proc = ctx.Process(target=_worker, args=(work, keys, tasks, results), daemon=True)
        proc.start()
        return [proc, tasks, None]

    slots = [start_worker() for _ in range(num_workers)]
    next_index = num_done = 0
    try:
        while num_done < len(keys):
            for slot in slots:
                if slot[2] is None and next_index < len(keys):
                    if on_start is not None:
                        on_start(keys[next_index])
                    slot[2] = next_index
                    slot[1].put(next_index)
                    next_index += 1
            try:
                index, result, wall_s = results.get(timeout=LIVENESS_POLL_S)
            except queue.Empty:
                for n, slot in enumerate(slots):
                    if slot[2] is not None and not slot[0].is_alive():
                        key = keys[slot[2]]
                        exitcode = slot[0].exitcode
                        slots[n] = start_worker()
                        num_done += 1
                        if on_lost is None:
                            raise RuntimeError(f"{key}: its worker process died (exit code {exitcode})") from None
                        yield key, on_lost(key, exitcode), 0.0
                continue
            for slot in slots:
                if slot[2] == index:
                    slot[2] = None
            num_done += 1
            if isinstance(result, BaseException):
                raise result
            yield keys[index], result, wall_s
        for slot in slots:
            slot[1].put(None)
        for slot in slots:
            slot[0].join()
    except KeyboardInterrupt as exc:
        for proc, _, _ in slots:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGINT)
        for proc, _, _ in slots:
            proc.join(timeout=30)
        raise KeyboardInterrupt("interrupted", [keys[s[2]] for s in slots if s[2] is not None]) from exc
    finally:  # an error, or the caller stopped reading: nothing is left running
        for proc, _, _ in slots:
            if proc.is_alive():
                proc.terminate()
                proc.join()


def _worker(work: Callable, keys: Sequence, tasks, results) -> None:
    try:
        while (index := tasks.get()) is not None:
            t0 = time.perf_counter()
            try:
                result = work(keys[index])
            except Exception as exc:  # a bug in ``work``: raised in the parent
                result = RuntimeError(f"{keys[index]}: {type(exc).__name__}: {exc}")
            results.put((index, result, time.perf_counter() - t0))
    except KeyboardInterrupt:  # the run under way recorded it; the parent reports it
        pass


_JOBS: Sequence[Callable[[], object]] = ()


def _run_job(i: int) -> None:
    _JOBS[i]()


def run_jobs(jobs: Sequence[Callable[[], object]], num_workers: int) -> None:
    """Call every job, over ``num_workers`` forked processes (each inherits the jobs, nothing is
    pickled but their indices); in this process with one worker or where fork is not offered."""
    global _JOBS
    if num_workers <= 1 or len(jobs) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for job in jobs:
            job()
        return
    _JOBS = jobs
    try:
        with multiprocessing.get_context("fork").Pool(min(num_workers, len(jobs))) as pool:
            for _ in pool.imap_unordered(_run_job, range(len(jobs))):
                pass
    finally:
        _JOBS = ()
