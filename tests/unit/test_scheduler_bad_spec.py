"""What the coordinator holds for a topology and cannot be read or placed - its spec, its
status, its assignment, a result, a rebalance request, the balancer's inputs - stops
nothing else: the scheduler places the other topologies, the reason reaches the log (and,
for a spec, the topology's results, where the submitter reads it), and readers go on."""
import json
import time

import pytest

from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.runtime.control.scheduler import SchedulerService
from streamnet.runtime.topology import TopologyBuilder


@pytest.fixture
def state():
    server = InProcessServer()
    st = ClusterState(server.session(), "t")
    st.register_worker("w0", {"host": "127.0.0.1", "port": 1, "threads": 2, "cores": 2, "pid": 1,
                              "started": time.time()})
    yield st
    server.shutdown()


def spec(name: str, **config) -> dict:
    b = TopologyBuilder(name)
    b.add_spout("s", "streamnet.examples.wordcount:SentenceSpout")
    d = b.build().to_dict()
    return dict(d, name=name, config=dict(d["config"], **config))


def test_a_spec_that_does_not_parse_leaves_the_others_scheduled(state, caplog):
    state.submit_topology("a-bad", spec("a-bad", balance="bogus"))    # sorted first: its pass comes first
    state.submit_topology("b-good", spec("b-good"))
    s = SchedulerService(state, "w0", auth=None, period_s=3600)
    s.reconcile()
    s.reconcile()
    assert state.assignment("b-good")[0] is not None
    assert state.assignment("a-bad")[0] is None
    failures = state.failures("a-bad")
    assert list(failures) == ["refused.scheduler"] and "bogus" in failures["refused.scheduler"]
    assert caplog.text.count("topology a-bad cannot be scheduled") == 1    # once per reason, not per pass
    assert state.failures("b-good") == {}


def test_a_status_node_that_is_not_text_leaves_the_others_scheduled(state):
    state.submit_topology("a-bad", spec("a-bad"))
    state.coord.put(state.path("topologies", "a-bad", "status"), b"\xff\xfe")    # written by hand, say
    state.submit_topology("b-good", spec("b-good"))
    SchedulerService(state, "w0", auth=None, period_s=3600).reconcile()
    assert state.assignment("b-good")[0] is not None
    assert state.assignment("a-bad")[0] is None          # a status no one knows: not running


def test_a_balancer_that_fails_leaves_the_topology_placed_and_its_run_going(state, monkeypatch, caplog):
    from streamnet.runtime.control import scheduler

    def decide(*args):
        raise TypeError("foreign_busy 'x' is not a number")     # a worker's load record it cannot read
    monkeypatch.setattr(scheduler, "decide", decide)
    state.submit_topology("b-good", spec("b-good", balance="load"))
    s = SchedulerService(state, "w0", auth=None, period_s=3600)
    s.reconcile()
    s.reconcile()
    assert state.assignment("b-good")[0] is not None
    assert state.failures("b-good") == {}                   # not refused: the run goes on unbalanced
    assert caplog.text.count("the load balancer failed") == 1


def test_a_result_node_that_does_not_decode_is_named_and_the_topology_can_be_killed(state, caplog):
    from streamnet.runtime.control.client import kill_topology
    state.submit_topology("t", spec("t"))
    state.publish_result("t", "failed.3", "bolt 'x' (task 3): prepare() raised")
    state.coord.put(state.path("topologies", "t", "results", "failed.4"), b"\x00garbage")
    assert state.failures("t")["failed.4"].startswith("<undecodable result failed.4: ")
    results = kill_topology(state, "t", timeout=5)             # raised CodecError, and t stayed behind
    assert results["failed.3"] == "bolt 'x' (task 3): prepare() raised"
    assert "t" not in state.topology_names()
    assert "its result failed.4 cannot be decoded" in caplog.text


