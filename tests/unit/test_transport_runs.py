"""Runs of tuples (messages.to_wire_all): consecutive tuples of a frame with one header
go as one wire entry, and the receiver checks, routes and delivers them as one - in
order, each a tuple of its own, and refused whole when any part is malformed."""
import asyncio
import os

import aiohttp
import pytest

from streamnet.runtime import codec
from streamnet.runtime.codec import CodecError
from streamnet.runtime.dataplane import routing
from streamnet.runtime.dataplane.acker import ROOT_BITS
from streamnet.runtime.dataplane.delivery import Delivery
from streamnet.runtime.dataplane import inbox as inbox_module
from streamnet.runtime.dataplane.executor import BoltExecutor
from streamnet.runtime.dataplane.inbox import Inbox
from streamnet.runtime.dataplane.routing import View
from streamnet.runtime.dataplane.transport import Auth
from streamnet.runtime.messages import AckMsg, DataMsg, DataRun, FailMsg, HoldMsg, from_wire, to_wire_all
from streamnet.testing import until


def _t(i, target=3, anchors=(), version=2, stream="default"):
    return DataMsg("train", target, stream, 1, [i], [list(a) for a in anchors], version)


def test_consecutive_tuples_with_one_header_travel_as_a_run_and_the_rest_as_before():
    msgs = [_t(0), _t(1, anchors=[(7, 8)]), _t(2), AckMsg("train", 0, 7, 9), _t(3), _t(4, target=4),
            _t(5, stream="other"), _t(6, stream="other")]
    wire = to_wire_all(msgs)
    assert [w[0] for w in wire] == ["T", "a", "t", "t", "T"]
    got = [from_wire(w) for w in wire]
    assert got[0] == DataRun("train", 3, "default", 1, [[0], [1], [2]], [[], [[7, 8]], []], 2)
    assert got[1:4] == msgs[3:6]
    assert len(got[4]) == 2 and got[4].stream == "other"


@pytest.mark.parametrize("bad", [
    ["T", "train", 3, "default", 1, 2, [[0], [1]], [[]]],              # fewer anchors than tuples
    ["T", "train", 3, "default", 1, 2, [[0], 5], [[], []]],            # a tuple's values not a list
    ["T", "train", 3, "default", 1, 2, [[0]], [0]],                    # anchors not a list
    ["T", "train", 3, "default", 1, 2, [[0]], [[[1, "x"]]]],           # an edge not an int
    ["T", "train", 3, "default", 1, "2", [[0]], [[]]],                 # a version not an int
    ["T", "train", 3, "default", 1, 2, [[0]]],                         # a field missing
])
def test_a_malformed_run_is_refused_whole(bad):
    with pytest.raises(CodecError):
        from_wire(bad)


def test_a_message_nested_thousands_deep_is_a_codec_error():
    """Its error text was str(msg), which raised RecursionError: past the stream's CodecError
    handling, aiohttp wrote a 500 into the frame stream and logged a traceback per message."""
    deep = []
    for _ in range(5000):
        deep = [deep]
    for bad in (["x", "a", 0, deep], ["a", "train", 0, deep, 1]):
        with pytest.raises(CodecError, match=r"malformed message \[.*\.\.\."):
            from_wire(bad)


def test_a_run_is_routed_once_as_its_tuples_would_be():
    view = View("w1", 2, frozenset({3}), {1: "w0", 3: "w1", 5: "w2"}, {"w0": "u", "w2": "v"})
    run = DataRun("train", 3, "default", 1, [[0], [1]], [[], []], 2)
    assert routing.inbound(run, view, "w0") == routing.DELIVER
    assert routing.inbound(run, view, "w2") == routing.STALE                 # its source is placed on w0
    moved = DataRun("train", 5, "default", 1, [[0], [1]], [[], []], 3)
    assert routing.inbound(moved, view, "w0") == routing.PARK                # from a newer assignment
    root = (1 << ROOT_BITS) | 9
    old = DataRun("train", 5, "default", 1, [[0], [1]], [[[root, 1]], [[root, 2]]], 1)
    assert routing.inbound(old, view, "w0") == routing.FAIL_ROOTS
    assert routing.failures(old, view) == [FailMsg("train", 1, root)]       # one per tree, not per tuple


