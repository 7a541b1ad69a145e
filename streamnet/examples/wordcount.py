"""Word count: sentences -> split -> fields-grouped count. Every sentence is a
tracked root, so a lost or failed tuple is replayed (at-least-once), and the
count bolt deduplicates by (sentence id, word position), so the counts are exact.

It survives the loss of any worker: the count bolt saves its state (counts and
the occurrences counted) every tick and acks what it counted only after the save
- so whatever was acked is in the saved state a restarted task restores - and the
spout saves which sentences completed, replaying the rest.

A count bolt may fail every N-th new tuple (`fail_every`) to exercise replay;
it fails each word occurrence at most once, as a transient fault would - a
fault that recurs on every replay of a sentence would never let it complete.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

from ..runtime import Bolt, Spout, TopologyBuilder, TopologyError

WORDS = ("storm stream bolt spout tuple worker acker anchor replay shuffle fields global "
         "zookeeper leader network gradient").split()


def sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(count)]


def expected_counts(count: int, seed: int) -> Counter:
    return Counter(w for s in sentences(count, seed) for w in s.split())


class SentenceSpout(Spout):
    outputs = ["sid", "sentence"]

    def open(self, ctx, collector):
        super().open(ctx, collector)
        mine = sentences(self.config.get("count", 1000), self.config.get("seed", 0))
        self.todo = list(range(ctx.task_index, len(mine), ctx.parallelism))[::-1]
        self.sentences = mine
        self.in_flight: set[int] = set()
        self.completed: set[int] = set()
        self.replayed = 0
        self._saved_at = time.monotonic()

    def restore(self, state):
        self.completed = set(state["completed"])
        self.replayed = state["replayed"]
        self.todo = [i for i in self.todo if i not in self.completed]

    def next_tuple(self):
        if time.monotonic() - self._saved_at > 0.5:
            self._saved_at = time.monotonic()   # a failed save is retried at the next interval
            self.ctx.save_state({"completed": sorted(self.completed), "replayed": self.replayed})
        if self.todo:
            i = self.todo.pop()
            self.in_flight.add(i)
            self.collector.emit([i, self.sentences[i]], msg_id=i)

    def ack(self, msg_id):
        self.in_flight.discard(msg_id)
        self.completed.add(msg_id)

    def fail(self, msg_id):
        self.replayed += 1
        self.in_flight.discard(msg_id)
        self.todo.append(msg_id)

    def is_done(self):
        return not self.todo and not self.in_flight

    def close(self):
        if self.is_done():
            self.ctx.publish("replayed", self.replayed)


class SplitBolt(Bolt):
    outputs = ["word", "sid", "pos"]

    def execute(self, tup):
        for pos, word in enumerate(tup["sentence"].split()):
            self.collector.emit([word, tup["sid"], pos], anchors=tup)
        self.collector.ack(tup)


class CountBolt(Bolt):
    outputs = ["word", "count"]
    tick_interval_s = 0.2

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.counts: Counter = Counter()
        self.counted: set[tuple[int, int]] = set()
        self.failed_once: set[tuple[int, int]] = set()
        self.seen = 0
        self.duplicates = 0
        self.unacked: list = []
        self.every = int(self.config.get("fail_every", 0))
        self.delay_s = float(self.config.get("delay_s", 0.0))

    async def execute(self, tup):
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        key = (tup["sid"], tup["pos"])
        if key in self.counted:
            self.duplicates += 1          # a replay of a word already counted
        else:
            self.seen += 1
            if self.every and self.seen % self.every == 0 and key not in self.failed_once:
                self.failed_once.add(key)
                self.collector.fail(tup)
                return
            self.counts[tup["word"]] += 1
            self.counted.add(key)
        self.unacked.append(tup)

    def tick(self):
        # commit, then ack: an acked word is always in the saved state
        if self.unacked:
            self.ctx.save_state(self.snapshot())
            for tup in self.unacked:
                self.collector.ack(tup)
            self.unacked.clear()

    def snapshot(self):
        return {"counts": dict(self.counts), "counted": sorted(self.counted), "duplicates": self.duplicates}

    def restore(self, state):
        self.counts = Counter(state["counts"])
        self.counted = {tuple(k) for k in state["counted"]}
        self.duplicates = state["duplicates"]

    def close(self):
        # not acked here: what was counted since the last tick is replayed wherever
        # this task runs next, and the dedup set keeps the count exact
        self.ctx.publish("counts", dict(self.counts))
        self.ctx.publish("duplicates", self.duplicates)


#: the most sentences: the spout makes all of them in open(), on its worker's event loop,
#: and saves the ids completed in the coordinator (a node holds 1 MB). 100,000,000 held
#: each worker it landed on for minutes, 1.8 GB and counting, deaf to kill and ZooKeeper
MAX_COUNT = 100_000


def topology(name: str = "wordcount", count: int = 1000, seed: int = 0, split: int = 2, counters: int = 3,
             fail_every: int = 0, delay_s: float = 0.0, **config):
    for option, value in (("count", count), ("fail_every", fail_every), ("delay_s", delay_s)):
        if value < 0:
            raise TopologyError(f"wordcount's {option} must be >= 0; got {value}")
    if count > MAX_COUNT:
        raise TopologyError(f"wordcount's count must be at most {MAX_COUNT:,} (every sentence is made when the "
                            f"spout opens, on its worker's event loop); got {count:,}")
    b = TopologyBuilder(name)
    b.add_spout("sentences", "streamnet.examples.wordcount:SentenceSpout", count=count, seed=seed)
    b.add_bolt("split", "streamnet.examples.wordcount:SplitBolt", parallelism=split).shuffle("sentences")
    b.add_bolt("count", "streamnet.examples.wordcount:CountBolt", parallelism=counters,
               fail_every=fail_every, delay_s=delay_s).fields("split", "word")
    return b.build(**config)


def merge_counts(results: dict) -> Counter:
    total: Counter = Counter()
    for key, value in results.items():
        if key.startswith("count.") and key.endswith(".counts"):
            total.update(value)
    return total