def test_a_rebalance_request_that_would_make_a_spec_that_cannot_run_is_dropped_and_the_run_goes_on(state, caplog):
    from streamnet.runtime.topology import MAX_TASKS
    state.submit_topology("t", spec("t"))
    s = SchedulerService(state, "w0", auth=None, period_s=3600)
    s.reconcile()
    before = state.assignment("t")[0]
    state.request_rebalance("t", {"parallelism": {"s": MAX_TASKS + 1}, "threads": {}})
    s.reconcile()
    assert state.rebalance_request("t") is None and state.failures("t") == {}
    assert state.assignment("t")[0] == before and state.topology("t")["components"][0]["parallelism"] == 1
    assert "rebalance request" in caplog.text and "refused" in caplog.text


@pytest.mark.parametrize("garbage", [b"{not json", b'{"tasks": []}'])
def test_an_assignment_node_that_cannot_be_read_is_placed_afresh_over(state, garbage):
    state.submit_topology("t", spec("t"))
    state.coord.put(state.path("assignments", "t"), garbage)
    assert state.assignment("t")[0] is None                 # counts as none (JSONDecodeError, AssignmentError)
    SchedulerService(state, "w0", auth=None, period_s=3600).reconcile()
    placed, _ = state.assignment("t")
    assert placed is not None and set(placed.tasks.values()) == {"w0"} and state.failures("t") == {}


def test_done_markers_and_balance_log_entries_of_another_shape_are_left_out(state):
    state.submit_topology("t", spec("t"))
    for kid in ("3", "x", "-1"):
        state.coord.put(state.path("topologies", "t", "done", kid), b"")
    assert state.done_tasks("t") == {3}                        # raised ValueError on "x"
    good = {"time": 1.5, "decision": "shares 1.1:0.9"}
    state.coord.put(state.path("topologies", "t", "balance"),
                    json.dumps([{"decision": "no time"}, "text", good]).encode())
    assert state.balance_log("t") == [good]                    # `status` raised KeyError 'time'
    state.coord.put(state.path("topologies", "t", "balance"), b"{not json")
    assert state.balance_log("t") == []


@pytest.mark.parametrize("request_", [{"parallelism": {"s": "three"}}, {"parallelism": 5}, ["s", 3]])
def test_a_rebalance_request_of_the_wrong_shape_is_dropped_and_the_run_goes_on(state, request_, caplog):
    """A ValueError, TypeError or AttributeError in the plan refused the topology on every
    pass, the request never cleared."""
    state.submit_topology("t", spec("t"))
    s = SchedulerService(state, "w0", auth=None, period_s=3600)
    s.reconcile()
    before = state.assignment("t")[0]
    state.coord.put(state.path("topologies", "t", "rebalance"), json.dumps(request_).encode())
    s.reconcile()
    s.reconcile()
    assert state.rebalance_request("t") is None and state.failures("t") == {}
    assert state.assignment("t")[0] == before
    assert "rebalance request" in caplog.text and "refused" in caplog.text


def test_a_rebalance_request_written_while_the_leader_plans_is_not_lost(state):
    """The leader cleared the request by name: one written after its read went with it."""
    state.submit_topology("t", spec("t"))
    state.request_rebalance("t", {"threads": {"w0": 3}})
    request, version = state.rebalance_request_version("t")
    state.request_rebalance("t", {"threads": {"w0": 4}})          # a newer one, mid-pass
    state.clear_rebalance("t", version)
    assert state.rebalance_request("t") == {"threads": {"w0": 4}}
    state.clear_rebalance("t", state.rebalance_request_version("t")[1])
    assert state.rebalance_request("t") is None


def test_a_clients_rebalance_while_another_is_pending_is_refused_not_written_over_it(state):
    """Two `rebalance` commands close together both said "requested"; the second wrote over
    the first, which was never carried out nor logged."""
    from streamnet.runtime.control.cluster_state import RebalancePendingError
    state.submit_topology("t", spec("t"))
    state.add_rebalance_request("t", {"parallelism": {"s": 2}, "threads": {}})
    with pytest.raises(RebalancePendingError, match=r"a rebalance of t is still pending \(\{'parallelism'"):
        state.add_rebalance_request("t", {"parallelism": {"s": 3}, "threads": {}})
    assert state.rebalance_request("t") == {"parallelism": {"s": 2}, "threads": {}}
    state.clear_rebalance("t", state.rebalance_request_version("t")[1])      # carried out
    state.add_rebalance_request("t", {"parallelism": {"s": 3}, "threads": {}})
    assert state.rebalance_request("t") == {"parallelism": {"s": 3}, "threads": {}}


