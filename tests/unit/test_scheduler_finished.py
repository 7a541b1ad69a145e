"""A topology whose spouts are all done (a finished run not yet killed, or one stopped
by SIGTERM to all its workers) keeps its assignment when workers leave or new ones
come: its tasks are not started again elsewhere, where a sync task finding no replica
reported updates lost that were not."""
import types

from streamnet.examples import wordcount
from streamnet.runtime.assignment import Assignment
from streamnet.runtime.control import scheduler
from streamnet.runtime.control.client import spout_tasks
from streamnet.runtime.control.scheduler import SchedulerService
from streamnet.runtime.topology import Topology

TOPO = wordcount.topology(split=2, counters=2)
CURRENT = Assignment(tasks={t: "w0" for t in range(TOPO.num_tasks)}, workers={"w0": "http://w0:1"},
                     threads={"w0": 1}, shares={})


def _service(monkeypatch, done: set, planned: list):
    state = types.SimpleNamespace(coord=types.SimpleNamespace(session_timeout=4.0),
                                  assignment=lambda name: (CURRENT, 3), done_tasks=lambda name: set(done),
                                  topology=lambda name: TOPO.to_dict())
    state.applied_workers = state.rebalance_request = lambda *a: None
    s = SchedulerService(state, "w1", auth=None)

    def plan(spec, workers, *rest):
        planned.append(sorted(workers))
        raise StopIteration     # the pass went on to placement: enough for this test
    monkeypatch.setattr(scheduler, "plan", plan)
    return s


def _pass(s, workers) -> None:
    try:
        s._reconcile_topology("t", workers)
    except StopIteration:
        pass


def test_a_finished_topology_is_not_placed_again_when_its_worker_leaves(monkeypatch, caplog):
    caplog.set_level("INFO")
    spouts = spout_tasks(Topology.from_dict(TOPO.to_dict()))
    assert spouts
    done, planned = set(), []
    s = _service(monkeypatch, done, planned)
    _pass(s, {"w1": {}})                     # w0 left while the spout still runs: its tasks move
    assert planned == [["w1"]]
    done |= spouts                           # every spout done: the tasks stay where they were
    planned.clear()
    _pass(s, {"w1": {}})
    _pass(s, {"w1": {}, "w2": {}})
    assert planned == []
    assert caplog.text.count("every spout is done") == 1