class _Runtime:
    def __init__(self):
        self.name, self.version = "train", 2
        self.view = View("w1", 2, frozenset({3}), {1: "w0", 3: "w1"}, {"w0": "u"})
        self.task_cid, self.fields = {1: "src"}, {"src": {"default": ["n"]}}
        self.parked, self.dropped, self.stale = [], 0, 0


def _delivery(rt):
    """A Delivery to one bolt, task 3, whose signals to other workers are recorded."""
    bolt = BoltExecutor.__new__(BoltExecutor)       # its queue is all delivery touches
    bolt.queue_taken, bolt.task = False, 3
    d = Delivery(worker_id="w1", auth=None, session=None, limits=None, runtimes={"train": rt},
                 on_unreachable=lambda *a: None)
    signals = []
    d._signal = lambda rt, peer, msg: signals.append((peer, msg))
    rt.executors = {3: bolt}
    return d, bolt, signals


def test_a_run_reaches_its_bolt_as_tuples_in_order_with_their_anchors(monkeypatch):
    monkeypatch.setattr(inbox_module, "MAX_HOLD_S", 3600.0)
    rt = _Runtime()
    d, bolt, signals = _delivery(rt)

    async def go():
        # smaller than the run: the rest waits in the overflow, the sender is told to hold
        bolt.inbound = Inbox(2, on_release=lambda inbox: d.release(rt, 3, inbox))
        await asyncio.wait_for(d.receive(DataRun("train", 3, "default", 1, [[0], [1], [2]],
                                                 [[], [[7, 8]], []], 2), sender="w0"), 30)
        assert bolt.inbound.qsize() == 2 and len(bolt.inbound.overflow) == 1
        assert signals == [("w0", HoldMsg("train", 3, True))]
        return [await asyncio.wait_for(bolt.inbound.get(), 30) for _ in range(3)]
    tuples = asyncio.run(go())
    assert [t["n"] for t in tuples] == [0, 1, 2]
    assert [t.anchors for t in tuples] == [{}, {7: 8}, {}]
    assert rt.dropped == 0
    assert signals[1:] == [("w0", HoldMsg("train", 3, False))]     # released: the overflow empty, the queue low


def test_receive_now_delivers_what_fits_spills_the_rest_and_leaves_the_rest_to_receive(monkeypatch):
    monkeypatch.setattr(inbox_module, "RETELL_S", 3600.0)      # "not told again so soon", whatever the host
    monkeypatch.setattr(inbox_module, "MAX_HOLD_S", 3600.0)

    async def go():  # holds are said again on a timer of the running loop
        rt = _Runtime()
        d, bolt, signals = _delivery(rt)
        bolt.inbound = Inbox(4, on_release=lambda inbox: d.release(rt, 3, inbox))    # hold at 3, release at 2
        run = DataRun("train", 3, "default", 1, [[0], [1]], [[], [[7, 8]]], 2)
        assert d.receive_now(run, sender="w0")                       # room for both: delivered at once
        assert bolt.inbound.qsize() == 2 and signals == []
        assert d.receive_now(_t(2), sender="w0")                     # 3 of 4: the sender is told to hold
        assert signals == [("w0", HoldMsg("train", 3, True))]
        assert [bolt.inbound.get_nowait()["n"] for _ in range(2)] == [0, 1]      # down to 2: released
        assert signals[1:] == [("w0", HoldMsg("train", 3, False))]
        bolt.inbound.put_nowait("x")
        bolt.inbound.put_nowait("y")
        del signals[:]
        assert d.receive_now(run, sender="w0")                       # room for one of two: the other overflows
        assert bolt.inbound.qsize() == 4 and [t["n"] for t, _ in bolt.inbound.overflow] == [1]
        assert signals == [("w0", HoldMsg("train", 3, True))] and rt.dropped == 0
        assert d.receive_now(_t(9), sender="w0")                     # behind it, in order; not told again so soon
        assert [t["n"] for t, _ in bolt.inbound.overflow] == [1, 9] and len(signals) == 1
        monkeypatch.setattr(inbox_module, "OVERFLOW_TUPLES", 2)
        assert not d.receive_now(_t(10), sender="w0")                # the overflow at its bound: the slow way
        assert len(bolt.inbound.overflow) == 2
        bolt.inbound = Inbox(3)
        bolt.queue_taken = True                                      # a fenced instance's queue: the slow way
        assert not d.receive_now(_t(5), sender="w0") and bolt.inbound.empty()
        moved = DataMsg("train", 4, "default", 1, [0], [[(0 << ROOT_BITS) | 9, 1]], 2)   # not here, not newer
        assert not d.receive_now(moved, sender="w0") and d.dropped == 0   # its trees fail: that may wait
        assert d.receive_now(_t(6, version=1), sender="w2")          # stale (task 1 is w0's): dropped at once
        assert rt.stale == 1
        assert d.receive_now(DataMsg("other", 3, "default", 1, [0], [], 2), sender="w0") and d.dropped == 1
    asyncio.run(go())


