"""A balancing change held only by its minimum interval is decided again when the
interval ends - not at the leader's next periodic pass or the next load record a
worker publishes (a co-tenant that left was followed up to a second late)."""
import threading
import types

import pytest

from streamnet.runtime.assignment import Assignment
from streamnet.runtime.control import scheduler
from streamnet.runtime.control.balance import Decision
from streamnet.runtime.control.scheduler import SchedulerService
from streamnet.runtime.control.client import wait_for

CURRENT = Assignment(tasks={0: "w0", 1: "w1"}, workers={"w0": "http://w0:1", "w1": "http://w1:1"},
                     threads={"w0": 1, "w1": 1}, shares={})


class Clock:
    """The scheduler's clocks, moved by the test alone: monotonic() and a wall clock
    (time(), the balancer's `now`) of another origin."""

    def __init__(self):
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t + 1.7e9


def test_a_change_held_by_its_interval_is_decided_again_when_it_ends(monkeypatch):
    clock, calls, waits = Clock(), [], []
    monkeypatch.setattr(scheduler, "time", clock)

    class Wake(threading.Event):
        """The loop's wait for work: each timeout it waits is recorded and passes at once
        on the clock (nothing sets it meanwhile); once the policy was asked again, it
        waits for the test to stop the loop."""

        def wait(self, timeout=None):
            if super().wait(0):
                return True
            if len(calls) >= 2:
                return super().wait()
            waits.append(timeout)
            clock.t += timeout
            return False

    def decide(name, topology, base, workers, memory, now):
        calls.append(now)
        return Decision(recheck_at=now + 0.3) if len(calls) == 1 else Decision()
    monkeypatch.setattr(scheduler, "decide", decide)
    s = SchedulerService(types.SimpleNamespace(), "w0", auth=None, period_s=3600)   # no periodic pass
    s.election = types.SimpleNamespace(is_leader=True, join=lambda: None, leave=lambda: None)
    s.reconcile = lambda: s._balance("t", None, CURRENT, {})
    s._wake = Wake()
    s._wake.set()
    s._thread.start()
    try:
        wait_for(lambda: len(calls) >= 2, 10, "the policy to be asked again")
        # the loop slept until the interval ended (0.3 s on its clock): not a period, nor not at all
        assert waits == [pytest.approx(0.3, abs=1e-6)]
        assert calls[1] - calls[0] == pytest.approx(0.3, abs=1e-6)
    finally:
        s._stop.set()
        s._wake.set()
        s._thread.join(10)
    assert not s._thread.is_alive()
