"""What a fenced bolt instance does with the tuples it took and the ones still queued."""
import asyncio
from types import SimpleNamespace

from streamnet.runtime.component import Tuple
from streamnet.runtime.dataplane import inbox as inbox_module
from streamnet.runtime.dataplane.acker import ROOT_BITS
from streamnet.runtime.dataplane.executor import BoltExecutor
from streamnet.runtime.dataplane.topology_runtime import TopologyRuntime
from streamnet.runtime.messages import DataMsg, FailMsg


class FakeRuntime:
    """What an executor needs of its runtime: a name and somewhere to deliver."""
    name = "t"
    view = SimpleNamespace(local=frozenset())     # no task of it is on this worker

    def __init__(self):
        self.sent: list = []
        self.executors: dict = {}

    async def deliver(self, target, msg):
        self.sent.append((target, msg))

    def write_now(self):
        pass                    # nothing is queued on links here

    def release_holds(self, task, inbox):
        self.released = getattr(self, "released", []) + sorted(inbox.released())

    hand_over_queue = TopologyRuntime.hand_over_queue
    _stop_executor = TopologyRuntime._stop_executor


def _bolt(rt, task=3):
    return BoltExecutor(rt, task, {"id": "count"}, object(), None, queue_size=8)


def _tup(root_task: int, root: int) -> Tuple:
    return Tuple([root], ["n"], "default", "split", 1, {(root_task << ROOT_BITS) | root: 7})


def _failed_roots(rt):
    return sorted(m.root & ((1 << ROOT_BITS) - 1) for _, m in rt.sent if isinstance(m, FailMsg))


def test_fenced_instance_fails_what_it_held_and_sends_nothing_it_emitted():
    async def go():
        rt = FakeRuntime()
        old = _bolt(rt)
        held = [_tup(0, 1), _tup(0, 2)]
        for t in held:
            old.holding[id(t)] = t
        old.ack(held[1])                                   # acked before the fence: not failed
        old.out.clear()
        old.out.append((5, DataMsg("t", 5, "default", 3, [1], [], 0)))   # emitted, then fenced
        await old.abandon()
        return rt
    rt = asyncio.run(go())
    assert [type(m) for _, m in rt.sent] == [FailMsg] and _failed_roots(rt) == [1]


def test_tuples_late_for_a_fenced_instance_go_to_its_successor_or_are_failed():
    async def go():
        rt = FakeRuntime()
        old, new = _bolt(rt), _bolt(rt)
        old.inbound.put_nowait(_tup(0, 10))
        rt.executors[3] = new
        moved = old.take_queue()                           # the restart hands the queue over
        assert [t.values for t in moved] == [[10]] and old.queue_taken
        old.inbound.put_nowait(_tup(0, 11))                # a delivery that waited for room
        await rt.hand_over_queue(old)
        assert new.inbound.get_nowait().values == [11] and old.inbound.empty()
        rt.executors[3] = old                              # no successor here: replay instead
        old.inbound.put_nowait(_tup(0, 12))
        await rt.hand_over_queue(old)
        return rt, old
    rt, old = asyncio.run(go())
    assert _failed_roots(rt) == [12] and old.inbound.empty()


def test_a_queue_and_overflow_larger_than_the_successors_queue_go_over_at_once_in_order():
    """A hand-over that waited for room in the new queue let tuples arriving meanwhile
    from the same sources go first (into the overflow, which the queue takes first)."""
    async def go():
        rt = FakeRuntime()
        old, new = _bolt(rt), _bolt(rt)
        old.inbound.spill([_tup(0, r) for r in range(12)])   # 8 queued, 4 in the overflow
        assert len(old.inbound.overflow) == 4
        rt.executors[3] = new
        await asyncio.wait_for(rt.hand_over_queue(old), 30)
        new.inbound.spill([_tup(0, 99)])                     # arrives after the hand-over
        return [new.inbound.get_nowait().values[0] for _ in range(13)]
    assert asyncio.run(go()) == list(range(12)) + [99]


def test_a_bolt_cancelled_at_its_stop_fails_its_queue_and_overflow_releases_its_senders_and_frees_a_stream(
        monkeypatch):
    """A stream waiting for room in the overflow of a bolt cancelled at its stop waited
    for ever (only a tuple taken made room), and its senders stayed held."""
    monkeypatch.setattr(inbox_module, "OVERFLOW_TUPLES", 2)
    monkeypatch.setattr(inbox_module, "MAX_HOLD_S", 3600.0)

    async def go():
        rt = FakeRuntime()
        ex = _bolt(rt)
        ex.inbound.spill([_tup(0, r) for r in range(10)])     # 8 queued, 2 in the overflow: at its bound
        ex.inbound.tell("w0")
        stream = asyncio.get_running_loop().create_task(ex.inbound.overflow_room())
        ex._task = asyncio.get_running_loop().create_task(asyncio.Event().wait())   # a bolt that never stops
        await rt._stop_executor(ex, timeout=0.1)
        await asyncio.wait_for(stream, 30)
        return rt, ex
    rt, ex = asyncio.run(go())
    assert _failed_roots(rt) == list(range(10)) and ex.inbound.empty() and ex.queue_taken
    assert rt.released == ["w0"] and ex.inbound.told == {}
