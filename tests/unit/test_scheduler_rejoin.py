"""A leader whose own ZooKeeper session expired (a ZooKeeper outage expires everyone's)
leaves the tasks of workers not registered again where they are for one session
timeout, instead of moving them all at once with every replica of the parameters."""
import types

from streamnet.runtime.assignment import Assignment
from streamnet.runtime.control import scheduler
from streamnet.runtime.control.scheduler import SchedulerService

CURRENT = Assignment(tasks={0: "w0", 1: "w0", 2: "w1"}, workers={"w0": "http://w0:1", "w1": "http://w1:1"},
                     threads={"w0": 1, "w1": 1}, shares={})


def stub_service(monkeypatch, planned: list, current: Assignment = CURRENT, spec: dict | None = None, **state):
    """A SchedulerService ("w0") over a stub cluster state: topology "t" assigned as
    `current` (version 3), with `spec` (None: none, and not parsed) and whatever other
    state calls a test gives. A pass that goes on to placement records the workers it
    would place on in `planned` and stops there (one_pass)."""
    stub = types.SimpleNamespace(coord=types.SimpleNamespace(session_timeout=4.0),
                                 assignment=lambda name: (current, 3), topology=lambda name: spec or {},
                                 applied_workers=lambda *a: None, rebalance_request_version=lambda *a: (None, -1), **state)
    s = SchedulerService(stub, "w0", auth=None)
    s.election = types.SimpleNamespace(node="n-1", join=lambda: None, stand=lambda: None)

    def plan(spec, workers, *rest):
        planned.append(sorted(workers))
        raise StopIteration     # the pass went on to placement: enough for these tests
    monkeypatch.setattr(scheduler, "plan", plan)
    if spec is None:
        s._parse = lambda name, spec: None
    return s


def one_pass(s, workers) -> None:
    try:
        s._reconcile_topology("t", workers)
    except StopIteration:
        pass


def test_after_its_session_expired_the_leader_waits_a_session_timeout_for_the_others(monkeypatch, caplog):
    caplog.set_level("INFO")
    planned = []
    s = stub_service(monkeypatch, planned)
    one_pass(s, {"w0": {}})                    # no expiry of ours: w1 left, its tasks move now
    assert planned == [["w0"]]
    s.rejoin()                              # our session expired and we registered again
    one_pass(s, {"w0": {}})
    one_pass(s, {"w0": {}})
    assert planned == [["w0"]]              # w1 may be registering again: its tasks stay
    assert caplog.text.count("not registered again yet") == 1
    one_pass(s, {"w0": {}, "w1": {}})          # it is back: placement goes on as usual
    assert planned == [["w0"], ["w0", "w1"]]
    s._grace_until -= 4.0                   # one session timeout later it would move them
    one_pass(s, {"w0": {}})
    assert planned == [["w0"], ["w0", "w1"], ["w0"]]
