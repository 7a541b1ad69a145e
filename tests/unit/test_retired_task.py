"""A stale task instance - its task placed elsewhere while its worker's session
expired - publishes nothing more: the instance that runs the task now publishes the
same keys, and a late write of the stale one's (a worker cut off from the coordinator
writes late) would replace a finished run's results."""
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
    session = 0

    def __init__(self, ctx):
        self.ctx = ctx

    def start(self):
        pass


def _moved(session_expired: bool):
    """Task 1 placed elsewhere, task 2 staying, on a worker whose session expired or not."""
    worker = types.SimpleNamespace(id="w1", load=types.SimpleNamespace(forget=lambda *a: None), sessions=0)
    rt = TopologyRuntime(worker, "ping", bench.ping(10, 1).to_dict())
    moving, staying = FakeExecutor(_context([], 1)), FakeExecutor(_context([], 2))
    rt.executors = {1: moving, 2: staying}
    if session_expired:
        worker.sessions += 1
    urls = {"w0": "http://w0", "w1": "http://w1", "w2": "http://w2"}
    asyncio.run(rt.apply(Assignment(tasks={0: "w0", 1: "w2", 2: "w1"}, workers=urls), 1))
    assert set(rt.executors) == {2}
    return moving, staying


def test_a_task_placed_elsewhere_while_the_session_expired_is_retired_and_one_that_stays_is_not():
    moving, staying = _moved(session_expired=True)
    assert moving.ctx.retired and not staying.ctx.retired


def test_a_task_moved_live_still_publishes_as_it_stops():
    # a balancing move: the instance stopped here may be the only one that ever publishes
    # (its successor may fail to start), as before
    moving, staying = _moved(session_expired=False)
    assert not moving.ctx.retired and not staying.ctx.retired


def test_an_instance_kept_here_across_an_expiry_and_moved_live_later_still_publishes():
    """The session expired but the new session's assignment kept the task here (the
    leader's grace): the instance is current, and a later balancing move is a live one."""
    worker = types.SimpleNamespace(id="w1", load=types.SimpleNamespace(forget=lambda *a: None), sessions=0)
    rt = TopologyRuntime(worker, "ping", bench.ping(10, 1).to_dict())
    kept = FakeExecutor(_context([], 1))
    rt.executors = {1: kept}
    urls = {"w0": "http://w0", "w1": "http://w1", "w2": "http://w2"}
    asyncio.run(rt.apply(Assignment(tasks={0: "w0", 1: "w1", 2: "w2"}, workers=urls), 1))
    worker.sessions += 1
    asyncio.run(rt.apply(Assignment(tasks={0: "w0", 1: "w1", 2: "w2"}, workers=urls), 2))
    asyncio.run(rt.apply(Assignment(tasks={0: "w0", 1: "w2", 2: "w2"}, workers=urls), 3))
    assert not kept.ctx.retired


def test_an_expired_session_is_counted_before_the_new_one_reads_anything():
    """Worker.sessions must have moved when the new session's watches deliver the
    assignment that placed this worker's tasks elsewhere: counted on LOST, not in the
    re-registration that follows CONNECTED on another thread."""
    import threading

    from kazoo.protocol.states import KazooState

    from streamnet.runtime.control.zk import ZkCoordinator
    coord = ZkCoordinator.__new__(ZkCoordinator)      # the listener's state alone, no server
    coord._connected, coord._closing, coord._lost, coord.sessions_lost = threading.Event(), False, False, 0
    coord._restart_callbacks = []
    coord._listener(KazooState.LOST)
    assert coord.sessions_lost == 1 and not coord._connected.is_set()
    coord._listener(KazooState.CONNECTED)
    assert coord.sessions_lost == 1 and coord._connected.is_set()
    worker = types.SimpleNamespace(state=types.SimpleNamespace(coord=coord))
    from streamnet.runtime.worker import Worker
    assert Worker.sessions.fget(worker) == 1
