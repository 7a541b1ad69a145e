"""The engine as a real cluster: streamnet-worker processes on a real ZooKeeper."""
import os
import threading
import time

import pytest

from streamnet.examples import wordcount
from streamnet.runtime import wait_for
from streamnet.runtime.control import is_done
from streamnet.runtime.control.zk import ZkCoordinator

from streamnet.testing import (ZooKeeper, cluster_in_mode, finish, placement, running_cluster,
                               zookeeper_installed)

pytestmark = pytest.mark.skipif(not zookeeper_installed(),
                                reason="needs Debian's zookeeper package (make test installs it)")


@pytest.fixture
def cluster(zk):
    with running_cluster(zk, workers=3) as (c, state):
        yield c, state


def test_workers_register_and_status_lists_them(cluster):
    c, state = cluster
    r = c.submit_cli("status")
    assert r.returncode == 0, r.stderr
    for w in ("w0", "w1", "w2"):
        assert w in r.stdout
    assert r.stdout.count(" leader") == 1


def test_examples_complete_with_exact_results(cluster, tmp_path):
    c, _ = cluster
    for example, opts in (("wordcount", ["--set", "count=4000"]), ("tensor_pipe", ["--set", "count=6"])):
        summary = tmp_path / f"{example}.json"
        r = c.submit_cli("submit", example, *opts, "--wait", "--timeout", "120", "--summary", str(summary))
        assert r.returncode == 0 and ": OK:" in r.stdout, (r.stdout, r.stderr)
        assert '"ok": true' in summary.read_text()


def _slow_wordcount(count=4000):
    # slow enough (a 1 ms count step) that the run is still going when a worker dies
    return wordcount.topology(count=count, split=2, counters=3, delay_s=0.001, max_spout_pending=50,
                              message_timeout_s=5)


def _counted(c, state, name: str) -> int:
    """Words counted so far, over the count tasks of every worker that answers."""
    return sum(m["executed"] for w in state.workers() for m in
               ((c.status(state, w) or {}).get("topologies", {}).get(name, {}).get("tasks", {}).values())
               if m["component"] == "count")


# on worker processes (zk) with the faults: make fast keeps the embedded cluster's run of the same body
@pytest.mark.parametrize("mode", ["local", pytest.param("zk", marks=pytest.mark.slow)])
@pytest.mark.parametrize("who", ["follower", pytest.param("leader", marks=pytest.mark.slow)])   # ~20 s each
def test_kill9_mid_topology_moves_its_tasks_and_counts_stay_exact(mode, zk_hosts, who):
    """SIGKILL of a worker mid-topology - a follower, or the leader (the scheduler):
    its tasks move to the survivors, a survivor leads, and the counts are exact. On
    worker processes the ZooKeeper session is 10 s (the most the test ZooKeeper's 500 ms
    tick allows) and the dead worker must be found by its peers' refused connections and
    the leader's probe, so its tasks move while its session still holds its registration;
    a dead leader is deposed by the next candidate in line the same way. (The embedded
    cluster ends a crashed worker's session at once.)"""
    with cluster_in_mode(mode, zk_hosts, session_timeout=10.0) as (c, state):
        topo = _slow_wordcount(3000)
        state.submit_topology(topo.name, topo.to_dict())
        wait_for(lambda: placement(state, topo.name), 30, "the first assignment")
        wait_for(lambda: _counted(c, state, topo.name) > 300, 60, "the count bolts to get going", interval=0.1)
        leader = wait_for(lambda: c.leader(state), 30, "a leader")
        workers = sorted(state.assignment(topo.name)[0].workers)
        victim = leader if who == "leader" else next(w for w in workers if w != leader)
        # the peers must be talking to it (links open) for its death to show as refused connections
        wait_for(lambda: all((c.status(state, w) or {}).get("links", {}).get(victim, {}).get("connected")
                             for w in state.workers() if w != victim), 60, "links to the victim", interval=0.1)
        t_kill = time.monotonic()
        c.kill9(victim)
        wait_for(lambda: victim not in placement(state, topo.name).values(), 30,
                 "the dead worker's tasks to be reassigned", interval=0.05)
        registered_at_move = victim in state.workers()
        print(f"tasks of the {who} {victim} moved {time.monotonic() - t_kill:.1f} s after SIGKILL "
              f"({'before' if registered_at_move else 'after'} its session ended)")
        new_leader = wait_for(lambda: (lambda w: w if w not in (None, victim) else None)(c.leader(state)), 30,
                              "a survivor to lead")
        if mode == "zk":
            assert registered_at_move, "the tasks moved only when the session ended, not on refused connections"
            logs = "".join(open(c.logs[w]).read() for w in workers if w != victim)
            assert "is unreachable" in logs
            assert (f"the leader {victim} is unreachable" in logs) == (who == "leader")
        results = finish(state, topo.name)
        assert wordcount.merge_counts(results) == wordcount.expected_counts(3000, 0)
        if who == "leader":     # the new leader places a new topology too
            assert new_leader != leader
            topo = wordcount.topology(count=1000)
            state.submit_topology(topo.name, topo.to_dict())
            assert wordcount.merge_counts(finish(state, topo.name, 60)) == wordcount.expected_counts(1000, 0)


