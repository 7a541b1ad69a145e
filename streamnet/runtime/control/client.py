"""Driving a topology from a client: wait for conditions, wait until done, kill and
collect results. Shared by LocalCluster, streamnet-submit, training and tests."""
from __future__ import annotations

import logging
import time
from typing import Callable

from ...errors import StreamnetError
from .cluster_state import FAILED_STATUS, RUNNING, ClusterState, UnknownTopologyError
from .coordinator import ConnectionLostError, SessionClosedError, retry_while_lost
from ..topology import Topology

log = logging.getLogger(__name__)


class ClusterTimeout(StreamnetError):
    pass


class TopologyGone(StreamnetError):
    """The topology was killed or removed while we waited for it to finish."""


class TopologyFailed(StreamnetError):
    """A task of the topology could not start, or a worker refused it: it would never finish."""


def wait_for(predicate, timeout: float, what: str, interval: float = 0.01):
    """Poll predicate until it returns something truthy; ClusterTimeout after timeout s.

    A lost coordinator connection (a ZooKeeper server going away: the client moves to
    another) is ridden out until the deadline: the predicate is simply asked again."""
    deadline = time.monotonic() + timeout
    lost = None
    while True:
        try:
            value = predicate()
            if lost is not None:
                log.info("coordinator connection back; still waiting for %s", what)
                lost = None
            if value:
                return value
        except SessionClosedError:
            raise
        except ConnectionLostError as e:
            if lost is None:
                log.warning("%s while waiting for %s; retrying", e, what)
            lost = e
        if time.monotonic() >= deadline:
            why = f" (coordinator unreachable: {lost})" if lost is not None else ""
            raise ClusterTimeout(f"timed out after {timeout:.1f} s waiting for {what}{why}")
        time.sleep(interval)


def retrying(fn: Callable[[], object], timeout: float, what: str):
    """fn(), asked again while the coordinator connection is lost (for idempotent calls);
    ClusterTimeout if it does not come back within timeout s."""
    try:
        return retry_while_lost(fn, timeout)
    except SessionClosedError:
        raise
    except ConnectionLostError as e:
        raise ClusterTimeout(f"timed out after {timeout:.1f} s waiting for {what} "
                             f"(coordinator unreachable: {e})") from None


def spout_tasks(topology: Topology) -> set[int]:
    return {t for c in topology.components if c["kind"] == "spout" for t in topology.tasks(c["id"])}


def is_done(state: ClusterState, name: str) -> bool:
    """Every spout task reported done: its source is exhausted and its trees complete."""
    return spout_tasks(Topology.from_dict(state.topology(name))) <= state.done_tasks(name)


def wait_done(state: ClusterState, name: str, timeout: float, interval: float = 0.1,
              on_poll: Callable[[int, int], None] | None = None,
              on_interrupt: Callable[[], bool] | None = None) -> None:
    """Until every spout task of `name` is done (source exhausted, trees complete).

    on_poll(done, total) runs after each look (progress, stop conditions). On Ctrl-C,
    on_interrupt() decides: True keeps waiting, False (or none given) re-raises.
    TopologyGone if it is killed or removed first; TopologyFailed if a task could not
    start or a worker refused it (the topology is left for the caller to kill);
    ClusterTimeout after timeout s."""
    what = f"topology {name!r} to finish"
    spouts = spout_tasks(Topology.from_dict(retrying(lambda: state.topology(name), timeout, what)))
    deadline = time.monotonic() + timeout

    def failed() -> None:
        failures = state.failures(name)
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise TopologyFailed(f"topology {name!r} failed: {next(iter(failures.values()))}{more}")

    def finished():
        failed()
        done = len(spouts & state.done_tasks(name))
        status = state.status(name) if done < len(spouts) else None
        if status == FAILED_STATUS:
            failed()    # its reason, written before the status (read above before it was there)
            raise TopologyFailed(f"topology {name!r} failed (a task could not start, or a worker refused it)")
        if done < len(spouts) and status not in RUNNING:
            raise TopologyGone(f"topology {name!r} was killed before it finished")
        if on_poll:
            on_poll(done, len(spouts))
        return done == len(spouts)

    while True:
        try:
            wait_for(finished, max(deadline - time.monotonic(), 0), what, interval)
            return
        except KeyboardInterrupt:
            if on_interrupt is None or not on_interrupt():
                raise


def request_stop(state: ClusterState, name: str) -> bool:
    """Ask a running topology to stop cleanly (its spouts get Spout.drain); True if this
    call asked (it was active), False if it was already stopping or killed."""
    if retrying(lambda: state.status(name), 60, f"the status of {name!r}") == "active":
        try:
            retrying(lambda: state.set_status(name, "stopping"), 60, f"{name!r} to be asked to stop")
        except UnknownTopologyError:
            return False     # killed meanwhile
        return True
    return False


def drain_topology(state: ClusterState, name: str, timeout: float) -> dict:
    """Ask the spouts to stop cleanly (Spout.drain), wait until they report done, then
    kill the topology and return its results."""
    request_stop(state, name)
    try:
        wait_done(state, name, timeout)    # UnknownTopologyError if it is not there
    except TopologyFailed as e:            # it cannot stop cleanly: a task never started
        log.warning("%s; killing it without a clean stop", e)
    return kill_topology(state, name, timeout)


def kill_topology(state: ClusterState, name: str, timeout: float = 60.0) -> dict:
    """Stop the topology on every worker (their components' close() runs and publishes),
    then return its results and remove it."""
    retrying(lambda: state.topology(name), timeout, f"topology {name!r}")  # UnknownTopologyError if not there
    current = retrying(lambda: state.assignment(name), timeout, f"the assignment of {name!r}")[0]
    assigned = set(current.workers) if current is not None else set()
    try:
        retrying(lambda: state.set_status(name, "killed"), timeout, f"{name!r} to be marked killed")
    except UnknownTopologyError:
        raise _killed_meanwhile(name) from None

    def stopped():
        if not state.has_topology(name):
            raise _killed_meanwhile(name)
        return state.stopped_workers(name) >= (assigned & set(state.workers()))
    wait_for(stopped, timeout, f"workers to stop {name!r}", interval=0.05)
    results = retrying(lambda: state.results(name), timeout, f"the results of {name!r}")
    if not retrying(lambda: state.has_topology(name), timeout, f"topology {name!r}"):
        raise _killed_meanwhile(name)   # the results read may be a part: the other kill has them whole
    retrying(lambda: state.remove_topology(name), timeout, f"{name!r} to be removed")
    return results


def _killed_meanwhile(name: str) -> TopologyGone:
    return TopologyGone(f"topology {name!r} was killed by another caller meanwhile; its results went to that caller")
