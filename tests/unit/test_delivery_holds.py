"""Backpressure per task (inbox.py, delivery.py): a bolt's full queue keeps what other
workers send it in an overflow, in order, and tells them to hold that task's tuples;
their emitters to it wait until released, while everything else they send goes on."""
import asyncio

import numpy as np
import pytest

from streamnet.runtime.codec import CodecError
from streamnet.runtime.component import Tuple
from streamnet.runtime.dataplane import delivery as delivery_module
from streamnet.runtime.dataplane import inbox as inbox_module
from streamnet.runtime.dataplane.delivery import Delivery
from streamnet.runtime.dataplane.inbox import Inbox
from streamnet.runtime.dataplane.routing import View
from streamnet.runtime.messages import AckMsg, DataMsg, HoldMsg, from_wire, to_wire_all
from streamnet.testing import until


def _tup(n, size=0):
    values = [n, np.zeros(size // 4, dtype=np.float32)] if size else [n]
    return Tuple(values, ["n", "x"][:len(values)], "default", "src", 1, {})


def test_a_hold_travels_as_a_checked_wire_message():
    for held in (True, False):
        msg = HoldMsg("train", 3, held)
        assert from_wire(to_wire_all([msg])[0]) == msg
    for bad in (["h", "train", 3, 2], ["h", "train", 3, True], ["h", "train", 3], ["h", "train", 3, 1, 0],
                ["h", "train", "3", 1]):
        with pytest.raises(CodecError):
            from_wire(bad)


@pytest.fixture
def slow_clock(monkeypatch):
    """Holds that neither lapse nor are said again within a test, however slow the host."""
    monkeypatch.setattr(inbox_module, "RETELL_S", 3600.0)
    monkeypatch.setattr(inbox_module, "MAX_HOLD_S", 3600.0)
    monkeypatch.setattr(delivery_module, "HOLD_LEASE_S", 3600.0)


def test_the_overflow_refills_the_queue_in_order_and_the_senders_are_released_once_it_is_low(slow_clock):
    released = []
    q = Inbox(4, on_release=lambda inbox: released.append(sorted(inbox.released())))
    assert (q.high, q.low) == (3, 2)
    q.spill([_tup(i) for i in range(7)])
    assert q.qsize() == 4 and [t["n"] for t, _ in q.overflow] == [4, 5, 6] and q.most_overflow == 3
    assert q.above_high() and not q.has_room(1) and not q.empty()
    assert q.tell("w0") and not q.tell("w0") and q.tell("w2")        # once each, within RETELL_S
    got = [q.get_nowait()["n"] for _ in range(4)]
    assert got == [0, 1, 2, 3] and q.qsize() == 3 and not q.overflow and released == []   # full, then 3
    assert q.get_nowait()["n"] == 4 and released == [["w0", "w2"]] and q.told == {}       # down to 2
    assert [q.get_nowait()["n"] for _ in range(2)] == [5, 6] and q.empty() and len(released) == 1
    assert q.has_room(4) and not q.has_room(5)


def test_held_senders_are_released_after_max_hold_s_whatever_the_queue(monkeypatch, slow_clock):
    """Local emitters, woken as each tuple is taken, could keep the queue above LOW for ever."""
    released = []
    q = Inbox(4, on_release=lambda inbox: released.append(sorted(inbox.released())))
    q.spill([_tup(i) for i in range(4)])
    q.tell("w0")
    q.get_nowait()
    q.put_nowait(_tup(9))                   # a local emitter fills it again
    assert released == []
    monkeypatch.setattr(inbox_module, "MAX_HOLD_S", 0.0)
    q.get_nowait()
    assert released == [["w0"]]


def test_the_overflow_is_bounded_in_tuples_and_in_array_bytes(monkeypatch):
    q = Inbox(1)
    monkeypatch.setattr(inbox_module, "OVERFLOW_BYTES", 1000)
    q.spill([_tup(0), _tup(1, size=600)])
    assert not q.overflow_full() and q.overflow_bytes == 600
    q.spill([_tup(2, size=600)])
    assert q.overflow_full() and q.overflow_bytes == 1200
    q.get_nowait()                       # 1 moves into the queue: 600 bytes left
    assert not q.overflow_full() and q.overflow_bytes == 600
    monkeypatch.setattr(inbox_module, "OVERFLOW_TUPLES", 1)
    assert q.overflow_full()
    nested = Tuple([3, [np.zeros(100, dtype=np.float32)], {"w": np.zeros(50, dtype=np.float32)}],
                   ["n", "x", "y"], "default", "src", 1, {})
    q.spill([nested, Tuple(["abc", b"de"], ["s", "b"], "default", "src", 1, {})])
    assert q.overflow_bytes == 600 + 600 + 5       # arrays inside lists and maps, strings and bytes count too


class _Link:
    def __init__(self):
        self.queue = asyncio.Queue(8)


class _Runtime:
    def __init__(self, name="train"):
        self.name, self.dropped = name, 0
        # task 3 (a bolt) and task 0 (a spout) on w0; this worker is w1
        self.view = View("w1", 2, frozenset(), {0: "w0", 3: "w0", 4: "w2"}, {"w0": "u0", "w2": "u2"})


def _delivery(rt=None):
    """A Delivery on w1 running `rt` (a _Runtime by default, named "train"), whose links are
    recorded: peer -> _Link."""
    rt = rt or _Runtime()
    d = Delivery(worker_id="w1", auth=None, session=None, limits=None, runtimes={rt.name: rt},
                 on_unreachable=lambda *a: None)
    links = {}
    d.link = lambda peer, url: links.setdefault(peer, _Link())
    return d, links, rt


def _data(target, n):
    return DataMsg("train", target, "default", 9, [n], [], 2)


async def _passes(n=10):
    for _ in range(n):
        await asyncio.sleep(0)                  # passes of the loop: nothing else runs


def test_emitters_to_a_held_task_wait_for_its_release_and_nothing_else_does(slow_clock):
    async def go():
        d, links, rt = _delivery()
        d.receive_now(HoldMsg("train", 3, True), sender="w0")
        assert d.holds_status() == {"now": ["w0/train[3]"], "told": 1, "lapsed": 0}
        held = asyncio.get_running_loop().create_task(d.send(rt, 3, _data(3, 1)))
        await d.send(rt, 0, AckMsg("train", 0, 5, 6))          # an ack to a spout on w0 goes at once
        await _passes()
        assert not held.done() and [m.target for m in links["w0"].queue._queue] == [0]
        d.receive_now(HoldMsg("train", 3, False), sender="w0")
        await asyncio.wait_for(held, 30)
        assert [m.target for m in links["w0"].queue._queue] == [0, 3] and d.held == {}
    asyncio.run(go())


def test_a_new_stream_from_the_peer_ends_its_holds(slow_clock):
    async def go():
        d, links, rt = _delivery()
        d.receive_now(HoldMsg("train", 3, True), sender="w0")
        d.receive_now(HoldMsg("train", 4, True), sender="w2")
        held = asyncio.get_running_loop().create_task(d.send(rt, 3, _data(3, 1)))
        await _passes()
        assert not held.done()
        d.peer_restarted("w0")                  # the release may have been lost with the old stream
        await asyncio.wait_for(held, 30)
        assert links["w0"].queue.qsize() == 1 and list(d.held) == [("w2", "train", 4)]
    asyncio.run(go())


def test_holds_end_with_their_topology_here(slow_clock):
    async def go():
        d, _, _ = _delivery()
        d.runtimes["other"] = _Runtime("other")
        d.receive_now(HoldMsg("train", 3, True), sender="w0")
        d.receive_now(HoldMsg("other", 3, True), sender="w0")
        fut = d.held[("w0", "train", 3)][0]
        d.forget("train")
        assert fut.done() and list(d.held) == [("w0", "other", 3)]
    asyncio.run(go())


def test_a_stale_hold_is_ignored():
    """A hold for a topology not here (killed, then submitted again), or for a task our
    assignment places elsewhere, would hold emitters that nobody will release."""
    async def go():
        d, _, _ = _delivery()
        d.receive_now(HoldMsg("gone", 3, True), sender="w0")     # no such topology here
        d.receive_now(HoldMsg("train", 4, True), sender="w0")    # task 4 is w2's
        d.receive_now(HoldMsg("train", 3, False), sender="w0")   # a release with no hold: nothing
        assert d.held == {} and d.holds == 0
    asyncio.run(go())


def test_a_hold_said_again_lasts_longer_and_one_not_said_again_lapses(monkeypatch):
    """A release lost with a stream, or one an instance stopped before sending, held its
    senders' emitters for ever."""
    async def go():
        d, links, rt = _delivery()
        loop = asyncio.get_running_loop()
        d.receive_now(HoldMsg("train", 3, True), sender="w0")
        first = d.held[("w0", "train", 3)][1]
        await asyncio.sleep(0.01)
        d.receive_now(HoldMsg("train", 3, True), sender="w0")    # said again: renewed, not counted again
        assert d.held[("w0", "train", 3)][1] > first and d.holds == 1
        monkeypatch.setattr(delivery_module, "HOLD_LEASE_S", 0.05)
        d.receive_now(HoldMsg("train", 3, True), sender="w0")    # the last word: lapses 0.05 s on
        t0 = loop.time()
        await asyncio.wait_for(d.send(rt, 3, _data(3, 1)), 30)
        return loop.time() - t0, links["w0"].queue.qsize(), d
    waited, queued, d = asyncio.run(go())
    assert 0 < waited and queued == 1 and d.held == {} and d.holds_status()["lapsed"] == 1


def test_a_hold_is_said_again_while_it_lasts_and_no_longer_once_released_or_its_instance_is_gone(monkeypatch):
    monkeypatch.setattr(delivery_module, "HOLD_LEASE_S", 0.04)     # said again every 0.02 s
    monkeypatch.setattr(inbox_module, "RETELL_S", 3600.0)

    class Bolt:
        task, inbound, queue_taken = 3, Inbox(4), False

    async def go():
        d, _, rt = _delivery()
        told = []
        d._signal = lambda rt, peer, msg: told.append((peer, msg.held))
        rt.executors = {3: Bolt}
        d._tell_hold(rt, Bolt, "w0")
        await until(lambda: len(told) >= 3, "the hold said twice more")
        assert set(told) == {("w0", True)}
        d.release(rt, 3, Bolt.inbound)
        n = len(told)
        await asyncio.sleep(0.1)                 # long enough for two more, were it still said
        assert told[n - 1:] == [("w0", False)] and Bolt.inbound.renewal is None
        d._tell_hold(rt, Bolt, "w2")
        rt.executors = {}                        # the instance stopped or moved: its holds lapse
        n = len(told)
        await asyncio.sleep(0.1)
        assert len(told) == n and Bolt.inbound.renewal is None
    asyncio.run(go())


def test_a_tuple_held_for_a_task_that_moves_goes_to_its_new_worker(monkeypatch, slow_clock):
    monkeypatch.setattr(delivery_module, "HELD_CHECK_S", 0.01)

    async def go():
        d, links, rt = _delivery()
        d.receive_now(HoldMsg("train", 3, True), sender="w0")
        held = asyncio.get_running_loop().create_task(d.send(rt, 3, _data(3, 1)))
        await _passes()
        assert not held.done()
        rt.view = View("w1", 3, frozenset(), {0: "w0", 3: "w2", 4: "w2"}, {"w0": "u0", "w2": "u2"})
        await asyncio.wait_for(held, 30)
        # and the hold is gone: were the task to come back to w0, nobody would release it
        assert "w0" not in links and links["w2"].queue.qsize() == 1 and d.held == {}
    asyncio.run(go())


def test_a_sender_is_told_to_hold_once_and_again_if_its_tuples_keep_coming(monkeypatch, slow_clock):
    class Bolt:
        task, inbound = 3, Inbox(4)

    async def go():
        d, _, rt = _delivery()
        told = []
        d._signal = lambda rt, peer, msg: told.append((peer, msg))
        d._tell_hold(rt, Bolt, "w0")
        d._tell_hold(rt, Bolt, "w0")                     # within RETELL_S: not again
        d._tell_hold(rt, Bolt, "w2")
        monkeypatch.setattr(inbox_module, "RETELL_S", 0.0)
        d._tell_hold(rt, Bolt, "w0")                     # the hold may have been lost: told again
        assert told == [("w0", HoldMsg("train", 3, True)), ("w2", HoldMsg("train", 3, True)),
                        ("w0", HoldMsg("train", 3, True))]
        d.release(rt, 3, Bolt.inbound)
        assert told[3:] == [("w0", HoldMsg("train", 3, False)), ("w2", HoldMsg("train", 3, False))]
        assert Bolt.inbound.told == {} and Bolt.inbound.renewal is None
    asyncio.run(go())
