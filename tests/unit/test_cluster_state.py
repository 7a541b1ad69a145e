"""ClusterState over a coordinator whose connection drops with a write in flight; what it
lists as workers."""
import pytest

from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.coordinator import BadVersionError, ConnectionLostError, NodeExistsError
from streamnet.runtime.control.inprocess import InProcessServer


class DroppingCoordinator:
    """Forwards to a session; the next write raises ConnectionLostError, after being
    applied (`applied=True`: the reply was lost) or not (the request was lost)."""

    def __init__(self, session):
        self._c, self.drop = session, None

    def __getattr__(self, name):
        fn = getattr(self._c, name)
        if name not in ("create", "set", "put"):
            return fn

        def write(*args, **kwargs):
            drop, self.drop = self.drop, None
            if drop is None:
                return fn(*args, **kwargs)
            if drop == "applied":
                fn(*args, **kwargs)
            raise ConnectionLostError("lost the ZooKeeper connection: ConnectionLoss")
        return write


@pytest.fixture
def states():
    server = InProcessServer()
    flaky = DroppingCoordinator(server.session())
    yield ClusterState(flaky, "c"), ClusterState(server.session(), "c"), flaky
    server.shutdown()


@pytest.mark.parametrize("drop", ["applied", "lost"])
def test_a_state_write_cut_off_by_a_lost_connection_is_settled(states, drop):
    mine, _, flaky = states
    flaky.drop = drop
    assert mine.save_state("t", "sync.0", {"step": 1}, -1) == 0            # create
    flaky.drop = drop
    assert mine.save_state("t", "sync.0", {"step": 2}, 0) == 1             # compare-and-set
    assert mine.load_state("t", "sync.0") == ({"step": 2}, 1)
    assert mine.save_state("t", "sync.0", {"step": 3}, 1) == 2             # and the next one still fits


def test_a_write_by_another_instance_still_fences_after_a_lost_connection(states):
    mine, other, flaky = states
    mine.save_state("t", "sync.0", {"step": 1}, -1)
    other.save_state("t", "sync.0", {"step": 9}, 0)                         # the task moved; the new owner wrote
    flaky.drop = "lost"
    with pytest.raises(BadVersionError):
        mine.save_state("t", "sync.0", {"step": 2}, 0)
    other.save_state("t", "sync.1", {"step": 9}, -1)
    flaky.drop = "lost"
    with pytest.raises(NodeExistsError):
        mine.save_state("t", "sync.1", {"step": 1}, -1)
    assert other.load_state("t", "sync.0") == ({"step": 9}, 1)


@pytest.mark.parametrize("drop", ["applied", "lost"])
def test_done_marks_and_results_survive_a_lost_connection(states, drop):
    mine, other, flaky = states
    other.submit_topology("t", {"components": []})
    flaky.drop = drop
    mine.mark_done("t", 3)
    flaky.drop = drop
    mine.publish_result("t", "sync.0.stats", {"steps": 7})
    assert other.done_tasks("t") == {3}
    assert other.results("t") == {"sync.0.stats": {"steps": 7}}


def test_a_node_under_workers_that_holds_no_info_is_no_worker(states):
    """A worker once named 'rack1/w1' made its parent 'rack1' a permanent node with no
    data: listed as a worker whose info was None, it broke every placement."""
    _, state, _ = states
    state.register_worker("w0", {"host": "127.0.0.1", "port": 1})
    state.coord.create(state.path("workers", "rack1", "w1"), b"{}", ephemeral=True)
    state.coord.create(state.path("workers", "garbled"), b"not json")
    assert state.workers() == {"w0": {"host": "127.0.0.1", "port": 1}}



def test_a_name_submitted_again_starts_clean_of_what_a_racing_kill_left(states):
    """A leader pass that read the spec before a kill wrote the assignment after it (the same
    name submitted again then looked placed, and no worker started it); a late result made
    the topology's node again, without a spec (the name then read as already submitted)."""
    from streamnet.runtime.control.cluster_state import TopologyExistsError
    _, state, _ = states
    state.coord.create(state.path("assignments", "t"), b'{"tasks": {}}')       # the orphan
    state.publish_result("u", "refused.scheduler", "late")                     # makes topologies/u again
    for name in ("t", "u"):
        state.submit_topology(name, {"name": name})
        assert state.topology(name) == {"name": name} and state.status(name) == "active"
    assert state.assignment("t")[0] is None and state.results("u") == {}
    with pytest.raises(TopologyExistsError, match="'t' is already submitted"):
        state.submit_topology("t", {"name": "t"})
    assert state.topology("t") == {"name": "t"}
