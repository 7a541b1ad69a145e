"""NN-S as runtime components, by their old import path.

Topology specs name components by import path, and specs built before the split
(stored in a cluster's ZooKeeper, or written by scripts) say
`streamnet.training.components:SyncBolt` and so on: keep those importable. NS-Map
now names each class where it lives.
"""
from .checkpoint_bolt import CheckpointBolt
from .compute_bolt import ComputeBolt
from .data_spout import DataSpout
from .eval_bolt import EvalBolt
from .sync_bolt import SyncBolt

__all__ = ["DataSpout", "ComputeBolt", "SyncBolt", "EvalBolt", "CheckpointBolt"]
