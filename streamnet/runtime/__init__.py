"""The stream engine: topologies, codec, transport, worker, acking, coordination.

It knows nothing of neural networks: a word count runs on it as well as training.
"""
from .cluster_state import ClusterState
from .codec import CodecError, Limits
from .component import BasicBolt, Bolt, Context, Spout, Tuple
from .coordinator import (BadVersionError, Coordinator, CoordinatorError, InProcessServer, NoNodeError,
                          NodeExistsError)
from .control import ClusterTimeout, kill_topology, wait_done, wait_for
from .executor import FencedError
from .local import LocalCluster
from .scheduler import assign
from .topology import Topology, TopologyBuilder, TopologyError
from .worker import Worker

__all__ = ["ClusterState", "CodecError", "Limits", "BasicBolt", "Bolt", "Context", "Spout", "Tuple",
           "BadVersionError", "Coordinator", "CoordinatorError", "InProcessServer", "NoNodeError",
           "NodeExistsError", "FencedError", "LocalCluster", "wait_for", "wait_done", "kill_topology", "ClusterTimeout", "assign", "Topology", "TopologyBuilder",
           "TopologyError", "Worker"]
