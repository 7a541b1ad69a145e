"""A worker that receives a tuple for a task it no longer runs fails the tuple's
trees, so the spout replays them at once (not after the message timeout); one from
a sender on a newer assignment is parked until this worker applies it. Exercised
on the real Delivery with the view a TopologyRuntime holds."""
import asyncio

from streamnet.runtime.dataplane.acker import ROOT_BITS
from streamnet.runtime.dataplane.delivery import Delivery
from streamnet.runtime.dataplane.routing import View
from streamnet.runtime.messages import DataMsg, FailMsg


class Runtime:
    """The part of a TopologyRuntime that delivery reads and writes."""

    def __init__(self, version, task_worker):
        self.name, self.version, self.executors = "train", version, {}
        self.view = View("w1", version, frozenset(), task_worker, {w: "http://x" for w in task_worker.values()})
        self.parked, self.dropped, self.stale = [], 0, 0

    def park(self, msg):
        self.parked.append(msg)


def _delivery(rt):
    d = Delivery(worker_id="w1", auth=None, session=None, limits=None, runtimes={rt.name: rt},
                 on_unreachable=lambda *a: None)
    d.sent = []

    async def send(runtime, task, msg):      # what would go over the links
        d.sent.append((task, msg))
    d.send = send
    return d


def test_a_tuple_sent_on_an_older_assignment_to_a_task_that_moved_fails_its_trees():
    # assignment v2 here: the spout (task 0) on w0, the sync bolt (task 3) moved to w2
    rt = Runtime(2, {0: "w0", 2: "w3", 3: "w2"})
    d = _delivery(rt)
    root = (0 << ROOT_BITS) | 77
    contribution = DataMsg("train", 3, "default", 2, [1.0], [[root, 12345]], 1)   # sender at v1
    asyncio.run(d.receive(contribution, sender="w3"))
    assert d.dropped == 1 and not rt.parked
    assert d.sent == [(0, FailMsg("train", 0, root))]


def test_a_tuple_from_a_newer_assignment_waits_for_it_instead():
    rt = Runtime(1, {0: "w0", 3: "w0"})
    d = _delivery(rt)
    msg = DataMsg("train", 3, "default", 2, [1.0], [[5, 1]], 2)                   # sender at v2
    asyncio.run(d.receive(msg, sender="w3"))
    assert rt.parked == [msg] and d.sent == [] and d.dropped == 0
