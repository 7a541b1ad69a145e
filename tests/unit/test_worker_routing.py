"""A worker that receives a tuple for a task it no longer runs fails the tuple's
trees, so the spout replays them at once (not after the message timeout)."""
import asyncio
from types import SimpleNamespace

from streamnet.runtime.dataplane.executor import ROOT_BITS
from streamnet.runtime.worker import Worker


def _worker(rt):
    w = Worker.__new__(Worker)              # routing only: no server, no coordinator
    w.id, w.runtimes, w.dropped, w.sent = "w1", {rt.name: rt}, 0, []

    async def deliver(runtime, task, msg):
        w.sent.append((task, msg))
    w.deliver = deliver
    return w


def test_a_tuple_sent_on_an_older_assignment_to_a_task_that_moved_fails_its_trees():
    # assignment v2 here: the spout (task 0) on w0, the sync bolt (task 3) moved to w2
    rt = SimpleNamespace(name="train", version=2, executors={}, task_worker={0: "w0", 2: "w3", 3: "w2"},
                         parked=[], park=lambda m: rt.parked.append(m))
    w = _worker(rt)
    root = (0 << ROOT_BITS) | 77
    contribution = ["t", "train", 3, "default", 2, [1.0], [[root, 12345]], 1]   # sender at v1
    asyncio.run(w._dispatch(contribution, sender="w3"))
    assert w.dropped == 1 and not rt.parked
    assert w.sent == [(0, ["f", "train", 0, root])]


def test_a_tuple_from_a_newer_assignment_waits_for_it_instead():
    rt = SimpleNamespace(name="train", version=1, executors={}, task_worker={0: "w0", 3: "w0"},
                         parked=[], park=lambda m: rt.parked.append(m))
    w = _worker(rt)
    msg = ["t", "train", 3, "default", 2, [1.0], [[5, 1]], 2]                   # sender at v2
    asyncio.run(w._dispatch(msg, sender="w3"))
    assert rt.parked == [msg] and w.sent == [] and w.dropped == 0
