"""The actuator's queue semantics, with tiny test policies (the real limits are in controllers/)."""

from controllers import NoLimit, Policy
from loadgen.core.clock import VirtualClock
from loadgen.core.gateway import Gateway


class Cap(Policy):
    name = "test-cap"

    def __init__(self, k: int, park_above: int = 10**9) -> None:
        self.k = k
        self.park_above = park_above

    def admit(self, view, demand_tokens, is_new):
        return view.num_active < self.k

    def park(self, view, demand_tokens):
        return view.num_active > self.park_above


def test_none_lets_everything_through_without_futures():
    gw = Gateway(VirtualClock(), NoLimit(), pool_tokens=1000)
    assert gw.arrive("a", 10) is None
    assert gw.before_turn("a", 20) is None
    assert gw.demand_tokens == 20
    gw.session_ended("a")
    assert gw.demand_tokens == 0 and not gw.active


def test_new_sessions_wait_in_fifo_and_are_admitted_when_a_session_ends():
    clock = VirtualClock()
    gw = Gateway(clock, Cap(1), pool_tokens=1000)
    assert gw.arrive("a", 10) is None
    f_b = gw.arrive("b", 10)
    f_c = gw.arrive("c", 10)
    assert f_b is not None and f_c is not None
    gw.turn_completed("a", 1.0)
    assert not f_b.done()
    gw.session_ended("a")
    assert f_b.done() and not f_c.done()
    assert list(gw.active) == ["b"]


def test_parked_sessions_are_readmitted_before_new_ones():
    clock = VirtualClock()
    gw = Gateway(clock, Cap(2, park_above=1), pool_tokens=1000)  # cap lowered to 1 below
    gw.arrive("a", 10)
    gw.arrive("b", 10)
    f_new = gw.arrive("c", 10)
    parked = gw.before_turn("b", 30)  # 2 active > 1: b parks at its turn boundary
    assert parked is not None and list(gw.parked)[0][0] == "b"
    assert gw.demand_tokens == 10
    gw.policy.k = 1
    gw.session_ended("a")  # frees room for one: the parked session goes first
    assert parked.done() and not f_new.done()
    assert gw.active == {"b": 30}


def test_control_starts_at_its_time():
    clock = VirtualClock()
    gw = Gateway(clock, Cap(0), pool_tokens=1000, control_start_s=100.0)
    assert gw.arrive("a", 10) is None  # before control: as 'none'
    clock.call_at(150.0, lambda: None)
    clock.run()
    assert gw.arrive("b", 10) is not None


def test_control_switches_on_by_a_timer_at_its_start_time():
    starts = []

    class Watch(Policy):
        name = "test-watch"

        def on_control_start(self, view):
            starts.append(view.now_s)

    clock = VirtualClock()
    gw = Gateway(clock, Watch(), pool_tokens=1000, control_start_s=100.0)
    assert not gw.control_on and gw.limit() != gw.limit()  # NaN: no limit before control
    clock.call_at(250.0, lambda: None)
    clock.run()
    assert starts == [100.0] and gw.control_on  # at its time, though no session event happened then


def test_an_empty_gate_admits_whatever_the_limit_says():
    gw = Gateway(VirtualClock(), Cap(0), pool_tokens=1000)
    assert gw.arrive("a", 10) is None  # nobody admitted: the liveness rule lets the head in
    assert gw.arrive("b", 10) is not None
