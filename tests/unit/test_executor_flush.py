"""An executor's flush hands its peers' messages to delivery before the local ones
(their frames then go first on the shared event loop), each target's in the
order they were emitted; a bolt has the links write what it emitted once it is
about to wait."""
import asyncio
from types import SimpleNamespace

from streamnet.runtime import Spout
from streamnet.runtime.component import Bolt, Context, Tuple
from streamnet.runtime.dataplane.executor import STOP, BoltExecutor, SpoutExecutor
from streamnet.testing import until
from tests.unit.test_fenced_executor import FakeRuntime


def test_flush_delivers_to_peers_first_and_keeps_each_targets_order():
    delivered = []

    async def deliver(target, msg):
        delivered.append((target, msg))
    rt = SimpleNamespace(name="t", topology=SimpleNamespace(config={"message_timeout_s": 30, "max_spout_pending": 4}),
                         view=SimpleNamespace(local=frozenset({1, 2})), deliver=deliver)
    ctx = Context(topology="t", component="data", task=1, task_index=0, parallelism=1, worker="w0", config={},
                  component_config={}, component_tasks=lambda c: [], compute=None, publish=lambda k, v: None,
                  save_state=None)
    ex = SpoutExecutor(rt, 1, {"id": "data"}, Spout(), ctx)
    ex.out = [(1, "a"), (5, "b"), (2, "c"), (1, "d"), (6, "e"), (5, "f")]
    asyncio.run(ex.flush())
    assert delivered == [(5, "b"), (6, "e"), (5, "f"), (1, "a"), (2, "c"), (1, "d")]
    assert ex.out == []
    ex.out = [(2, "g")]              # a lone message, local or not, goes as it is
    asyncio.run(ex.flush())
    assert delivered[-1] == (2, "g")


def test_a_bolt_sends_what_it_emitted_when_it_is_about_to_wait_not_after_each_tuple():
    """BoltExecutor.run calls rt.write_now() (the links write their queued frames at once)
    when its queue is empty and it is about to wait - once after a burst of tuples, so
    what the burst emitted to a peer can share a frame."""
    class Recording(FakeRuntime):
        def __init__(self):
            super().__init__()
            self.events: list = []

        def write_now(self):
            self.events.append("write_now")

    class Counting(Bolt):
        outputs = []

        def execute(self, tup):
            rt.events.append(("execute", tup["n"]))

    rt = Recording()

    async def go():
        ex = BoltExecutor(rt, 3, {"id": "counting"}, Counting(), SimpleNamespace(), queue_size=8)
        for n in range(3):                      # a burst, queued before the bolt runs
            ex.inbound.put_nowait(Tuple([n], ["n"], "default", "src", 1, {}))
        ex.start()
        await until(lambda: rt.events.count("write_now") == 1, "the bolt to wait after its burst")
        ex.inbound.put_nowait(Tuple([3], ["n"], "default", "src", 1, {}))
        await until(lambda: rt.events.count("write_now") == 2, "the bolt to wait again")
        ex.inbound.put_nowait(STOP)
        await asyncio.wait_for(ex._task, 10)
    asyncio.run(go())
    assert rt.events == [("execute", 0), ("execute", 1), ("execute", 2), "write_now", ("execute", 3), "write_now"]
