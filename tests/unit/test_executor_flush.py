"""An executor's flush hands its peers' messages to delivery before the local ones
(their link tasks then run first on the shared event loop), each target's in the
order they were emitted."""
import asyncio
from types import SimpleNamespace

from streamnet.runtime import Spout
from streamnet.runtime.component import Context
from streamnet.runtime.dataplane.executor import SpoutExecutor


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