async def _waiting_at_the_bound(d, bolt):
    """A stream's receive() of tuple 2, waiting: bolt's queue of 1 holds tuple 0 and its
    overflow (OVERFLOW_TUPLES patched to 1) tuple 1."""
    bolt.inbound = Inbox(1)
    assert d.receive_now(_t(0), sender="w0") and d.receive_now(_t(1), sender="w0")
    waiting = asyncio.get_running_loop().create_task(d.receive(_t(2), sender="w0"))
    for _ in range(10):                                     # passes of the loop: nothing else runs
        await asyncio.sleep(0)
    assert not waiting.done()                               # queue and overflow full: the stream waits
    return waiting


def test_a_stream_waits_for_an_overflow_at_its_bound(monkeypatch):
    monkeypatch.setattr(inbox_module, "OVERFLOW_TUPLES", 1)
    rt = _Runtime()
    d, bolt, signals = _delivery(rt)

    async def go():
        waiting = await _waiting_at_the_bound(d, bolt)
        first = bolt.inbound.get_nowait()                        # 1 moves up from the overflow: room for 2
        await asyncio.wait_for(waiting, 30)
        return [first["n"], bolt.inbound.get_nowait()["n"], bolt.inbound.get_nowait()["n"]]
    assert asyncio.run(go()) == [0, 1, 2]


def test_a_stream_that_waited_for_an_overflow_routes_its_message_again(monkeypatch):
    """The task moved while the stream waited: its tuple went into the old instance's
    overflow, where nobody would take it."""
    monkeypatch.setattr(inbox_module, "OVERFLOW_TUPLES", 1)
    rt = _Runtime()
    d, bolt, signals = _delivery(rt)

    async def go():
        waiting = await _waiting_at_the_bound(d, bolt)
        rt.view = View("w1", 2, frozenset(), {1: "w0", 3: "w2"}, {"w0": "u", "w2": "v"})   # task 3 moved
        rt.executors = {}
        bolt.inbound.get_nowait()                                # the old instance takes one: room
        await asyncio.wait_for(waiting, 30)
    asyncio.run(go())
    assert [t["n"] for t in bolt.inbound._queue] == [1] and not bolt.inbound.overflow   # not into the old one
    assert d.dropped == 1                                        # unanchored, for a task not here: dropped


def test_links_to_workers_no_assignment_names_are_closed():
    """A link to a worker that left for good reconnected every 2 s for the life of the
    process, holding what was queued to it."""
    async def go():
        async with aiohttp.ClientSession() as session:
            d = Delivery(worker_id="w0", auth=Auth(os.urandom(32), "w0"), session=session,
                         limits=codec.DEFAULT_LIMITS, runtimes={}, on_unreachable=lambda *a: None)
            gone, kept = d.link("w8", "http://127.0.0.1:1"), d.link("w9", "http://127.0.0.1:1")
            await gone.send(AckMsg("t", 0, 1, 1))
            d.prune({"w9"})
            assert list(d.links) == ["w9"]
            await until(lambda: gone._task.done(), "the link to w8 to stop", timeout=10)
            assert not kept._task.done()
            await d.close()
            return kept._task.done()
    assert asyncio.run(go())
