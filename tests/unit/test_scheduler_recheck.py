"""A balancing change held only by its minimum interval is decided again when the
interval ends - not at the leader's next periodic pass or the next load record a
worker publishes (a co-tenant that left was followed up to a second late)."""
import time
import types

from streamnet.runtime.assignment import Assignment
from streamnet.runtime.control import scheduler
from streamnet.runtime.control.balance import Decision
from streamnet.runtime.control.scheduler import SchedulerService
from streamnet.runtime.control.client import wait_for

CURRENT = Assignment(tasks={0: "w0", 1: "w1"}, workers={"w0": "http://w0:1", "w1": "http://w1:1"},
                     threads={"w0": 1, "w1": 1}, shares={})


def test_a_change_held_by_its_interval_is_decided_again_when_it_ends(monkeypatch):
    calls = []

    def decide(name, topology, base, workers, memory, now):
        calls.append(time.monotonic())
        return Decision(recheck_at=now + 0.3) if len(calls) == 1 else Decision()
    monkeypatch.setattr(scheduler, "decide", decide)
    s = SchedulerService(types.SimpleNamespace(), "w0", auth=None, period_s=3600)   # no periodic pass
    s.election = types.SimpleNamespace(is_leader=True, join=lambda: None, leave=lambda: None)
    s.reconcile = lambda: s._balance("t", None, CURRENT, {})
    s._wake.set()
    s._thread.start()
    try:
        wait_for(lambda: len(calls) >= 2, 10, "the policy to be asked again")
        assert calls[1] - calls[0] >= 0.25       # when the interval ended, not at once
    finally:
        s._stop.set()
        s._wake.set()
        s._thread.join(10)
