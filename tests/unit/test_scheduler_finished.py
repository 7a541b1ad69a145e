"""A topology whose spouts are all done (a finished run not yet killed, or one stopped
by SIGTERM to all its workers) keeps its assignment when workers leave or new ones
come: its tasks are not started again elsewhere, where a sync task finding no replica
reported updates lost that were not."""
from streamnet.examples import wordcount
from streamnet.runtime.assignment import Assignment
from streamnet.runtime.control.client import spout_tasks
from streamnet.runtime.topology import Topology
from tests.unit.test_scheduler_rejoin import one_pass, stub_service

TOPO = wordcount.topology(split=2, counters=2)
CURRENT = Assignment(tasks={t: "w2" for t in range(TOPO.num_tasks)}, workers={"w2": "http://w2:1"},
                     threads={"w2": 1}, shares={})


def test_a_finished_topology_is_not_placed_again_when_its_worker_leaves(monkeypatch, caplog):
    caplog.set_level("INFO")
    spouts = spout_tasks(Topology.from_dict(TOPO.to_dict()))
    assert spouts
    done, planned = set(), []
    s = stub_service(monkeypatch, planned, CURRENT, TOPO.to_dict(), done_tasks=lambda name: set(done))
    one_pass(s, {"w1": {}})                     # w2 left while the spout still runs: its tasks move
    assert planned == [["w1"]]
    done |= spouts                           # every spout done: the tasks stay where they were
    planned.clear()
    one_pass(s, {"w1": {}})
    one_pass(s, {"w1": {}, "w2": {}})
    assert planned == []
    assert caplog.text.count("every spout is done") == 1