def test_wrong_secret_can_neither_join_read_nor_change(cluster, tmp_path):
    c, state = cluster
    bad = tmp_path / "bad-secret"
    bad.write_bytes(b"x" * 32)
    bad.chmod(0o600)
    args = ["--zk", c.zk_hosts, "--cluster", c.name, "--secret-file", str(bad)]
    import subprocess
    import sys
    w = subprocess.run([sys.executable, "-m", "streamnet.cli.worker", *args, "--port", "0", "--name", "evil"],
                       capture_output=True, text=True, timeout=60)
    assert w.returncode == 2 and "wrong cluster secret" in w.stderr, w.stderr
    for cmd in (["list"], ["kill", "wordcount"], ["rebalance", "wordcount", "--threads", "w0=4"]):
        r = subprocess.run([sys.executable, "-m", "streamnet.cli.submit", *cmd, *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "wrong cluster secret" in r.stderr, (cmd, r.stderr)
    # a raw ZooKeeper client with another secret is refused too
    other = ZkCoordinator(c.zk_hosts, b"another secret entirely")
    try:
        with pytest.raises(Exception, match="wrong cluster secret"):
            other.children(f"{c.root}/{c.name}/workers")
    finally:
        other.close()
    assert set(state.workers()) == {"w0", "w1", "w2"}


@pytest.mark.slow     # about 17 s
def test_rebalance_changes_parallelism_live_without_losing_tuples(cluster):
    c, state = cluster
    topo = _slow_wordcount(3000)
    state.submit_topology(topo.name, topo.to_dict())
    wait_for(lambda: placement(state, topo.name), 30, "the first assignment")
    # split is stateless; count keeps per-task state, which a new parallelism would have to
    # repartition by key - the engine does not do that (see the README)
    r = c.submit_cli("rebalance", topo.name, "--parallelism", "split=4", "--threads", "w0=2")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: len(placement(state, topo.name)) == 8 and
             state.assignment(topo.name)[0].spec_version == 1, 60, "the new layout", interval=0.1)
    assert [comp["parallelism"] for comp in state.topology(topo.name)["components"]] == [1, 4, 3]
    assert state.assignment(topo.name)[0].threads["w0"] == 2
    results = finish(state, topo.name)
    assert wordcount.merge_counts(results) == wordcount.expected_counts(3000, 0)


@pytest.mark.slow
def test_cluster_trains_lenet5_to_completion(cluster, tmp_path):
    c, _ = cluster
    summary = tmp_path / "train.json"
    r = c.submit_cli("submit", "lenet5-mixbp", "--dataset", "synthetic", "--epochs", "2", "--workers", "3",
                     "--checkpoint-dir", str(tmp_path / "ckpt"), "--wait", "--timeout", "300",
                     "--summary", str(summary), timeout=400)
    assert r.returncode == 0, (r.stdout, r.stderr)
    import json
    s = json.loads(summary.read_text())
    assert s["epochs"] == 2 and s["units"] == 3 and s["samples_processed"] == 2 * 2048
    assert s["test_accuracy"] > 0.5 and len(s["per_worker"]) >= 2
    # one checkpoint per epoch, the last one at the last step, intact
    ckpts = sorted((tmp_path / "ckpt").iterdir())
    # named by the rounds done: the last one holds the parameters after every round
    assert len(ckpts) == 2 and ckpts[-1].name.endswith(f"-{s['sync_rounds']:08d}.ckpt")
    from streamnet.training.checkpoint import read_checkpoint
    assert read_checkpoint(str(ckpts[-1])).size == s["num_params"]


FASHION = "/usr/share/datasets/fashion-mnist"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION), reason="install dataset-fashion-mnist (make test does)")
def test_lenet5_mixbp_on_two_workers_reaches_89_percent(zk, tmp_path):
    with running_cluster(zk, workers=2) as (c, _):
        summary = tmp_path / "lenet5.json"
        r = c.submit_cli("submit", "lenet5-mixbp", "--workers", "2", "--wait", "--summary", str(summary),
                         timeout=1800)
        assert r.returncode == 0, (r.stdout, r.stderr)
        import json
        s = json.loads(summary.read_text())
        print("LeNet-5 MixBP, 2 worker processes on ZooKeeper:",
              {k: s[k] for k in ("test_accuracy", "samples_per_s", "wall_s", "epochs", "sync_rounds", "bytes_sent")})
        assert s["test_accuracy"] >= 0.89


