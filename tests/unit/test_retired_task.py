"""A task instance that moved away publishes nothing more: the instance that runs the
task now publishes the same keys, and a late write of the old one's (a worker cut off
from the coordinator writes late) would replace a finished run's results."""
import asyncio
import types

from streamnet.examples import bench
from streamnet.runtime.assignment import Assignment
from streamnet.runtime.component import Context
from streamnet.runtime.dataplane.topology_runtime import TopologyRuntime


def _context(published: list, task: int = 1) -> Context:
    return Context(topology="t", component="echo", task=task, task_index=0, parallelism=1, worker="w1", config={},
                   component_config={}, component_tasks=lambda c: range(1), compute=None,
                   publish=lambda k, v: published.append((k, v)), save_state=lambda s: None)


def test_a_retired_context_drops_what_it_publishes():
    published = []
    ctx = _context(published)
    ctx.publish("stats", 1)
    ctx.retire()
    ctx.publish("stats", 2)
    assert published == [("echo.0.stats", 1)]


class FakeExecutor:
    _task = None

    def __init__(self, ctx):
        self.ctx = ctx

    def start(self):
        pass


def test_a_task_placed_elsewhere_is_retired_and_one_that_stays_is_not():
    worker = types.SimpleNamespace(id="w1", load=types.SimpleNamespace(forget=lambda *a: None))
    rt = TopologyRuntime(worker, "ping", bench.ping(10, 1).to_dict())
    moving, staying = FakeExecutor(_context([], 1)), FakeExecutor(_context([], 2))
    rt.executors = {1: moving, 2: staying}
    urls = {"w0": "http://w0", "w1": "http://w1", "w2": "http://w2"}
    asyncio.run(rt.apply(Assignment(tasks={0: "w0", 1: "w2", 2: "w1"}, workers=urls), 1))
    assert moving.ctx.retired and not staying.ctx.retired
    assert set(rt.executors) == {2}
