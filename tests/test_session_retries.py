"""A retried turn, as the agent lived it: its latency counts from when the agent wanted the turn,
across every attempt; each attempt keeps its own row."""

import math

import numpy as np
import pyarrow as pa

from controllers.registry import make_policy
from loadgen.analysis.latency import turn_latencies
from loadgen.analysis.slo import turns_meeting
from loadgen.core.clock import VirtualClock
from loadgen.core.engines import EngineMetrics, TurnResult
from loadgen.core.gateway import Gateway
from loadgen.core.recording import RunRecorder
from loadgen.core.session import RetryPolicy, RunEnv, run_session
from loadgen.core.spec.experiment import SLOSpec
from loadgen.core.workload import SessionPlan
from trace_shapes import SessionShape


class TimesOutThenAnswers:
    """The first ``num_failures`` attempts of turn 0 time out after 100 s; every other attempt
    answers its first token 0.5 s after it was sent and finishes 1.0 s after."""

    needs_token_ids = False
    pool_tokens = 100_000

    def __init__(self, clock: VirtualClock, num_failures: int = 1) -> None:
        self.clock = clock
        self.num_failures = num_failures
        self.attempts = 0

    async def generate(self, request) -> TurnResult:
        sent = self.clock.now()
        if request.turn_index == 0 and self.attempts < self.num_failures:
            self.attempts += 1
            await self.clock.sleep(100.0)
            return TurnResult(sent, math.nan, self.clock.now(), request.prompt_tokens, 0, 0,
                              error="TransportError: timeout after 100 s")
        await self.clock.sleep(1.0)
        return TurnResult(sent, sent + 0.5, sent + 1.0, request.prompt_tokens, 0, request.max_tokens)

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(0, 0, 0.0, 0, 0, 0)


def run_one_session(num_failures: int, max_attempts: int = 3) -> pa.Table:
    clock = VirtualClock()
    engine = TimesOutThenAnswers(clock, num_failures)
    recorder = RunRecorder(None, "r", "base", 1, 1e9)
    env = RunEnv(clock, engine, Gateway(clock, make_policy("none"), engine.pool_tokens), recorder,
                 retry=RetryPolicy(max_attempts=max_attempts, backoff_s=0.5))
    shape = SessionShape("synthetic", 100, (10, 10), (5,), (2.0,))
    clock.spawn(run_session(SessionPlan(0, 0.0, shape), env))
    clock.run()
    recorder.close()
    return recorder.tables()["turns"]


def test_a_retried_turn_counts_from_when_the_agent_wanted_it_across_every_attempt():
    """The first attempt times out after 100 s, the retry (after a 0.5 s backoff) answers in
    1.0 s: the agent waited 101.5 s for the turn, 101.0 s for its first token."""
    turns = run_one_session(num_failures=1)
    rows = turns.to_pydict()
    assert rows["turn_index"] == [0, 0, 1] and rows["attempt"] == [1, 2, 1]
    assert rows["error"][0].startswith("TransportError") and rows["error"][1] is None
    assert rows["ready_s"][0] == rows["ready_s"][1] == 0.0  # both attempts: the turn the agent wanted at 0
    assert rows["submitted_s"][:2] == [0.0, 100.5]  # when each attempt went out
    lat = turn_latencies(turns)
    assert list(lat.turn_index) == [0, 1]
    assert lat.ttft_s[0] == 101.0 and lat.turn_s[0] == 101.5
    assert lat.ttft_s[1] == 0.5 and lat.turn_s[1] == 1.0
    # the retried turn misses a 10 s turn SLO; the other meets it
    assert list(turns_meeting(lat, SLOSpec(turn_s=10.0))) == [False, True]


def test_rows_written_before_attempts_were_recorded_count_from_the_first_attempt():
    """Older results reset ready_s and admit_s at every retry: the turn's earliest row says
    when the agent wanted it."""
    turns = run_one_session(num_failures=1)
    old = turns.drop_columns(["attempt", "submitted_s"])
    ready = old.column("ready_s").to_numpy().copy()
    ready[1] = 100.5
    old = old.set_column(old.column_names.index("ready_s"), "ready_s", pa.array(ready))
    old = old.set_column(old.column_names.index("admit_s"), "admit_s", pa.array(ready))
    lat = turn_latencies(old)
    assert lat.turn_s[0] == 101.5 and lat.gateway_wait_s[0] == 0.0


def test_retries_per_turn_and_failures_by_cause_are_counted():
    from loadgen.analysis.attempts import attempt_outcome

    outcome = attempt_outcome(run_one_session(num_failures=2))
    assert outcome == {"turn_attempts": 4, "turns_retried": 1, "retries_per_turn_mean": 2 / 2,
                       "retries_per_turn_max": 2, "turns_failed": 0, "turns_truncated": 0,
                       "failed_attempts_by_cause": {"timeout": 2}, "failed_turns_by_cause": {}}
    failed = attempt_outcome(run_one_session(num_failures=3))  # every attempt of turn 0 failed
    assert failed["turns_failed"] == 1 and failed["failed_turns_by_cause"] == {"timeout": 1}
    assert failed["turn_attempts"] == 3 and failed["turns_retried"] == 1


def test_the_latency_table_says_how_many_turns_were_retried_failed_and_truncated():
    from loadgen.analysis.latency import format_turn_outcomes

    rows = [{"arm": "base", "turns_retried": 3, "turns_failed": 1, "turns_truncated": 0,
             "failed_turns_by_cause": {"timeout": 1}},
            {"arm": "calm", "turns_retried": 0, "turns_failed": 0, "turns_truncated": 0, "failed_turns_by_cause": {}}]
    lines = format_turn_outcomes(rows)
    assert lines[1:] == ["  base: 3 turns retried, 1 failed (timeout 1), 0 truncated (fewer output tokens than asked)"]
    assert format_turn_outcomes(rows[1:]) == []


def test_an_http_status_decides_a_failures_cause_whatever_its_body_says():
    from loadgen.analysis.attempts import failure_cause

    assert failure_cause("HttpStatusError: HTTP 400: ValueError: prompt too long") == "http_4xx"
    assert failure_cause("HttpStatusError: HTTP 500: timeout after 5 s upstream") == "http_5xx"
    assert failure_cause("HttpStatusError: HTTP 503: ServerDisconnectedError") == "http_5xx"
    # without a status, the text decides
    assert failure_cause("TransportError: timeout after 5 s") == "timeout"
    assert failure_cause("ClientResponseError: malformed response (ValueError: no usage)") == "malformed"
    assert failure_cause("ServerDisconnectedError: Server disconnected") == "disconnected"