@pytest.mark.slow     # a 3-server ensemble and its outage: about a minute
def test_without_a_quorum_clients_get_a_clear_error_and_workers_keep_their_tasks():
    """Two of three ensemble members die mid-topology: `streamnet-submit list` says there
    is no quorum and exits 1 instead of blocking; the workers stay up with their tasks
    and log the same; once the members are back the topology completes exactly."""
    server = ZooKeeper(servers=3).start()
    try:
        with running_cluster(server.hosts, workers=2) as (c, state):
            topo = _slow_wordcount(count=6000)
            state.submit_topology(topo.name, topo.to_dict())
            wait_for(lambda: placement(state, topo.name), 30, "the first assignment")
            workers = {w: f"http://{i['host']}:{i['port']}" for w, i in state.workers().items()}

            def running_here(url):
                tasks = ((_get_json(url + "/status") or {}).get("topologies", {}).get(topo.name) or {}).get("tasks")
                return tasks and any(m["executed"] for m in tasks.values())
            wait_for(lambda: all(running_here(u) for u in workers.values()), 60, "tasks running on both workers",
                     interval=0.1)
            server.kill(1)
            server.kill(2)
            wait_for(lambda: not server.serving(0), 30, "server 0 to lose its quorum", interval=0.1)
            t0 = time.monotonic()
            r = c.submit_cli("list", timeout=120)
            took = time.monotonic() - t0
            print(f"submit list without a quorum: exit {r.returncode} after {took:.1f} s: {r.stderr.strip()}")
            assert r.returncode == 1, (r.stdout, r.stderr)
            assert "ZooKeeper has no quorum (1 of 3 servers reachable)" in r.stderr
            assert "Traceback" not in r.stderr
            wait_for(lambda: all("no quorum" in open(c.logs[w]).read() for w in workers), 30,
                     "the workers to log the outage", interval=0.2)
            assert all(c.procs[w].poll() is None for w in workers), "a worker exited without a quorum"
            server.restart(1)
            server.restart(2)
            results = finish(state, topo.name, timeout=300)
    finally:
        server.stop()
    assert wordcount.merge_counts(results) == wordcount.expected_counts(6000, 0)


def _get_json(url: str):
    import json
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return json.load(r)
    except OSError:
        return None


def test_a_recursive_delete_outlasts_children_created_while_it_runs(zk):
    # kill_topology removes a topology's nodes while a worker may still publish under them:
    # a child created between listing a node's children and deleting it is listed again
    import uuid
    coord = ZkCoordinator(zk, os.urandom(24).hex().encode(), session_timeout=10)
    root = "/sn-delete-" + uuid.uuid4().hex[:8]
    try:
        coord.create(f"{root}/results/a", b"", makepath=True)
        late = iter([f"{root}/results/b", f"{root}/results/c"])    # a worker publishing, twice
        real = coord.zk.get_children_async

        def listing_then_a_publish(path, *args, **kwargs):
            answer = real(path, *args, **kwargs)
            if path == f"{root}/results":
                nxt = next(late, None)
                if nxt:
                    answer.get(timeout=10)
                    coord.zk.create(nxt, b"", acl=coord.zk.get_acls(root)[0])
            return answer
        coord.zk.get_children_async = listing_then_a_publish
        coord.delete(root, recursive=True)
        assert coord.zk.exists(root) is None
        assert next(late, None) is None                  # both late children were created, and removed
    finally:
        coord.zk.get_children_async = real
        if coord.zk.exists(root):
            coord.zk.delete(root, recursive=True)
        coord.close()


