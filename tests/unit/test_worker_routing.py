"""A worker that receives a tuple for a task it no longer runs fails the tuple's
trees, so the spout replays them at once (not after the message timeout); one from
a sender on a newer assignment is parked until this worker applies it. Exercised
on the real Delivery with the view a TopologyRuntime holds."""
import asyncio
import types

import numpy as np

from streamnet.runtime.dataplane.acker import ROOT_BITS
from streamnet.runtime.dataplane.delivery import Delivery
from streamnet.runtime.dataplane.routing import View
from streamnet.runtime.messages import DataMsg, DataRun, FailMsg


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


def _parking_runtime():
    """A real TopologyRuntime's parking, with small bounds."""
    from streamnet.examples import bench
    from streamnet.runtime.dataplane.topology_runtime import TopologyRuntime
    worker = types.SimpleNamespace(id="w1")
    rt = TopologyRuntime(worker, "ping", bench.ping(10, 1).to_dict())
    rt.MAX_PARKED, rt.MAX_PARKED_BYTES = 5, 3000
    return rt


def test_parking_is_bounded_by_the_bytes_of_the_arrays_it_holds():
    rt = _parking_runtime()
    big = DataMsg("ping", 3, "default", 2, [np.zeros(250, np.float32), {"v": np.zeros(250, np.float32)}], [], 2)
    rt.park(big)                                     # 2,000 bytes
    rt.park(big)                                     # 4,000 would be past 3,000: dropped
    assert rt.parked == [big] and rt.dropped == 1 and rt.parked_bytes == 2000
    small = DataMsg("ping", 3, "default", 2, [1.0], [], 2)
    rt.park(small)                                   # the count bound still has room
    assert rt.parked == [big, small] and rt.dropped == 1


def test_parking_counts_the_whole_frame_a_received_array_keeps():
    """A received array is a view of its frame: a small one kept a large frame alive, and
    parking counted only the small one's bytes."""
    from streamnet.runtime import codec
    rt = _parking_runtime()                          # bounded at 3,000 bytes
    frame = codec.encode_bytes([np.zeros(2500, np.float32), np.zeros(10, np.float32)])
    small = codec.decode(frame)[1]                   # 40 bytes of a frame of 10,000 and more
    rt.park(DataMsg("ping", 3, "default", 2, [small], [], 2))
    assert rt.parked == [] and rt.dropped == 1       # it holds the frame: past the bound
    own = DataMsg("ping", 3, "default", 2, [np.zeros(10, np.float32)], [], 2)
    rt.park(own)
    assert rt.parked == [own] and rt.parked_bytes == 40           # an array of its own: its bytes
    assert codec.held_bytes([small, {"again": small}]) == codec.held_bytes(small) >= len(frame)   # once


def test_parking_counts_the_tuples_of_a_run_and_unpark_empties_it():
    rt = _parking_runtime()
    run = DataRun("ping", 3, "default", 2, [[1.0]] * 4, [[]] * 4, 2)
    rt.park(run)
    rt.park(run)                                     # 8 tuples past the bound of 5: all 4 dropped
    assert rt.parked == [run] and rt.parked_tuples == 4 and rt.dropped == 4
    assert rt.unpark() == [run]
    assert rt.parked == [] and rt.parked_tuples == rt.parked_bytes == 0
    rt.park(run)                                     # room again
    assert rt.parked == [run] and rt.dropped == 4
