"""The stream engine: topologies, codec, transport, worker, acking, coordination.

It knows nothing of neural networks: a word count runs on it as well as training.
"""
from .cluster_state import ClusterState
from .codec import CodecError, Limits
from .component import BasicBolt, Bolt, Context, Spout, Tuple
from .coordinator import (BadVersionError, Coordinator, CoordinatorError, InProcessServer, NoNodeError,
                          NodeExistsError)
from .local import LocalCluster, wait_for
from .scheduler import assign
from .topology import Topology, TopologyBuilder, TopologyError
from .worker import Worker

__all__ = ["ClusterState", "CodecError", "Limits", "BasicBolt", "Bolt", "Context", "Spout", "Tuple",
           "BadVersionError", "Coordinator", "CoordinatorError", "InProcessServer", "NoNodeError",
           "NodeExistsError", "LocalCluster", "wait_for", "assign", "Topology", "TopologyBuilder",
           "TopologyError", "Worker"]