def test_closing_a_session_is_bounded_while_zookeeper_does_not_answer(zk):
    """kazoo's stop joins its threads without a bound: a worker or daemon asked to stop
    while its ZooKeeper stopped answering (connection open, nothing comes back) must not
    wait on it longer than the bound; an answering ZooKeeper closes at once."""
    from streamnet.testing import Relay
    host, port = zk.split(",")[0].rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        pytest.skip("needs a local ZooKeeper to relay to")
    healthy = ZkCoordinator(zk, os.urandom(24).hex().encode(), session_timeout=30)
    assert healthy.close(timeout=10) is True                 # closed within the bound: it answers
    closed = None
    with Relay(int(port)) as relay:
        coord = ZkCoordinator(relay.address, os.urandom(24).hex().encode(), session_timeout=30)
        try:
            coord.exists("/")
            relay.hold()
            wait_for(lambda: _sends_and_is_held(coord, relay), 10, "a call the relay holds", interval=0.05)
            before = set(threading.enumerate())
            t0 = time.monotonic()
            closed = coord.close(timeout=1.0)
            took = time.monotonic() - t0
            abandoned = [t for t in threading.enumerate() if t not in before and t.name == "zk-close"]
        finally:
            if closed is None:       # failed before the close under test: close it here
                relay.heal()
                coord.close(timeout=10)
    # it gave up at its bound; unbounded, kazoo's stop waits max(session timeout, 10 s) = 30 s
    # here for the answer the relay holds, so a bound well below that is no timing claim
    assert closed is False, "close() waited for kazoo's stop to finish while ZooKeeper did not answer"
    # the relay closed: the held connection is cut, and the stop that close() left behind ends
    wait_for(lambda: not any(t.is_alive() for t in abandoned), 40, "the abandoned close of the session to end",
             interval=0.1)
    assert took < 15, f"close(timeout=1.0) took {took:.1f} s"


def _sends_and_is_held(coord, relay) -> bool:
    coord.zk.exists_async("/")       # a request that gets no answer while the relay holds
    return relay.bytes_held > 0


def test_a_watch_whose_callback_raises_is_not_lost_and_does_not_raise_into_the_caller(zk, caplog):
    """kazoo runs a data watch's first call inside its constructor and re-raised its error
    there: a worker's loop over the topologies stopped at a bad node, and the topologies
    after it were never watched."""
    import uuid
    coord = ZkCoordinator(zk, os.urandom(24).hex().encode(), session_timeout=10)
    path = "/sn-watch-" + uuid.uuid4().hex[:8]
    seen = []

    def callback(data, version):
        seen.append(data)
        data.decode()                                     # raises on the first value

    try:
        coord.create(path, b"\xff", makepath=True)
        coord.watch_data(path, callback)                  # raised UnicodeDecodeError here
        coord.set(path, b"ok")
        wait_for(lambda: seen[-1:] == [b"ok"], 10, "the watch to see the next value")
        assert seen[0] == b"\xff" and "a watch on " + path in caplog.text
    finally:
        coord.zk.delete(path, recursive=True)
        coord.close()


def test_kill_checkpoint_says_whether_the_topology_had_finished_or_was_stopped(cluster):
    """`kill --checkpoint` of a topology without checkpoints: one still running is stopped
    cleanly (it said "had finished" of it), one that came to its end had finished."""
    c, state = cluster
    running = _slow_wordcount(100_000)
    state.submit_topology(running.name, running.to_dict())
    wait_for(lambda: placement(state, running.name), 30, "the first assignment")
    r = c.submit_cli("kill", running.name, "--checkpoint", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert f"stopped {running.name} cleanly, every spout done" in r.stdout, r.stdout
    ended = wordcount.topology(count=50)
    state.submit_topology(ended.name, ended.to_dict())
    wait_for(lambda: is_done(state, ended.name), 60, "word count to finish")
    r = c.submit_cli("kill", ended.name, "--checkpoint", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert f"{ended.name} had finished" in r.stdout, r.stdout
