"""A component that raises in open()/prepare() fails its topology visibly: the client
gets the component's error at once (instead of waiting for ever), and the workers
stay up and run the next topology."""
import os

import pytest

from streamnet.examples import wordcount
from streamnet.runtime import LocalCluster
from streamnet.runtime.control import TopologyFailed, drain_topology, kill_topology, wait_done, wait_for
from streamnet.testing import running_cluster

pytestmark = pytest.mark.usefixtures("no_leaks")


def _raise(what):
    def method(self, ctx, collector):
        raise ValueError(f"{what} cannot start here")
    return method


@pytest.mark.parametrize("cls,method", [(wordcount.CountBolt, "prepare"), (wordcount.SentenceSpout, "open")])
def test_a_component_that_cannot_start_fails_its_topology_and_the_workers_go_on(cls, method, monkeypatch):
    with LocalCluster(workers=2) as c:
        with monkeypatch.context() as m:
            m.setattr(cls, method, _raise(cls.__name__))
            with pytest.raises(TopologyFailed) as e:
                c.run(wordcount.topology(count=200), timeout=60)   # before: waited the 60 s, then ClusterTimeout
        kind = "bolt 'count'" if method == "prepare" else "spout 'sentences'"
        assert f"topology 'wordcount' failed: {kind} (task " in str(e.value)
        assert f"{method}() raised ValueError: {cls.__name__} cannot start here" in str(e.value)
        assert "wordcount" not in c.state.topology_names()           # run() killed it
        results = c.run(wordcount.topology(count=300), timeout=60)   # the same workers, the next topology
        assert wordcount.merge_counts(results) == wordcount.expected_counts(300, 0)


def test_submit_wait_exits_1_with_the_workers_error_when_a_worker_lacks_the_dataset(zk, tmp_path, monkeypatch):
    """The workers look for the dataset in $STREAMNET_DATA, an empty directory on their
    host; the submitting host has it. `submit --wait` exits 1 naming the missing file."""
    monkeypatch.setenv("STREAMNET_DATA", str(tmp_path))      # inherited by the worker processes only
    with running_cluster(zk, workers=2) as (c, state):
        monkeypatch.delenv("STREAMNET_DATA")
        r = c.submit_cli("submit", "lenet5-mixbp", "--workers", "2", "--epochs", "1", "--train-limit", "256",
                         "--test-limit", "64", "--wait", "--timeout", "120", timeout=150)
        assert r.returncode == 1, r.stderr
        err = r.stderr.strip().splitlines()[-1]
        assert err.startswith("streamnet-submit: error: topology 'lenet5-mixbp' failed: ") and "raised" in err, r.stderr
        assert str(tmp_path) in err and "train-images-idx3-ubyte" in err, r.stderr
        assert "Traceback" not in r.stderr
        assert state.topology_names() == []                           # killed, not left running
        assert all(p.poll() is None for p in c.procs.values())       # the workers stay up
        assert os.listdir(tmp_path) == []                          # nothing made in the data directory


def test_a_clean_stop_of_a_topology_that_cannot_start_kills_it(monkeypatch):
    """kill --checkpoint (drain_topology) cannot wait for a task that never started."""
    with LocalCluster(workers=2) as c:
        monkeypatch.setattr(wordcount.CountBolt, "prepare", _raise("CountBolt"))
        c.submit(wordcount.topology(count=200))
        wait_for(lambda: c.state.failures("wordcount"), 60, "the count bolt's failure to be published")
        results = drain_topology(c.state, "wordcount", 60)
        assert any(k.startswith("failed.") for k in results)
        assert "wordcount" not in c.state.topology_names()


def test_a_component_whose_constructor_raises_fails_its_topology_and_the_workers_go_on(monkeypatch):
    def refuse(self, **config):
        raise TypeError("CountBolt takes no such setting")
    with LocalCluster(workers=2) as c:
        with monkeypatch.context() as m:
            m.setattr(wordcount.CountBolt, "__init__", refuse)
            with pytest.raises(TopologyFailed) as e:
                c.run(wordcount.topology(count=200), timeout=60)
        assert "bolt 'count' (task " in str(e.value)
        assert "its constructor raised TypeError: CountBolt takes no such setting" in str(e.value)
        results = c.run(wordcount.topology(count=300), timeout=60)   # the same workers, the next topology
        assert wordcount.merge_counts(results) == wordcount.expected_counts(300, 0)


def test_a_task_whose_saved_state_cannot_be_read_fails_its_topology_and_the_workers_go_on(monkeypatch):
    from streamnet.runtime import codec
    from streamnet.runtime.control.cluster_state import ClusterState
    real = ClusterState.load_state

    def load_state(self, name, key):
        if name == "wordcount" and key == "count.0":
            raise codec.CodecError("malformed frame header: ExtraData")      # a node written by something else
        return real(self, name, key)
    with LocalCluster(workers=2) as c:
        with monkeypatch.context() as m:
            m.setattr(ClusterState, "load_state", load_state)
            with pytest.raises(TopologyFailed) as e:
                c.run(wordcount.topology(count=200), timeout=60)     # before: waited the 60 s, then ClusterTimeout
        assert "bolt 'count' (task " in str(e.value)
        assert "its saved state (count.0) cannot be read: malformed frame header" in str(e.value)
        results = c.run(wordcount.topology(count=300), timeout=60)
        assert wordcount.merge_counts(results) == wordcount.expected_counts(300, 0)


def test_a_topology_that_cannot_start_is_marked_failed_and_stops_with_no_client_waiting(monkeypatch):
    """Submitted without a client waiting on it (`submit` without --wait), such a topology
    stayed "active": the work sent to the task that never started was failed and replayed
    at once, for ever (20,000 replays a second and as many log lines). Now the worker
    marks it failed, every worker stops its tasks, and a client that looks later gets the
    reason."""
    with LocalCluster(workers=2) as c:
        monkeypatch.setattr(wordcount.CountBolt, "prepare", _raise("CountBolt"))
        c.submit(wordcount.topology(count=wordcount.MAX_COUNT))
        wait_for(lambda: c.state.status("wordcount") == "failed", 60, "the topology to be marked failed")
        assert c.state.failures("wordcount")            # written before the status
        wait_for(lambda: not any("wordcount" in w.runtimes for w in c.workers), 60,
                 "every worker to stop the topology's tasks")
        with pytest.raises(TopologyFailed) as e:
            wait_done(c.state, "wordcount", 10)
        assert "prepare() raised ValueError: CountBolt cannot start here" in str(e.value)
        results = kill_topology(c.state, "wordcount", 60)
        assert any(k.startswith("failed.") for k in results)
        assert "wordcount" not in c.state.topology_names()
