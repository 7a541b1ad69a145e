"""flood: an endless unanchored spout into a slow bolt - for watching backpressure.

`crossing()` is the same flood through a slow relay on every worker into a sink on
every worker (shuffle both ways), so that tuples cross between the workers in both
directions: each relay waits on the stream to the other worker while it holds its own
queue full."""
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


class RelayBolt(Bolt):
    """SlowBolt that passes each tuple on."""
    outputs = ["n", "pad"]

    def execute(self, tup):
        time.sleep(float(self.config.get("delay_s", 0.001)))
        self.collector.emit([tup.values[0], tup.values[1]])


def topology(name="flood", delay_s=0.001, sinks=1, pad=100, **config):
    b = TopologyBuilder(name)
    b.add_spout("numbers", "streamnet.examples.flood:CounterSpout", pad=pad)
    b.add_bolt("slow", "streamnet.examples.flood:SlowBolt", parallelism=sinks, delay_s=delay_s).shuffle("numbers")
    return b.build(**config)


def crossing(name="crossing", workers=2, delay_s=0.001, pad=100, **config):
    """numbers -> relay (slow) -> sink, each with one task per worker, shuffled."""
    b = TopologyBuilder(name)
    b.add_spout("numbers", "streamnet.examples.flood:CounterSpout", parallelism=workers, pad=pad)
    b.add_bolt("relay", "streamnet.examples.flood:RelayBolt", parallelism=workers,
               delay_s=delay_s).shuffle("numbers")
    b.add_bolt("sink", "streamnet.examples.flood:SlowBolt", parallelism=workers, delay_s=0.0).shuffle("relay")
    return b.build(**config)