@pytest.mark.parametrize("info,problem", [
    ({"host": "127.0.0.1", "threads": 2}, "port None"),
    ({"host": "127.0.0.1", "port": 7, "threads": "auto"}, "threads 'auto'"),
    ({"port": 7}, "no host"),
])
def test_a_worker_record_placement_cannot_use_is_left_out_and_the_others_scheduled(state, info, problem, caplog):
    """A KeyError in the placement refused every topology on every pass."""
    state.coord.create(state.path("workers", "w9"), json.dumps(info).encode(), ephemeral=True)
    assert set(state.workers()) == {"w0"}
    assert f"the node of worker w9 is not a worker's registration ({problem})" in caplog.text
    state.submit_topology("t", spec("t"))
    SchedulerService(state, "w0", auth=None, period_s=3600).reconcile()
    assert state.assignment("t")[0] is not None and state.failures("t") == {}


def test_a_topology_node_the_leader_may_not_read_stops_only_that_topology(state, monkeypatch):
    """A submitter may set a node's ACL: the UnauthorisedError of its status read aborted
    the whole pass, every pass, and no topology after it was placed or moved."""
    from streamnet.runtime.control.coordinator import CoordinatorError
    state.submit_topology("a-locked", spec("a-locked"))
    state.submit_topology("b-good", spec("b-good"))
    status = state.status

    def locked(name):
        if name == "a-locked":
            raise CoordinatorError("ZooKeeper refused access to /t/topologies/a-locked/status")
        return status(name)
    monkeypatch.setattr(state, "status", locked)
    SchedulerService(state, "w0", auth=None, period_s=3600).reconcile()
    assert state.assignment("b-good")[0] is not None
    assert "refused access" in state.failures("a-locked")["refused.scheduler"]


def test_a_refusal_is_withdrawn_once_the_topology_is_placed(state):
    """The refusal stayed in the results after the cause was mended: a submitter waiting
    then failed on it."""
    state.submit_topology("t", spec("t", balance="bogus"))
    s = SchedulerService(state, "w0", auth=None, period_s=3600)
    s.reconcile()
    assert "refused.scheduler" in state.failures("t")
    state.update_topology("t", spec("t"))        # mended (a rebalance, or by hand)
    s.reconcile()
    assert state.assignment("t")[0] is not None and state.failures("t") == {}


@pytest.mark.parametrize("version", ["1", None, -1, 1.5])
def test_a_spec_whose_version_is_not_a_whole_number_is_refused(state, version):
    """"1" was a TypeError on every worker; null an assignment rewritten on every pass."""
    state.submit_topology("t", dict(spec("t"), version=version))
    SchedulerService(state, "w0", auth=None, period_s=3600).reconcile()
    assert state.assignment("t")[0] is None
    assert f"version must be a whole number >= 0; got {version!r}" in state.failures("t")["refused.scheduler"]


def test_a_rebalance_of_a_fixed_parallelism_is_dropped_by_the_leader(state, caplog):
    """A training run's units and sync slices follow its configuration: the data spout cut
    cfg.units shares for however many compute tasks a rebalance made. Threads may change."""
    state.submit_topology("t", spec("t", fixed_parallelism=True))
    s = SchedulerService(state, "w0", auth=None, period_s=3600)
    s.reconcile()
    before = state.assignment("t")[0]
    state.request_rebalance("t", {"parallelism": {"s": 2}, "threads": {}})
    s.reconcile()
    assert state.rebalance_request("t") is None and state.assignment("t")[0] == before
    assert state.topology("t")["components"][0]["parallelism"] == 1
    assert "fixes its components' parallelism" in caplog.text


def test_training_topologies_fix_their_parallelism():
    from streamnet.training.config import DataConfig, lenet5_mixbp
    from streamnet.training.nsmap import build_topology
    assert build_topology(lenet5_mixbp(units=2, data=DataConfig(dataset="synthetic"))).config["fixed_parallelism"]
    with pytest.raises(Exception, match="fixed_parallelism must be true or false"):
        from streamnet.runtime.topology import Topology
        Topology.from_dict(spec("t", fixed_parallelism="yes"))


