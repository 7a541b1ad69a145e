"""The stream engine: topologies, codec, transport, worker, acking, coordination.

It knows nothing of neural networks: a word count runs on it as well as training.

What both planes share lives here (topology.py, component.py, codec.py,
messages.py, assignment.py, the worker shell worker.py, local.py); the data
plane in dataplane/, the control plane in control/.
"""
from .codec import CodecError, Limits
from .component import BasicBolt, Bolt, Context, Spout, Tuple
from .control.client import ClusterTimeout, kill_topology, wait_done, wait_for
from .control.cluster_state import ClusterState
from .control.coordinator import (BadVersionError, ConnectionLostError, Coordinator, CoordinatorError, NoNodeError,
                                  NodeExistsError, SessionClosedError)
from .control.inprocess import InProcessServer
from .control.placement import assign
from .dataplane.fencing import FencedError
from .dataplane.log_budget import LogBudget
from .local import LocalCluster
from .topology import Topology, TopologyBuilder, TopologyError, resolve
from .worker import Worker

__all__ = ["ClusterState", "CodecError", "Limits", "BasicBolt", "Bolt", "Context", "Spout", "Tuple",
           "BadVersionError", "ConnectionLostError", "Coordinator", "CoordinatorError", "InProcessServer", "NoNodeError",
           "NodeExistsError", "SessionClosedError", "FencedError", "LogBudget", "LocalCluster", "wait_for", "wait_done",
           "kill_topology",
           "ClusterTimeout", "assign", "Topology", "TopologyBuilder", "TopologyError", "Worker", "resolve"]
