"""A bolt's tick runs between its tuples, never during one: when due before the next
tuple, and - the bolt idle - when a timer wakes it (BoltExecutor.run)."""
import asyncio
import time
from types import SimpleNamespace

from streamnet.runtime.component import Bolt, Tuple
from streamnet.runtime.dataplane.executor import STOP, BoltExecutor
from tests.unit.test_fenced_executor import FakeRuntime

TICK_S = 0.05


class TickingBolt(Bolt):
    outputs = []
    tick_interval_s = TICK_S

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, float]] = []
        self.executing = False

    async def execute(self, tup):
        self.executing = True
        self.events.append(("tuple", time.monotonic()))
        await asyncio.sleep(tup["hold_s"])            # a round computing elsewhere
        self.executing = False
        self.collector.ack(tup)

    def tick(self):
        assert not self.executing, "a tick ran inside execute"
        self.events.append(("tick", time.monotonic()))


def _tup(hold_s: float) -> Tuple:
    return Tuple([hold_s], ["hold_s"], "default", "src", 1, {})


async def _until(condition, deadline_s: float = 10.0):
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.005)


def _run(feed):
    async def go():
        bolt = TickingBolt()
        ex = BoltExecutor(FakeRuntime(), 3, {"id": "ticking"}, bolt, SimpleNamespace(), queue_size=64)
        ex.start()
        try:
            await feed(ex, bolt)
        finally:
            ex.inbound.put_nowait(STOP)
            await asyncio.wait_for(ex._task, 10)
        return bolt.events
    return asyncio.run(go())


def test_an_idle_bolt_is_woken_for_its_ticks():
    async def feed(ex, bolt):
        await _until(lambda: sum(e == "tick" for e, _ in bolt.events) >= 3)
        assert ex.inbound.empty()       # woken from the queue's wait, nothing left behind
    events = _run(feed)
    ticks = [t for e, t in events if e == "tick"]
    assert all(b - a >= TICK_S * 0.9 for a, b in zip(ticks, ticks[1:]))    # once an interval, not in a spin


def test_a_busy_bolt_ticks_between_its_tuples():
    async def feed(ex, bolt):
        # tuples always waiting: the queue never empties while they last
        for _ in range(12):
            ex.inbound.put_nowait(_tup(TICK_S / 2))
        await _until(lambda: sum(e == "tuple" for e, _ in bolt.events) == 12 and not bolt.executing)
    events = _run(feed)
    kinds = [e for e, _ in events]
    assert kinds.count("tuple") == 12
    first, last = kinds.index("tuple"), len(kinds) - 1 - kinds[::-1].index("tuple")
    assert kinds[first:last].count("tick") >= 2      # 12 x 25 ms of tuples: due about every second one
