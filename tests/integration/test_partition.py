"""A real network partition: workers in Linux network namespaces (deploy/cluster-netns.sh),
one host cut off mid-training and healed. Needs root and iproute2; skipped otherwise."""
import os
import shutil
import subprocess
import time
import uuid

import pytest

from streamnet.runtime import wait_for
from streamnet.runtime.control import is_done, kill_topology
from streamnet.testing import ROOT, placement, stale_dropped, worker_sessions, zookeeper_installed
from streamnet.training import DataConfig, lenet5_mixbp
from streamnet.training.nsmap import build_topology

from .test_training_faults import _finished_exactly, _refused_saves

SCRIPT = os.path.join(ROOT, "deploy", "cluster-netns.sh")
FASHION = "/usr/share/datasets/fashion-mnist"
ZK_ADDRESS = "10.77.0.1"      # cluster-netns.sh's ZooKeeper, on the bridge


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not zookeeper_installed(), reason="needs Debian's zookeeper package"),
              pytest.mark.skipif(not os.path.isdir(FASHION), reason="needs dataset-fashion-mnist")]


@pytest.fixture(scope="session")
def netns_usable():
    """Skips unless this process may make network namespaces (root and iproute2): probed
    once, when a test here runs (not when the tests are collected), with a namespace of a
    name of its own that is removed again whatever happened."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and network namespaces (iproute2)")
    name = f"snprobe-{uuid.uuid4().hex[:8]}"
    try:
        probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"needs root and network namespaces: ip netns add failed: {probe.stderr.strip()}")


@pytest.fixture
def netns_cluster(netns_usable, tmp_path, zk_root):
    from streamnet.runtime.control.cluster_state import ClusterState
    from streamnet.runtime.control.zk import ZkCoordinator
    env = dict(os.environ, STREAMNET_NETNS_DIR=str(tmp_path / "netns"))

    def sh(*args):
        r = subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, f"cluster-netns.sh {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}"
        return r
    state = None
    try:     # torn down whatever failed: an `up` that fails half way leaves ZooKeeper and namespaces
        sh("up", "3")
        secret = (tmp_path / "netns" / "secret").read_bytes().strip()
        # the workers take the test's root from $STREAMNET_ZK_ROOT (conftest's zk_root)
        state = ClusterState(ZkCoordinator(f"{ZK_ADDRESS}:2281", secret, session_timeout=10), "netns", root=zk_root)
        wait_for(lambda: len(state.workers()) == 3, 60, "3 workers in their namespaces", interval=0.2)
        yield sh, state, tmp_path / "netns"
    finally:
        if state is not None:
            state.coord.close()
        sh("down")


def zookeeper_route(host: str, op: str) -> None:
    """Add (or delete) a blackhole route to ZooKeeper's address in `host`'s namespace:
    healed with it, the host is back among its peers but not yet in ZooKeeper, so its
    stale instances act before they learn that they were replaced (healed at once, it
    learns the new assignment first and stops them unfenced: nothing to assert)."""
    subprocess.run(["ip", "-n", f"sn{host.removeprefix('host')}", "route", op, "blackhole", f"{ZK_ADDRESS}/32"],
                   check=True, capture_output=True, timeout=30)


@pytest.mark.parametrize("victim", ["compute", "sync"])
def test_training_survives_a_network_partition(netns_cluster, victim):
    """Cut the host of a compute unit (or of the spout and sync bolt) off the network
    mid-run, wait until its tasks moved, heal it: the run finishes, each sample of each
    epoch counted once, and the healed worker registers again in a new session. Its
    stale spout and sync bolt ran on through the cut, so they must be fenced: what they
    send is dropped as stale by the workers that now run their tasks (their /status), or
    their next state save is refused (its log); its host is healed 2 s before it reaches
    ZooKeeper again (as in test_training_faults), so that they act first. (A stale compute
    unit may hold nothing - it may have been waiting for parameters - so its fencing is
    printed, not asserted.) A cut-off link stalls rather than fails, so the stale spout
    would wait on its trees to the end; with a message timeout shorter than the time the
    cut lasts it replays them, and that work reaches the healed peers from an instance they
    know is superseded. (With the default 300 s timeout it could stop unfenced, having
    done nothing: seen in 2 of 5 runs.)"""
    sh, state, run = netns_cluster
    cfg = lenet5_mixbp(units=2, epochs=3, data=DataConfig(train_limit=12000, test_limit=2000))
    topo = build_topology(cfg, name="partition", message_timeout_s=6.0)
    state.submit_topology(topo.name, topo.to_dict())
    tasks = wait_for(lambda: placement(state, topo.name), 60, "the assignment")
    host = tasks[topo.tasks(victim)[0]]
    session = worker_sessions(state)[host]
    wait_for(lambda: (state.results(topo.name).get("sync.0.progress") or {}).get("rounds", 0) >= 10, 120,
             "training to get going", interval=0.2)
    t_cut = time.monotonic()
    sh("cut", host.removeprefix("host"))
    try:
        wait_for(lambda: host not in placement(state, topo.name).values(), 60,
                 "the cut-off host's tasks to move", interval=0.1)
        moved_after = time.monotonic() - t_cut
        if victim == "sync":
            zookeeper_route(host, "add")
    finally:
        sh("heal", host.removeprefix("host"))
    if victim == "sync":
        try:
            deadline = time.monotonic() + 2.0
            wait_for(lambda: time.monotonic() >= deadline, 5, "the time away from ZooKeeper", interval=0.1)
        finally:
            zookeeper_route(host, "del")
    host_log = str(run / f"{host}.log")
    try:
        if victim == "sync":
            wait_for(lambda: stale_dropped(state, topo.name) or _refused_saves(host_log), 60,
                     "the cut-off spout and sync bolt to be fenced", interval=0.2)
        wait_for(lambda: worker_sessions(state).get(host) not in (None, session), 60,
                 "the healed worker to register again in a new session", interval=0.2)
        stale, refused = stale_dropped(state, topo.name), _refused_saves(host_log)
        wait_for(lambda: is_done(state, topo.name), 120, "the end of training", interval=0.5)
    except Exception:
        for log in sorted(run.glob("host*.log")):
            print(f"--- {log.name}\n" + "".join(l for l in open(log) if "kazoo" not in l)[-6000:])
        raise
    results = kill_topology(state, topo.name, 60)
    _finished_exactly(cfg, results, f"cut {victim} host {host} off, its tasks moved after {moved_after:.1f} s; "
                                    f"{stale} stale tuple(s) dropped, {refused} state save(s) refused")
