"""Components for perf/transport.py: ping-pong latency, bulk tensors, small tuples.

Timing happens inside the components and is published as results. A tensor carries
the time it was sent (`time.perf_counter`: CLOCK_MONOTONIC on Linux, one clock for
every process of the machine), so the bolt that takes it records the hop it made,
from the sender's emit to its own execute, across worker processes too.
"""
from __future__ import annotations

import time

import numpy as np

from ..runtime import Bolt, Spout, TopologyBuilder


class TensorSpout(Spout):
    """Emits `count` float32 tensors of `size` values, reliably, each with the time it
    was sent; records emit->ack times."""
    outputs = ["i", "x", "t"]

    def open(self, ctx, collector):
        super().open(ctx, collector)
        self.count, self.size = int(self.config["count"]), int(self.config["size"])
        self.x = np.random.default_rng(0).standard_normal(self.size, dtype=np.float32)
        self.sent = 0
        self.t_emit: dict[int, float] = {}
        self.rtt: list[float] = []
        self.t0 = self.t1 = None
        self.failed = 0

    def next_tuple(self):
        if self.sent < self.count:
            i = self.sent
            self.sent += 1
            if self.t0 is None:
                self.t0 = time.perf_counter()
            self.t_emit[i] = now = time.perf_counter()
            self.collector.emit([i, self.x, now], msg_id=i)

    def ack(self, i):
        self.t1 = time.perf_counter()
        self.rtt.append(self.t1 - self.t_emit.pop(i))

    def fail(self, i):
        self.failed += 1
        self.t_emit.pop(i, None)

    def is_done(self):
        return self.sent >= self.count and not self.t_emit

    def close(self):
        self.ctx.publish("stats", {"worker": self.ctx.worker, "rtt_s": self.rtt, "elapsed_s": (self.t1 or 0) - (self.t0 or 0),
                                   "bytes": self.size * 4 * len(self.rtt), "failed": self.failed})


class HopBolt(Bolt):
    """Records each input's hop: from the time it carries (`t`, when its sender emitted
    it) to its execute here; with `t0` (the spout's emit, carried on by an echo) also
    the whole way there and back. Published at close with this task's worker."""

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.hop_s: list[float] = []
        self.back_s: list[float] = []

    def arrived(self, tup) -> float:
        now = time.perf_counter()
        self.hop_s.append(now - tup["t"])
        if "t0" in tup.fields:
            self.back_s.append(now - tup["t0"])
        return now

    def close(self):
        self.ctx.publish("hops", {"worker": self.ctx.worker, "hop_s": self.hop_s, "back_s": self.back_s})


class EchoBolt(HopBolt):
    """Sends each tensor back on, stamped anew, with the spout's stamp as t0."""
    outputs = ["i", "x", "t", "t0"]

    def execute(self, tup):
        now = self.arrived(tup)
        self.collector.emit([tup["i"], tup["x"], now, tup["t"]], anchors=tup)
        self.collector.ack(tup)


class AckSink(HopBolt):
    outputs = []

    def execute(self, tup):
        self.arrived(tup)
        self.collector.ack(tup)


class SmallSpout(Spout):
    """Unanchored small tuples as fast as backpressure allows."""
    outputs = ["n"]

    def open(self, ctx, collector):
        super().open(ctx, collector)
        self.n = 0

    def next_tuple(self):
        for _ in range(64):  # several per call: the loop overhead is not the transport's
            self.n += 1
            self.collector.emit([self.n])


class CountSink(Bolt):
    outputs = []

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.n = 0

    def execute(self, tup):
        self.n += 1


def ping(size: int, count: int):
    b = TopologyBuilder("ping")
    b.add_spout("ping", "streamnet.examples.bench:TensorSpout", size=size, count=count)
    b.add_bolt("echo", "streamnet.examples.bench:EchoBolt").shuffle("ping")
    b.add_bolt("back", "streamnet.examples.bench:AckSink").shuffle("echo")
    return b.build(max_spout_pending=1)


def bulk(size: int, count: int, pending: int = 8):
    b = TopologyBuilder("bulk")
    b.add_spout("src", "streamnet.examples.bench:TensorSpout", size=size, count=count)
    b.add_bolt("sink", "streamnet.examples.bench:AckSink").shuffle("src")
    return b.build(max_spout_pending=pending)


def small():
    b = TopologyBuilder("small")
    b.add_spout("src", "streamnet.examples.bench:SmallSpout")
    b.add_bolt("sink", "streamnet.examples.bench:CountSink").shuffle("src")
    return b.build(queue_size=4096)
