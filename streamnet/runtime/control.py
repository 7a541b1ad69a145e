"""Driving a topology from a client: wait for conditions, wait until done, kill and
collect results. Shared by LocalCluster, streamnet-submit, training and tests."""
from __future__ import annotations

import time

from ..errors import StreamnetError
from .cluster_state import ClusterState
from .topology import Topology


class ClusterTimeout(StreamnetError):
    pass


def wait_for(predicate, timeout: float, what: str, interval: float = 0.01):
    """Poll predicate until it returns something truthy; ClusterTimeout after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise ClusterTimeout(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


def spout_tasks(topology: Topology) -> set[int]:
    return {t for c in topology.components if c["kind"] == "spout" for t in topology.tasks(c["id"])}


def is_done(state: ClusterState, name: str) -> bool:
    """Every spout task reported done: its source is exhausted and its trees complete."""
    return spout_tasks(Topology.from_dict(state.topology(name))) <= state.done_tasks(name)


def wait_done(state: ClusterState, name: str, timeout: float, interval: float = 0.1) -> None:
    spouts = spout_tasks(Topology.from_dict(state.topology(name)))
    wait_for(lambda: spouts <= state.done_tasks(name), timeout, f"topology {name!r} to finish", interval)


def request_stop(state: ClusterState, name: str) -> bool:
    """Ask a running topology to stop cleanly (its spouts get Spout.drain); True if this
    call asked (it was active), False if it was already stopping or killed."""
    if state.status(name) == "active":
        state.set_status(name, "stopping")
        return True
    return False


def drain_topology(state: ClusterState, name: str, timeout: float) -> dict:
    """Ask the spouts to stop cleanly (Spout.drain), wait until they report done, then
    kill the topology and return its results."""
    state.topology(name)  # UnknownTopologyError if it is not there
    request_stop(state, name)
    wait_done(state, name, timeout)
    return kill_topology(state, name, timeout)


def kill_topology(state: ClusterState, name: str, timeout: float = 60.0) -> dict:
    """Stop the topology on every worker (their components' close() runs and publishes),
    then return its results and remove it."""
    state.topology(name)  # UnknownTopologyError if it is not there
    assigned = set((state.assignment(name)[0] or {}).get("workers", {}))
    state.set_status(name, "killed")
    wait_for(lambda: state.stopped_workers(name) >= (assigned & set(state.workers())), timeout,
             f"workers to stop {name!r}", interval=0.05)
    results = state.results(name)
    state.remove_topology(name)
    return results
