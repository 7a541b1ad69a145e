"""tensor_pipe: seeded random float32 arrays -> transform (on the compute threads)
-> checksum sink. The sink's SHA-256 of each array must equal the one computed
locally from the same seed: the tensors crossed the wire intact.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..runtime import Bolt, Spout, TopologyBuilder, TopologyError


def make_array(seed: int, i: int, size: int) -> np.ndarray:
    return np.random.default_rng([seed, i]).standard_normal(size, dtype=np.float32)


def transform(x: np.ndarray) -> np.ndarray:
    return x * np.float32(2.0) + np.float32(1.0)


def digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def expected(count: int, size: int, seed: int = 0) -> dict[int, str]:
    return {i: digest(transform(make_array(seed, i, size))) for i in range(count)}


class ArraySpout(Spout):
    outputs = ["id", "array"]

    def open(self, ctx, collector):
        super().open(ctx, collector)
        n = int(self.config.get("count", 10))
        self.todo = list(range(ctx.task_index, n, ctx.parallelism))[::-1]
        self.in_flight: set[int] = set()
        self.size, self.seed = int(self.config.get("size", 1024)), int(self.config.get("seed", 0))

    def next_tuple(self):
        if self.todo:
            i = self.todo.pop()
            self.in_flight.add(i)
            self.collector.emit([i, make_array(self.seed, i, self.size)], msg_id=i)

    def ack(self, msg_id):
        self.in_flight.discard(msg_id)

    def fail(self, msg_id):
        self.todo.append(msg_id)

    def is_done(self):
        return not self.todo and not self.in_flight


class TransformBolt(Bolt):
    outputs = ["id", "array"]

    async def execute(self, tup):
        y = await self.ctx.compute(transform, tup["array"])
        self.collector.emit([tup["id"], y], anchors=tup)
        self.collector.ack(tup)


class ChecksumBolt(Bolt):
    outputs = []

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.sums: dict[int, str] = {}

    async def execute(self, tup):
        self.sums[tup["id"]] = await self.ctx.compute(digest, tup["array"])
        self.collector.ack(tup)

    def close(self):
        self.ctx.publish("checksums", {str(k): v for k, v in self.sums.items()})


def topology(name: str = "tensor_pipe", count: int = 10, size: int = 1024, seed: int = 0,
             transformers: int = 2, sinks: int = 1, **config):
    if count < 0 or size < 1:
        raise TopologyError(f"tensor_pipe takes count >= 0 and size >= 1; got count {count}, size {size}")
    b = TopologyBuilder(name)
    b.add_spout("arrays", "streamnet.examples.tensor_pipe:ArraySpout", count=count, size=size, seed=seed)
    b.add_bolt("transform", "streamnet.examples.tensor_pipe:TransformBolt", parallelism=transformers).shuffle("arrays")
    b.add_bolt("checksum", "streamnet.examples.tensor_pipe:ChecksumBolt", parallelism=sinks).shuffle("transform")
    return b.build(**config)


def merge_checksums(results: dict) -> dict[int, str]:
    out: dict[int, str] = {}
    for key, value in results.items():
        if key.endswith(".checksums"):
            out.update({int(k): v for k, v in value.items()})
    return out