def test_a_rebalance_of_a_fixed_parallelism_is_refused_by_the_client(state, monkeypatch, capsys):
    from streamnet.cli import cluster_commands, submit
    state.submit_topology("t", spec("t", fixed_parallelism=True))
    monkeypatch.setattr(cluster_commands, "connect", lambda a: (state.coord, state, None))
    monkeypatch.setattr(state.coord, "close", lambda: None)
    assert submit.main(["rebalance", "t", "--parallelism", "s=2", "--zk", "127.0.0.1:1"]) == 2
    assert "'t' fixes its components' parallelism" in capsys.readouterr().err
    assert state.rebalance_request("t") is None
    assert submit.main(["rebalance", "t", "--threads", "w0=2", "--zk", "127.0.0.1:1"]) == 0
    assert state.rebalance_request("t") == {"parallelism": {}, "threads": {"w0": 2}}


@pytest.mark.parametrize("ends", ["finished", "killed", "failed"])
def test_a_rebalance_of_a_topology_that_no_longer_runs_is_refused_by_the_client(state, monkeypatch, capsys, ends):
    """It was written to the coordinator, "requested", and never carried out."""
    from streamnet.cli import cluster_commands, submit
    state.submit_topology("t", spec("t"))
    monkeypatch.setattr(cluster_commands, "connect", lambda a: (state.coord, state, None))
    monkeypatch.setattr(state.coord, "close", lambda: None)
    if ends == "finished":
        state.mark_done("t", 0)                   # its one spout task
        says = "'t' has finished (its spouts are done): nothing of it runs to rebalance"
    else:
        state.set_status("t", ends)
        says = f"'t' is {ends}: nothing of it runs to rebalance"
    assert submit.main(["rebalance", "t", "--threads", "w0=2", "--zk", "127.0.0.1:1"]) == 2
    assert says in capsys.readouterr().err
    assert state.rebalance_request("t") is None


def test_a_second_kill_racing_the_first_says_so_and_leaves_no_topology_node_behind(state):
    # two `kill`s at once: the second had found the topology, then the first removed it;
    # marking it killed made its status node again (a spec-less topology that `list` and
    # `status` stumbled on), and its wait for the workers ran to the timeout
    from streamnet.runtime.control import client
    state.submit_topology("t", spec("t"))
    state.publish_result("t", "counts", {"a": 1})
    real_assignment = state.assignment
    first: list = []

    def the_first_kill_runs_meanwhile(name):
        answer = real_assignment(name)
        if not first:
            first.append(None)
            first[0] = client.kill_topology(state, name, timeout=5)
        return answer
    state.assignment = the_first_kill_runs_meanwhile
    t0 = time.monotonic()
    with pytest.raises(client.TopologyGone, match="another"):
        client.kill_topology(state, "t", timeout=5)
    assert time.monotonic() - t0 < 2                       # said at once, not after the wait's timeout
    assert first == [{"counts": {"a": 1}}]                 # the first kill has the results
    assert "t" not in state.topology_names()
    assert state.coord.exists(state.path("topologies", "t")) is None


def test_marking_a_removed_topology_stopping_or_failed_makes_nothing_again(state):
    from streamnet.runtime.control.cluster_state import UnknownTopologyError
    state.submit_topology("t", spec("t"))
    state.remove_topology("t")
    with pytest.raises(UnknownTopologyError):
        state.set_status("t", "stopping")
    assert state.coord.exists(state.path("topologies", "t")) is None
    # a stop asked, or a worker failing it, as a kill removes it: read "active" (and the
    # reason there) just before the kill, nothing to mark after it
    from streamnet.runtime.control.client import request_stop
    state.status = lambda name: "active"
    assert request_stop(state, "t") is False
    real_exists = state.coord.exists
    state.coord.exists = lambda path: 1 if path.endswith("results/failed.3") else real_exists(path)
    assert state.fail_topology("t", "failed.3") is False
    assert real_exists(state.path("topologies", "t")) is None
