"""The control plane: where tasks run, who leads, what clients ask.

coordinator.py  the Coordinator interface, its errors and the one retry-while-lost helper
inprocess.py    the in-process coordinator (embedded local cluster)
zk.py           the ZooKeeper coordinator (kazoo); the cluster's ACLs made and checked at start
roles.py        ZooKeeper roles (worker, submit, observer): credentials and each top node's ACL
cluster_state.py the cluster's layout in the coordinator, read and written by name
placement.py    pure placement: workers and topology in, assignment out
election.py     leader election over ephemeral sequential nodes, and the authenticated liveness probe
scheduler.py    the leader's loop: read, ask placement, write what changed
client.py       what clients do: wait, wait until done, stop, kill, drain

The client calls are re-exported here: `from streamnet.runtime.control import wait_done`.
"""
from .client import (ClusterTimeout, TopologyFailed, TopologyGone, drain_topology, is_done, kill_topology, request_stop,
                     retrying, spout_tasks, wait_done, wait_for)
from .cluster_state import RUNNING, ClusterState, TopologyExistsError, UnknownTopologyError

__all__ = ["ClusterTimeout", "TopologyFailed", "TopologyGone", "drain_topology", "is_done", "kill_topology", "request_stop",
           "retrying", "spout_tasks", "wait_done", "wait_for", "RUNNING", "ClusterState", "TopologyExistsError",
           "UnknownTopologyError"]
