"""flood: an endless unanchored spout into a slow bolt - for watching backpressure."""
from __future__ import annotations

import time

from ..runtime import Bolt, Spout, TopologyBuilder


class CounterSpout(Spout):
    outputs = ["n", "pad"]

    def open(self, ctx, collector):
        super().open(ctx, collector)
        self.n = 0
        self.pad = "x" * int(self.config.get("pad", 100))

    def next_tuple(self):
        self.n += 1
        self.collector.emit([self.n, self.pad])


class SlowBolt(Bolt):
    outputs = []

    def execute(self, tup):
        time.sleep(float(self.config.get("delay_s", 0.001)))  # blocks the loop: the worst case


def topology(name="flood", delay_s=0.001, sinks=1, pad=100, **config):
    b = TopologyBuilder(name)
    b.add_spout("numbers", "streamnet.examples.flood:CounterSpout", pad=pad)
    b.add_bolt("slow", "streamnet.examples.flood:SlowBolt", parallelism=sinks, delay_s=delay_s).shuffle("numbers")
    return b.build(**config)
